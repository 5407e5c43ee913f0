//! What an attempt abandoned by its clock (`stormguard_deadline::clocks`) fails with.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use stormguard_classify::{Failure, Outcome, Reason};

/// An attempt abandoned by its clock: no response head came within what the backend's healthy
/// answers showed (see `stormguard_deadline::clocks`). A retryable timeout the backend did not
/// accept; the request goes on (a retry, or the next backend under a failover).
pub struct AttemptTimedOut {
    after: Duration,
    failure: Failure,
}

impl AttemptTimedOut {
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            failure: Failure::new(attempt_timeout()),
        }
    }

    /// How long the attempt waited.
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Debug for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptTimedOut")
            .field("after", &self.after)
            .finish()
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no response head after {:?}", self.after)
    }
}

impl StdError for AttemptTimedOut {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.failure)
    }
}

/// What a fired clock is: a retryable timeout, not accepted.
pub(crate) fn attempt_timeout() -> Outcome {
    Outcome::retryable(Reason::Timeout).with_accepted(false)
}
