//! The stream guard: [`open`] reads an event stream up to its first content event, and a
//! [`GuardedStream`] hands it on, ending with [`StreamInterrupted`] if it breaks after that. The
//! rules and the timeouts are in the [crate docs](crate).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{BoxError, Failure, Outcome, Reason};

use crate::continued::Continued;
use crate::sse::{self, EventKind, FrameKind, Parser};

/// The stream guard's settings: see the [crate docs](crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamPolicy {
    first_event: Option<Duration>,
    first_content: Option<Duration>,
    idle: Option<Duration>,
    progress: Option<Duration>,
    max_opening: usize,
}

impl StreamPolicy {
    /// Longest wait for a stream's first frame: 60 s.
    pub const DEFAULT_FIRST_EVENT: Duration = Duration::from_secs(60);
    /// Longest silence between two frames of any kind: 60 s.
    pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);
    /// Longest time between two content events, pings notwithstanding: 300 s.
    pub const DEFAULT_PROGRESS: Duration = Duration::from_secs(300);
    /// Most bytes held back before the first content event: 1 MiB. A stream that sends more
    /// before any content is handed on as it is (it is not an LLM's).
    pub const DEFAULT_MAX_OPENING: usize = 1 << 20;

    /// Wait at most `timeout` for the first frame (`None`: only the deadline bounds it).
    #[must_use]
    pub fn with_first_event(mut self, timeout: Option<Duration>) -> Self {
        self.first_event = timeout;
        self
    }

    /// Fail a stream whose first content event has not come `timeout` after it was opened
    /// (`None`: only the first-event timeout and the deadline bound the wait). Off by default;
    /// the retry engine sets it per attempt from the backend's learned clock.
    #[must_use]
    pub fn with_first_content(mut self, timeout: Option<Duration>) -> Self {
        self.first_content = timeout;
        self
    }

    /// End a stream silent for `timeout` (`None`: never).
    #[must_use]
    pub fn with_idle(mut self, timeout: Option<Duration>) -> Self {
        self.idle = timeout;
        self
    }

    /// End a stream without a content event for `timeout` (`None`: never).
    #[must_use]
    pub fn with_progress(mut self, timeout: Option<Duration>) -> Self {
        self.progress = timeout;
        self
    }

    /// Hold back at most `bytes` before the first content event.
    #[must_use]
    pub fn with_max_opening(mut self, bytes: usize) -> Self {
        self.max_opening = bytes;
        self
    }

    /// The first-event timeout.
    pub fn first_event(&self) -> Option<Duration> {
        self.first_event
    }

    /// The first-content timeout.
    pub fn first_content(&self) -> Option<Duration> {
        self.first_content
    }

    /// The idle timeout.
    pub fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// The progress timeout.
    pub fn progress(&self) -> Option<Duration> {
        self.progress
    }

    /// The most bytes held back before the first content event.
    pub fn max_opening(&self) -> usize {
        self.max_opening
    }
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self {
            first_event: Some(Self::DEFAULT_FIRST_EVENT),
            first_content: None,
            idle: Some(Self::DEFAULT_IDLE),
            progress: Some(Self::DEFAULT_PROGRESS),
            max_opening: Self::DEFAULT_MAX_OPENING,
        }
    }
}

/// Why a stream that had delivered content stopped early.
#[derive(Debug)]
#[non_exhaustive]
pub enum InterruptCause {
    /// The provider sent an error event; its outcome.
    ErrorEvent(Outcome),
    /// The connection failed (reset, cut): the body's error.
    Reset(BoxError),
    /// Nothing came for the idle timeout.
    Idle(Duration),
    /// No content came for the progress timeout (after content) or the first-content timeout
    /// (before it), whatever else did.
    NoProgress(Duration),
    /// The stream broke the event-stream format's limits (a line or an event too large).
    Malformed(sse::SseError),
    /// The stream ended without its terminal event, before its answer said it was complete
    /// (read for the formats a stream can be continued in, `continuation::Format`).
    Unfinished,
}

