//! Relaying one caller's request: its body read within the cap, its `model` read, its route
//! found, its head cleaned, and the answer handed back as it comes (event streams too), marked
//! with the attempts it took. When a drain's grace ends, a request still waiting is answered
//! 503, and a stream still open ends with its in-band error event ([`super::drain`]).

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use serde::Deserialize;
use stormguard::stream::is_event_stream;
use tower::ServiceExt;

use super::Shared;
use super::degraded::AsksStream;
use super::drain::{DrainingStream, draining_response};
use super::headers::{X_STORMGUARD_ATTEMPTS, strip};
use super::refusal::Refusal;
use super::upstream::AttemptCount;
use crate::format::Format;

/// The one field the gateway reads of a body; the rest is relayed untouched.
#[derive(Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    /// Whether it asks for an event stream (for a degraded answer in the same shape); a value
    /// that is not a boolean is the provider's to refuse, read here as no.
    #[serde(default, deserialize_with = "lenient_bool")]
    stream: bool,
}

fn lenient_bool<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(value.as_bool().unwrap_or(false))
}

/// Relays a request of a caller speaking `format`.
pub(crate) async fn relay(
    State(shared): State<Arc<Shared>>,
    format: Format,
    request: Request,
) -> Response<Body> {
    let mut in_flight = shared.ending.begin();
    let response = tokio::select! {
        relayed = try_relay(&shared, format, request) => match relayed {
            Ok(response) => response,
            Err(refusal) => refusal.to_response(format),
        },
        () = shared.ending.ended() => {
            in_flight.end();
            tracing::info!("request ended by the drain: answered 503");
            return draining_response(format);
        }
    };
    if !is_event_stream(response.headers()) {
        return response;
    }
    let ending = &shared.ending;
    response.map(|body| Body::new(DrainingStream::new(body, format, ending, in_flight)))
}

async fn try_relay(
    shared: &Shared,
    format: Format,
    request: Request,
) -> Result<Response<Body>, Refusal> {
    let (mut head, body) = request.into_parts();
    let body = read_body(body, shared.max_body_bytes).await?;
    let (model, asks_stream) = model_of(&body)?;
    let Some(route) = shared.routes.find(&model, format) else {
        return Err(Refusal::unknown_model(&model));
    };
    if route.format != format {
        let message = format!(
            "the model `{}` is served in the {} format: call {} instead",
            super::refusal::shown(&model),
            route.format.name(),
            route.format.example_path()
        );
        return Err(Refusal::bad_request(message));
    }
    let Some(upstream) = route.upstream.clone() else {
        return Err(Refusal::unavailable(&model));
    };
    strip(&mut head.headers);
    // Only the path travels: the origin is the deployment's, set by its adapter.
    head.uri = head
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap_or_default();
    let attempts = AttemptCount::default();
    head.extensions.insert(attempts.clone());
    head.extensions.insert(AsksStream(asks_stream));
    let answer = upstream
        .oneshot(http::Request::from_parts(head, Full::new(body)))
        .await;
    let mut response = match answer {
        Ok(response) => response,
        Err(error) => failure(&error, format, shared),
    };
    response
        .headers_mut()
        .insert(X_STORMGUARD_ATTEMPTS, HeaderValue::from(attempts.get()));
    Ok(response)
}

/// The caller's answer when the route gave up without a provider's answer: the library's status
/// and headers (`Retry-After`, `x-should-retry: false`), a body in the caller's format.
fn failure(error: &stormguard::Error, format: Format, shared: &Shared) -> Response<Body> {
    let (head, ()) = stormguard::error_response::<()>(error, false).into_parts();
    shared
        .failures
        .record(error.reason().as_str(), error.attempts());
    let refusal = Refusal {
        status: head.status,
        kind: "api_error",
        message: format!("the gateway gave up on the providers: {}", error.reason()),
    };
    let mut response = refusal.to_response(format);
    for (name, value) in &head.headers {
        response.headers_mut().insert(name, value.clone());
    }
    response
}

/// The whole body, or a 413 past `limit` bytes (a 400 if it breaks off).
async fn read_body(body: Body, limit: usize) -> Result<Bytes, Refusal> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Refusal::too_large(limit))
        }
        Err(_) => Err(Refusal::bad_request("the request body could not be read")),
    }
}

/// The body's `model`, a string.
fn model_of(body: &[u8]) -> Result<(String, bool), Refusal> {
    let field: ModelField<'_> = serde_json::from_slice(body).map_err(|error| {
        if error.is_data() {
            Refusal::bad_request("`model` must be a string")
        } else {
            Refusal::bad_request("the request body is not a JSON object")
        }
    })?;
    match field.model {
        Some(model) if !model.is_empty() => Ok((model.into_owned(), field.stream)),
        _ => Err(Refusal::bad_request("the request names no `model`")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_a_string_of_a_json_object() {
        assert_eq!(
            model_of(br#"{"model":"gpt","messages":[]}"#).unwrap(),
            ("gpt".to_owned(), false)
        );
        assert_eq!(
            model_of(br#"{"model":"g\u0070t","stream":true}"#).unwrap(),
            ("gpt".to_owned(), true)
        );
        // A stream that is not a boolean is the provider's to refuse: relayed as asked.
        assert_eq!(
            model_of(br#"{"stream":"yes","model":"gpt"}"#).unwrap(),
            ("gpt".to_owned(), false)
        );
        for body in [
            &br#"{"model":3}"#[..],
            b"not json",
            b"[1,2]",
            br#"{"messages":[]}"#,
            b"",
        ] {
            assert_eq!(model_of(body).unwrap_err().status, 400);
        }
    }
}
