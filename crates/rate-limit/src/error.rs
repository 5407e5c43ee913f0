//! [`RateLimited`]: a request the client's own rate limit did not let through.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use stormguard_classify::{Failure, Outcome, Reason};

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateLimitCause {
    /// Its slot would come later than the wait allowed (the limit's `max_wait`, or the request's
    /// deadline).
    Wait,
    /// It weighs more tokens than a whole minute's quota: it could never go.
    TooHeavy {
        /// The request's estimated tokens.
        tokens: u64,
        /// The tokens-per-minute limit.
        per_minute: u64,
    },
}

/// A request the client's rate limit refused locally: it never reached the provider.
///
/// Its source is a [`Failure`] with the outcome `Outcome::fatal(Reason::RateLimitedLocally)`, not
/// accepted, with [`retry_after`](Self::retry_after) as its hint: the retry engine does not retry
/// it (the wait it allowed is over), [`outcome_of`](stormguard_classify::outcome_of) reads it,
/// and [`error_response`](stormguard_classify::error_response) answers it with 429,
/// `Retry-After` and `x-should-retry: false`.
#[derive(Debug)]
pub struct RateLimited {
    cause: RateLimitCause,
    failure: Failure,
}

impl RateLimited {
    pub(crate) fn new(retry_after: Duration, cause: RateLimitCause) -> Self {
        let outcome = Outcome::fatal(Reason::RateLimitedLocally)
            .with_accepted(false)
            .with_retry_after(Some(retry_after));
        Self {
            cause,
            failure: Failure::new(outcome),
        }
    }

    /// How long until the request's slot would have come: ask again after this. For a request
    /// heavier than a minute's quota, a minute (it will not fit then either).
    pub fn retry_after(&self) -> Duration {
        self.failure.outcome().retry_after().unwrap_or_default()
    }

    /// Why it was refused.
    pub fn cause(&self) -> RateLimitCause {
        self.cause
    }

    /// What it is in stormguard's vocabulary: fatal, [`Reason::RateLimitedLocally`], not
    /// accepted, with the time to come back as its hint.
    pub fn outcome(&self) -> Outcome {
        self.failure.outcome()
    }
}

impl Clone for RateLimited {
    fn clone(&self) -> Self {
        Self {
            cause: self.cause,
            failure: Failure::new(self.failure.outcome()),
        }
    }
}

impl PartialEq for RateLimited {
    fn eq(&self, other: &Self) -> bool {
        (self.cause, self.outcome()) == (other.cause, other.outcome())
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            RateLimitCause::Wait => write!(
                f,
                "rate limited locally: no slot within the wait allowed, retry after {} ms",
                self.retry_after().as_millis()
            ),
            RateLimitCause::TooHeavy { tokens, per_minute } => write!(
                f,
                "rate limited locally: {tokens} tokens exceed the limit of {per_minute} a minute"
            ),
        }
    }
}

impl Error for RateLimited {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.failure)
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for RateLimited {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use stormguard_classify::{BoxError, Classify, LlmClassifier, error_response, outcome_of};

    use super::*;

    #[test]
    fn a_refusal_is_final_not_accepted_and_answered_with_429() {
        let limited = RateLimited::new(Duration::from_millis(1_200), RateLimitCause::Wait);
        let expected = Outcome::fatal(Reason::RateLimitedLocally)
            .with_accepted(false)
            .with_retry_after(Some(Duration::from_millis(1_200)));
        assert_eq!(outcome_of(&limited), Some(expected));
        let boxed: BoxError = Box::new(limited.clone());
        assert_eq!(LlmClassifier::default().classify_error(&*boxed), expected);
        let response: http::Response<()> = error_response(&*boxed, false);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["x-should-retry"], "false");
        assert_eq!(
            limited.to_string(),
            "rate limited locally: no slot within the wait allowed, retry after 1200 ms"
        );
        let heavy = RateLimited::new(
            Duration::from_secs(60),
            RateLimitCause::TooHeavy {
                tokens: 50_000,
                per_minute: 30_000,
            },
        );
        assert_eq!(
            heavy.to_string(),
            "rate limited locally: 50000 tokens exceed the limit of 30000 a minute"
        );
    }
}