impl InterruptCause {
    /// A short snake_case name, for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::ErrorEvent(_) => "error_event",
            Self::Reset(_) => "reset",
            Self::Idle(_) => "idle",
            Self::NoProgress(_) => "no_progress",
            Self::Malformed(_) => "malformed",
            Self::Unfinished => "unfinished",
        }
    }

    /// What the interruption is in stormguard's vocabulary: the error event's outcome, or a
    /// failure the backend did not accept (a transport error, a timeout).
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::ErrorEvent(outcome) => *outcome,
            Self::Reset(_) | Self::Malformed(_) | Self::Unfinished => {
                Outcome::retryable(Reason::Transport).with_accepted(false)
            }
            Self::Idle(_) | Self::NoProgress(_) => {
                Outcome::retryable(Reason::Timeout).with_accepted(false)
            }
        }
    }
}

/// A stream that stopped after it had delivered content: never restarted (the caller has seen
/// part of the answer), it ends with this error, which says how much was delivered and why.
///
/// Its source chain holds a [`Failure`] with the interruption's outcome
/// ([`outcome_of`](stormguard_classify::outcome_of) reads it).
pub struct StreamInterrupted {
    events: u64,
    bytes: u64,
    cause: InterruptCause,
    failure: Failure,
}

impl StreamInterrupted {
    pub(crate) fn new(events: u64, bytes: u64, cause: InterruptCause) -> Self {
        let failure = Failure::new(cause.outcome());
        Self {
            events,
            bytes,
            cause,
            failure,
        }
    }

    /// Content events delivered before the interruption.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes of the stream delivered before the interruption.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Why it stopped.
    pub fn cause(&self) -> &InterruptCause {
        &self.cause
    }
}

impl fmt::Debug for StreamInterrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamInterrupted")
            .field("events", &self.events)
            .field("bytes", &self.bytes)
            .field("cause", &self.cause)
            .finish()
    }
}

impl fmt::Display for StreamInterrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream interrupted after {} content events ({} bytes): ",
            self.events, self.bytes
        )?;
        match &self.cause {
            InterruptCause::ErrorEvent(outcome) => write!(f, "error event ({outcome})"),
            InterruptCause::Reset(error) => write!(f, "connection failed ({error})"),
            InterruptCause::Idle(after) => write!(f, "nothing for {after:?}"),
            InterruptCause::NoProgress(after) => write!(f, "no content for {after:?}"),
            InterruptCause::Malformed(error) => write!(f, "malformed stream ({error})"),
            InterruptCause::Unfinished => f.write_str("ended before its answer was complete"),
        }
    }
}

impl StdError for StreamInterrupted {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.failure)
    }
}

/// What a stream delivered before it was interrupted, for a [`Resume`] hook.
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

    /// Bytes of the stream delivered (whole events only, when a resume hook is set).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The `data` of each content event delivered, in order (an OpenAI chunk's JSON, an
    /// Anthropic `content_block_delta`'s JSON): what the caller has seen of the answer.
    pub fn content(&self) -> &[String] {
        &self.content
    }
}

/// The body of a continuation, as a [`Resume`] hook's future yields it.
pub type ResumedBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send + 'static>>;

/// The future a [`Resume`] hook returns: the continuation's body, or `None` (it failed: the
/// stream ends with [`StreamInterrupted`]).
pub type Resumed = Pin<Box<dyn Future<Output = Option<ResumedBody>> + Send + 'static>>;

type ResumeFn = dyn Fn(&Received, &http::request::Parts, &Bytes) -> Option<Resumed> + Send + Sync;

/// An opt-in hook that continues an interrupted stream instead of ending it: given what was
/// received, the original request's head (with its deadline) and body, it may send a
/// continuation request (for example the partial answer as an assistant prefix) through a client
/// that shares the same retry budget, and return the future of its answer's body. The stream
/// then goes on with that body's bytes after the last whole event delivered; if the hook
/// declines (`None`), or the continuation fails, the stream ends with [`StreamInterrupted`].
///
/// The head is the original request's: it carries the deadline, and its `Idempotency-Key`,
/// which a continuation (another request) should not reuse: remove it (and `content-length`)
/// before sending. `tests/tests/streams.rs` has a hook that adds the partial answer as an
/// assistant prefix to an OpenAI chat request.
///
/// While a hook is set, a stream is handed on in whole events (a partial event is held back
/// until its end arrives), so that the continuation never joins half an event. The content kept
/// for the hook is bounded (1 MiB); beyond it, the stream is not resumed.
#[derive(Clone)]
pub struct Resume {
    hook: std::sync::Arc<ResumeFn>,
}

