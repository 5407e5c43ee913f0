//! The HTTP status rules and the header rules every classifier shares.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::grpc::code::GrpcCode;
use crate::headers;
use crate::hint;
use crate::outcome::{Outcome, Reason, Verdict};

/// The outcome of an HTTP status alone (see the table of [`HttpClassifier`]).
pub const fn status_outcome(status: StatusCode) -> Outcome {
    match status.as_u16() {
        100..=399 => Outcome::success(),
        code @ 400..=499 => client_error(code),
        code => server_error(code),
    }
}

const fn client_error(code: u16) -> Outcome {
    match code {
        400 => Outcome::fatal(Reason::BadRequest),
        401 => Outcome::fatal(Reason::Unauthorized),
        402 => Outcome::fatal(Reason::QuotaExhausted),
        403 => Outcome::fatal(Reason::Forbidden),
        404 | 410 => Outcome::fatal(Reason::NotFound),
        408 => Outcome::retryable(Reason::Timeout),
        409 => Outcome::retryable(Reason::Conflict).with_accepted(true),
        413 => Outcome::fatal(Reason::PayloadTooLarge),
        421 | 425 => Outcome::retryable(Reason::ClientError).with_accepted(true),
        422 => Outcome::fatal(Reason::Unprocessable),
        429 => Outcome::retryable(Reason::RateLimited),
        _ => Outcome::fatal(Reason::ClientError),
    }
}

const fn server_error(code: u16) -> Outcome {
    match code {
        501 | 505 => Outcome::fatal(Reason::ServerError),
        502 | 503 => Outcome::retryable(Reason::Unavailable),
        504 => Outcome::retryable(Reason::Timeout),
        529 => Outcome::retryable(Reason::Overloaded),
        _ => Outcome::retryable(Reason::ServerError),
    }
}

/// Is this reason a rate limit, for which the reset headers make a hint?
const fn is_rate_limit(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::RateLimited | Reason::Grpc(GrpcCode::ResourceExhausted)
    )
}

/// Applies the header rules (see [`HttpClassifier`]) to an outcome: `x-should-retry`, then the hint.
/// `hint` is the best hint found so far (standard headers, pushback, body); the reset headers
/// are read only when it is `None`.
pub(crate) fn finish(
    mut outcome: Outcome,
    headers: &HeaderMap,
    hint: Option<Duration>,
    now: SystemTime,
) -> Outcome {
    if outcome.is_success() {
        return outcome;
    }
    if let Some(should_retry) = headers
        .get(headers::X_SHOULD_RETRY)
        .and_then(hint::should_retry)
    {
        let accepted = outcome.is_accepted();
        match (should_retry, outcome.verdict()) {
            (false, Verdict::Retryable) => {
                outcome = Outcome::fatal(Reason::ServerSaidNoRetry).with_accepted(accepted);
            }
            (true, Verdict::Fatal) if outcome.reason() != Reason::ServerSaidNoRetry => {
                outcome = Outcome::retryable(Reason::ServerSaidRetry).with_accepted(accepted);
            }
            _ => {}
        }
    }
    if !outcome.is_retryable() {
        return outcome.with_retry_after(None);
    }
    let hint = hint.or_else(|| {
        is_rate_limit(outcome.reason())
            .then(|| hint::rate_limit_reset(headers, now))
            .flatten()
    });
    outcome.with_retry_after(hint)
}

/// Classifies an HTTP response head: status rules, then header rules.
pub(crate) fn classify(parts: &http::response::Parts, now: SystemTime) -> Outcome {
    let outcome = status_outcome(parts.status);
    if outcome.is_success() {
        return outcome;
    }
    let hint = hint::server_hint(&parts.headers, now);
    finish(outcome, &parts.headers, hint, now)
}

/// Ready classifier for plain HTTP backends: the status rules and header rules below,
/// no body; errors are classified like [`TransportClassifier`](crate::TransportClassifier).
/// Use [`LlmClassifier`](crate::LlmClassifier) when responses may be gRPC or carry provider error
/// bodies.
///
/// | status | verdict | accepted | reason |
/// |---|---|---|---|
/// | 1xx, 2xx, 3xx | success | yes | |
/// | 408 Request Timeout | retryable | no | `timeout` |
/// | 409 Conflict | retryable | yes | `conflict` (a lock or concurrent update; the OpenAI and Anthropic SDKs retry it) |
/// | 421 Misdirected Request, 425 Too Early | retryable | yes | `client_error` (RFC 9110 15.5.20, RFC 8470: retry on another connection / later) |
/// | 429 Too Many Requests | retryable | no | `rate_limited` |
/// | 400, 401, 402, 403, 404, 410, 413, 422, other 4xx | fatal | yes | `bad_request`, `unauthorized`, `quota_exhausted`, `forbidden`, `not_found`, `not_found`, `payload_too_large`, `unprocessable`, `client_error` |
/// | 500, 502, 503, 504, 529, other 5xx | retryable | no | `server_error`, `unavailable`, `unavailable`, `timeout`, `overloaded`, `server_error` |
/// | 501 Not Implemented, 505 HTTP Version Not Supported | fatal | yes | `server_error` (the same request gets the same answer) |
///
/// Then the header rules, in this order:
/// 1. `x-should-retry: true | false` overrides the verdict either way (a fatal answer becomes
///    retryable with reason `server_said_retry`, a retryable one fatal with `server_said_no_retry`;
///    "accepted" keeps the status's answer). An explicit "stop" already taken from
///    `grpc-retry-pushback-ms` is not overridden: of two conflicting server signals the one that
///    sends no more traffic wins. It is ignored on successes: a success is never retried.
/// 2. A retryable outcome gets a hint, by precedence: `retry-after-ms`, `retry-after`,
///    `grpc-retry-pushback-ms`, the body's `RetryInfo.retryDelay`, and, for rate limits only,
///    the `x-ratelimit-reset-*` / `anthropic-ratelimit-*-reset` headers. Fatal outcomes carry no
///    hint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpClassifier;

impl HttpClassifier {
    /// Classifies a response head, dating HTTP-date hints from `now` (deterministic tests).
    pub fn classify_http_at(&self, parts: &http::response::Parts, now: SystemTime) -> Outcome {
        classify(parts, now)
    }
}

impl crate::Classify for HttpClassifier {
    fn classify_http(&self, parts: &http::response::Parts, _body: &[u8]) -> Outcome {
        if parts.status.as_u16() < 400 {
            return Outcome::success();
        }
        classify(parts, SystemTime::now())
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        crate::transport::classify_error(error)
    }

    fn needs_body(&self, _parts: &http::response::Parts) -> bool {
        false
    }
}
