//! [`GaveUp`]: the error returned when the engine stops retrying a retryable error.

use std::error::Error;
use std::fmt;

use stormguard_classify::{BoxError, MAX_CHAIN, Reason};

/// Why the engine stopped retrying a retryable failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpCause {
    /// `max_attempts` attempts were sent.
    AttemptsExhausted,
    /// The retry budget refused the retry: too many retries for the recent successes.
    BudgetExhausted,
    /// The request's deadline leaves no room for the delay plus another attempt.
    Deadline,
    /// The server asked for a delay above the hint policy's maximum.
    HintTooLong,
}

impl GiveUpCause {
    /// A short snake_case name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Deadline => "deadline",
            Self::HintTooLong => "hint_too_long",
        }
    }
}

impl fmt::Display for GiveUpCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AttemptsExhausted => "attempts exhausted",
            Self::BudgetExhausted => "retry budget exhausted",
            Self::Deadline => "deadline too close",
            Self::HintTooLong => "server asked for a delay above the maximum",
        })
    }
}

/// The engine gave up on a retryable error: the last attempt's error (its [`source`]) would
/// have been retried, but attempts, budget, deadline or the server's hint said stop.
///
/// Finding a `GaveUp` in an error's source chain means "already retried here, do not retry
/// again": a server layer answering for this error should say so to its own client
/// (`x-should-retry: false`). Errors the engine never retries (fatal ones, and stormguard's own
/// local rejections) come back unwrapped. Failed *responses* the engine gives up on come back as
/// responses, marked in their headers (see the crate docs).
///
/// [`source`]: std::error::Error::source
#[derive(Debug)]
pub struct GaveUp {
    attempts: u32,
    reason: Reason,
    cause: GiveUpCause,
    source: BoxError,
}

impl GaveUp {
    pub(crate) fn new(attempts: u32, reason: Reason, cause: GiveUpCause, source: BoxError) -> Self {
        Self {
            attempts,
            reason,
            cause,
            source,
        }
    }

    /// Attempts sent, the first one included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The classification of the last failure.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// Why the engine stopped.
    pub fn cause(&self) -> GiveUpCause {
        self.cause
    }

    /// The last attempt's error.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt{} ({}); last failure: {}",
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.cause,
            self.reason.as_str(),
        )
    }
}

impl Error for GaveUp {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// Whether a `T` sits anywhere in `error`'s source chain, the error itself included.
///
/// `std::io::Error` needs a special step: its `source()` skips the error it wraps (it returns
/// the wrapped error's own source), so the wrapped error is reached through `get_ref`. The walk
/// stops after [`MAX_CHAIN`] links, whatever a hostile `source()` does.
pub(crate) fn chain_contains<T: Error + 'static>(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    for _ in 0..MAX_CHAIN {
        let Some(current) = next else {
            return false;
        };
        if current.is::<T>() {
            return true;
        }
        next = match current.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn Error + 'static)),
            None => current.source(),
        };
    }
    false
}
