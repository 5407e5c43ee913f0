//! A guarded stream that continues itself: when it is cut, stalls, errs after content or ends
//! before its answer is complete, it asks for the rest ([`continuation`](crate::continuation))
//! and splices the answer in; when it cannot, it ends with the in-band error event of its
//! provider's format, then [`StreamInterrupted`].

use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HeaderName};
use http_body::{Body, Frame};
use stormguard_classify::BoxError;

use crate::continuation::{
    Format, Splice, Transcript, continuation_body, error_event, terminal_event,
};
use crate::guard::{GuardedStream, InterruptCause, Resumed, ResumedBody, StreamInterrupted};
use crate::sse::{FrameKind, Parser};

/// What sends a continuation request and resolves to its answer's body (`None`: it could not
/// be had: refused, failed, not a stream). The retry engine makes one that sends through itself,
/// under the retry budget.
pub type Continuer = Box<dyn FnMut(http::Request<Bytes>) -> Resumed + Send>;

/// In the extensions of a continuation request: it continues another stream. The engine does
/// not continue a continuation (the stream it continues does, from the whole transcript).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuationRequest;

/// What a guarded stream needs to continue itself: the request it answers, how to send a
/// continuation, and how many it may send ([`GuardedStream::with_continuation`]).
pub struct Continuation {
    format: Format,
    head: http::request::Parts,
    body: Bytes,
    continuer: Option<Mutex<Continuer>>,
    left: u32,
}

impl Continuation {
    /// The continuation of the stream answering the request `head` + `body`, in `format`: at
    /// most `left` continuation requests sent through `continuer` (none, or 0: the stream only
    /// ends with the in-band error event when it cannot be completed).
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
            continuer: continuer.map(Mutex::new),
            left,
        }
    }

    /// The request that asks for the rest of what `transcript` read, if one may be sent.
    fn next(&mut self, transcript: &Transcript) -> Option<Resumed> {
        if self.left == 0 || self.continuer.is_none() || transcript.continuable().is_err() {
            return None;
        }
        let body = continuation_body(transcript, &self.body).ok()?;
        self.left -= 1;
        let mut head = self.head.clone();
        // Another request: its own key (the engine gives it one), its own length.
        head.headers
            .remove(HeaderName::from_static("idempotency-key"));
        head.headers.remove(CONTENT_LENGTH);
        head.extensions.insert(ContinuationRequest);
        let request = http::Request::from_parts(head, body);
        let continuer = lock(self.continuer.as_mut()?);
        Some(continuer(request))
    }
}

impl std::fmt::Debug for Continuation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Continuation")
            .field("format", &self.format)
            .field("left", &self.left)
            .finish()
    }
}

/// A continuing stream's state: the continuation, the first interruption (what the caller is
/// told if the answer cannot be completed), and where the splice stands.
pub(crate) struct Continued {
    continuation: Continuation,
    transcript: Transcript,
    cause: Option<InterruptCause>,
    stage: Stage,
}

/// Where a continued stream stands. Behind mutexes only so that the stream stays `Sync`; they
/// are reached with `get_mut`, never locked.
enum Stage {
    /// Handing on the original stream.
    Original,
    /// Waiting for a continuation's answer.
    Waiting(Mutex<Resumed>),
    /// Reading a continuation, its events rewritten by the splice.
    Reading(Box<Reading>),
    /// Ending: these bytes (an in-band error event, a terminal event), then the error, if any.
    Ending(Option<Bytes>, Option<BoxError>),
    /// The in-band error event was handed on: one poll's pause for it to be written, then the
    /// error.
    Flushing(Option<BoxError>),
    Done,
}

struct Reading {
    body: Mutex<ResumedBody>,
    parser: Parser,
    frames: Vec<crate::sse::Frame>,
    splice: Splice,
}

