//! The errors of a refused or cut attempt: [`BreakerOpen`], [`BulkheadFull`], and [`Rejected`],
//! which is either.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use stormguard_classify::{BoxError, Failure, Outcome, Reason};

/// Why the breaker opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpenCause {
    /// Health failures reached the failure ratio of the window.
    Failures,
    /// Nothing came back from the backend for far longer than its recent answers made plausible,
    /// while attempts were in flight.
    Stall,
    /// A half-open probe failed.
    ProbeFailed,
    /// Health failures in a row reached the configured count.
    ConsecutiveFailures,
    /// Told to open from outside ([`CircuitBreaker::open_now`](crate::CircuitBreaker::open_now)):
    /// another replica's breaker of the same backend opened (a fleet's shared cooldowns).
    Told,
}

impl OpenCause {
    /// A short snake_case name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Failures => "failures",
            Self::Stall => "stall",
            Self::ProbeFailed => "probe_failed",
            Self::ConsecutiveFailures => "consecutive_failures",
            Self::Told => "told",
        }
    }
}

impl fmt::Display for OpenCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Failures => "too many health failures",
            Self::Stall => "the backend stopped answering",
            Self::ProbeFailed => "a probe failed",
            Self::ConsecutiveFailures => "failures in a row",
            Self::Told => "another replica's breaker opened",
        })
    }
}

/// An attempt the open breaker refused (or, on a stall, cut while it was in flight): the backend
/// is failing, and the breaker says when to come back.
///
/// Final for this request on this backend: its source is a [`Failure`] with the outcome
/// `Outcome::fatal(Reason::BreakerOpen)`, not accepted, with [`retry_after`](Self::retry_after)
/// as its hint, so the retry engine never retries it,
/// [`outcome_of`](stormguard_classify::outcome_of) reads it without knowing this type, and
/// [`error_response`](stormguard_classify::error_response) answers it with 503, `Retry-After` and
/// `x-should-retry: false`. Another backend (failover) may still take the request.
#[derive(Debug)]
pub struct BreakerOpen {
    cause: OpenCause,
    was_sent: bool,
    failure: Failure,
}

impl BreakerOpen {
    pub(crate) fn new(retry_after: Duration, cause: OpenCause, was_sent: bool) -> Self {
        let outcome = Outcome::fatal(Reason::BreakerOpen)
            .with_accepted(false)
            .with_retry_after(Some(retry_after));
        Self {
            cause,
            was_sent,
            failure: Failure::new(outcome),
        }
    }

    /// How long until the breaker lets a probe through: ask again after this.
    pub fn retry_after(&self) -> Duration {
        self.failure.outcome().retry_after().unwrap_or_default()
    }

    /// Why the breaker opened.
    pub fn cause(&self) -> OpenCause {
        self.cause
    }

    /// Whether the attempt had been sent, and was cut in flight when the breaker opened on a
    /// stall (the backend may have received it); `false` when it was refused before sending.
    pub fn was_sent(&self) -> bool {
        self.was_sent
    }

    /// What it is in stormguard's vocabulary: fatal, [`Reason::BreakerOpen`], not accepted, with
    /// the time to come back as its hint.
    pub fn outcome(&self) -> Outcome {
        self.failure.outcome()
    }
}

impl Clone for BreakerOpen {
    fn clone(&self) -> Self {
        Self {
            cause: self.cause,
            was_sent: self.was_sent,
            failure: Failure::new(self.failure.outcome()),
        }
    }
}

impl PartialEq for BreakerOpen {
    fn eq(&self, other: &Self) -> bool {
        (self.cause, self.was_sent, self.outcome())
            == (other.cause, other.was_sent, other.outcome())
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.was_sent { "cut" } else { "refused" };
        write!(
            f,
            "circuit breaker open ({}): attempt {verb}, retry after {} ms",
            self.cause,
            self.retry_after().as_millis()
        )
    }
}