impl Resume {
    /// A resume hook.
    pub fn new<F>(hook: F) -> Self
    where
        F: Fn(&Received, &http::request::Parts, &Bytes) -> Option<Resumed> + Send + Sync + 'static,
    {
        Self {
            hook: std::sync::Arc::new(hook),
        }
    }
}

impl fmt::Debug for Resume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resume")
    }
}

/// A resume hook with the request it would continue.
struct Resumable {
    resume: Resume,
    head: http::request::Parts,
    body: Bytes,
}

/// Where a resumed stream stands: waiting for the continuation, or reading it. Behind a mutex
/// only so that the stream stays `Sync`; it is reached with `get_mut`, never locked.
enum Spliced {
    Waiting {
        resumed: std::sync::Mutex<Resumed>,
        cause: Option<InterruptCause>,
    },
    Reading(std::sync::Mutex<ResumedBody>),
}

/// Called once with how a guarded stream ended.
type AtEnd = Box<dyn FnOnce(&StreamEnd) + Send + Sync>;

/// How a guarded stream ended, for [`GuardedStream::with_at_end`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamEnd {
    outcome: Outcome,
    events: u64,
    longest_gap: Option<Duration>,
    usage: Option<TokenCounts>,
}

impl StreamEnd {
    /// Success when it ended cleanly, else the interruption's outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Content events it delivered.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The longest wait between two of its content events (`None`: fewer than two), what a
    /// backend's gap clock learns from.
    pub fn longest_gap(&self) -> Option<Duration> {
        self.longest_gap
    }

    /// The tokens the stream said it used (its usage events: OpenAI's last chunk with
    /// `stream_options.include_usage`, Anthropic's `message_start` and `message_delta`), when it
    /// was opened [`counting_usage`](OpenStream::counting_usage) and said any.
    pub fn usage(&self) -> Option<TokenCounts> {
        self.usage
    }
}

/// Reads `body`, an event stream, up to its first content event: see the [crate docs](crate).
pub fn open<RB: Body<Data = Bytes>>(body: RB, policy: StreamPolicy) -> OpenStream<RB> {
    let now = Instant::now();
    OpenStream {
        guard: Some(Guard::new(Box::pin(body), policy, now)),
        read: BytesMut::new(),
    }
}

/// What reading a stream up to its first content event found.
pub enum Opening<RB: Body> {
    /// Content came (or the stream ended, or it held back the most it may): the stream, whole
    /// from its first byte.
    Open(Box<GuardedStream<RB>>),
    /// Something else came first: an error event (its outcome), a failure or silence (a
    /// transport failure or a timeout, not accepted). `read` holds the bytes read, `rest` what
    /// was not, for a caller who gets this answer as it is.
    Failed {
        /// How the stream failed.
        outcome: Outcome,
        /// The bytes read before it failed.
        read: Bytes,
        /// The unread rest of the stream.
        rest: Pin<Box<RB>>,
    },
}

impl<RB: Body> fmt::Debug for Opening<RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(stream) => f.debug_tuple("Open").field(stream).finish(),
            Self::Failed { outcome, read, .. } => f
                .debug_struct("Failed")
                .field("outcome", outcome)
                .field("read", &read.len())
                .finish(),
        }
    }
}

/// The future of [`open`].
pub struct OpenStream<RB: Body> {
    guard: Option<Guard<RB>>,
    read: BytesMut,
}

impl<RB: Body> OpenStream<RB> {
    /// Reads the usage the stream's events report, for [`StreamEnd::usage`].
    #[must_use]
    pub fn counting_usage(mut self) -> Self {
        if let Some(guard) = self.guard.as_mut() {
            guard.count_usage = true;
        }
        self
    }

