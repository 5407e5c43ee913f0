//! [`Outcome`]: the answer every classifier gives, and [`Reason`], why.

use std::fmt;
use std::time::Duration;

use crate::grpc::code::GrpcCode;

/// The first two questions an [`Outcome`] answers: did it work, and if not, can a retry help?
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The request succeeded (or, for a stream, started successfully).
    Success,
    /// The request failed and the same request may succeed later.
    Retryable,
    /// The request failed and retrying the same request cannot help.
    Fatal,
}

impl Verdict {
    /// Snake-case name, for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Retryable => "retryable",
            Verdict::Fatal => "fatal",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The classification of one response or error.
///
/// It answers the three questions every layer that reacts to results asks:
///
/// 1. did it succeed ([`is_success`](Outcome::is_success))?
/// 2. if not, can a retry help ([`is_retryable`](Outcome::is_retryable)) or never
///    ([`is_fatal`](Outcome::is_fatal)), and after how long does the server want the retry
///    ([`retry_after`](Outcome::retry_after))?
/// 3. did the backend *accept* the request ([`is_accepted`](Outcome::is_accepted)): it did the
///    work and answered, even with a 4xx, as opposed to rejecting or failing it (overload,
///    unavailability, timeouts, transport failures)? Adaptive throttling and circuit breakers count
///    this, not success.
///
/// `Outcome` is small and `Copy`; builders are `const fn`.
///
/// ```
/// use std::time::Duration;
/// use stormguard_classify::{Outcome, Reason};
///
/// let outcome = Outcome::retryable(Reason::RateLimited)
///     .with_retry_after(Some(Duration::from_millis(1500)));
/// assert!(outcome.is_retryable());
/// assert!(!outcome.is_accepted());
/// assert_eq!(outcome.retry_after(), Some(Duration::from_millis(1500)));
/// assert_eq!(outcome.reason().as_str(), "rate_limited");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    verdict: Verdict,
    accepted: bool,
    reason: Reason,
    retry_after: Option<Duration>,
}

impl Outcome {
    /// A success: accepted, no hint, reason [`Reason::Success`].
    pub const fn success() -> Self {
        Outcome {
            verdict: Verdict::Success,
            accepted: true,
            reason: Reason::Success,
            retry_after: None,
        }
    }

    /// A failure a retry may fix. Not accepted unless changed with
    /// [`with_accepted`](Outcome::with_accepted).
    pub const fn retryable(reason: Reason) -> Self {
        Outcome {
            verdict: Verdict::Retryable,
            accepted: false,
            reason,
            retry_after: None,
        }
    }

    /// A failure no retry can fix. Accepted unless changed with
    /// [`with_accepted`](Outcome::with_accepted).
    pub const fn fatal(reason: Reason) -> Self {
        Outcome {
            verdict: Verdict::Fatal,
            accepted: true,
            reason,
            retry_after: None,
        }
    }

    /// The same outcome with the "accepted by the backend" answer replaced.
    #[must_use]
    pub const fn with_accepted(mut self, accepted: bool) -> Self {
        self.accepted = accepted;
        self
    }

    /// The same outcome with the server's retry hint replaced.
    #[must_use]
    pub const fn with_retry_after(mut self, hint: Option<Duration>) -> Self {
        self.retry_after = hint;
        self
    }

    /// The same outcome with its reason replaced.
    #[must_use]
    pub const fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = reason;
        self
    }

    /// Success, retryable or fatal.
    pub const fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Did the request succeed?
    pub const fn is_success(&self) -> bool {
        matches!(self.verdict, Verdict::Success)
    }

    /// Can a retry help? False for successes and for fatal failures.
    pub const fn is_retryable(&self) -> bool {
        matches!(self.verdict, Verdict::Retryable)
    }

    /// Did the request fail in a way no retry can fix?
    pub const fn is_fatal(&self) -> bool {
        matches!(self.verdict, Verdict::Fatal)
    }

    /// Did the backend accept the request and answer it (even with a 4xx)? False for overload,
    /// unavailability, timeouts and transport failures.
    pub const fn is_accepted(&self) -> bool {
        self.accepted
    }

    /// The server's hint of when to retry, as parsed (bounded by
    /// [`hint::HINT_CEILING`](crate::hint::HINT_CEILING), never compared with a cap here).
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Why: a printable reason for logs and metrics.
    pub const fn reason(&self) -> Reason {
        self.reason
    }
}

impl Default for Outcome {
    fn default() -> Self {
        Outcome::success()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.verdict, self.reason)?;
        if !self.is_success() && !self.accepted {
            f.write_str(", rejected by the backend")?;
        }
        if let Some(hint) = self.retry_after {
            write!(f, ", server asks to retry after {hint:?}")?;
        }
        Ok(())
    }
}

