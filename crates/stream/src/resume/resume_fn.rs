//! [`ResumeFn`]: a resume hook made of a closure, called once with what was received.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;

use super::{AnswerFuture, MakeResume, Resume, Resumption};
use crate::interrupted::InterruptCause;
use crate::sse::{Event, EventKind, classify_event};

/// What a stream delivered before it was interrupted, for a [`ResumeFn`]'s closure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    events: u64,
    bytes: u64,
    content: Vec<String>,
}

impl Received {
    /// Content events delivered.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes of the stream delivered (whole events only: a stream with a resume hook is handed
    /// on in whole events).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The `data` of each content event delivered, in order (an OpenAI chunk's JSON, an
    /// Anthropic `content_block_delta`'s JSON): what the caller has seen of the answer.
    pub fn content(&self) -> &[String] {
        &self.content
    }
}

/// Most bytes of content kept for the closure: 1 MiB (a long answer's text is far less).
const MAX_KEPT: usize = 1 << 20;

type Hook = dyn Fn(&Received, &Parts, &Bytes) -> Option<AnswerFuture> + Send + Sync;

/// A resume hook made of a closure, for the formats the built-in
/// [`Continuations`](crate::continuation::Continuations) does not know: given what was received,
/// the original request's head (with its deadline) and body, the closure may send a continuation
/// (for example the partial answer as an assistant prefill) through a client that shares the
/// same retry budget, and return the future of its answer. The stream then goes on with that
/// answer's frames, as they came, after the last whole event delivered; if the closure declines
/// (`None`), or the continuation fails, the stream ends with
/// [`StreamInterrupted`](crate::StreamInterrupted).
///
/// The closure is called once per stream, when it is interrupted after content; a stream that
/// ends, with or without a terminal event, is complete. What the continuation's answer is read
/// as: its events and comments as they came, its error event or anything after its terminal
/// event never handed on, a failure of it ending the stream with the first interruption.
///
/// The head is the original request's: it carries the deadline, and its `Idempotency-Key`,
/// which a continuation (another request) should not reuse: remove it (and `content-length`)
/// before sending. `tests/tests/streams.rs` has a closure that adds the partial answer as an
/// assistant prefill to an OpenAI chat request.
///
/// The content kept for the closure is bounded (1 MiB); beyond it, the stream is not resumed.
/// Each event is classified once more to keep it, one JSON parse: the price of the closure's
/// [`Received`].
#[derive(Clone)]
pub struct ResumeFn {
    hook: Arc<Hook>,
}

impl ResumeFn {
    /// A resume hook that calls `hook`.
    pub fn new<F>(hook: F) -> Self
    where
        F: Fn(&Received, &Parts, &Bytes) -> Option<AnswerFuture> + Send + Sync + 'static,
    {
        Self {
            hook: Arc::new(hook),
        }
    }
}

impl fmt::Debug for ResumeFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResumeFn")
    }
}

impl MakeResume for ResumeFn {
    fn make_resume(&self, head: &Parts, body: &Bytes) -> Option<Box<dyn Resume>> {
        Some(Box::new(Once {
            hook: Some(Arc::clone(&self.hook)),
            head: head.clone(),
            body: body.clone(),
            events: 0,
            content: Vec::new(),
            kept: 0,
            overflowed: false,
        }))
    }
}

/// One stream's [`ResumeFn`]: the closure until it is called, the request, and the content
/// events shown.
struct Once {
    hook: Option<Arc<Hook>>,
    head: Parts,
    body: Bytes,
    events: u64,
    /// The data of the content events, while the closure may still be called.
    content: Vec<String>,
    kept: usize,
    overflowed: bool,
}

impl Resume for Once {
    fn shown(&mut self, event: &Event) {
        if classify_event(event) != EventKind::Content {
            return;
        }
        self.events += 1;
        if self.hook.is_none() || self.overflowed {
            return;
        }
        if self.kept + event.data.len() <= MAX_KEPT {
            self.kept += event.data.len();
            self.content.push(event.data.clone());
        } else {
            self.overflowed = true;
            self.content = Vec::new();
        }
    }

    fn content_events(&self) -> u64 {
        self.events
    }

    fn resume(&mut self, cause: &InterruptCause, bytes: u64) -> Resumption {
        // It reads no format: a stream that ended is complete.
        if matches!(cause, InterruptCause::Unfinished) {
            return Resumption::Complete(None);
        }
        let Some(hook) = self.hook.take() else {
            return Resumption::Interrupted;
        };
        if self.overflowed {
            return Resumption::Interrupted;
        }
        let received = Received {
            events: self.events,
            bytes,
            content: std::mem::take(&mut self.content),
        };
        match hook(&received, &self.head, &self.body) {
            Some(answer) => Resumption::Continuation(answer),
            None => Resumption::Interrupted,
        }
    }
}
