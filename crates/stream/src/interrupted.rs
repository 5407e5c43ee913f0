//! [`StreamInterrupted`]: how a stream that stopped after content ends, and why it stopped
//! ([`InterruptCause`]).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use stormguard_classify::{BoxError, Failure, Outcome, Reason};

use crate::sse;

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
    /// The stream ended without a terminal event. Its resume hook, asked with this cause, says
    /// whether the answer was complete all the same (a format without a terminal event) or not
    /// (the built-in [`Continuations`](crate::continuation::Continuations) reads it in the
    /// answer's own events); a stream that ends with this error was not.
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

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for StreamInterrupted {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}