/// Why a request ended as it did: printable for logs ([`Display`](fmt::Display)) and metrics
/// ([`as_str`](Reason::as_str), snake_case, a fixed set of labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The request succeeded.
    Success,
    /// The server is rate limiting this client (HTTP 429, `rate_limit_exceeded`, `rate_limit_error`,
    /// `RESOURCE_EXHAUSTED` with a hint).
    RateLimited,
    /// The server is overloaded (HTTP 529, Anthropic `overloaded_error`).
    Overloaded,
    /// The server or a gateway in front of it is unavailable (HTTP 502, 503, `UNAVAILABLE`).
    Unavailable,
    /// The server failed (HTTP 500 and other 5xx, `api_error`, `server_error`).
    ServerError,
    /// The request or the server timed out (HTTP 408, 504, io `TimedOut`, a timeout layer).
    Timeout,
    /// The connection failed before a response arrived (refused, reset, aborted, broken pipe ...).
    Transport,
    /// Quota, spend limit or billing exhausted (`insufficient_quota`, `billing_error`, spend limits,
    /// daily quotas): nothing gets better until someone pays or the day ends.
    QuotaExhausted,
    /// The prompt does not fit the model's context window (`context_length_exceeded`).
    ContextTooLong,
    /// The request or its output was refused by a content filter or policy.
    ContentFiltered,
    /// The request is malformed (HTTP 400, `invalid_request_error`, `INVALID_ARGUMENT`).
    BadRequest,
    /// Missing or invalid credentials (HTTP 401, `invalid_api_key`, `authentication_error`).
    Unauthorized,
    /// The credentials lack permission (HTTP 403, `permission_error`).
    Forbidden,
    /// The resource or model does not exist (HTTP 404, `model_not_found`, `not_found_error`).
    NotFound,
    /// The request is too large (HTTP 413, `request_too_large`).
    PayloadTooLarge,
    /// The request is well-formed but cannot be processed (HTTP 422).
    Unprocessable,
    /// The request conflicts with the current state of the resource (HTTP 409).
    Conflict,
    /// The server said `x-should-retry: true` on a response that would otherwise be fatal.
    ServerSaidRetry,
    /// The server said not to retry (`x-should-retry: false`, negative or unparseable
    /// `grpc-retry-pushback-ms`) on a response that would otherwise be retryable.
    ServerSaidNoRetry,
    /// Any other 4xx answer.
    ClientError,
    /// A gRPC status code (the response was gRPC).
    Grpc(GrpcCode),
    /// The request was dropped locally by client-side throttling.
    Throttled,
    /// A retry was refused (or shed by a server) because retries exceed their budget.
    RetryBudgetExhausted,
    /// The request was refused locally by an open circuit breaker.
    BreakerOpen,
    /// The request was refused locally: too many attempts already in flight to the backend.
    BulkheadFull,
    /// The request was refused locally: the client's own rate limit had no slot for it within
    /// the wait it allows (or it weighs more than a whole minute's quota).
    RateLimitedLocally,
    /// No backend could take the request: every provider of a failover was unhealthy, refused it
    /// locally, or failed.
    NoBackend,
    /// The request's deadline expired.
    DeadlineExceeded,
    /// An error nobody could identify.
    Other,
}

