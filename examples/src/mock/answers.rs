//! The mock's whole (not streamed) answers and its error answers, in the shape of the API the
//! request came to.

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use serde_json::{Value, json};
use stormguard::chaos::ErrorAnswer;

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

/// The answer of a request that fails with `fault` before any body: the provider's error
/// answer ([`ErrorAnswer`], the one copy of each body, shared with `stormguard::chaos`), named
/// in [`MOCK_FAULT`].
pub(super) fn fault_response(api: Api, fault: Fault) -> Response<Body> {
    let answer = match fault {
        Fault::RateLimited { retry_after } => ErrorAnswer::RateLimited {
            retry_after: Some(retry_after),
        },
        Fault::QuotaExhausted => ErrorAnswer::QuotaExhausted,
        Fault::Overloaded => ErrorAnswer::Overloaded,
        // The stream faults fail in the body; a 503 if one is ever answered here.
        Fault::Unavailable | Fault::ErrorBeforeContent | Fault::CutMidStream => {
            ErrorAnswer::Unavailable
        }
    };
    let mut response = answer.response(api.provider()).map(Body::from);
    mark_fault(&mut response, fault);
    response
}

/// Names `fault` in the answer's [`MOCK_FAULT`] header, so that a client behind a gateway can
/// tell which answers the mock failed (a cut stream's head says so before the cut).
pub(super) fn mark_fault<B>(response: &mut Response<B>, fault: Fault) {
    response
        .headers_mut()
        .insert(MOCK_FAULT, HeaderValue::from_static(fault.name()));
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