impl Error for BreakerOpen {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.failure)
    }
}

/// What a bulkhead refusal is in the shared vocabulary: fatal (the backend already holds as many
/// attempts as it may), [`Reason::BulkheadFull`], not accepted (it never saw this one).
static BULKHEAD_FULL: Failure =
    Failure::new(Outcome::fatal(Reason::BulkheadFull).with_accepted(false));

/// An attempt refused because the backend already has the most attempts in flight that the
/// breaker allows ([`BreakerConfig::with_max_in_flight`](crate::BreakerConfig::with_max_in_flight)).
///
/// Final, like [`BreakerOpen`]: its source is a [`Failure`] with the outcome
/// `Outcome::fatal(Reason::BulkheadFull)`, not accepted, answered with 503 and
/// `x-should-retry: false` by a gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BulkheadFull {
    max_in_flight: u32,
}

impl BulkheadFull {
    pub(crate) fn new(max_in_flight: u32) -> Self {
        Self { max_in_flight }
    }

    /// The cap that was reached.
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }
}

impl fmt::Display for BulkheadFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bulkhead full: {} attempts already in flight to the backend",
            self.max_in_flight
        )
    }
}

impl Error for BulkheadFull {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&BULKHEAD_FULL)
    }
}

/// Why the breaker did not let an attempt through (or cut it): open, or the bulkhead full.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejected {
    /// The breaker is open (or half-open with every probe slot taken).
    Open(BreakerOpen),
    /// The cap on attempts in flight is reached.
    Full(BulkheadFull),
}

impl Rejected {
    /// What it is in stormguard's vocabulary: fatal, not accepted,
    /// [`Reason::BreakerOpen`] or [`Reason::BulkheadFull`].
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Open(open) => open.outcome(),
            Self::Full(_) => BULKHEAD_FULL.outcome(),
        }
    }

    /// The error itself, boxed: a [`BreakerOpen`] or a [`BulkheadFull`], for `error.is::<_>()`.
    pub fn into_error(self) -> BoxError {
        match self {
            Self::Open(open) => Box::new(open),
            Self::Full(full) => Box::new(full),
        }
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(open) => open.fmt(f),
            Self::Full(full) => full.fmt(f),
        }
    }
}

impl Error for Rejected {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Open(open) => open.source(),
            Self::Full(full) => full.source(),
        }
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for BreakerOpen {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for BulkheadFull {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for Rejected {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use stormguard_classify::{Classify, LlmClassifier, error_response, outcome_of};

    use super::*;

    #[test]
    fn refusals_are_final_not_accepted_and_say_when_to_come_back() {
        let open = BreakerOpen::new(Duration::from_millis(1_500), OpenCause::Stall, false);
        let expected = Outcome::fatal(Reason::BreakerOpen)
            .with_accepted(false)
            .with_retry_after(Some(Duration::from_millis(1_500)));
        assert_eq!(outcome_of(&open), Some(expected));
        let boxed = Rejected::Open(open.clone()).into_error();
        assert!(boxed.is::<BreakerOpen>());
        assert_eq!(LlmClassifier::default().classify_error(&*boxed), expected);
        let response: http::Response<()> = error_response(&*boxed, false);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["x-should-retry"], "false");
        assert_eq!(
            open.to_string(),
            "circuit breaker open (the backend stopped answering): attempt refused, retry after 1500 ms"
        );

        let full = Rejected::Full(BulkheadFull::new(8));
        assert_eq!(full.outcome().reason(), Reason::BulkheadFull);
        assert!(!full.outcome().is_accepted());
        assert!(full.outcome().is_fatal());
        let response: http::Response<()> = error_response(&*full.clone().into_error(), false);
        assert_eq!(response.status(), 503);
        assert!(response.headers().get("retry-after").is_none());
        assert_eq!(
            full.to_string(),
            "bulkhead full: 8 attempts already in flight to the backend"
        );
    }
}
