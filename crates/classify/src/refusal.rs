//! The answer stormguard gives in place of a backend's: one shape for every refusal.
//!
//! A server layer that sheds a request (an expired deadline, a retry beyond the budget), and a
//! gateway that answers for an upstream call that failed without a response, both answer with
//! [`refusal_response`]. The status follows the outcome's reason; every refusal is marked "do not
//! retry" ([`mark_do_not_retry`]): whoever refused already did all the retrying the system can
//! afford, and retrying at one layer only is what keeps 3 x 3 = 9 attempts per call from happening.

use std::error::Error;

use http::{HeaderValue, Response, StatusCode, header};

use crate::grpc::code::GrpcCode;
use crate::headers::{APPLICATION_GRPC, GRPC_MESSAGE, GRPC_STATUS, RETRY_AFTER, mark_do_not_retry};
use crate::outcome::{Outcome, Reason};

/// The response for a request stormguard answers itself, because of `outcome`:
///
/// | reason | HTTP | gRPC |
/// |---|---|---|
/// | `throttled`, `retry_budget_exhausted`, `breaker_open`, `bulkhead_full` | 503 | `UNAVAILABLE` |
/// | `rate_limited_locally` | 429 | `RESOURCE_EXHAUSTED` |
/// | `deadline_exceeded`, `timeout` | 504 | `DEADLINE_EXCEEDED` |
/// | `bad_request` (a request body that could not be read) | 400 | `INVALID_ARGUMENT` |
/// | any other (an upstream failure) | 502 | `UNAVAILABLE` |
///
/// HTTP answers carry the status and `x-should-retry: false` (honoured by the official OpenAI and
/// Anthropic SDKs), and `retry-after` (whole seconds, rounded up) when the outcome says when the
/// refusal ends (an open circuit breaker and a rate limit do): for a caller that schedules work, not for an
/// SDK's automatic retry. gRPC answers are trailers-only, as gRPC's "PROTOCOL-HTTP2" specification
/// prescribes for errors raised before any message: HTTP 200, `content-type: application/grpc`,
/// `grpc-status`, `grpc-message` (the reason in words) and `grpc-retry-pushback-ms: -1` (gRFC A6:
/// do not retry). The body is `B::default()`.
///
/// ```
/// use stormguard_classify::{Outcome, Reason, refusal_response};
///
/// let expired = Outcome::fatal(Reason::DeadlineExceeded);
/// let http: http::Response<()> = refusal_response(&expired, false);
/// assert_eq!(http.status(), 504);
/// assert_eq!(http.headers()["x-should-retry"], "false");
///
/// let grpc: http::Response<()> = refusal_response(&expired, true);
/// assert_eq!(grpc.status(), 200);
/// assert_eq!(grpc.headers()["grpc-status"], "4");
/// assert_eq!(grpc.headers()["grpc-message"], "deadline exceeded");
/// assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
/// ```
pub fn refusal_response<B: Default>(outcome: &Outcome, grpc: bool) -> Response<B> {
    let reason = outcome.reason();
    let (status, code) = match reason {
        Reason::Throttled
        | Reason::RetryBudgetExhausted
        | Reason::BreakerOpen
        | Reason::BulkheadFull
        | Reason::NoBackend => (StatusCode::SERVICE_UNAVAILABLE, GrpcCode::Unavailable),
        Reason::RateLimitedLocally => (StatusCode::TOO_MANY_REQUESTS, GrpcCode::ResourceExhausted),
        Reason::DeadlineExceeded | Reason::Timeout => {
            (StatusCode::GATEWAY_TIMEOUT, GrpcCode::DeadlineExceeded)
        }
        Reason::BadRequest => (StatusCode::BAD_REQUEST, GrpcCode::InvalidArgument),
        _ => (StatusCode::BAD_GATEWAY, GrpcCode::Unavailable),
    };
    let mut response = Response::new(B::default());
    if grpc {
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, APPLICATION_GRPC);
        headers.insert(GRPC_STATUS, HeaderValue::from(code.as_i32()));
        headers.insert(GRPC_MESSAGE, HeaderValue::from_static(reason.description()));
    } else {
        *response.status_mut() = status;
        if let Some(after) = outcome.retry_after() {
            // Whole seconds, rounded up: RFC 9110's delay-seconds.
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
    }
    mark_do_not_retry(response.headers_mut(), grpc);
    response
}

/// What a gateway should answer when its upstream call failed with `error` instead of returning
/// a response: [`refusal_response`] for the error's classification (its [`Failure`](crate::Failure)
/// when stormguard raised it, else what [`TransportClassifier`](crate::TransportClassifier) makes
/// of it). A request stormguard throttled gets 503, one whose deadline passed 504, any other
/// failure 502; all of them are marked "do not retry".
///
/// Pass `grpc = true` when answering a gRPC request ([`is_grpc`](crate::is_grpc) of its headers).
///
/// It takes the error as a gateway holds it ([`AsError`]): the [`BoxError`](crate::BoxError) of a
/// tower `Service` (what axum's `HandleErrorLayer` hands its handler), as `&error`; stormguard's
/// own errors; a `&dyn Error`.
///
/// ```
/// use stormguard_classify::{BoxError, Failure, Outcome, Reason, error_response};
///
/// let error: BoxError = Box::new(Failure::new(Outcome::fatal(Reason::Throttled)));
/// let response: http::Response<()> = error_response(&error, false);
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["x-should-retry"], "false");
/// ```
pub fn error_response<B: Default>(error: &(impl AsError + ?Sized), grpc: bool) -> Response<B> {
    refusal_response(&crate::transport::classify_error(error.as_error()), grpc)
}

