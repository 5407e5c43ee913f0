//! Resuming a stream interrupted after content by continuations, for OpenAI Chat Completions and
//! Anthropic Messages: the request that asks for the rest of the answer, and the splice that
//! joins its answer to the caller's stream.
//!
//! # Why
//! A stream that has delivered tokens must not be restarted: the caller would see the first half
//! of the answer twice. It can be *resumed*: a continuation carries the text received so far as
//! an assistant prefill (the model goes on from the end of it), with `max_tokens` reduced by what
//! was delivered, and its answer's events are rewritten so that the caller reads one answer,
//! every token once, in order, with one terminal event, in the first stream's framing (its ids,
//! its block indices, its usage summed with the continuation's).
//!
//! # The pieces
//! - [`Transcript`] reads every event of the first stream that reached the caller: the text, the
//!   ids and usage the splice needs, and whether the answer can be continued at all (text only:
//!   a tool call, a thinking block or an image cannot be a prefill);
//! - [`continuation_body`] builds the second request's body from the first's;
//! - [`Splice`] rewrites the second stream's events, one by one, into the bytes to hand on;
//! - [`error_event`] and [`terminal_event`] end a stream that cannot be completed, or that said
//!   it was finished but lost its terminal event, in the provider's own format;
//! - [`Continuations`], the [resume hook](crate::resume) that drives them for one stream, and
//!   sends each continuation through a [`Continuer`](crate::Continuer).
//!
//! Nothing here does I/O: the continuer sends, and the guarded stream reads.
//!
//! ```
//! use stormguard_stream::continuation::{Format, Splice, Transcript, continuation_body};
//! use stormguard_stream::sse::Event;
//!
//! let event = |data: &str| Event {
//!     event_type: "message".to_owned(),
//!     data: data.to_owned(),
//!     id: None,
//!     retry: None,
//! };
//! // The caller was shown "Hello", then the stream was cut.
//! let mut transcript = Transcript::new(Format::OpenAiChat);
//! transcript.read(&event(
//!     r#"{"id":"chatcmpl-1","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}"#,
//! ));
//! assert_eq!(transcript.text(), "Hello");
//! assert_eq!(transcript.continuable(), Ok(()));
//!
//! let request = br#"{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"Hi"}]}"#;
//! let body: serde_json::Value = serde_json::from_slice(&continuation_body(&transcript, request)?)?;
//! assert_eq!(body["messages"][1], serde_json::json!({"role": "assistant", "content": "Hello"}));
//! assert_eq!(body["max_tokens"], 99);
//!
//! // The continuation's chunks reach the caller with the first stream's id.
//! let mut splice = Splice::new(&transcript);
//! let rest = splice.event(&event(
//!     r#"{"id":"chatcmpl-2","created":2,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}"#,
//! ));
//! let rest = String::from_utf8(rest.unwrap_or_default().to_vec())?;
//! assert!(rest.contains(r#""id":"chatcmpl-1""#) && rest.contains(r#""content":" world""#));
//! assert_eq!(splice.event(&event("[DONE]")).as_deref(), Some(&b"data: [DONE]\n\n"[..]));
//! assert!(splice.terminal_seen());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod continuations;
mod error;
mod splice;
mod transcript;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::sse::{Event, MESSAGE};

pub use self::body::continuation_body;
pub use self::continuations::Continuations;
pub use self::error::NotContinuable;
pub use self::splice::Splice;
pub use self::transcript::Transcript;

/// The member a spliced usage carries, `"stormguard": {"continued": true}`, so that whoever reads
/// the counts knows two requests made them.
const MARK: &str = "stormguard";

/// The streaming formats whose answers can be continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions (`POST /v1/chat/completions` with `"stream": true`), and the
    /// servers that copy it.
    OpenAiChat,
    /// Anthropic Messages (`POST /v1/messages` with `"stream": true`).
    AnthropicMessages,
}

