//! The stream guard: [`open`] reads an event stream up to its first content event, and a
//! [`GuardedStream`] hands it on, ending with [`StreamInterrupted`] if it breaks after that, or
//! going on as its [`Resume`] hook says. The rules and the timeouts are in the
//! [crate docs](crate).

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use stormguard_classify::polled_after_completion;
use stormguard_classify::usage::{TokenCounts, model_named};
use stormguard_classify::{BoxError, Outcome, Reason};

use crate::interrupted::{InterruptCause, StreamInterrupted};
use crate::resume::{AnswerBody, AnswerFuture, Resume, Resumption};
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

/// Called once with how a guarded stream ended.
type AtEnd = Box<dyn FnOnce(&StreamEnd) + Send + Sync>;

/// Told the wait between two content events of a stream, as each comes (see
/// [`OpenStream::timing_gaps`]).
pub type GapTimer = Box<dyn FnMut(Duration) + Send + Sync>;

/// How a guarded stream ended, for [`GuardedStream::with_at_end`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEnd {
    outcome: Outcome,
    events: u64,
    longest_gap: Option<Duration>,
    usage: Option<TokenCounts>,
    model: Option<Box<str>>,
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

    /// The model its first usage event named (see [`model_named`]), when it was opened
    /// [`counting_usage`](OpenStream::counting_usage).
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
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

    /// Tells `gaps` the wait between each content event and the one before it, as it comes
    /// (the stream's own events, not a continuation's): what a time-per-output-chunk metric
    /// records.
    #[must_use]
    pub fn timing_gaps(mut self, gaps: GapTimer) -> Self {
        if let Some(guard) = self.guard.as_mut() {
            guard.gaps = Some(gaps);
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
            polled_after_completion("OpenStream");
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
    /// The frames the last chunk completed, read by `scan` (and shown to a resume hook).
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
    /// Told each gap, if anyone is.
    gaps: Option<GapTimer>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// An interruption found ahead of what was delivered, handed out after it.
    interrupted: Option<InterruptCause>,
    /// Where the stream can be cut after the last complete frame, in bytes of the stream: its
    /// end, or for a comment inside an event, that event's start ([`Frame::boundary`](sse::Frame::boundary)).
    last_end: u64,
    /// Whether the usage events are read, the most they reported, and the model the first
    /// named.
    count_usage: bool,
    usage: Option<TokenCounts>,
    model: Option<Box<str>>,
    /// Whether a terminal event came (`[DONE]`, `message_stop`: any format's).
    terminal: bool,
}

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
            gaps: None,
            policy,
            events: 0,
            sleep: None,
            interrupted: None,
            last_end: 0,
            count_usage: false,
            usage: None,
            model: None,
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
        if self.model.is_none() {
            self.model = model_named(event.data.as_bytes()).map(Box::from);
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
                    Ok(data) => match self.feed(&data) {
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

    /// Parses a chunk: the frames it completed replace the last chunk's.
    fn feed(&mut self, data: &[u8]) -> Result<(), sse::SseError> {
        self.frames.clear();
        self.parser.feed(data, &mut self.frames)
    }

    /// Reads the frames the last chunk completed (it started at byte `start` of the stream),
    /// moving the timers.
    fn scan(&mut self, start: u64) -> Scan {
        let now = Instant::now();
        let mut scan = Scan::Nothing;
        let mut boundary = start;
        // Taken out while they are read (and put back after, for the resume hook).
        let frames = std::mem::take(&mut self.frames);
        for frame in &frames {
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
                        if let Some(gaps) = self.gaps.as_mut() {
                            gaps(gap);
                        }
                    }
                    scan = Scan::Content;
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
/// [`StreamInterrupted`] if it breaks (an error event, a failure, a timeout), unless its
/// [`Resume`] hook completes it.
pub struct GuardedStream<RB: Body> {
    guard: Guard<RB>,
    /// What was read to open it, not yet handed on.
    opening: Option<Bytes>,
    /// Bytes handed on.
    bytes: u64,
    at_end: Option<AtEnd>,
    /// Its resume hook, if it has one. Behind a mutex only so that the stream stays `Sync`: it
    /// is reached with `get_mut`, never locked.
    resume: Option<Mutex<Box<dyn Resume>>>,
    /// With a resume hook: the bytes after the last whole event, held back.
    held: BytesMut,
    stage: Stage,
}

/// Where a guarded stream stands: handing on its own stream, then, once that stopped, waiting
/// for a continuation's answer and reading it (as often as its resume hook sends one), then
/// ending. The futures and bodies are behind mutexes only so that the stream stays `Sync`; they
/// are reached with `get_mut`, never locked.
enum Stage {
    /// Handing on the stream's own events.
    Original,
    /// Waiting for a continuation's answer; `cause`: the first interruption.
    Waiting {
        answer: Mutex<AnswerFuture>,
        cause: InterruptCause,
    },
    /// Reading a continuation's answer.
    Reading(Box<Reading>),
    /// Ending: these bytes (a last event without its blank line, a terminal event, an in-band
    /// error event), then the error, if any.
    Ending(Option<Bytes>, Option<BoxError>),
    /// The in-band error event was handed on: one poll's pause for it to be written, then the
    /// error.
    Flushing(Option<BoxError>),
    Done,
}

/// A continuation's answer being read: its frames, and where the held bytes start in it.
struct Reading {
    body: Mutex<AnswerBody>,
    parser: Parser,
    frames: Vec<sse::Frame>,
    at: u64,
    /// The first interruption.
    cause: InterruptCause,
}

/// Where a continuation's answer stands after a chunk of it.
enum Read {
    /// More is to come.
    More,
    /// Its terminal event was handed on: the last of it.
    Last,
    /// It stopped for this cause: its error event, or a chunk the parser refused.
    Stopped(InterruptCause),
}

/// The stage that hands on `bytes`, if there are any, and ends the stream cleanly.
fn ending(bytes: Option<Bytes>) -> Stage {
    match bytes.filter(|bytes| !bytes.is_empty()) {
        Some(bytes) => Stage::Ending(Some(bytes), None),
        None => Stage::Done,
    }
}

fn lock<T>(mutex: &mut Mutex<T>) -> &mut T {
    mutex
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<RB: Body<Data = Bytes>> GuardedStream<RB> {
    fn new(guard: Guard<RB>, opening: Bytes) -> Self {
        Self {
            guard,
            opening: Some(opening).filter(|bytes| !bytes.is_empty()),
            bytes: 0,
            at_end: None,
            resume: None,
            held: BytesMut::new(),
            stage: Stage::Original,
        }
    }

    /// Goes on as `resume` says when the stream stops before its answer is complete: when it is
    /// interrupted after content, or ends without a terminal event (see [`Resume`]). Handed on in
    /// whole events from now on (a partial event is held back until its end arrives), so that a
    /// continuation never joins half an event.
    #[must_use]
    pub fn with_resume(mut self, mut resume: Box<dyn Resume>) -> Self {
        self.whole_events();
        // What the opening showed the caller: every whole event of it.
        if let Some(opening) = &self.opening {
            let mut frames = Vec::new();
            if Parser::new().feed(opening, &mut frames).is_ok() {
                for frame in &frames {
                    if let FrameKind::Event(event) = &frame.kind {
                        resume.shown(event);
                    }
                }
            }
        }
        self.resume = Some(Mutex::new(resume));
        self
    }

    /// From now on, whole events only: what follows the last one waits for its end.
    fn whole_events(&mut self) {
        if let Some(mut opening) = self.opening.take() {
            let whole = usize::try_from(self.guard.last_end)
                .unwrap_or(usize::MAX)
                .min(opening.len());
            self.held.extend_from_slice(&opening.split_off(whole));
            self.opening = Some(opening).filter(|bytes| !bytes.is_empty());
        }
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

    /// Tells `at_end`, once, how this stream ended.
    fn report(&mut self, outcome: &Outcome) {
        if let Some(at_end) = self.at_end.take() {
            at_end(&StreamEnd {
                outcome: *outcome,
                events: self.guard.events,
                longest_gap: self.guard.longest_gap,
                usage: self.guard.usage,
                model: self.guard.model.take(),
            });
        }
    }

    /// A chunk of the stream's own: its resume hook is shown its events, and it is handed on up
    /// to an error event (the interruption, handed out after it).
    fn read_own(&mut self, data: Bytes) -> Option<Bytes> {
        let start = self.guard.parser.consumed() - data.len() as u64;
        let upto = match self.guard.scan(start) {
            Scan::Error { outcome, at } => {
                self.guard.interrupt(InterruptCause::ErrorEvent(outcome));
                Some(at)
            }
            _ => None,
        };
        self.show(upto);
        self.deliver(data, start, upto)
    }

    /// The resume hook is shown the events the last chunk completed, up to `upto`, where an
    /// error event starts (what follows one is never handed on).
    fn show(&mut self, upto: Option<u64>) {
        let Some(resume) = self.resume.as_mut() else {
            return;
        };
        let resume = lock(resume);
        for frame in &self.guard.frames {
            if upto.is_some_and(|at| frame.boundary > at) {
                break;
            }
            if let FrameKind::Event(event) = &frame.kind {
                resume.shown(event);
            }
        }
    }

    /// The stream's own events ended cleanly: complete, unless its resume hook says otherwise
    /// (it ended without a terminal event).
    fn ended(&mut self) {
        // A terminal event of any format ends it: a stream whose request's path named another
        // format is not taken for an interrupted one.
        if self.resume.is_none() || self.guard.terminal {
            self.report(&Outcome::success());
            // A last event without its blank line, held back: it ends the stream.
            self.stage = ending(Some(self.held.split().freeze()));
            return;
        }
        let outcome = match self.go_on(InterruptCause::Unfinished, None) {
            true => Outcome::success(),
            false => InterruptCause::Unfinished.outcome(),
        };
        self.report(&outcome);
    }

    /// The stream broke: resumed if its hook can, else ended with [`StreamInterrupted`].
    fn stop(&mut self, cause: InterruptCause) {
        // This attempt ended as it did, whatever its resume hook does.
        self.report(&cause.outcome());
        self.held.clear();
        if self.resume.is_some() {
            self.go_on(cause, None);
        } else {
            self.stage = self.interrupted(cause);
        }
    }

    /// The stream or its continuation stopped for `cause` (`first`: the interruption before it,
    /// if any): it goes on as its resume hook says. Whether the answer was complete.
    fn go_on(&mut self, cause: InterruptCause, first: Option<InterruptCause>) -> bool {
        let resumption = match self.resume.as_mut() {
            Some(resume) => lock(resume).resume(&cause, self.bytes),
            None => Resumption::Interrupted,
        };
        let cause = first.unwrap_or(cause);
        let (stage, complete) = match resumption {
            Resumption::Continuation(answer) => {
                let answer = Mutex::new(answer);
                (Stage::Waiting { answer, cause }, false)
            }
            // Held bytes are left only by a clean end: a last event without its blank line.
            Resumption::Complete(None) => (ending(Some(self.held.split().freeze())), true),
            Resumption::Complete(end) => (ending(end), true),
            Resumption::Interrupted => (self.interrupted(cause), false),
        };
        self.held.clear();
        self.stage = stage;
        complete
    }

    /// The stage that ends a stream that cannot be completed: its resume hook's in-band error
    /// event, if any, then [`StreamInterrupted`] with the first interruption.
    fn interrupted(&mut self, cause: InterruptCause) -> Stage {
        let (event, events) = match self.resume.as_mut() {
            Some(resume) => {
                let resume = lock(resume);
                (
                    resume.error_event(&cause, self.bytes),
                    resume.content_events(),
                )
            }
            None => (None, self.guard.events),
        };
        let error = StreamInterrupted::new(events, self.bytes, cause);
        Stage::Ending(event, Some(Box::new(error)))
    }

    /// A continuation's answer came (`None`: it could not be had, and whoever sent it retried it
    /// already: no other is asked for).
    fn answered(&mut self, answer: Option<AnswerBody>) {
        let Stage::Waiting { cause, .. } = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.stage = match answer {
            Some(body) => Stage::Reading(Box::new(Reading {
                body: Mutex::new(body),
                parser: Parser::new(),
                frames: Vec::new(),
                at: 0,
                cause,
            })),
            None => self.interrupted(cause),
        };
    }

    /// One frame of a continuation's answer: the spliced bytes to hand on, if any.
    fn read_answer(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Option<Bytes> {
        let data = match frame {
            Some(Ok(frame)) => frame.into_data().ok()?,
            Some(Err(error)) => {
                self.held.clear();
                self.answer_stopped(InterruptCause::Reset(error));
                return None;
            }
            None => {
                self.answer_stopped(InterruptCause::Unfinished);
                return None;
            }
        };
        let (out, read) = self.splice(&data);
        self.bytes += out.len() as u64;
        match read {
            Read::More => {}
            Read::Last => self.stage = Stage::Done,
            Read::Stopped(cause) => {
                self.held.clear();
                self.answer_stopped(cause);
            }
        }
        Some(out.freeze()).filter(|out| !out.is_empty())
    }

    /// Splices the frames a chunk of a continuation's answer completed: the bytes to hand on, and
    /// where the answer stands.
    fn splice(&mut self, data: &Bytes) -> (BytesMut, Read) {
        let mut out = BytesMut::new();
        let (Stage::Reading(reading), Some(resume)) = (&mut self.stage, self.resume.as_mut())
        else {
            return (out, Read::More);
        };
        if let Err(error) = reading.parser.feed(data, &mut reading.frames) {
            return (out, Read::Stopped(InterruptCause::Malformed(error)));
        }
        let resume = lock(resume);
        self.held.extend_from_slice(data);
        for frame in reading.frames.drain(..) {
            let length = usize::try_from(frame.boundary.saturating_sub(reading.at));
            let length = length.unwrap_or(usize::MAX).min(self.held.len());
            let raw = self.held.split_to(length).freeze();
            reading.at = frame.boundary;
            let kind = match &frame.kind {
                FrameKind::Event(event) => sse::classify_event(event),
                FrameKind::Comment => EventKind::Control,
            };
            if let EventKind::Error(outcome) = kind {
                return (out, Read::Stopped(InterruptCause::ErrorEvent(outcome)));
            }
            if let Some(spliced) = resume.splice(&frame.kind, raw) {
                if let FrameKind::Event(event) = &frame.kind {
                    resume.shown(event);
                }
                out.extend_from_slice(&spliced);
            }
            if kind == EventKind::Done {
                return (out, Read::Last);
            }
        }
        (out, Read::More)
    }

    /// A continuation's answer stopped for `cause` (`Unfinished`: it ended): the stream's resume
    /// hook is asked again.
    fn answer_stopped(&mut self, cause: InterruptCause) {
        let Stage::Reading(reading) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.go_on(cause, Some(reading.cause));
    }

    /// Hands on `data` (the chunk that began at byte `start` of the stream), up to `upto`: all of
    /// it, or, with a resume hook, up to the last whole event (the rest is held back).
    fn deliver(&mut self, data: Bytes, start: u64, upto: Option<u64>) -> Option<Bytes> {
        let whole = self.resume.is_some();
        let upto = match (whole, upto) {
            (_, Some(at)) => at,
            (true, None) => self.guard.last_end,
            (false, None) => start + data.len() as u64,
        };
        let data = if whole || !self.held.is_empty() {
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

impl<RB: Body<Data = Bytes>> GuardedStream<RB>
where
    RB::Error: Into<BoxError>,
{
    /// Hands on the stream's own events; `Continue` once they stopped and the stage moved on.
    fn poll_own(&mut self, cx: &mut Context<'_>) -> ControlFlow<Polled> {
        loop {
            if let Some(opening) = self.opening.take() {
                self.bytes += opening.len() as u64;
                return ControlFlow::Break(Poll::Ready(Some(Ok(Frame::data(opening)))));
            }
            let cause = match self.guard.interrupted.take() {
                Some(cause) => cause,
                None => match self.guard.poll_chunk(cx) {
                    Poll::Pending => match self.guard.poll_timers(cx) {
                        Some(cause) => cause,
                        None => return ControlFlow::Break(Poll::Pending),
                    },
                    Poll::Ready(Chunk::Data(data)) => match self.read_own(data) {
                        Some(data) => {
                            return ControlFlow::Break(Poll::Ready(Some(Ok(Frame::data(data)))));
                        }
                        None => continue,
                    },
                    Poll::Ready(Chunk::Trailers(trailers)) => {
                        return ControlFlow::Break(Poll::Ready(Some(Ok(Frame::trailers(
                            trailers,
                        )))));
                    }
                    Poll::Ready(Chunk::End) => {
                        self.ended();
                        return ControlFlow::Continue(());
                    }
                    Poll::Ready(Chunk::Failed(error)) => InterruptCause::Reset(error.into()),
                    Poll::Ready(Chunk::Malformed(error)) => InterruptCause::Malformed(error),
                },
            };
            self.stop(cause);
            return ControlFlow::Continue(());
        }
    }
}

/// What a guarded stream's poll gives.
type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

impl<RB: Body<Data = Bytes>> Body for GuardedStream<RB>
where
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        loop {
            match &mut this.stage {
                Stage::Original => {
                    if let ControlFlow::Break(polled) = this.poll_own(cx) {
                        return polled;
                    }
                }
                Stage::Waiting { answer, .. } => {
                    let answer = ready!(lock(answer).as_mut().poll(cx));
                    this.answered(answer);
                }
                Stage::Reading(reading) => {
                    let frame = ready!(lock(&mut reading.body).as_mut().poll_frame(cx));
                    if let Some(data) = this.read_answer(frame) {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Stage::Ending(bytes, error) => {
                    if let Some(bytes) = bytes.take() {
                        this.bytes += bytes.len() as u64;
                        // Once, before the error: a server relaying the stream (hyper's) drops
                        // what it has not written when its body fails, and it writes what it
                        // holds while the body is pending, so the event reaches the caller.
                        if error.is_some() {
                            this.stage = Stage::Flushing(error.take());
                        }
                        return Poll::Ready(Some(Ok(Frame::data(bytes))));
                    }
                    let error = error.take();
                    this.stage = Stage::Done;
                    return Poll::Ready(error.map(Err));
                }
                Stage::Flushing(error) => {
                    this.stage = Stage::Ending(None, error.take());
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Stage::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done | Stage::Ending(None, None))
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