    /// Keeps the data of the content events, for a [`Resume`] hook
    /// ([`GuardedStream::with_resume`]).
    #[must_use]
    pub fn keeping_content(mut self) -> Self {
        if let Some(guard) = self.guard.as_mut() {
            guard.keep = true;
        }
        self
    }
}

impl<RB: Body> Unpin for OpenStream<RB> {}

impl<RB: Body<Data = Bytes>> Future for OpenStream<RB>
where
    RB::Error: Into<BoxError>,
{
    type Output = Opening<RB>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(guard) = this.guard.as_mut() else {
            panic!("stormguard's OpenStream polled after it completed");
        };
        loop {
            let failed = match guard.poll_chunk(cx) {
                Poll::Pending => match guard.poll_timers(cx) {
                    Some(cause) => Some(cause.outcome()),
                    None => return Poll::Pending,
                },
                Poll::Ready(Chunk::Data(data)) => {
                    this.read.extend_from_slice(&data);
                    match guard.scan(this.read.len() as u64 - data.len() as u64) {
                        Scan::Nothing if this.read.len() <= guard.policy.max_opening => continue,
                        Scan::Error { outcome, .. } if guard.events == 0 => Some(outcome),
                        // Content, an error after it, or the most held back: open.
                        scan => {
                            let mut guard = this.guard.take().expect("checked above");
                            let mut read = std::mem::take(&mut this.read).freeze();
                            if let Scan::Error { outcome, at } = scan {
                                read.truncate(usize::try_from(at).unwrap_or(usize::MAX));
                                guard.interrupt(InterruptCause::ErrorEvent(outcome));
                            }
                            return Poll::Ready(Opening::Open(Box::new(GuardedStream::new(
                                guard, read,
                            ))));
                        }
                    }
                }
                Poll::Ready(Chunk::Trailers(_) | Chunk::End) => {
                    let guard = this.guard.take().expect("checked above");
                    let read = std::mem::take(&mut this.read).freeze();
                    return Poll::Ready(Opening::Open(Box::new(GuardedStream::new(guard, read))));
                }
                Poll::Ready(Chunk::Failed(_)) => {
                    Some(Outcome::retryable(Reason::Transport).with_accepted(false))
                }
                Poll::Ready(Chunk::Malformed(_)) => {
                    Some(Outcome::retryable(Reason::Transport).with_accepted(false))
                }
            };
            if let Some(outcome) = failed {
                let guard = this.guard.take().expect("checked above");
                let read = std::mem::take(&mut this.read).freeze();
                return Poll::Ready(Opening::Failed {
                    outcome,
                    read,
                    rest: guard.body,
                });
            }
        }
    }
}

/// What the guard got from the body.
enum Chunk<E> {
    Data(Bytes),
    Trailers(http::HeaderMap),
    End,
    Failed(E),
    Malformed(sse::SseError),
}

/// What a chunk held, in stream order.
enum Scan {
    /// No content, no error: life (or nothing complete yet).
    Nothing,
    /// At least one content event, and no error.
    Content,
    /// An error event, starting at byte `at` of the stream.
    Error { outcome: Outcome, at: u64 },
}

/// The reading side shared by the opening and the guarded stream: the body, the parser, the
/// counts and the timers.
struct Guard<RB: Body> {
    body: Pin<Box<RB>>,
    parser: Parser,
    /// The frames the last chunk completed, read by `scan`.
    frames: Vec<sse::Frame>,
    policy: StreamPolicy,
    /// Content events seen.
    events: u64,
    /// When the alive timer and the progress timer run out (the first-event timeout counts as
    /// the alive timer until the first frame, the first-content timeout as the progress timer
    /// until the first content event).
    alive: Option<Instant>,
    progress: Option<Instant>,
    /// When the last content event came, and the longest wait between two.
    last_content: Option<Instant>,
    longest_gap: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// An interruption found ahead of what was delivered, handed out after it.
    interrupted: Option<InterruptCause>,
    done: bool,
    /// Where the stream can be cut after the last complete frame, in bytes of the stream: its
    /// end, or for a comment inside an event, that event's start ([`Frame::boundary`](sse::Frame::boundary)).
    last_end: u64,
    /// Whether the data of content events is kept (for a resume hook), and what was kept.
    keep: bool,
    kept: Kept,
    /// Whether the usage events are read, and the most they reported.
    count_usage: bool,
    usage: Option<TokenCounts>,
    /// Whether a terminal event came (`[DONE]`, `message_stop`: any format's).
    terminal: bool,
}

