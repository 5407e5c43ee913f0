//! The demo's mock provider: OpenAI's `/v1/chat/completions` and Anthropic's `/v1/messages`,
//! whole or streamed, served twice, each on a port of its own: flaky, and backup.
//!
//! Its answers count: the text of an answer of twelve words is `1 2 3 ... 12`, so a reader sees
//! at once a word repeated or missing. A request whose last message is the assistant's (a
//! prefill, which is how the gateway asks a backend to continue a cut stream) is answered from
//! the word after the prefill's.
//!
//! The flaky one fails on purpose, on a fixed schedule per API so that a reader can predict
//! it: of the whole (not streamed) requests it receives, every third one (the first, the fourth,
//! ...; every other request of a caller, as the retry of each is the next) is answered in turn
//! with a server error (OpenAI's 500 `server_error`, Anthropic's 529 `overloaded_error`) and with
//! a 429 carrying `Retry-After: 1`; of the streams, every third one (the first, the fourth, ...)
//! is cut after a few words, the connection reset. The backup never fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use http::{HeaderValue, Response, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use super::stream::{self, Api};

/// Words in an answer whose request sets no `max_tokens`.
pub const DEFAULT_WORDS: u64 = 12;

/// Most words in one answer, whatever `max_tokens` asks: an answer is a demo, not a load test.
pub const MAX_WORDS: u64 = 200;

/// Words a cut stream delivers before its connection is reset, at most (half the answer when it
/// is shorter, at least one).
pub const CUT_AFTER_WORDS: u64 = 4;

/// What the flaky provider's 429 asks callers to wait, in seconds (`Retry-After: 1`).
pub const RETRY_AFTER_SECS: u64 = 1;

/// The response header in which the flaky provider names what it did to an answer it failed (a cut
/// stream's head says so before the cut, and the gateway relays it).
pub const X_DEMO_FAULT: &str = "x-demo-fault";

/// How many times the mock failed on purpose, and how many continuations it served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    /// Server errors: OpenAI's 500, Anthropic's 529.
    pub server_errors: u64,
    /// 429s with `Retry-After`.
    pub rate_limits: u64,
    /// Streams cut after a few words.
    pub cuts: u64,
    /// Requests answered from the word after an assistant prefill.
    pub continuations: u64,
}

/// The mock's state: its counters of arrivals and of what it injected.
#[derive(Debug, Default)]
pub(crate) struct Mock {
    /// Arrivals at the flaky provider, per API and per kind (whole, streamed), for its schedule.
    arrivals: [[AtomicU64; 2]; 2],
    server_errors: AtomicU64,
    rate_limits: AtomicU64,
    cuts: AtomicU64,
    continuations: AtomicU64,
}

/// What the flaky provider does to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    ServerError,
    RateLimited,
    Cut,
}

impl Mock {
    /// What it injected so far.
    pub(crate) fn injected(&self) -> Injected {
        Injected {
            server_errors: self.server_errors.load(Ordering::Relaxed),
            rate_limits: self.rate_limits.load(Ordering::Relaxed),
            cuts: self.cuts.load(Ordering::Relaxed),
            continuations: self.continuations.load(Ordering::Relaxed),
        }
    }

    /// The fault the flaky provider's schedule gives to its next request of `api`.
    fn schedule(&self, api: Api, streamed: bool) -> Option<Fault> {
        let arrival =
            self.arrivals[api.index()][usize::from(streamed)].fetch_add(1, Ordering::Relaxed);
        if !arrival.is_multiple_of(3) {
            return None;
        }
        let (fault, counter) = match (streamed, (arrival / 3) % 2) {
            (true, _) => (Fault::Cut, &self.cuts),
            (false, 0) => (Fault::ServerError, &self.server_errors),
            (false, _) => (Fault::RateLimited, &self.rate_limits),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }
}

/// The members of a request the mock reads; the rest is ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Asked {
    model: Value,
    max_tokens: Option<Value>,
    stream: Option<Value>,
    messages: Vec<Message>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Message {
    role: Value,
    content: Value,
}

impl Asked {
    /// The words of the assistant prefill the answer goes on from: the last message's, if it is
    /// the assistant's.
    fn prefill_words(&self) -> u64 {
        match self.messages.last() {
            Some(last) if last.role == "assistant" => words(&last.content),
            _ => 0,
        }
    }

