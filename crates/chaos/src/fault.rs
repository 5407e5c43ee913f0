//! [`Fault`]: what to inject ([`FaultKind`]), into how many calls (a rate), and when (a
//! schedule); and how one call draws the fault it gets.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::ErrorAnswer;

/// What a fault does to a call.
///
/// The first four act on the call: they are drawn when it is made. The last four act on an
/// event stream (a `2xx` answer with `content-type: text/event-stream`) and are drawn, apart,
/// for every call whose answer turns out to be one. An event is a block of lines ended by a
/// blank line, a keep-alive comment included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The provider's error answer, in the shape of the API the request went to (see
    /// [`Provider::of_path`](crate::Provider::of_path)). The call never reaches the service.
    Answer(ErrorAnswer),
    /// The answer comes this much later: the inner call's future is polled only once it has
    /// passed.
    Latency(Duration),
    /// No answer, ever: the call stays pending until its caller drops it (a black hole). The
    /// call never reaches the service.
    Silence,
    /// The connection is reset before any answer. Under a client, the call fails with an
    /// `io::Error` of kind `ConnectionReset` (a retryable transport error to every stormguard
    /// classifier); in front of a server, the answer's body fails at once, so the server
    /// aborts the connection. The call never reaches the service.
    Reset,
    /// The stream's body is replaced with its provider's error event (OpenAI's
    /// `data: {"error": ...}`, Anthropic's `event: error` `overloaded_error`) and ends: an error
    /// after the `200`, before any content.
    ErrorBeforeContent,
    /// The stream's body fails (`ConnectionReset`) after this many events.
    CutAfter(u32),
    /// The stream's body sends nothing more after this many events, and never ends: pending
    /// until its reader drops it.
    StallAfter(u32),
    /// A content event cut short ([`Provider::malformed_event`](crate::Provider::malformed_event))
    /// is put in the stream after this many events; the stream goes on after it.
    MalformedAfter(u32),
}

impl FaultKind {
    /// Whether this fault acts on an event stream (drawn when the answer is one) rather than
    /// on the call.
    pub fn is_stream(self) -> bool {
        matches!(
            self,
            FaultKind::ErrorBeforeContent
                | FaultKind::CutAfter(_)
                | FaultKind::StallAfter(_)
                | FaultKind::MalformedAfter(_)
        )
    }

    /// A short snake_case name: an [`ErrorAnswer`]'s name, `latency`, `silence`, `reset`,
    /// `error_before_content`, `cut`, `stall`, `malformed`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Answer(answer) => answer.name(),
            FaultKind::Latency(_) => "latency",
            FaultKind::Silence => "silence",
            FaultKind::Reset => "reset",
            FaultKind::ErrorBeforeContent => "error_before_content",
            FaultKind::CutAfter(_) => "cut",
            FaultKind::StallAfter(_) => "stall",
            FaultKind::MalformedAfter(_) => "malformed",
        }
    }
}

impl fmt::Display for FaultKind {
    /// What the fault does, in a few words: `429 rate_limited (retry after 1s)`,
    /// `latency 250ms`, `cut after 3 events`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FaultKind::Answer(answer) => {
                write!(f, "{} {}", answer.status().as_u16(), answer.name())?;
                match answer {
                    ErrorAnswer::RateLimited {
                        retry_after: Some(delay),
                    } => write!(f, " (retry after {delay:?})"),
                    ErrorAnswer::RateLimited { retry_after: None } => f.write_str(" (no hint)"),
                    _ => Ok(()),
                }
            }
            FaultKind::Latency(delay) => write!(f, "latency {delay:?}"),
            FaultKind::CutAfter(events) => write!(f, "cut after {events} events"),
            FaultKind::StallAfter(events) => write!(f, "stall after {events} events"),
            FaultKind::MalformedAfter(events) => write!(f, "malformed event after {events} events"),
            other => f.write_str(&other.name().replace('_', " ")),
        }
    }
}

/// One fault to inject: its [`FaultKind`], the share of calls it hits (its rate, from 0 to 1)
/// and when it is on (its schedule: from `start` after the layer's origin, for `duration`;
/// by default from the origin on, for ever).
///
/// A fault counts the calls it was injected into. Clones count together: the same fault given
/// to two layers counts the injections of both.
///
/// ```
/// use std::time::Duration;
/// use stormguard_chaos::{ErrorAnswer, Fault, FaultKind};
///
/// // From 10 s to 40 s, one call in five gets a 503.
/// let outage = Fault::new(FaultKind::Answer(ErrorAnswer::Unavailable), 0.2)
///     .with_start(Duration::from_secs(10))
///     .with_duration(Some(Duration::from_secs(30)));
/// assert!(!outage.is_on(Duration::from_secs(9)));
/// assert!(outage.is_on(Duration::from_secs(10)));
/// assert!(!outage.is_on(Duration::from_secs(40)));
/// ```
#[derive(Clone, Debug)]
pub struct Fault {
    kind: FaultKind,
    rate: f64,
    start: Duration,
    duration: Option<Duration>,
    injected: Arc<AtomicU64>,
}

impl Fault {
    /// `kind`, injected into a share `rate` of the calls (a stream fault: of the event
    /// streams), from the layer's origin on, for ever. A rate outside 0..=1 is brought into
    /// it (NaN is 0).
    pub fn new(kind: FaultKind, rate: f64) -> Self {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        Self {
            kind,
            rate,
            start: Duration::ZERO,
            duration: None,
            injected: Arc::new(AtomicU64::new(0)),
        }
    }