/// An error as a gateway holds it, for [`error_response`]: the `BoxError` every tower `Service`
/// fails with (any `Box` or `Arc` of an error), a `&dyn Error`, or one of stormguard's errors
/// (each crate implements it for its own). Another error type is passed as `&error as &dyn Error`.
///
/// A trait rather than `&dyn Error`: a `&Box<dyn Error + Send + Sync>` does not coerce to
/// `&dyn Error` (the box is no `Error` itself), and one blanket impl for every `Error` would
/// leave no room for the box's.
pub trait AsError {
    /// The error, as a trait object whose source chain can be walked.
    fn as_error(&self) -> &(dyn Error + 'static);
}

impl AsError for dyn Error + 'static {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl AsError for dyn Error + Send + 'static {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl AsError for dyn Error + Send + Sync + 'static {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl<T: AsError + ?Sized> AsError for Box<T> {
    fn as_error(&self) -> &(dyn Error + 'static) {
        (**self).as_error()
    }
}

impl<T: AsError + ?Sized> AsError for std::sync::Arc<T> {
    fn as_error(&self) -> &(dyn Error + 'static) {
        (**self).as_error()
    }
}

impl AsError for std::io::Error {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl AsError for crate::Failure {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl<B: 'static> AsError for crate::ClassifiedError<B> {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Failure;
    use crate::headers::{GRPC_RETRY_PUSHBACK_MS, X_SHOULD_RETRY};

    fn status(reason: Reason) -> StatusCode {
        refusal_response::<()>(&Outcome::fatal(reason), false).status()
    }

    #[test]
    fn each_reason_gets_its_status_and_every_answer_says_do_not_retry() {
        assert_eq!(status(Reason::Throttled), 503);
        assert_eq!(status(Reason::RetryBudgetExhausted), 503);
        assert_eq!(status(Reason::DeadlineExceeded), 504);
        assert_eq!(status(Reason::BadRequest), 400);
        assert_eq!(status(Reason::Transport), 502);
        assert_eq!(status(Reason::ServerError), 502);
        for reason in [Reason::Throttled, Reason::Transport] {
            let http: Response<()> = refusal_response(&Outcome::fatal(reason), false);
            assert_eq!(http.headers()[X_SHOULD_RETRY], "false");
            assert!(http.headers().get(GRPC_STATUS).is_none());
            let grpc: Response<()> = refusal_response(&Outcome::fatal(reason), true);
            assert_eq!(grpc.status(), 200);
            assert_eq!(grpc.headers()[header::CONTENT_TYPE], "application/grpc");
            assert_eq!(grpc.headers()[GRPC_STATUS], "14");
            assert_eq!(grpc.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
            assert!(grpc.headers().get(X_SHOULD_RETRY).is_none());
        }
    }

    #[test]
    fn a_refusal_that_ends_says_when_in_whole_seconds() {
        let open = Outcome::fatal(Reason::BreakerOpen)
            .with_accepted(false)
            .with_retry_after(Some(std::time::Duration::from_millis(2_100)));
        let http: Response<()> = refusal_response(&open, false);
        assert_eq!(http.status(), 503);
        assert_eq!(http.headers()[RETRY_AFTER], "3");
        assert_eq!(http.headers()[X_SHOULD_RETRY], "false");
        assert_eq!(status(Reason::BulkheadFull), 503);
        let paced = Outcome::fatal(Reason::RateLimitedLocally)
            .with_accepted(false)
            .with_retry_after(Some(std::time::Duration::from_millis(400)));
        let http: Response<()> = refusal_response(&paced, false);
        assert_eq!(http.status(), 429);
        assert_eq!(http.headers()[RETRY_AFTER], "1");
        assert_eq!(http.headers()[X_SHOULD_RETRY], "false");
        let grpc: Response<()> = refusal_response(&open, true);
        assert!(grpc.headers().get(RETRY_AFTER).is_none());
    }

    #[test]
    fn error_responses_read_the_failure_in_the_chain() {
        let throttled = Failure::new(Outcome::fatal(Reason::Throttled));
        let wrapped = std::io::Error::other(throttled);
        let response: Response<()> = error_response(&wrapped, false);
        assert_eq!(response.status(), 503);

        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(error_response::<()>(&refused, false).status(), 502);
    }

    /// What a tower `Service` fails with, and what a gateway's error handler holds: a `BoxError`,
    /// answered through a plain reference to it.
    #[test]
    fn a_box_error_is_answered_as_it_is_held() {
        let expired: crate::BoxError =
            Box::new(Failure::new(Outcome::fatal(Reason::DeadlineExceeded)));
        let response: Response<()> = error_response(&expired, false);
        assert_eq!(response.status(), 504);
        assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    }
}

/// In the extensions of an answer made in the process in place of the backend's (a breaker's
/// [fallback](https://docs.rs/stormguard-breaker) while it is open, a failover's degraded answer
/// when no backend can answer): the backend never answered it, and this is why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalAnswer {
    outcome: Outcome,
}

impl LocalAnswer {
    /// Marks an answer made because of `outcome` (fatal, not accepted: the refusal or failure
    /// that kept the backend from answering).
    pub fn new(outcome: Outcome) -> Self {
        Self { outcome }
    }

    /// Why the backend did not answer: the refusal's or the last failure's outcome.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
}