impl Format {
    /// The format of a request's answer, from its path (the query string is not part of it): a
    /// path ending in `/chat/completions` is [`OpenAiChat`](Format::OpenAiChat) (which also
    /// covers Azure's `/openai/deployments/{name}/chat/completions`), one ending in `/messages`
    /// [`AnthropicMessages`](Format::AnthropicMessages); any other is `None`.
    pub fn of_request(head: &http::request::Parts) -> Option<Format> {
        let path = head.uri.path();
        if path.ends_with("/chat/completions") {
            Some(Format::OpenAiChat)
        } else if path.ends_with("/messages") {
            Some(Format::AnthropicMessages)
        } else {
            None
        }
    }

    /// A short snake_case name, for logs and metrics: `openai_chat`, `anthropic_messages`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Format::OpenAiChat => "openai_chat",
            Format::AnthropicMessages => "anthropic_messages",
        }
    }
}

/// The in-band error event a stream that cannot be completed ends with, in its provider's
/// format, so that SDKs raise instead of returning a truncated answer as complete: the openai
/// Python SDK raises `APIError` on a data frame with an `error` member, the anthropic SDK on an
/// `event: error`.
///
/// - OpenAI: `data: {"error":{"message":..,"type":"stream_interrupted","code":"stream_interrupted","param":null}}`;
/// - Anthropic: `event: error` with `data: {"type":"error","error":{"type":"api_error","message":..}}`.
///
/// The message says that the stream was interrupted, why (`cause`, a short name such as `reset`,
/// `idle` or `error_event`), and how much had been delivered (`events` content events, `bytes`
/// bytes).
pub fn error_event(format: Format, cause: &str, events: u64, bytes: u64) -> Bytes {
    let message = format!(
        "stream interrupted ({cause}) after {events} content events ({bytes} bytes); \
         the answer is incomplete"
    );
    match format {
        Format::OpenAiChat => {
            let error = json!({"error": {
                "message": message,
                "type": "stream_interrupted",
                "code": "stream_interrupted",
                "param": null,
            }});
            encode(MESSAGE, &error.to_string())
        }
        Format::AnthropicMessages => {
            let error =
                json!({"type": "error", "error": {"type": "api_error", "message": message}});
            encode("error", &error.to_string())
        }
    }
}

/// The terminal event of a format, for a stream that said it was finished (a `finish_reason`, a
/// `stop_reason`) but ended without it: `data: [DONE]`, or Anthropic's `event: message_stop`.
pub fn terminal_event(format: Format) -> Bytes {
    match format {
        Format::OpenAiChat => Bytes::from_static(b"data: [DONE]\n\n"),
        Format::AnthropicMessages => {
            Bytes::from_static(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
        }
    }
}

/// One event in SSE form: an `event` line unless its type is `message`, one `data` line per line
/// of data, and the blank line that ends it.
///
/// Event ids are not written: the ones a continuation sends name positions in another stream,
/// and the LLM APIs send none.
fn encode(event_type: &str, data: &str) -> Bytes {
    let mut out = String::with_capacity(event_type.len() + data.len() + 16);
    if event_type != MESSAGE {
        out.push_str("event: ");
        out.push_str(event_type);
        out.push('\n');
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// An event's data as a JSON object, if it is one.
fn object(data: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(data) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    }
}

/// An Anthropic event's type: its `event` field, or, for an event that had none, its data's
/// `type` (which Anthropic sends as well).
fn anthropic_type<'a>(event: &'a Event, data: &'a Map<String, Value>) -> &'a str {
    if event.event_type == MESSAGE {
        string(data, "type").unwrap_or(MESSAGE)
    } else {
        &event.event_type
    }
}

/// Present and not `null`: a `finish_reason`, a `stop_reason`, an `error` that was sent.
fn is_set(value: Option<&Value>) -> bool {
    value.is_some_and(|value| !value.is_null())
}

/// A member that is a count (a non-negative integer).
fn count(object: &Map<String, Value>, key: &str) -> Option<u64> {
    object.get(key).and_then(Value::as_u64)
}

/// A member that is a string.
fn string<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(Value::as_str)
}

/// A member that is an object.
fn member<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    object.get(key).and_then(Value::as_object)
}

/// Text and the whitespace that ends it. Anthropic rejects a final assistant message that ends
/// in whitespace, so the prefill is the first part, and the caller has already seen the second.
fn split_trailing_whitespace(text: &str) -> (&str, &str) {
    text.split_at(text.trim_end().len())
}
