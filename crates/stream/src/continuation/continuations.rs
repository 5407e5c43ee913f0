//! [`Continuations`]: the resume hook of the formats stormguard knows, which drives the pieces of
//! this module.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderName};

use super::{Format, Splice, Transcript, continuation_body, error_event, terminal_event};
use crate::interrupted::InterruptCause;
use crate::resume::{AnswerFuture, Continuer, Resume, Resumption};
use crate::sse::{Event, FrameKind};

/// The resume hook of a stream in a [`Format`] stormguard knows: its [`Transcript`]; when it
/// stops before its answer is complete, a continuation request with the text received as a
/// prefill ([`continuation_body`]), sent through a [`Continuer`], whose answer is rewritten
/// by a [`Splice`]; at most `left` of them. An answer that said it was complete gets the
/// terminal event it lost ([`terminal_event`]); one that cannot be completed (not continuable,
/// no continuation left, none that could be had) ends with the provider's in-band
/// [`error_event`].
pub struct Continuations {
    format: Format,
    head: http::request::Parts,
    body: Bytes,
    continuer: Option<Continuer>,
    left: u32,
    transcript: Transcript,
    /// The splice of the continuation sent last.
    splice: Option<Splice>,
}

impl Continuations {
    /// The hook of the stream answering the request `head` + `body`, in `format`: at most `left`
    /// continuation requests sent through `continuer` (none, or 0: the stream only ends with the
    /// in-band error event when it cannot be completed).
    pub fn new(
        format: Format,
        head: http::request::Parts,
        body: Bytes,
        continuer: Option<Continuer>,
        left: u32,
    ) -> Self {
        Self {
            format,
            head,
            body,
            continuer,
            left,
            transcript: Transcript::new(format),
            splice: None,
        }
    }

    /// Sends the request that asks for the rest of what the transcript read, if one may be sent.
    fn send(&mut self) -> Option<AnswerFuture> {
        if self.left == 0 || self.continuer.is_none() || self.transcript.continuable().is_err() {
            return None;
        }
        let body = continuation_body(&self.transcript, &self.body).ok()?;
        self.left -= 1;
        let mut head = self.head.clone();
        // Another request: its own key (the engine gives it one), its own length.
        head.headers
            .remove(HeaderName::from_static("idempotency-key"));
        head.headers.remove(CONTENT_LENGTH);
        let request = http::Request::from_parts(head, body);
        self.splice = Some(Splice::new(&self.transcript));
        let continuer = self.continuer.as_mut()?;
        Some(continuer(request))
    }
}

impl Resume for Continuations {
    fn shown(&mut self, event: &Event) {
        self.transcript.read(event);
    }

    fn content_events(&self) -> u64 {
        self.transcript.content_events()
    }

    fn resume(&mut self, _cause: &InterruptCause, _bytes: u64) -> Resumption {
        let terminal_seen = self.transcript.terminal_seen();
        if self.transcript.finished() || terminal_seen {
            return Resumption::Complete((!terminal_seen).then(|| terminal_event(self.format)));
        }
        match self.send() {
            Some(answer) => Resumption::Continuation(answer),
            None => Resumption::Interrupted,
        }
    }

    fn splice(&mut self, frame: &FrameKind, _raw: Bytes) -> Option<Bytes> {
        let FrameKind::Event(event) = frame else {
            return None;
        };
        self.splice.as_mut()?.event(event)
    }

    fn error_event(&self, cause: &InterruptCause, bytes: u64) -> Option<Bytes> {
        let events = self.transcript.content_events();
        Some(error_event(self.format, cause.as_str(), events, bytes))
    }
}

impl std::fmt::Debug for Continuations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Continuations")
            .field("format", &self.format)
            .field("left", &self.left)
            .finish()
    }
}
