//! [`LlmClassifier`]: the default classifier for `http` services.

mod body;

use std::time::SystemTime;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};

use crate::grpc::{self, is_grpc};
use crate::headers;
use crate::hint;
use crate::outcome::Outcome;
use crate::status::{self, status_outcome};

pub(crate) use body::ErrorBody;

/// The default classifier for `http` services: one default that is right for an LLM API, a tonic
/// channel and a plain HTTP backend.
///
/// Per response:
/// 1. gRPC responses (`content-type: application/grpc...`, see [`is_grpc`]) follow the gRPC rules
///    ([`GrpcClassifier`](crate::GrpcClassifier)): `grpc-status` in the headers of a trailers-only
///    response, `grpc-retry-pushback-ms`; a `200` without `grpc-status` is a success (the stream
///    started).
/// 2. Other responses follow the HTTP status rules ([`HttpClassifier`](crate::HttpClassifier)).
/// 3. The JSON error body of a non-2xx response refines the verdict and the reason, in the shapes
///    of OpenAI, Anthropic and Gemini / Vertex AI: 429 `insufficient_quota` is fatal, 429
///    `rate_limit_exceeded` retryable, 400 `context_length_exceeded` fatal with reason
///    `context_too_long`, a Gemini `RetryInfo` gives a hint, a Gemini daily `QuotaFailure` is
///    fatal ...
/// 4. Headers: `x-should-retry` overrides the verdict either way, then a retryable outcome gets
///    the server's hint (`retry-after-ms` > `retry-after` > `grpc-retry-pushback-ms` > body
///    `RetryInfo` > rate-limit reset headers).
///
/// Errors are classified like [`TransportClassifier`](crate::TransportClassifier).
///
/// # Provider error bodies
/// Shapes understood (the documented error formats of each provider):
///
/// - OpenAI (and Azure OpenAI, Groq, Mistral, vLLM and other compatible servers):
///   `{"error": {"message", "type", "param", "code"}}`, where `code` may be a string, a number or
///   null; Azure adds `"innererror": {"code": "ResponsibleAIPolicyViolation"}`. The flat form
///   `{"object": "error", "message", "type", "code"}` is read too.
/// - Anthropic: `{"type": "error", "error": {"type": "overloaded_error", "message"}}`; a
///   monthly spend limit is a `rate_limit_error` with `"details": {"error_code":
///   "enforced_spend_limit_reached"}` (fatal, unlike the rate limit it resembles).
/// - Gemini / Vertex AI (Google's `google.rpc.Status` in JSON):
///   `{"error": {"code": 429, "message", "status": "RESOURCE_EXHAUSTED", "details": [...]}}`, with
///   `google.rpc.RetryInfo` (`retryDelay`), `google.rpc.QuotaFailure` (`violations`) and
///   `google.rpc.ErrorInfo` (`reason`, `metadata.quota_limit`) details, and the legacy
///   `errors: [{"reason": "rateLimitExceeded"}]`;
///   also wrapped in an array, `[{"error": {...}}]`, as some Google endpoints send it.
///
/// The body is read in one `serde_json` pass (whose recursion limit of 128 bounds nesting) that
/// keeps only the fields at those paths, borrowed from the body (a typical error body is read
/// without allocating), looks at no more than 16 items of any array, and reads nothing past
/// [`ERROR_BODY_LIMIT`](crate::ERROR_BODY_LIMIT) bytes. A body that is empty, not
/// JSON, truncated or of another shape yields nothing, and the status decides alone.
///
/// Then, by precedence: a daily quota is fatal `quota_exhausted`; quota, billing, spend-limit,
/// context-length and content-policy kinds are fatal whatever the status; other kinds only rename
/// the reason when they agree with the status's verdict; the message names fatal answers that
/// stayed generic ("prompt is too long", "credit balance is too low").
///
/// The success path is a status check and one `content-type` lookup (plus a `grpc-status` lookup
/// for gRPC): no allocation, no clock read. The classifier is `Copy`, so cloning it per request
/// costs nothing.
///
/// ```
/// use http::Response;
/// use stormguard_classify::{LlmClassifier, Reason};
///
/// let (parts, ()) = Response::builder()
///     .status(429)
///     .header("retry-after-ms", "1500")
///     .header("retry-after", "5")
///     .body(())
///     .unwrap()
///     .into_parts();
/// let body = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
/// let outcome = LlmClassifier::default().classify_http(&parts, body);
/// assert!(outcome.is_retryable());
/// assert_eq!(outcome.reason(), Reason::RateLimited);
/// assert_eq!(outcome.retry_after(), Some(std::time::Duration::from_millis(1500)));
///
/// let quota = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
/// let outcome = LlmClassifier::default().classify_http(&parts, quota);
/// assert!(outcome.is_fatal());
/// assert_eq!(outcome.reason(), Reason::QuotaExhausted);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlmClassifier {
    // No settings today; a private field keeps `LlmClassifier::default()` the way to make one,
    // so that settings can come without breaking callers.
    _private: (),
}

