//! [`Error`]: why a request through the engine ended without a response, and [`GiveUpCause`].

use std::error::Error as StdError;
use std::fmt;

use http::Response;
use stormguard_adaptive_throttle::Throttled;
use stormguard_classify::{BoxError, Failure, Outcome, Reason, refusal_response};
use stormguard_deadline::DeadlineExceeded;

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
    /// An attempt's clock fired, or the server answered 429, and the request goes on elsewhere:
    /// under a router, to its next backend ([`Route::with_hand_off`](crate::Route::with_hand_off),
    /// [`Route::with_hand_off_429`](crate::Route::with_hand_off_429)).
    HandedOn,
}

impl GiveUpCause {
    /// A short snake_case name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Deadline => "deadline",
            Self::HintTooLong => "hint_too_long",
            Self::HandedOn => "handed_on",
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
            Self::HandedOn => "handed on to the next backend",
        })
    }
}

/// A request through the [`ClientService`](crate::ClientService) that ended without a response: the throttle
/// dropped it, the circuit breaker refused or cut it (with no fallback), its deadline passed, the engine gave up retrying a failed call, or the call failed
/// in a way no retry helps.
///
/// It says what it is in stormguard's vocabulary: its source is a
/// [`Failure`] with the request's [`Outcome`] (and the error that caused it, if any, below that),
/// so [`outcome_of`](stormguard_classify::outcome_of), any classifier's `classify_error` and
/// [`error_response`](stormguard_classify::error_response) read it without knowing this type.
/// The outcome of a request the engine gave up on is *fatal*: it was retried here as much as the
/// budget allows, and no layer above should retry it again.
///
/// A gateway answers for it with [`to_response`](Self::to_response) (or, with the `axum`
/// feature, by returning it from a handler: it implements `IntoResponse` the same way): 503 for a
/// throttled request or one the breaker refused (with `Retry-After` when the breaker says when it
/// lets probes through), 504 for an expired deadline, 502 for an upstream failure, each marked
/// `x-should-retry: false`.
#[derive(Debug)]
pub struct Error {
    failure: Failure,
    attempts: u32,
    gave_up: Option<GiveUpCause>,
    rate_limited_throughout: bool,
}

impl Error {
    /// The adaptive throttle dropped the attempt locally: it never reached the backend.
    pub(crate) fn throttled(attempts: u32) -> Self {
        let outcome = Outcome::fatal(Reason::Throttled).with_accepted(false);
        Self::new(Failure::with_source(outcome, Box::new(Throttled)), attempts)
    }

    /// A layer of the engine, or one above it (a failover with no backend left), refused the
    /// request locally (the rate limit had no slot for it, the circuit breaker refused it or cut
    /// it in flight): `refusal`, whose outcome is `outcome`, after `attempts` attempts.
    pub fn refused(outcome: Outcome, refusal: BoxError, attempts: u32) -> Self {
        Self::new(Failure::with_source(outcome, refusal), attempts)
    }

    /// The request's deadline passed.
    pub(crate) fn deadline_exceeded(attempts: u32) -> Self {
        Self::new(deadline_failure(), attempts)
    }

    /// The request's own body could not be read: it was never sent.
    pub(crate) fn unreadable_body(source: BoxError) -> Self {
        let outcome = Outcome::fatal(Reason::BadRequest).with_accepted(false);
        Self::new(Failure::with_source(outcome, source), 0)
    }

    /// The call failed with `source`, classified as `outcome`, and the engine did not retry it.
    pub(crate) fn failed(outcome: Outcome, source: BoxError, attempts: u32) -> Self {
        Self::new(Failure::with_source(outcome, source), attempts)
    }

    /// The engine gave up retrying the retryable failure `source`.
    pub(crate) fn given_up(
        last: Outcome,
        source: BoxError,
        attempts: u32,
        cause: GiveUpCause,
    ) -> Self {
        // Final from here on: fatal, whatever the last attempt's verdict was.
        let outcome = Outcome::fatal(last.reason()).with_accepted(last.is_accepted());
        Self {
            gave_up: Some(cause),
            ..Self::new(Failure::with_source(outcome, source), attempts)
        }
    }

    fn new(failure: Failure, attempts: u32) -> Self {
        Self {
            failure,
            attempts,
            gave_up: None,
            rate_limited_throughout: false,
        }
    }

    /// What went wrong, as every stormguard layer classifies it.
    pub fn outcome(&self) -> Outcome {
        self.failure.outcome()
    }

    /// Why: [`Reason::Throttled`], [`Reason::BreakerOpen`], [`Reason::BulkheadFull`],
    /// [`Reason::DeadlineExceeded`], or the last failure's reason.
    pub fn reason(&self) -> Reason {
        self.failure.outcome().reason()
    }

    /// Attempts sent, the first one included (0 when none was).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the engine stopped retrying, when it did: `None` for a local refusal, an expired
    /// deadline, or a failure it never retried (fatal, or a body it could not replay).
    pub fn gave_up(&self) -> Option<GiveUpCause> {
        self.gave_up
    }

    /// Whether the server answered 429 to every attempt sent (at least one): see
    /// [`Report::rate_limited_throughout`](crate::Report::rate_limited_throughout). An error
    /// built outside the engine says `false`.
    pub fn rate_limited_throughout(&self) -> bool {
        self.rate_limited_throughout
    }

    /// The error that caused it: the last attempt's error, or the local refusal
    /// ([`Throttled`], [`DeadlineExceeded`], [`BreakerOpen`](stormguard_breaker::BreakerOpen),
    /// [`BulkheadFull`](stormguard_breaker::BulkheadFull),
    /// [`ConcurrencyFull`](stormguard_concurrency::ConcurrencyFull)).
    pub fn into_source(self) -> Option<BoxError> {
        self.failure.into_source()
    }

