//! [`ConcurrencyFull`]: an attempt the limit did not let through.

use std::error::Error;
use std::fmt;

use stormguard_classify::{Failure, Outcome, Reason};

/// What a refusal is in the shared vocabulary: fatal (the backend already holds as many attempts
/// as it can take), [`Reason::BulkheadFull`], not accepted (it never saw this one).
static FULL: Failure = Failure::new(Outcome::fatal(Reason::BulkheadFull).with_accepted(false));

/// An attempt refused because the limit's worth of attempts was in flight for as long as it
/// could wait.
///
/// Final for the request on that backend, like the breaker's bulkhead: its source is a
/// [`Failure`] with the outcome `Outcome::fatal(Reason::BulkheadFull)`, not accepted, which a
/// gateway answers with 503 and `x-should-retry: false`, and a failover takes to its next
/// backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConcurrencyFull {
    limit: u32,
}

impl ConcurrencyFull {
    pub(crate) fn new(limit: u32) -> Self {
        Self { limit }
    }

    /// The limit that was reached.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// What it is in stormguard's vocabulary: fatal, not accepted, [`Reason::BulkheadFull`].
    pub fn outcome(&self) -> Outcome {
        FULL.outcome()
    }
}

impl fmt::Display for ConcurrencyFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "concurrency limit reached: {} attempts already in flight to the backend",
            self.limit
        )
    }
}

impl Error for ConcurrencyFull {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&FULL)
    }
}
