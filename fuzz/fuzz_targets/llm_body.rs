//! `LlmClassifier::classify_http` on an arbitrary status, arbitrary values of every header it
//! reads, and an arbitrary body (of any length): no panic, hints bounded by `HINT_CEILING`, only
//! retryable outcomes carry a hint, successes are accepted, and the classifier reads no more than
//! `ERROR_BODY_LIMIT` bytes of the body.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderName, Response, StatusCode};
use libfuzzer_sys::fuzz_target;
use stormguard_classify::hint::HINT_CEILING;
use stormguard_classify::{
    Classify, ERROR_BODY_LIMIT, GrpcClassifier, HttpClassifier, LlmClassifier, headers,
};

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

fuzz_target!(|data: &[u8]| {
    let (seed, data) = stormguard_fuzz::u64_and_rest(data);
    let Ok(status) = StatusCode::from_u16(100 + (seed % 900) as u16) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs((seed >> 16) % 4_000_000_000);
    let (headers, body) = stormguard_fuzz::headers_and_rest(data, &names());
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    let (parts, ()) = response.into_parts();

    let classifier = LlmClassifier::default();
    let outcome = classifier.classify_http_at(&parts, body, now);
    assert!(
        outcome
            .retry_after()
            .is_none_or(|hint| hint <= HINT_CEILING)
    );
    if !outcome.is_retryable() {
        assert_eq!(outcome.retry_after(), None);
    }
    if outcome.is_success() {
        assert!(outcome.is_accepted());
    }
    // Bytes past the limit are never read: a longer body classifies like its prefix.
    if body.len() > ERROR_BODY_LIMIT {
        let prefix = classifier.classify_http_at(&parts, &body[..ERROR_BODY_LIMIT], now);
        assert_eq!(outcome, prefix);
    }
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
});