    /// On from `start` after the layer's origin ([`ChaosLayer::origin`](crate::ChaosLayer::origin)).
    #[must_use]
    pub fn with_start(mut self, start: Duration) -> Self {
        self.start = start;
        self
    }

    /// On for `duration` from its start (`None`: for ever).
    #[must_use]
    pub fn with_duration(mut self, duration: Option<Duration>) -> Self {
        self.duration = duration;
        self
    }

    /// What it does.
    pub fn kind(&self) -> FaultKind {
        self.kind
    }

    /// The share of calls (of event streams, for a stream fault) it hits while it is on.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// When it comes on, after the layer's origin.
    pub fn start(&self) -> Duration {
        self.start
    }

    /// How long it stays on (`None`: for ever).
    pub fn duration(&self) -> Option<Duration> {
        self.duration
    }

    /// Whether it is on `elapsed` after the layer's origin: from its start (included) to its
    /// end (excluded). An end past what a `Duration` holds never comes.
    pub fn is_on(&self, elapsed: Duration) -> bool {
        let end = self
            .duration
            .and_then(|duration| self.start.checked_add(duration));
        elapsed >= self.start && end.is_none_or(|end| elapsed < end)
    }

    /// The calls it was injected into so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Counts one injection.
    pub(crate) fn count(&self) {
        self.injected.fetch_add(1, Ordering::Relaxed);
    }
}

/// The fault a call gets from `faults` for the uniform `draw` in `[0, 1)`, among those that are
/// on `elapsed` after the origin and act on a stream or not (`stream`).
///
/// The faults on share `[0, 1)` in their order, each a stretch as long as its rate: a draw
/// that falls in a fault's stretch gets it, one past their sum gets none. So each fault hits its
/// rate of the calls, and at most one fault of each sort hits a call; where the rates add up
/// past 1, the later faults get what the earlier ones leave.
pub(crate) fn pick(faults: &[Fault], elapsed: Duration, stream: bool, draw: f64) -> Option<&Fault> {
    let mut end = 0.0;
    for fault in faults {
        if fault.kind.is_stream() != stream || !fault.is_on(elapsed) {
            continue;
        }
        end += fault.rate;
        if draw < end {
            return Some(fault);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(kind: FaultKind, rate: f64) -> Fault {
        Fault::new(kind, rate)
    }

    #[test]
    fn faults_share_the_draws_in_their_order_each_by_its_rate() {
        let faults = [
            fault(FaultKind::Silence, 0.1),
            fault(FaultKind::CutAfter(2), 0.5),
            fault(FaultKind::Reset, 0.2),
        ];
        let at = Duration::ZERO;
        let picked = |draw| pick(&faults, at, false, draw).map(|fault| fault.kind());
        assert_eq!(picked(0.0), Some(FaultKind::Silence));
        assert_eq!(picked(0.099), Some(FaultKind::Silence));
        // The stream fault takes no stretch of the call's draw.
        assert_eq!(picked(0.1), Some(FaultKind::Reset));
        assert_eq!(picked(0.299), Some(FaultKind::Reset));
        assert_eq!(picked(0.301), None);
        let streamed = |draw| pick(&faults, at, true, draw).map(|fault| fault.kind());
        assert_eq!(streamed(0.49), Some(FaultKind::CutAfter(2)));
        assert_eq!(streamed(0.5), None);
    }

    #[test]
    fn a_fault_is_on_from_its_start_for_its_duration() {
        let later = fault(FaultKind::Silence, 1.0)
            .with_start(Duration::from_secs(5))
            .with_duration(Some(Duration::from_secs(2)));
        for (secs, on) in [(0, false), (4, false), (5, true), (6, true), (7, false)] {
            assert_eq!(later.is_on(Duration::from_secs(secs)), on, "{secs} s");
            let picked = pick(
                std::slice::from_ref(&later),
                Duration::from_secs(secs),
                false,
                0.5,
            );
            assert_eq!(picked.is_some(), on, "{secs} s");
        }
        let always = fault(FaultKind::Reset, 1.0);
        assert!(always.is_on(Duration::ZERO) && always.is_on(Duration::MAX));
        // Rates are brought into 0..=1.
        assert_eq!(fault(FaultKind::Reset, 7.0).rate(), 1.0);
        assert_eq!(fault(FaultKind::Reset, -1.0).rate(), 0.0);
        assert_eq!(fault(FaultKind::Reset, f64::NAN).rate(), 0.0);
    }

    #[test]
    fn kinds_say_what_they_do() {
        let limited = FaultKind::Answer(ErrorAnswer::RateLimited {
            retry_after: Some(Duration::from_secs(1)),
        });
        assert_eq!(limited.to_string(), "429 rate_limited (retry after 1s)");
        assert_eq!(FaultKind::CutAfter(3).to_string(), "cut after 3 events");
        assert_eq!(
            FaultKind::ErrorBeforeContent.to_string(),
            "error before content"
        );
        assert_eq!(FaultKind::Silence.name(), "silence");
        assert!(FaultKind::MalformedAfter(0).is_stream() && !FaultKind::Reset.is_stream());
    }
}