/// The data of the content events seen, kept for a resume hook, up to [`MAX_KEPT`] bytes.
#[derive(Default)]
struct Kept {
    content: Vec<String>,
    size: usize,
    overflowed: bool,
}

/// Most bytes of content kept for a resume hook: 1 MiB (a long answer's text is far less).
const MAX_KEPT: usize = 1 << 20;

impl<RB: Body<Data = Bytes>> Guard<RB> {
    fn new(body: Pin<Box<RB>>, policy: StreamPolicy, now: Instant) -> Self {
        Self {
            body,
            parser: Parser::new(),
            frames: Vec::new(),
            alive: policy.first_event.map(|timeout| now + timeout),
            progress: policy.first_content.map(|timeout| now + timeout),
            last_content: None,
            longest_gap: None,
            policy,
            events: 0,
            sleep: None,
            interrupted: None,
            done: false,
            last_end: 0,
            keep: false,
            kept: Kept::default(),
            count_usage: false,
            usage: None,
            terminal: false,
        }
    }

    /// Reads what a usage event reports, if counting.
    fn count(&mut self, event: &sse::Event) {
        if !self.count_usage || !event.data.contains("usage") {
            return;
        }
        if let Some(counts) = TokenCounts::of_json(event.data.as_bytes()) {
            self.usage = Some(self.usage.map_or(counts, |usage| usage.max(counts)));
        }
    }

    fn interrupt(&mut self, cause: InterruptCause) {
        self.interrupted.get_or_insert(cause);
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Chunk<RB::Error>> {
        loop {
            return Poll::Ready(match ready!(self.body.as_mut().poll_frame(cx)) {
                None => Chunk::End,
                Some(Err(error)) => Chunk::Failed(error),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => match self.parser.feed(&data, &mut self.frames) {
                        Ok(()) => Chunk::Data(data),
                        Err(error) => Chunk::Malformed(error),
                    },
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => Chunk::Trailers(trailers),
                        Err(_) => continue,
                    },
                },
            });
        }
    }

    /// Reads the frames the last chunk completed (it started at byte `start` of the stream),
    /// moving the timers.
    fn scan(&mut self, start: u64) -> Scan {
        let now = Instant::now();
        let mut scan = Scan::Nothing;
        let mut boundary = start;
        // Taken out while they are read (and put back, with their room, after).
        let mut frames = std::mem::take(&mut self.frames);
        for frame in frames.drain(..) {
            self.alive = self.policy.idle.map(|timeout| now + timeout);
            let kind = match frame.kind {
                FrameKind::Comment => EventKind::Control,
                FrameKind::Event(ref event) => {
                    self.count(event);
                    sse::classify_event(event)
                }
            };
            match kind {
                EventKind::Content => {
                    self.events += 1;
                    self.progress = self.policy.progress.map(|timeout| now + timeout);
                    if let Some(last) = self.last_content.replace(now) {
                        let gap = now.saturating_duration_since(last);
                        self.longest_gap = Some(self.longest_gap.map_or(gap, |at| at.max(gap)));
                    }
                    scan = Scan::Content;
                    if let (true, FrameKind::Event(event)) = (self.keep, &frame.kind) {
                        let kept = &mut self.kept;
                        if kept.size + event.data.len() <= MAX_KEPT {
                            kept.size += event.data.len();
                            kept.content.push(event.data.clone());
                        } else {
                            kept.overflowed = true;
                        }
                    }
                }
                // What follows an error is not read: the stream ends there.
                EventKind::Error(outcome) => {
                    scan = Scan::Error {
                        outcome,
                        at: boundary,
                    };
                    break;
                }
                EventKind::Done => self.terminal = true,
                EventKind::Control => {}
            }
            // A comment inside an event ends a frame but not the event: the stream is cut at
            // the event's start, never between its lines.
            boundary = frame.boundary;
            self.last_end = frame.boundary;
        }
        self.frames = frames;
        scan
    }

    /// The timeout that ran out, if one did; else the timer is armed for the next.
    fn poll_timers(&mut self, cx: &mut Context<'_>) -> Option<InterruptCause> {
        let now = Instant::now();
        if self.alive.is_some_and(|at| now >= at) {
            let after = if self.parser.consumed() == 0 {
                self.policy.first_event
            } else {
                self.policy.idle
            };
            return Some(InterruptCause::Idle(after.unwrap_or_default()));
        }
        if self.progress.is_some_and(|at| now >= at) {
            let after = match self.events {
                0 => self.policy.first_content,
                _ => self.policy.progress,
            };
            return Some(InterruptCause::NoProgress(after.unwrap_or_default()));
        }
        let next = match (self.alive, self.progress) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return None,
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
        if sleep.deadline() != next {
            sleep.as_mut().reset(next);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => self.poll_timers(cx),
            Poll::Pending => None,
        }
    }
}