    /// The numbers of the answer's first and last words.
    fn span(&self) -> (u64, u64) {
        let prefill = self.prefill_words().min(u64::from(u32::MAX));
        let last = match self.max_tokens.as_ref().and_then(Value::as_u64) {
            Some(max_tokens) => prefill + max_tokens.clamp(1, MAX_WORDS),
            None => DEFAULT_WORDS.max(prefill + 1),
        };
        (prefill + 1, last)
    }
}

/// The request of `body`: a JSON object (serde would take an array for a struct too).
fn read(body: &[u8]) -> Option<Asked> {
    let object = serde_json::from_slice::<serde_json::Map<String, Value>>(body).ok()?;
    serde_json::from_value(Value::Object(object)).ok()
}

/// The words of a message's content: its string, or its text parts' (both APIs allow parts).
fn words(content: &Value) -> u64 {
    let count = |text: &str| text.split_whitespace().count() as u64;
    match content {
        Value::String(text) => count(text),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text")?.as_str())
            .map(count)
            .sum(),
        _ => 0,
    }
}

/// The words numbered `first` to `last`, space-separated.
pub(crate) fn counted(first: u64, last: u64) -> String {
    (first..=last)
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The flaky provider's state, or the backup's (`false`).
pub(crate) type Provider = (Arc<Mock>, bool);

/// Answers any request: `/v1/chat/completions` and `/v1/messages`, as the flaky provider or as
/// the backup.
pub(crate) async fn answer(
    State((mock, flaky)): State<Provider>,
    request: Request,
) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let Some(api) = route(&path) else {
        return error(
            Api::Chat,
            StatusCode::NOT_FOUND,
            "not_found_error",
            "no such path",
        );
    };
    let body = match axum::body::to_bytes(request.into_body(), 1 << 20).await {
        Ok(body) => body,
        Err(_) => return invalid(api, "the body is over 1 MiB or broken"),
    };
    let Some(asked) = read(&body) else {
        return invalid(api, "the body is not a JSON object of a chat request");
    };
    let streamed = asked.stream == Some(Value::Bool(true));
    let fault = if flaky {
        mock.schedule(api, streamed)
    } else {
        None
    };
    let (first, last) = asked.span();
    if first > 1 {
        mock.continuations.fetch_add(1, Ordering::Relaxed);
    }
    let who = if flaky { "flaky" } else { "backup" };
    let model = asked.model.as_str().unwrap_or("mock").to_owned();
    match fault {
        Some(Fault::ServerError) => {
            tracing::info!(provider = who, %path, "demo provider: a server error, on purpose");
            server_error(api)
        }
        Some(Fault::RateLimited) => {
            tracing::info!(provider = who, %path, "demo provider: a 429 with Retry-After, on purpose");
            rate_limited(api)
        }
        _ if !streamed => {
            tracing::info!(provider = who, %path, first, last, "demo provider: answered");
            whole(api, &model, first, last)
        }
        Some(Fault::Cut) => {
            let cut = cut_word(first, last);
            tracing::info!(provider = who, %path, first, cut, "demo provider: a stream cut after word {cut}, on purpose");
            let mut response = stream::respond(api, model, (first, last), Some(cut));
            if let Ok(value) = HeaderValue::from_str(&format!("stream cut after word {cut}")) {
                response.headers_mut().insert(X_DEMO_FAULT, value);
            }
            response
        }
        None => {
            tracing::info!(provider = who, %path, first, last, "demo provider: streaming");
            stream::respond(api, model, (first, last), None)
        }
    }
}

/// The word after which a stream of the words `first` to `last` is cut: half of them, at least
/// one and at most [`CUT_AFTER_WORDS`].
fn cut_word(first: u64, last: u64) -> u64 {
    let words = last - first + 1;
    first + (words / 2).clamp(1, CUT_AFTER_WORDS) - 1
}

/// The API of `path`, whatever prefix it has (a base URL's path is kept before `/v1`).
fn route(path: &str) -> Option<Api> {
    if path.ends_with(crate::format::CHAT_COMPLETIONS) {
        Some(Api::Chat)
    } else if path.ends_with(crate::format::MESSAGES) {
        Some(Api::Messages)
    } else {
        None
    }
}

/// A whole answer of the words `first` to `last`.
fn whole(api: Api, model: &str, first: u64, last: u64) -> Response<Body> {
    let text = counted(first, last);
    let words = last - first + 1;
    let body = match api {
        Api::Chat => json!({
            "id": "chatcmpl-demo",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "finish_reason": "stop",
            }],
            "usage": { "prompt_tokens": 1, "completion_tokens": words, "total_tokens": words + 1 },
        }),
        Api::Messages => json!({
            "id": "msg_demo",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{ "type": "text", "text": text }],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": { "input_tokens": 1, "output_tokens": words },
        }),
    };
    json_response(StatusCode::OK, &body)
}

/// OpenAI's 500 `server_error`, Anthropic's 529 `overloaded_error`.
fn server_error(api: Api) -> Response<Body> {
    let message = "the demo's flaky provider failed this request on purpose";
    let mut response = match api {
        Api::Chat => error(
            api,
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            message,
        ),
        Api::Messages => match StatusCode::from_u16(529) {
            Ok(status) => error(api, status, "overloaded_error", message),
            Err(_) => error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", message),
        },
    };
    mark(&mut response, "server error");
    response
}