fn lock<T>(mutex: &mut Mutex<T>) -> &mut T {
    mutex
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Continued {
    pub(crate) fn new(continuation: Continuation, opening: &[u8]) -> Self {
        let mut transcript = Transcript::new(continuation.format);
        // What the opening delivered: every whole event of it.
        let mut parser = Parser::new();
        let mut frames = Vec::new();
        if parser.feed(opening, &mut frames).is_ok() {
            for frame in &frames {
                if let FrameKind::Event(event) = &frame.kind {
                    transcript.read(event);
                }
            }
        }
        Self {
            continuation,
            transcript,
            cause: None,
            stage: Stage::Original,
        }
    }

    /// The transcript of what the caller was handed, fed by the original stream's reader.
    pub(crate) fn transcript(&mut self) -> &mut Transcript {
        &mut self.transcript
    }

    /// Whether the original stream is still the one handed on.
    pub(crate) fn original(&self) -> bool {
        matches!(self.stage, Stage::Original)
    }

    /// The stream was interrupted by `cause` (or ended, `None`, without its terminal event):
    /// continued if it can be, finished with its terminal event if the answer was complete,
    /// else ended with the in-band error and the first interruption.
    pub(crate) fn interrupted(&mut self, cause: InterruptCause, bytes: u64) {
        if self.transcript.finished() || self.transcript.terminal_seen() {
            let end = (!self.transcript.terminal_seen()).then(|| terminal_event(self.format()));
            self.stage = Stage::Ending(end, None);
            return;
        }
        let cause = self.cause.take().unwrap_or(cause);
        match self.continuation.next(&self.transcript) {
            Some(resumed) => {
                self.cause = Some(cause);
                self.stage = Stage::Waiting(Mutex::new(resumed));
            }
            None => {
                let events = self.transcript.content_events();
                let event = error_event(self.format(), cause.as_str(), events, bytes);
                let error = StreamInterrupted::new(events, bytes, cause);
                self.stage = Stage::Ending(Some(event), Some(Box::new(error)));
            }
        }
    }

    fn format(&self) -> Format {
        self.continuation.format
    }

    /// Hands on what comes after the original stream stopped.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &mut u64,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match &mut self.stage {
                Stage::Original | Stage::Done => return Poll::Ready(None),
                Stage::Waiting(resumed) => match ready!(lock(resumed).as_mut().poll(cx)) {
                    Some(body) => {
                        self.stage = Stage::Reading(Box::new(Reading {
                            body: Mutex::new(body),
                            parser: Parser::new(),
                            frames: Vec::new(),
                            splice: Splice::new(&self.transcript),
                        }));
                    }
                    None => {
                        // The engine retried it already: no other is asked for.
                        self.continuation.left = 0;
                        self.failed(*bytes);
                    }
                },
                Stage::Reading(reading) => {
                    let frame = ready!(lock(&mut reading.body).as_mut().poll_frame(cx));
                    if let Some(data) = self.read(frame, *bytes) {
                        *bytes += data.len() as u64;
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Stage::Ending(event, error) => {
                    if let Some(event) = event.take() {
                        *bytes += event.len() as u64;
                        // Once, before the error: a server relaying the stream (hyper's) drops
                        // what it has not written when its body fails, and it writes what it
                        // holds while the body is pending, so the event reaches the caller.
                        if error.is_some() {
                            self.stage = Stage::Flushing(error.take());
                        }
                        return Poll::Ready(Some(Ok(Frame::data(event))));
                    }
                    let error = error.take();
                    self.stage = Stage::Done;
                    return Poll::Ready(error.map(Err));
                }
                Stage::Flushing(error) => {
                    self.stage = Stage::Ending(None, error.take());
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
    }

    /// A continuation could not be had: another, or the end.
    fn failed(&mut self, bytes: u64) {
        let cause = self.cause.take().unwrap_or(InterruptCause::Unfinished);
        self.interrupted(cause, bytes)
    }

    /// One frame of the continuation: the spliced bytes to hand on, if any.
    fn read(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>, bytes: u64) -> Option<Bytes> {
        let Stage::Reading(reading) = &mut self.stage else {
            return None;
        };
        let data = match frame {
            Some(Ok(frame)) => frame.into_data().ok()?,
            // Cut or ended: what was spliced so far stays; the rest is asked for again.
            Some(Err(_)) | None => {
                if reading.splice.terminal_seen() {
                    self.stage = Stage::Done;
                } else {
                    self.failed(bytes);
                }
                return None;
            }
        };
        if reading.parser.feed(&data, &mut reading.frames).is_err() {
            self.failed(bytes);
            return None;
        }
        let mut out = BytesMut::new();
        for frame in reading.frames.drain(..) {
            let FrameKind::Event(event) = frame.kind else {
                continue;
            };
            if let Some(spliced) = reading.splice.event(&event) {
                self.transcript.read(&event);
                out.extend_from_slice(&spliced);
            }
        }
        if reading.splice.error().is_some() {
            self.failed(bytes + out.len() as u64);
        } else if reading.splice.terminal_seen() {
            self.stage = Stage::Done;
        }
        Some(out.freeze()).filter(|out| !out.is_empty())
    }
}

impl<RB: Body<Data = Bytes>> GuardedStream<RB> {
    /// Continues the stream with `continuation` when it is interrupted after content, or ends
    /// before its answer is complete; when it cannot be continued, it ends with its provider's
    /// in-band error event, then [`StreamInterrupted`]. Handed on in whole events from now on.
    #[must_use]
    pub fn with_continuation(mut self, continuation: Continuation) -> Self {
        self.whole_events();
        let opening = self.opening_bytes();
        self.continued = Some(Box::new(Continued::new(continuation, &opening)));
        self
    }
}
