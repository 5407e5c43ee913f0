//! A guard for the event streams of LLM APIs: an error before the first token is a clean retry,
//! a stream that has delivered tokens is never restarted, and a stream that stalls is cut.
//!
//! # The problem
//!
//! Most LLM traffic is streamed (`text/event-stream`), and streams fail in two ways that status
//! codes miss:
//!
//! - before any content: Anthropic answers `200` and then sends `event: error` with
//!   `overloaded_error`; OpenAI-compatible servers send a `{"error": ...}` data frame. The status
//!   said success, the provider said "overloaded". Read up to the first content event, such a
//!   stream is a failure like a 529: retried under the budget and the deadline, and the caller
//!   only ever sees a clean stream.
//! - after content: the user has seen part of the answer. A retry would show it twice, so the
//!   stream is never restarted: it is resumed by its [`Resume`] hook from what was received, or
//!   it ends with [`StreamInterrupted`], which says how many content events and bytes were
//!   delivered and why it stopped (an error event, a reset, silence).
//!
//! SDK timeouts cover the time to the first byte; a stream that stalls half way hangs.
//!
//! # The rules
//!
//! [`open`] reads a stream up to its first content event and resolves to an [`Opening`]:
//! [`Failed`](Opening::Failed) with the outcome of an error event, a reset or silence that came
//! first (the retry engine replays the request), or [`Open`](Opening::Open) with a
//! [`GuardedStream`] that hands the stream on whole, from its first byte. Which events are
//! content is [`sse::classify_event`]'s answer, from the formats the providers document (OpenAI
//! Chat Completions and Responses, Anthropic Messages, Gemini); error events are classified with
//! the rules of error bodies ([`LlmClassifier`](stormguard_classify::LlmClassifier)).
//!
//! The guard has three timeouts, each off with `None` ([`StreamPolicy`]):
//!
//! - **first event** (60 s): until any event or comment arrives. Providers send an opening event
//!   as soon as they admit the request (OpenAI's role chunk, Anthropic's `message_start`), long
//!   before the first token of a slow model, so a minute of silence means a stuck request;
//! - **idle** (60 s): between any two frames, keep-alive comments and `ping` events included
//!   (they are life). Anthropic pings every few seconds, and a token stream sends many events a
//!   second;
//! - **progress** (300 s): between content events, pings *not* included: a stream that only
//!   pings for five minutes delivers nothing, whatever its keep-alives say. Long enough for a
//!   reasoning model's thinking before its first token.
//!
//! Before the first content event the request's own deadline bounds the wait as well. At most
//! 1 MiB is held back before the first content event: a stream that sends more is handed on as
//! it is (it is not an LLM's).
//!
//! # Resuming an interrupted stream
//!
//! A [`GuardedStream`] may be given a resume hook ([`GuardedStream::with_resume`]), which sees
//! every event the caller was shown and says what follows when the stream stops before its answer
//! is complete: the [`resume`] module's one mechanism. The [`continuation`] module holds the hook
//! for OpenAI Chat Completions and Anthropic Messages, [`Continuations`], and its pieces: a
//! [`Transcript`] of what the caller was shown, the [`continuation_body`] that asks for the rest
//! (the text received as a prefill, `max_tokens` reduced), and a [`Splice`] that rewrites the
//! continuation's events into the first stream's framing, so that every token arrives once, in
//! order, with one terminal event. A stream that cannot be completed ends with the provider's
//! own [`error_event`], so that SDKs raise instead of returning a truncated answer as complete.
//! For other formats, [`ResumeFn`] makes a hook of a closure.
//!
//! # Words
//!
//! Each idea has one word, in the code as in these docs:
//!
//! - **interrupted**: a stream stopped after content (an error event, a reset, silence, an end
//!   before its answer was complete); it is never restarted. [`InterruptCause`] says why,
//!   [`StreamInterrupted`] ends a stream that stays interrupted.
//! - **resume**: go on with an interrupted stream, as its hook ([`Resume`]) says; the hook is
//!   made per stream by a [`MakeResume`].
//! - **continuation**: the request that asks for the rest of an answer, and its answer
//!   ([`AnswerFuture`], [`AnswerBody`]).
//! - **continuer**: what sends a continuation and returns the future of its answer
//!   ([`Continuer`]); the engine's goes through the engine, a failover's to its next backend.
//!   Whoever sends a continuation knows it is one: its own stream is never resumed (the stream
//!   it continues goes on from all it received).
//! - **prefill**: the text received, sent as the assistant message the model goes on from
//!   ([`continuation_body`]).
//! - **splice**: rewriting a continuation's events into the first stream's framing (its ids, its
//!   block indices, its usage summed), so that the caller reads one answer ([`Splice`],
//!   [`Resume::splice`]).
//! - **transcript**: what the caller was shown of an answer, event by event ([`Transcript`],
//!   [`Resume::shown`]).
//!
//! [`Transcript`]: continuation::Transcript
//! [`continuation_body`]: continuation::continuation_body
//! [`Splice`]: continuation::Splice
//! [`error_event`]: continuation::error_event
//! [`Continuations`]: continuation::Continuations
//!
//! # The format
//!
//! The [`sse`] module parses event streams after the WHATWG HTML Living Standard,
//! "Server-sent events" (sections "Parsing an event stream" and "Interpreting an event stream"),
//! incrementally, in bounded memory, and says where each event ends in the bytes.
//!
//! # Where it is used
//!
//! The retry engine (`stormguard-retry`'s `ClientLayer`) applies the guard to every
//! `text/event-stream` success ([`is_event_stream`]) and hands the stream back as a
//! [`ResponseBody::boxed`](stormguard_classify::body::ResponseBody::boxed) body, telling the
//! circuit breaker how it ends ([`GuardedStream::with_at_end`]). The facade re-exports this
//! crate as `stormguard::stream` (the parser as `stormguard::stream::sse`).
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use stormguard_classify::Reason;
//! use stormguard_stream::{Opening, StreamPolicy, open};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Anthropic fails the request after its `200`, before any text: a retry is clean.
//! let overloaded = "event: message_start\n\
//!     data: {\"type\":\"message_start\",\"message\":{\"role\":\"assistant\",\"content\":[]}}\n\n\
//!     event: error\n\
//!     data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
//! let body = Full::new(Bytes::from_static(overloaded.as_bytes()));
//! let Opening::Failed { outcome, .. } = open(body, StreamPolicy::default()).await else {
//!     panic!("an error before any content fails the opening");
//! };
//! assert!(outcome.is_retryable());
//! assert_eq!(outcome.reason(), Reason::Overloaded);
//!
//! // A stream with content is handed on whole, from its first byte.
//! let answer = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!     data: [DONE]\n\n";
//! let body = Full::new(Bytes::from_static(answer.as_bytes()));
//! let Opening::Open(stream) = open(body, StreamPolicy::default()).await else {
//!     panic!("content opens the stream");
//! };
//! let read = stream.collect().await.map(|whole| whole.to_bytes());
//! assert_eq!(read.ok().as_deref(), Some(answer.as_bytes()));
//! # }
//! ```

pub mod continuation;
mod guard;
mod interrupted;
pub mod resume;
pub mod sse;

pub use self::guard::{
    GapTimer, GuardedStream, OpenStream, Opening, StreamEnd, StreamPolicy, open,
};
pub use self::interrupted::{InterruptCause, StreamInterrupted};
pub use self::resume::{
    AnswerBody, AnswerFuture, Continuer, MakeResume, Received, Resume, ResumeFn, Resumption,
};
pub use stormguard_classify::is_event_stream;
