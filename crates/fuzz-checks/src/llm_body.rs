//! `LlmClassifier::classify_http` on an arbitrary status, arbitrary values of every header it
//! reads, and an arbitrary body (of any length): no panic, hints bounded by `HINT_CEILING`, only
//! retryable outcomes carry a hint, successes are accepted, and the classifier reads no more than
//! `ERROR_BODY_LIMIT` bytes of the body.
//!
//! The other readers of error bodies: `classify_without_status` (the error events of a stream)
//! on the body as JSON, whose outcome is a failure with the same hint rules; and
//! `classify_response`, which reads the error body off a response arriving in chunks (of a size
//! the input picks, the body padded past `ERROR_BODY_LIMIT` when it asks): its outcome is that of
//! the first `ERROR_BODY_LIMIT` bytes, and the caller still reads every byte, in order.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderName, Response, StatusCode};
use stormguard_classify::body::classify_response;
use stormguard_classify::hint::HINT_CEILING;
use stormguard_classify::{
    Classify, ERROR_BODY_LIMIT, GrpcClassifier, HttpClassifier, LlmClassifier, Outcome, Reason,
    TransportClassifier, headers,
};

/// The `LlmClassifier` on a fixed clock, so that a response classified twice gets one outcome.
#[derive(Clone, Copy)]
struct AtTime(SystemTime);

impl Classify for AtTime {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        LlmClassifier::default().classify_http_at(parts, body, self.0)
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        TransportClassifier.classify_error(error)
    }

    fn needs_body(&self, parts: &http::response::Parts) -> bool {
        LlmClassifier::default().needs_body(parts)
    }
}

/// No panic, a bounded hint, and a hint only on a retryable outcome.
pub(crate) fn check_hint(outcome: &Outcome) {
    assert!(
        outcome
            .retry_after()
            .is_none_or(|hint| hint <= HINT_CEILING)
    );
    if !outcome.is_retryable() {
        assert_eq!(outcome.retry_after(), None);
    }
}

fn names() -> Vec<HeaderName> {
    vec![
        headers::RETRY_AFTER,
        headers::RETRY_AFTER_MS,
        headers::X_MS_RETRY_AFTER_MS,
        headers::X_SHOULD_RETRY,
        headers::GRPC_STATUS,
        headers::GRPC_MESSAGE,
        headers::GRPC_RETRY_PUSHBACK_MS,
        http::header::CONTENT_TYPE,
        headers::X_RATELIMIT_RESET_REQUESTS,
        headers::X_RATELIMIT_RESET_TOKENS,
        headers::X_RATELIMIT_REMAINING_REQUESTS,
        headers::X_RATELIMIT_REMAINING_TOKENS,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_RESET,
        headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_REMAINING,
    ]
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let (seed, data) = crate::input::u64_and_rest(data);
    let Ok(status) = StatusCode::from_u16(100 + (seed % 900) as u16) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs((seed >> 16) % 4_000_000_000);
    let (headers, body) = crate::input::headers_and_rest(data, &names());
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    let (parts, ()) = response.into_parts();

    let classifier = LlmClassifier::default();
    let outcome = classifier.classify_http_at(&parts, body, now);
    check_hint(&outcome);
    if outcome.is_success() {
        assert!(outcome.is_accepted());
    }
    // Bytes past the limit are never read: a longer body classifies like its prefix.
    if body.len() > ERROR_BODY_LIMIT {
        let prefix = classifier.classify_http_at(&parts, &body[..ERROR_BODY_LIMIT], now);
        assert_eq!(outcome, prefix);
    }
    // An error event of a stream: the body's JSON with no status of its own.
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) {
        for fallback in [
            Outcome::retryable(Reason::ServerError),
            Outcome::fatal(Reason::BadRequest),
        ] {
            let event = classifier.classify_without_status(&json, fallback);
            assert!(!event.is_success());
            check_hint(&event);
        }
    }

    // The body read off the response as the layers read it, in chunks, maybe past the limit.
    let padded = seed & (1 << 12) != 0;
    let mut streamed = body.to_vec();
    if padded {
        // JSON allows whitespace after the value: the classifier must not look past the limit.
        streamed.resize(ERROR_BODY_LIMIT, b' ');
        streamed.extend_from_slice(body);
    }
    let chunk = 1 + (seed >> 13) as usize % if padded { 16 * 1024 } else { 64 };
    let mut response = Response::new(crate::input::Chunked::new(&streamed, chunk));
    *response.status_mut() = parts.status;
    *response.headers_mut() = parts.headers.clone();
    let at_time = AtTime(now);
    let (response, read) = crate::input::now(classify_response(&at_time, response));
    let seen = &streamed[..streamed.len().min(ERROR_BODY_LIMIT)];
    let expected = if at_time.needs_body(&parts) {
        at_time.classify_http(&parts, seen)
    } else {
        at_time.classify_http(&parts, &[])
    };
    assert_eq!(read, expected);
    let delivered = crate::input::read_body(response.into_body());
    assert_eq!(delivered.as_deref(), Some(&streamed[..]));

    let live = classifier.classify_http(&parts, body);
    assert!(live.retry_after().is_none_or(|hint| hint <= HINT_CEILING));
    let _ = classifier.needs_body(&parts);
    for other in [
        HttpClassifier.classify_http_at(&parts, now),
        GrpcClassifier.classify_http_at(&parts, now),
    ] {
        assert!(other.retry_after().is_none_or(|hint| hint <= HINT_CEILING));
        if !other.is_retryable() {
            assert_eq!(other.retry_after(), None);
        }
    }
}
