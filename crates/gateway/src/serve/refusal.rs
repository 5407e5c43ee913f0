//! The gateway's own error answers, in the caller's API format.

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::json;

use crate::format::Format;

/// An error answered by the gateway itself: its status, its kind and a message for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// The error's type, as the format names them (`invalid_request_error`, `not_found_error`).
    pub kind: &'static str,
    /// What the caller reads.
    pub message: String,
}

/// Longest part of a caller's model name an answer repeats: a name is short, and a body of
/// megabytes sent as a name is not echoed back whole.
const SHOWN_MODEL_CHARS: usize = 200;

/// `model` as an answer repeats it: its first [`SHOWN_MODEL_CHARS`] characters.
pub(crate) fn shown(model: &str) -> &str {
    model
        .char_indices()
        .nth(SHOWN_MODEL_CHARS)
        .map_or(model, |(end, _)| &model[..end])
}

impl Refusal {
    /// A 400: the request cannot be served as it is.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 401: no caller key, or not one of the gateway's.
    pub fn unauthorized() -> Self {
        let message =
            "missing or unknown API key: send one of the gateway's caller keys as a bearer token";
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
    }

    /// A 404: the gateway serves no such model.
    pub fn unknown_model(model: &str) -> Self {
        let model = shown(model);
        let message = format!(
            "the model `{model}` does not exist on this gateway (GET /v1/models lists them)"
        );
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// A 413: the body is larger than the gateway accepts.
    pub fn too_large(limit: usize) -> Self {
        let message =
            format!("the request body is larger than this gateway accepts ({limit} bytes)");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", message)
    }

    /// A 503: the model has no deployment that can be called (none has its key set).
    pub fn unavailable(model: &str) -> Self {
        let model = shown(model);
        let message = format!("no deployment of `{model}` can be called: none has its key set");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "api_error", message)
    }

    /// A 503: the gateway is shutting down and did not answer the request within its drain's
    /// grace. Sent with `x-should-retry: true` and `Retry-After: 1`, so that the SDK sends it
    /// again and the load balancer takes it to another replica.
    pub fn draining() -> Self {
        let message = "the gateway is shutting down: send the request again";
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", message)
    }

    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    /// The answer, in `format`.
    pub fn to_response(&self, format: Format) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body(format).to_string()));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    /// The error's JSON, in `format`.
    pub fn body(&self, format: Format) -> serde_json::Value {
        match format {
            Format::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": null,
                    "code": null,
                }
            }),
            Format::Anthropic => json!({
                "type": "error",
                "error": { "type": self.kind, "message": self.message },
            }),
        }
    }
}