/// An event stream after its first content event, handed on whole from its first byte: yields
/// what was read to open it, then the rest, counting content events and bytes, and ends with
/// [`StreamInterrupted`] if it breaks (an error event, a failure, a timeout).
pub struct GuardedStream<RB: Body> {
    guard: Guard<RB>,
    /// What was read to open it, not yet handed on.
    opening: Option<Bytes>,
    /// Bytes handed on.
    bytes: u64,
    at_end: Option<AtEnd>,
    /// With a resume hook: the hook, and the bytes after the last whole event, held back.
    resumable: Option<Box<Resumable>>,
    held: BytesMut,
    spliced: Option<Spliced>,
    /// Handed on in whole events only (a resume hook or a continuation is set).
    whole: bool,
    /// With a continuation: its state.
    pub(crate) continued: Option<Box<Continued>>,
}

impl<RB: Body<Data = Bytes>> GuardedStream<RB> {
    fn new(guard: Guard<RB>, opening: Bytes) -> Self {
        Self {
            guard,
            opening: Some(opening).filter(|bytes| !bytes.is_empty()),
            bytes: 0,
            at_end: None,
            resumable: None,
            held: BytesMut::new(),
            spliced: None,
            whole: false,
            continued: None,
        }
    }

    /// From now on, whole events only: what follows the last one waits for its end.
    pub(crate) fn whole_events(&mut self) {
        self.whole = true;
        if let Some(mut opening) = self.opening.take() {
            let whole = usize::try_from(self.guard.last_end)
                .unwrap_or(usize::MAX)
                .min(opening.len());
            self.held.extend_from_slice(&opening.split_off(whole));
            self.opening = Some(opening).filter(|bytes| !bytes.is_empty());
        }
    }

    /// What was read to open the stream and is handed on first (whole events, once
    /// [`whole_events`](Self::whole_events) was called).
    pub(crate) fn opening_bytes(&self) -> Bytes {
        self.opening.clone().unwrap_or_default()
    }

    /// Continues the stream with `resume` if it is interrupted, as a continuation of the request
    /// with head `head` and body `body` (see [`Resume`]). Meant for a stream opened
    /// [`keeping_content`](OpenStream::keeping_content).
    #[must_use]
    pub fn with_resume(mut self, resume: Resume, head: http::request::Parts, body: Bytes) -> Self {
        self.whole_events();
        self.resumable = Some(Box::new(Resumable { resume, head, body }));
        self
    }

