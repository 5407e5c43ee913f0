//! The request every variant gets, an LLM call as a client sends it, and the two backends: one
//! that answers at once, one that fails every other call.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::Full;
use tower::Service;

/// The request type of every variant.
pub type Req = Request<Full<Bytes>>;

/// The response type of the backends.
pub type Res = Response<Full<Bytes>>;

/// A small chat-completion request, as an LLM client sends it (103 bytes).
const CHAT_REQUEST: &[u8] = br#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"Say hello in one word."}]}"#;

/// A small chat-completion answer.
const CHAT_RESPONSE: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}"#;

/// The JSON error body of an overloaded provider.
const OVERLOADED: &[u8] =
    br#"{"error":{"message":"The server is overloaded.","type":"server_error","code":null}}"#;

/// Parsed once, as a client keeps its endpoint: every request gets a cheap clone.
static ENDPOINT: LazyLock<Uri> =
    LazyLock::new(|| Uri::from_static("http://llm.invalid/v1/chat/completions"));

/// `POST /v1/chat/completions`, `content-type: application/json`, the chat body.
pub fn chat_request() -> Req {
    let mut request = Request::new(Full::new(Bytes::from_static(CHAT_REQUEST)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = ENDPOINT.clone();
    request.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    request
}

fn answer(status: StatusCode, body: &'static [u8]) -> Res {
    let mut response = Response::new(Full::new(Bytes::from_static(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The backend of the success path: 200 at once.
pub fn healthy(_request: Req) -> Ready<Result<Res, Infallible>> {
    ready(Ok(answer(StatusCode::OK, CHAT_RESPONSE)))
}

/// The backend of the failure path: 503 (with an OpenAI-style error body), 200, 503, 200 ...
/// so that every request through a retrying layer fails once and succeeds on its first retry.
#[derive(Clone, Default)]
pub struct Flaky {
    /// Calls so far, shared by clones.
    pub calls: Arc<AtomicU64>,
}

impl Service<Req> for Flaky {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Req) -> Self::Future {
        let response = if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            answer(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED)
        } else {
            answer(StatusCode::OK, CHAT_RESPONSE)
        };
        ready(Ok(response))
    }
}