/// A 429 that asks to wait [`RETRY_AFTER_SECS`].
fn rate_limited(api: Api) -> Response<Body> {
    let message = "the demo's flaky provider rate-limits this request on purpose";
    let kind = match api {
        Api::Chat => "requests",
        Api::Messages => "rate_limit_error",
    };
    let mut response = error(api, StatusCode::TOO_MANY_REQUESTS, kind, message);
    if api == Api::Chat {
        response = with_code(response, message);
    }
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    mark(&mut response, "rate limited");
    response
}

/// OpenAI's rate-limit answer carries `code: rate_limit_exceeded` (a 429 without it may be a
/// spent quota, which no retry cures).
fn with_code(response: Response<Body>, message: &str) -> Response<Body> {
    let body = json!({ "error": {
        "message": message,
        "type": "requests",
        "param": null,
        "code": "rate_limit_exceeded",
    }});
    let (head, _) = response.into_parts();
    Response::from_parts(head, Body::from(body.to_string()))
}

fn mark(response: &mut Response<Body>, what: &'static str) {
    response
        .headers_mut()
        .insert(X_DEMO_FAULT, HeaderValue::from_static(what));
}

/// A 400 `invalid_request_error`.
fn invalid(api: Api, message: &str) -> Response<Body> {
    error(
        api,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        message,
    )
}

/// An error answer in `api`'s shape.
fn error(api: Api, status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let body = match api {
        Api::Chat => json!({ "error": {
            "message": message, "type": kind, "param": null, "code": null,
        }}),
        Api::Messages => json!({
            "type": "error",
            "error": { "type": kind, "message": message },
        }),
    };
    json_response(status, &body)
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn asked(json: &str) -> Asked {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn an_answer_goes_on_after_the_prefill() {
        assert_eq!(asked(r#"{"model":"m"}"#).span(), (1, DEFAULT_WORDS));
        assert_eq!(asked(r#"{"max_tokens":8}"#).span(), (1, 8));
        let prefilled = asked(
            r#"{"max_tokens":5,"messages":[{"role":"user","content":"count"},
                {"role":"assistant","content":"1 2 3"}]}"#,
        );
        assert_eq!(prefilled.span(), (4, 8));
        // Anthropic's content parts count by their text; a prefill without max_tokens ends at
        // the default answer's last word.
        let parts = asked(
            r#"{"messages":[{"role":"assistant","content":[{"type":"text","text":"1 2"},
                {"type":"text","text":" 3 4"}]}]}"#,
        );
        assert_eq!(parts.span(), (5, DEFAULT_WORDS));
        // An assistant turn followed by the user's is history, not a prefill.
        let history = asked(
            r#"{"messages":[{"role":"assistant","content":"1 2"},{"role":"user","content":"go on"}]}"#,
        );
        assert_eq!(history.span(), (1, DEFAULT_WORDS));
        assert_eq!(counted(3, 6), "3 4 5 6");
        assert_eq!(cut_word(1, 12), 4);
        assert_eq!(cut_word(1, 5), 2);
        assert_eq!(cut_word(7, 7), 7);
    }

    #[test]
    fn hostile_numbers_are_bounded() {
        assert_eq!(
            asked(r#"{"max_tokens":18446744073709551615}"#).span(),
            (1, MAX_WORDS)
        );
        assert_eq!(asked(r#"{"max_tokens":0}"#).span(), (1, 1));
        assert_eq!(asked(r#"{"max_tokens":-3}"#).span(), (1, DEFAULT_WORDS));
        assert_eq!(asked(r#"{"max_tokens":"many"}"#).span(), (1, DEFAULT_WORDS));
        assert!(read(br#"{"messages":7}"#).is_none());
        assert!(read(b"[1,2]").is_none());
        assert!(read(b"not json").is_none());
    }

    #[test]
    fn the_flaky_schedule_fails_every_third_request_of_each_kind() {
        let mock = Mock::default();
        let whole: Vec<_> = (0..7).map(|_| mock.schedule(Api::Chat, false)).collect();
        assert_eq!(
            whole,
            [
                Some(Fault::ServerError),
                None,
                None,
                Some(Fault::RateLimited),
                None,
                None,
                Some(Fault::ServerError)
            ]
        );
        // Each API and kind has its own count.
        assert_eq!(
            mock.schedule(Api::Messages, false),
            Some(Fault::ServerError)
        );
        assert_eq!(mock.schedule(Api::Chat, true), Some(Fault::Cut));
        assert_eq!(mock.schedule(Api::Chat, true), None);
        assert_eq!(
            mock.injected(),
            Injected {
                server_errors: 3,
                rate_limits: 1,
                cuts: 1,
                continuations: 0
            }
        );
        assert_eq!(route("/v1/messages"), Some(Api::Messages));
        assert_eq!(route("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(route("/v1/embeddings"), None);
        assert_eq!(route("/any/prefix/v1/messages"), Some(Api::Messages));
        assert_eq!(route("/v1/messages/batches"), None);
    }
}