    /// Calls `at_end` once, with how the stream ended: success when it ends cleanly, the
    /// interruption's outcome when it breaks; never when its reader drops it first (then
    /// `at_end` is dropped uncalled).
    #[must_use]
    pub fn with_at_end<F>(mut self, at_end: F) -> Self
    where
        F: FnOnce(&StreamEnd) + Send + Sync + 'static,
    {
        self.at_end = Some(Box::new(at_end));
        self
    }

    /// Content events seen so far.
    pub fn events(&self) -> u64 {
        self.guard.events
    }

    /// Bytes handed on so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn end(&mut self, outcome: &Outcome) {
        self.guard.done = true;
        self.report(outcome);
    }

    /// Tells `at_end`, once, how this stream ended.
    fn report(&mut self, outcome: &Outcome) {
        if let Some(at_end) = self.at_end.take() {
            at_end(&StreamEnd {
                outcome: *outcome,
                events: self.guard.events,
                longest_gap: self.guard.longest_gap,
                usage: self.guard.usage,
            });
        }
    }

    fn interrupted(&mut self, cause: InterruptCause) -> BoxError {
        self.end(&cause.outcome());
        Box::new(StreamInterrupted::new(self.guard.events, self.bytes, cause))
    }

    /// The stream broke: continued by the resume hook if there is one and it takes it (then
    /// `None`, the continuation is being waited for), else ended with [`StreamInterrupted`].
    fn stop(&mut self, cause: InterruptCause) -> Option<BoxError> {
        if self.continued.is_some() {
            // This attempt ended as it did, whatever the continuation does.
            self.report(&cause.outcome());
            self.held.clear();
            if let Some(continued) = self.continued.as_mut() {
                continued.interrupted(cause, self.bytes);
            }
            return None;
        }
        let resumed = self.resumable.take().and_then(|resumable| {
            if self.guard.kept.overflowed {
                return None;
            }
            let received = Received {
                events: self.guard.events,
                bytes: self.bytes,
                content: std::mem::take(&mut self.guard.kept.content),
            };
            (resumable.resume.hook)(&received, &resumable.head, &resumable.body)
        });
        let Some(resumed) = resumed else {
            return Some(self.interrupted(cause));
        };
        // This attempt ended as it did, whatever the continuation does.
        self.report(&cause.outcome());
        self.held.clear();
        self.spliced = Some(Spliced::Waiting {
            resumed: std::sync::Mutex::new(resumed),
            cause: Some(cause),
        });
        None
    }

    /// A continuation's transcript reads the events the last chunk completed, up to an error
    /// event (what follows one is never handed on).
    fn transcribe(&mut self) {
        let Some(continued) = self.continued.as_mut() else {
            return;
        };
        for frame in &self.guard.frames {
            let FrameKind::Event(event) = &frame.kind else {
                continue;
            };
            if matches!(sse::classify_event(event), EventKind::Error(_)) {
                break;
            }
            continued.transcript().read(event);
        }
    }

    /// The original stream ended: whether a continuation takes it from here, because it ended
    /// without its terminal event (its answer incomplete, or complete and the terminal event
    /// lost).
    fn unfinished(&mut self) -> bool {
        let Some(continued) = self.continued.as_mut() else {
            return false;
        };
        // A terminal event of any format ends it: a stream whose request's path named another
        // format is not taken for a cut one.
        if !continued.original() || continued.transcript().terminal_seen() || self.guard.terminal {
            return false;
        }
        let outcome = match continued.transcript().finished() {
            true => Outcome::success(),
            false => InterruptCause::Unfinished.outcome(),
        };
        continued.interrupted(InterruptCause::Unfinished, self.bytes);
        self.report(&outcome);
        self.held.clear();
        true
    }

    /// Hands on the continuation of a resumed stream.
    fn poll_spliced(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match self.spliced.as_mut() {
                None => return Poll::Ready(None),
                Some(Spliced::Waiting { resumed, cause }) => {
                    let resumed = resumed
                        .get_mut()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match ready!(resumed.as_mut().poll(cx)) {
                        Some(body) => {
                            self.spliced = Some(Spliced::Reading(std::sync::Mutex::new(body)));
                        }
                        None => {
                            let cause =
                                cause.take().unwrap_or(InterruptCause::Idle(Duration::ZERO));
                            self.spliced = None;
                            self.guard.done = true;
                            let error =
                                StreamInterrupted::new(self.guard.events, self.bytes, cause);
                            return Poll::Ready(Some(Err(Box::new(error))));
                        }
                    }
                }
                Some(Spliced::Reading(body)) => {
                    let body = body
                        .get_mut()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let frame = ready!(body.as_mut().poll_frame(cx));
                    if let Some(Ok(frame)) = &frame
                        && let Some(data) = frame.data_ref()
                    {
                        self.bytes += data.len() as u64;
                    }
                    if frame.is_none() {
                        self.spliced = None;
                        self.guard.done = true;
                    }
                    return Poll::Ready(frame);
                }
            }
        }
    }

    /// Hands on `data` (the chunk that began at byte `start` of the stream), up to `upto`: all of
    /// it, or, with a resume hook, up to the last whole event (the rest is held back).
    fn deliver(&mut self, data: Bytes, start: u64, upto: Option<u64>) -> Option<Bytes> {
        let upto = match (self.whole, upto) {
            (_, Some(at)) => at,
            (true, None) => self.guard.last_end,
            (false, None) => start + data.len() as u64,
        };
        let data = if self.whole || !self.held.is_empty() {
            self.held.extend_from_slice(&data);
            let ready = usize::try_from(upto.saturating_sub(self.bytes))
                .unwrap_or(usize::MAX)
                .min(self.held.len());
            self.held.split_to(ready).freeze()
        } else {
            let mut data = data;
            data.truncate(usize::try_from(upto.saturating_sub(start)).unwrap_or(usize::MAX));
            data
        };
        self.bytes += data.len() as u64;
        Some(data).filter(|data| !data.is_empty())
    }
}

