//! Reading `text/event-stream` responses: an incremental Server-Sent Events [`Parser`], and
//! [`classify_event`], which tells the events of LLM providers' streams apart (output the user
//! sees, protocol and keep-alive, end of stream, error).
//!
//! # Why
//! An LLM provider can fail a streamed request *after* its `200`: Anthropic sends an
//! `event: error` carrying an `overloaded_error`, OpenAI a `data: {"error": {...}}` frame. Until
//! the first event with content, nothing has reached the user, so such an error is a retryable
//! failure like a 529 and the request can be replayed cleanly; after it, a replay would show the
//! first half of the answer twice. The retry engine therefore reads a stream up to its first
//! content event, and needs to know where each event ends in the bytes it buffered.
//!
//! # The parser
//! [`Parser`] follows the WHATWG HTML Living Standard, "Server-sent events", sections "Parsing an
//! event stream" and "Interpreting an event stream":
//!
//! - the stream is UTF-8; invalid sequences become U+FFFD, and one leading byte order mark is
//!   skipped;
//! - lines end in CRLF, LF or CR, and a CRLF split between two chunks is one line end;
//! - a line starting with `:` is a comment (servers send them as keep-alives), reported as a
//!   [`FrameKind::Comment`] frame;
//! - `name: value` is a field (one space after the colon is dropped; a line without a colon is a
//!   field with an empty value): `event` sets the event type, `data` appends a line of data
//!   (several are joined with `\n`), `id` sets the last event ID unless the value contains NUL,
//!   `retry` sets the reconnection time if the value is ASCII digits, other names are ignored;
//! - a blank line dispatches the event, of type `message` unless an `event` field said
//!   otherwise; an event that had no `data` field is not dispatched, but its blank line still
//!   clears the event type;
//! - an event left unfinished when the stream ends is never dispatched.
//!
//! Each [`Frame`] says at which byte of the stream it ended ([`Frame::end`]) and where the bytes
//! a caller holds can be cut between events ([`Frame::boundary`]: the same byte, but for a comment
//! inside an event). Memory is bounded against hostile or broken streams: a line longer than
//! [`DEFAULT_MAX_LINE`] or an event with more data than [`DEFAULT_MAX_EVENT`] (both configurable)
//! is an [`SseError`], after which the parser takes no more input.
//!
//! # The classification
//! [`classify_event`] sorts an [`Event`] into an [`EventKind`] from the stream formats providers
//! document: OpenAI's Chat Completions chunks (and the legacy Completions ones) ending in
//! `data: [DONE]`, OpenAI's Responses API events, Anthropic's Messages streaming events, and
//! Gemini's `streamGenerateContent?alt=sse` chunks. Error events are classified with the same
//! rules as the error bodies of non-2xx responses (see
//! [`LlmClassifier`](stormguard_classify::LlmClassifier)).
//!
//! ```
//! use stormguard_classify::Reason;
//! use stormguard_stream::sse::{EventKind, FrameKind, Parser, classify_event};
//!
//! // An Anthropic stream that fails after its `200`, before any text: a retry is clean.
//! let stream = b"event: message_start\r\n\
//!     data: {\"type\":\"message_start\",\"message\":{\"role\":\"assistant\",\"content\":[]}}\r\n\r\n\
//!     : keep-alive\r\n\
//!     event: error\r\n\
//!     data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\r\n\r\n";
//!
//! let mut parser = Parser::new();
//! let mut input = &stream[..];
//! let mut seen = Vec::new();
//! // The stream may arrive in any chunks: here, the whole of it at once.
//! while let Some(frame) = parser.next_frame(&mut input)? {
//!     match frame.kind {
//!         FrameKind::Comment => seen.push("comment"),
//!         FrameKind::Event(event) => match classify_event(&event) {
//!             EventKind::Error(outcome) => {
//!                 assert!(outcome.is_retryable());
//!                 assert_eq!(outcome.reason(), Reason::Overloaded);
//!                 // The error event ends the stream's bytes.
//!                 assert_eq!(frame.end, stream.len() as u64);
//!                 seen.push("error");
//!             }
//!             EventKind::Control => seen.push("control"),
//!             other => panic!("unexpected {other:?}"),
//!         },
//!     }
//! }
//! assert_eq!(seen, ["control", "comment", "error"]);
//! # Ok::<(), stormguard_stream::sse::SseError>(())
//! ```

mod classify;
mod error;
mod parser;

pub(crate) use self::classify::is_given;
pub use self::classify::{EventKind, UNRECOGNIZED_ERROR, classify_event};
pub use self::error::SseError;
pub(crate) use self::parser::MESSAGE;
pub use self::parser::{DEFAULT_MAX_EVENT, DEFAULT_MAX_LINE, Event, Frame, FrameKind, Parser};

/// An event of type `event_type` with `data`, for the parser's and the classifier's tests.
#[cfg(test)]
fn event(event_type: &str, data: &str) -> Event {
    Event {
        event_type: event_type.to_owned(),
        data: data.to_owned(),
        id: None,
        retry: None,
    }
}

/// A `message` event with `data`.
#[cfg(test)]
fn message(data: &str) -> Event {
    event("message", data)
}