    /// The error that caused it, if it is a `T`; else this error, unchanged.
    pub fn downcast_source<T: StdError + 'static>(self) -> Result<T, Self> {
        let Self {
            failure,
            attempts,
            gave_up,
            rate_limited_throughout,
        } = self;
        let outcome = failure.outcome();
        let failure = match failure.into_source().map(|source| source.downcast::<T>()) {
            Some(Ok(source)) => return Ok(*source),
            Some(Err(source)) => Failure::with_source(outcome, source),
            None => Failure::new(outcome),
        };
        Err(Self {
            failure,
            attempts,
            gave_up,
            rate_limited_throughout,
        })
    }

    /// The answer a gateway gives its own caller for this error
    /// ([`refusal_response`](stormguard_classify::refusal_response) of its outcome): 503, 504 or
    /// 502, marked "do not retry" (gRPC: `UNAVAILABLE` or `DEADLINE_EXCEEDED` with
    /// `grpc-retry-pushback-ms: -1`).
    pub fn to_response<B: Default>(&self, grpc: bool) -> Response<B> {
        refusal_response(&self.outcome(), grpc)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.attempts;
        let plural = if attempts == 1 { "" } else { "s" };
        match (self.gave_up, self.reason()) {
            (Some(cause), reason) => write!(
                f,
                "gave up after {attempts} attempt{plural} ({cause}); last failure: {reason}"
            ),
            (None, Reason::Throttled) => {
                f.write_str("request throttled locally: the backend is rejecting")
            }
            (None, Reason::DeadlineExceeded) => {
                write!(f, "deadline exceeded after {attempts} attempt{plural}")
            }
            (
                None,
                reason @ (Reason::BreakerOpen | Reason::BulkheadFull | Reason::RateLimitedLocally),
            ) => write!(
                f,
                "request refused locally after {attempts} attempt{plural}: {reason}"
            ),
            (None, reason) if attempts == 0 => write!(f, "request not sent: {reason}"),
            (None, reason) => write!(
                f,
                "request failed after {attempts} attempt{plural}: {reason}"
            ),
        }
    }
}

/// What a request whose deadline passed fails with: a request's error, or the error of a body
/// handed back that its deadline cut.
pub(crate) fn deadline_failure() -> Failure {
    let outcome = Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false);
    Failure::with_source(outcome, Box::new(DeadlineExceeded::new()))
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.failure)
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Error {
    /// [`Error::to_response`] for an HTTP caller.
    fn into_response(self) -> axum::response::Response {
        self.to_response(false)
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for Error {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

/// Tells the engine's [`Error`] in `output`, if that is what it hands back, whether the server
/// answered 429 to every attempt: known only once the request ends, as it is counted across
/// attempts.
pub(crate) fn mark_rate_limited<B>(output: &mut Result<Response<B>, Error>, throughout: bool) {
    if let Err(error) = output {
        error.rate_limited_throughout = throughout;
    }
}

#[cfg(test)]
mod tests {
    use stormguard_classify::{chain, outcome_of};

    use super::*;

    #[test]
    fn local_refusals_say_what_they_are_and_keep_their_typed_error() {
        let throttled = Error::throttled(1);
        assert_eq!(
            outcome_of(&throttled).map(|o| o.reason()),
            Some(Reason::Throttled)
        );
        assert!(chain(&throttled).any(|link| link.is::<Throttled>()));
        assert_eq!(throttled.to_response::<()>(false).status(), 503);

        let expired = Error::deadline_exceeded(2);
        assert!(chain(&expired).any(|link| link.is::<DeadlineExceeded>()));
        assert_eq!(expired.to_response::<()>(false).status(), 504);
        assert_eq!(expired.to_string(), "deadline exceeded after 2 attempts");
    }

    #[test]
    fn a_give_up_is_final_for_whoever_classifies_it_next() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let last = Outcome::retryable(Reason::Transport);
        let error = Error::given_up(last, Box::new(refused), 3, GiveUpCause::BudgetExhausted);
        let outcome = outcome_of(&error).expect("an outcome");
        assert!(outcome.is_fatal());
        assert!(!outcome.is_accepted());
        assert_eq!(outcome.reason(), Reason::Transport);
        assert_eq!(error.gave_up(), Some(GiveUpCause::BudgetExhausted));
        assert_eq!(error.to_response::<()>(false).status(), 502);
        assert_eq!(
            error.to_response::<()>(false).headers()["x-should-retry"],
            "false"
        );
        assert!(chain(&error).any(|link| link.is::<std::io::Error>()));
        assert_eq!(
            error.to_string(),
            "gave up after 3 attempts (retry budget exhausted); last failure: connection failed"
        );
    }

    /// The run of 429s is told to the error; a response is left as it is.
    #[test]
    fn the_run_of_429s_is_told_to_the_error() {
        let limited = Outcome::retryable(Reason::RateLimited);
        let refused = Error::refused(limited, "no slot".into(), 2);
        let mut errored: Result<Response<()>, Error> = Err(refused);
        assert!(
            errored
                .as_ref()
                .is_err_and(|e| !e.rate_limited_throughout())
        );
        mark_rate_limited(&mut errored, true);
        assert!(errored.as_ref().is_err_and(Error::rate_limited_throughout));
        // Kept through a failed downcast.
        let kept = errored.err().map(|e| e.downcast_source::<Throttled>());
        assert!(matches!(kept, Some(Err(e)) if e.rate_limited_throughout()));

        let mut success: Result<Response<()>, Error> = Ok(Response::new(()));
        mark_rate_limited(&mut success, true);
        assert!(success.is_ok());
    }
}