impl LlmClassifier {
    /// The classifier (`Copy`: cloning it per request costs nothing).
    pub const fn new() -> Self {
        LlmClassifier { _private: () }
    }

    /// Classifies a response head plus its buffered (possibly empty, possibly truncated) body.
    pub fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        if is_plain_success(parts, parts.headers.get(CONTENT_TYPE)) {
            return Outcome::success();
        }
        self.classify_http_at(parts, body, SystemTime::now())
    }

    /// [`classify_http`](LlmClassifier::classify_http) with the current time given, for HTTP-date
    /// and RFC 3339 hints (deterministic tests).
    pub fn classify_http_at(
        &self,
        parts: &http::response::Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Outcome {
        if is_grpc(&parts.headers) {
            return grpc::classify(parts, now);
        }
        let base = status_outcome(parts.status);
        if base.is_success() {
            return base;
        }
        let body = ErrorBody::parse(body);
        let outcome = body.map_or(base, |body| body.refine(base));
        let hint = hint::server_hint(&parts.headers, now)
            .or_else(|| body.and_then(|body| body.retry_delay));
        status::finish(outcome, &parts.headers, hint, now)
    }

    /// Classifies a provider's error that came without a status of its own, already parsed as
    /// JSON: the data of an error event in a stream whose response was a `200` (Anthropic's
    /// `{"type": "error", "error": {...}}`, OpenAI's `{"error": {...}}` frame, the `response.error`
    /// of OpenAI's `response.failed`), as `stormguard-stream` reads it.
    ///
    /// The rules are those of error bodies (see the [type docs](LlmClassifier)), with the kind the
    /// error names standing in for the status and keeping the verdict and reason it has on its own
    /// (`overloaded_error` is retryable `overloaded`, `invalid_request_error` fatal
    /// `bad_request` ...). An error that names no kind this classifier knows, or JSON of no error
    /// shape, gets `fallback` (still refined: a daily Gemini quota is fatal). A retryable outcome
    /// takes the error's `RetryInfo` delay as its hint.
    ///
    /// ```
    /// use stormguard_classify::{LlmClassifier, Outcome, Reason};
    ///
    /// let error = serde_json::json!({"type": "error", "error": {"type": "overloaded_error"}});
    /// let fallback = Outcome::retryable(Reason::ServerError);
    /// let outcome = LlmClassifier::new().classify_without_status(&error, fallback);
    /// assert!(outcome.is_retryable() && !outcome.is_accepted());
    /// assert_eq!(outcome.reason(), Reason::Overloaded);
    ///
    /// let unknown = serde_json::json!({"error": {"message": "something broke"}});
    /// assert_eq!(LlmClassifier::new().classify_without_status(&unknown, fallback), fallback);
    /// ```
    pub fn classify_without_status(&self, error: &serde_json::Value, fallback: Outcome) -> Outcome {
        ErrorBody::from_value(error).map_or(fallback, |body| body.outcome_without_status(fallback))
    }
}

/// The fast path: a 1xx-3xx non-gRPC response, or a gRPC `200` whose headers carry no failing
/// `grpc-status`.
/// `content_type`: the response's, read once by the caller.
fn is_plain_success(parts: &http::response::Parts, content_type: Option<&HeaderValue>) -> bool {
    if parts.status.as_u16() >= 400 {
        return false;
    }
    if !content_type.is_some_and(crate::grpc::is_grpc_type) {
        return true;
    }
    parts.status == StatusCode::OK
        && parts
            .headers
            .get(headers::GRPC_STATUS)
            .is_none_or(|value| value.as_bytes() == b"0")
}

impl crate::Classify for LlmClassifier {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        LlmClassifier::classify_http(self, parts, body)
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        crate::transport::classify_error(error)
    }

    /// One reading of the content type for both answers: the common success, neither gRPC nor
    /// an error, is known from it and the status.
    fn classify_head(&self, parts: &http::response::Parts) -> (Outcome, bool) {
        let content_type = parts.headers.get(CONTENT_TYPE);
        if is_plain_success(parts, content_type) {
            let stream = content_type.is_some_and(crate::body::is_event_stream_type);
            return (Outcome::success(), stream);
        }
        // An error or a failed gRPC call: not a stream to guard.
        (self.classify_http_at(parts, &[], SystemTime::now()), false)
    }

    fn needs_body(&self, parts: &http::response::Parts) -> bool {
        parts.status.as_u16() >= 400 && !is_grpc(&parts.headers)
    }
}

#[cfg(test)]
mod tests;