impl Reason {
    /// Snake-case label for metrics, e.g. `rate_limited` or `grpc_unavailable`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Success => "success",
            Reason::RateLimited => "rate_limited",
            Reason::Overloaded => "overloaded",
            Reason::Unavailable => "unavailable",
            Reason::ServerError => "server_error",
            Reason::Timeout => "timeout",
            Reason::Transport => "transport",
            Reason::QuotaExhausted => "quota_exhausted",
            Reason::ContextTooLong => "context_too_long",
            Reason::ContentFiltered => "content_filtered",
            Reason::BadRequest => "bad_request",
            Reason::Unauthorized => "unauthorized",
            Reason::Forbidden => "forbidden",
            Reason::NotFound => "not_found",
            Reason::PayloadTooLarge => "payload_too_large",
            Reason::Unprocessable => "unprocessable",
            Reason::Conflict => "conflict",
            Reason::ServerSaidRetry => "server_said_retry",
            Reason::ServerSaidNoRetry => "server_said_no_retry",
            Reason::ClientError => "client_error",
            Reason::Grpc(code) => code.metric_label(),
            Reason::Throttled => "throttled",
            Reason::RetryBudgetExhausted => "retry_budget_exhausted",
            Reason::BreakerOpen => "breaker_open",
            Reason::BulkheadFull => "bulkhead_full",
            Reason::RateLimitedLocally => "rate_limited_locally",
            Reason::NoBackend => "no_backend",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::Other => "other",
        }
    }

    /// Whether a guard on this side refused the request before it left the process (the
    /// adaptive throttle, the circuit breaker or its bulkhead, the rate limit): it never reached
    /// the backend, cost it nothing, and says nothing about it.
    pub const fn is_local_refusal(self) -> bool {
        matches!(
            self,
            Reason::Throttled
                | Reason::BreakerOpen
                | Reason::BulkheadFull
                | Reason::RateLimitedLocally
        )
    }

    /// The reason in a few lowercase words (its `Display`, but for gRPC codes).
    pub(crate) const fn description(self) -> &'static str {
        match self {
            Reason::Success => "success",
            Reason::RateLimited => "rate limited by the server",
            Reason::Overloaded => "server overloaded",
            Reason::Unavailable => "service unavailable",
            Reason::ServerError => "server error",
            Reason::Timeout => "timed out",
            Reason::Transport => "connection failed",
            Reason::QuotaExhausted => "quota, spend limit or billing exhausted",
            Reason::ContextTooLong => "prompt exceeds the context window",
            Reason::ContentFiltered => "refused by a content filter",
            Reason::BadRequest => "bad request",
            Reason::Unauthorized => "unauthorized",
            Reason::Forbidden => "forbidden",
            Reason::NotFound => "not found",
            Reason::PayloadTooLarge => "payload too large",
            Reason::Unprocessable => "unprocessable request",
            Reason::Conflict => "conflict",
            Reason::ServerSaidRetry => "server asked for a retry",
            Reason::ServerSaidNoRetry => "server asked not to retry",
            Reason::ClientError => "client error",
            Reason::Grpc(_) => "grpc status",
            Reason::Throttled => "throttled locally: the backend is rejecting",
            Reason::RetryBudgetExhausted => "retry budget exhausted",
            Reason::BreakerOpen => "circuit breaker open: the backend is failing",
            Reason::BulkheadFull => "too many requests in flight to the backend",
            Reason::RateLimitedLocally => "over the client's rate limit",
            Reason::NoBackend => "no backend available: every provider is failing",
            Reason::DeadlineExceeded => "deadline exceeded",
            Reason::Other => "unidentified error",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Grpc(code) => write!(f, "grpc status {} {}", code.as_i32(), code.as_str()),
            other => f.write_str(other.description()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_REASONS: [Reason; 29] = [
        Reason::Success,
        Reason::RateLimited,
        Reason::Overloaded,
        Reason::Unavailable,
        Reason::ServerError,
        Reason::Timeout,
        Reason::Transport,
        Reason::QuotaExhausted,
        Reason::ContextTooLong,
        Reason::ContentFiltered,
        Reason::BadRequest,
        Reason::Unauthorized,
        Reason::Forbidden,
        Reason::NotFound,
        Reason::PayloadTooLarge,
        Reason::Unprocessable,
        Reason::Conflict,
        Reason::ServerSaidRetry,
        Reason::ServerSaidNoRetry,
        Reason::ClientError,
        Reason::Grpc(GrpcCode::Unavailable),
        Reason::Throttled,
        Reason::RetryBudgetExhausted,
        Reason::BreakerOpen,
        Reason::BulkheadFull,
        Reason::RateLimitedLocally,
        Reason::NoBackend,
        Reason::DeadlineExceeded,
        Reason::Other,
    ];

    #[test]
    fn constructors_answer_the_three_questions() {
        let success = Outcome::success();
        assert!(success.is_success() && !success.is_retryable() && !success.is_fatal());
        assert!(success.is_accepted());
        let retryable = Outcome::retryable(Reason::Unavailable);
        assert!(retryable.is_retryable() && !retryable.is_success() && !retryable.is_fatal());
        assert!(!retryable.is_accepted());
        let fatal = Outcome::fatal(Reason::BadRequest);
        assert!(fatal.is_fatal() && !fatal.is_retryable() && !fatal.is_success());
        assert!(fatal.is_accepted());
        let changed = retryable
            .with_accepted(true)
            .with_retry_after(Some(Duration::from_secs(3)));
        assert!(changed.is_accepted());
        assert_eq!(changed.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(changed.reason(), Reason::Unavailable);
        assert_eq!(Outcome::default(), Outcome::success());
    }

    #[test]
    fn outcome_is_small() {
        assert!(std::mem::size_of::<Outcome>() <= 24);
    }

    #[test]
    fn reasons_print_distinct_snake_case_labels() {
        let mut labels: Vec<&str> = ALL_REASONS.iter().map(|reason| reason.as_str()).collect();
        for label in &labels {
            assert!(
                label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label}"
            );
        }
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ALL_REASONS.len());
        assert_eq!(
            Reason::Grpc(GrpcCode::ResourceExhausted).as_str(),
            "grpc_resource_exhausted"
        );
        assert_eq!(
            Reason::Grpc(GrpcCode::Unavailable).to_string(),
            "grpc status 14 UNAVAILABLE"
        );
        assert_eq!(
            Reason::RateLimited.to_string(),
            "rate limited by the server"
        );
    }

    #[test]
    fn outcome_display_says_everything() {
        let outcome = Outcome::retryable(Reason::RateLimited)
            .with_retry_after(Some(Duration::from_millis(1500)));
        assert_eq!(
            outcome.to_string(),
            "retryable (rate limited by the server), rejected by the backend, server asks to retry after 1.5s"
        );
        assert_eq!(
            Outcome::fatal(Reason::ContextTooLong).to_string(),
            "fatal (prompt exceeds the context window)"
        );
        assert_eq!(Outcome::success().to_string(), "success (success)");
    }
}
