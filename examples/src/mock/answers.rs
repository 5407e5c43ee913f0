//! The mock's whole (not streamed) answers and its error answers, in the shape of the API the
//! request came to.

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use serde_json::{Value, json};
use stormguard::classify::headers::RETRY_AFTER_MS;

use super::request::{Api, ChatRequest};
use super::{Fault, MOCK_FAULT};

/// The text of a whole answer, whatever `max_tokens` asks (its usage says `max_tokens`).
const WHOLE_ANSWER: &str = "This is the mock speaking.";

/// A whole answer to `chat`: a `chat.completion`, or an Anthropic `message`.
pub(super) fn completion(api: Api, chat: &ChatRequest, max_tokens: u32) -> Response<Body> {
    let prompt_tokens = chat.prompt_tokens();
    let body = match api {
        Api::Chat => json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": 0,
            "model": chat.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": WHOLE_ANSWER },
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens.saturating_add(max_tokens as usize),
            },
        }),
        Api::Messages => json!({
            "id": "msg_mock",
            "type": "message",
            "role": "assistant",
            "model": chat.model,
            "content": [{ "type": "text", "text": WHOLE_ANSWER }],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": { "input_tokens": prompt_tokens, "output_tokens": max_tokens },
        }),
    };
    json_response(StatusCode::OK, &body)
}

/// The answer of a request that fails with `fault` before any body: the fault's status, its
/// error body and, for a rate limit, the providers' hints.
pub(super) fn fault_response(api: Api, fault: Fault) -> Response<Body> {
    let status = StatusCode::from_u16(fault.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = json_response(status, &error_body(api, fault));
    mark_fault(&mut response, fault);
    if let Fault::RateLimited { retry_after } = fault {
        let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER_MS, HeaderValue::from(millis));
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Names `fault` in the answer's [`MOCK_FAULT`] header, so that a client behind a gateway can
/// tell which answers the mock failed (a cut stream's head says so before the cut).
pub(super) fn mark_fault<B>(response: &mut Response<B>, fault: Fault) {
    response
        .headers_mut()
        .insert(MOCK_FAULT, HeaderValue::from_static(fault.name()));
}

/// The provider's error JSON for `fault`. OpenAI: a stream fault's error frame is a 503's body;
/// a 529 is Anthropic's own error, so it is Anthropic's shape on either API. Anthropic: its
/// `{"type": "error", "error": {"type": ..., "message": ...}}`, an error event's data too.
pub(super) fn error_body(api: Api, fault: Fault) -> Value {
    match api {
        Api::Chat => chat_error(fault),
        Api::Messages => {
            let (kind, message) = match fault {
                Fault::RateLimited { .. } => ("rate_limit_error", "Number of requests exceeded"),
                Fault::QuotaExhausted => ("billing_error", "Your credit balance is too low"),
                Fault::Unavailable | Fault::CutMidStream => ("api_error", "Internal server error"),
                Fault::Overloaded | Fault::ErrorBeforeContent => ("overloaded_error", "Overloaded"),
            };
            json!({ "type": "error", "error": { "type": kind, "message": message } })
        }
    }
}

/// OpenAI's error JSON for `fault`.
fn chat_error(fault: Fault) -> Value {
    match fault {
        Fault::RateLimited { .. } => json!({ "error": {
            "message": "Rate limit reached for requests. Please try again shortly.",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }}),
        Fault::QuotaExhausted => json!({ "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }}),
        Fault::Unavailable | Fault::ErrorBeforeContent | Fault::CutMidStream => {
            json!({ "error": {
                "message": "The server is overloaded or not ready yet.",
                "type": "server_error",
                "code": null,
            }})
        }
        Fault::Overloaded => json!({
            "type": "error",
            "error": { "type": "overloaded_error", "message": "Overloaded" },
        }),
    }
}

/// 400 `invalid_request_error`, in the API's shape.
pub(super) fn invalid_request(api: Api, message: &str) -> Response<Body> {
    let body = match api {
        Api::Chat => json!({ "error": {
            "message": message,
            "type": "invalid_request_error",
            "code": null,
        }}),
        Api::Messages => json!({
            "type": "error",
            "error": { "type": "invalid_request_error", "message": message },
        }),
    };
    json_response(StatusCode::BAD_REQUEST, &body)
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