impl<RB: Body<Data = Bytes>> Body for GuardedStream<RB>
where
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.spliced.is_some() {
                return this.poll_spliced(cx);
            }
            if let Some(continued) = this.continued.as_mut()
                && !continued.original()
            {
                let polled = continued.poll(cx, &mut this.bytes);
                if let Poll::Ready(None) = polled {
                    this.guard.done = true;
                }
                return polled;
            }
            if this.guard.done {
                return Poll::Ready(None);
            }
            if let Some(opening) = this.opening.take() {
                this.bytes += opening.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(opening))));
            }
            let cause = match this.guard.interrupted.take() {
                Some(cause) => cause,
                None => match this.guard.poll_chunk(cx) {
                    Poll::Pending => match this.guard.poll_timers(cx) {
                        Some(cause) => cause,
                        None => return Poll::Pending,
                    },
                    Poll::Ready(Chunk::Data(data)) => {
                        let start = this.guard.parser.consumed() - data.len() as u64;
                        this.transcribe();
                        let upto = match this.guard.scan(start) {
                            Scan::Error { outcome, at } => {
                                this.guard.interrupt(InterruptCause::ErrorEvent(outcome));
                                Some(at)
                            }
                            _ => None,
                        };
                        match this.deliver(data, start, upto) {
                            Some(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                            None => continue,
                        }
                    }
                    Poll::Ready(Chunk::Trailers(trailers)) => {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Poll::Ready(Chunk::End) if this.unfinished() => continue,
                    Poll::Ready(Chunk::End) => {
                        this.end(&Outcome::success());
                        // A last event without its blank line, held back: it ends the stream.
                        if !this.held.is_empty() {
                            let rest = this.held.split().freeze();
                            this.bytes += rest.len() as u64;
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
                        }
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Chunk::Failed(error)) => InterruptCause::Reset(error.into()),
                    Poll::Ready(Chunk::Malformed(error)) => InterruptCause::Malformed(error),
                },
            };
            if let Some(error) = this.stop(cause) {
                return Poll::Ready(Some(Err(error)));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.done
            && self
                .continued
                .as_ref()
                .is_none_or(|continued| continued.original())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<RB: Body> fmt::Debug for GuardedStream<RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedStream")
            .field("events", &self.guard.events)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for StreamInterrupted {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}
