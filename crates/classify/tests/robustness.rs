//! Hostile responses the other suites do not reach: gRPC heads with arbitrary status and
//! pushback bytes, provider-shaped JSON bodies whose fields hold arbitrary values, every header
//! the classifier reads (the Anthropic input/output limits and Azure's `x-ms-retry-after-ms`
//! included), and error bodies around the 64 KiB read limit. Outcomes stay bounded by
//! `HINT_CEILING`, only retryable outcomes carry a hint, and a body never turns a fatal status
//! retryable.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use proptest::prelude::*;
use serde_json::{Value, json};
use stormguard_classify::hint::{self, HINT_CEILING, Pushback};
use stormguard_classify::{
    ERROR_BODY_LIMIT, GrpcClassifier, GrpcCode, HttpClassifier, LlmClassifier, Outcome, Reason,
    headers, status_outcome,
};

fn now_from(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn parts(status: u16, headers: HeaderMap) -> http::response::Parts {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    *response.headers_mut() = headers;
    response.into_parts().0
}

/// What every outcome must satisfy, whatever the input.
fn well_formed(outcome: Outcome) -> Result<(), TestCaseError> {
    prop_assert!(
        outcome
            .retry_after()
            .is_none_or(|hint| hint <= HINT_CEILING),
        "hint {:?} above the ceiling",
        outcome.retry_after()
    );
    if !outcome.is_retryable() {
        prop_assert_eq!(outcome.retry_after(), None);
    }
    if outcome.is_success() {
        prop_assert!(outcome.is_accepted());
        prop_assert_eq!(outcome.reason(), Reason::Success);
    }
    Ok(())
}

/// Header values: numbers of every size and sign, dates, Go durations, and arbitrary bytes.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "-?[0-9]{0,30}".prop_map(String::into_bytes),
        "[0-9]{1,8}\\.[0-9]{0,12}".prop_map(String::into_bytes),
        "([0-9]{1,22}(ns|us|µs|ms|s|m|h)){1,4}".prop_map(String::into_bytes),
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[-+][0-9]{2}:[0-9]{2})"
            .prop_map(String::into_bytes),
        Just(b"Sun, 06 Nov 1994 08:49:37 GMT".to_vec()),
        Just(b"Fri, 31 Dec 9999 23:59:59 GMT".to_vec()),
        Just(b"true".to_vec()),
        Just(b"false".to_vec()),
        Just(b"0".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..80),
    ]
}

/// Every header a classifier reads.
fn header_name() -> impl Strategy<Value = HeaderName> {
    prop::sample::select(vec![
        headers::RETRY_AFTER,
        headers::RETRY_AFTER_MS,
        headers::X_MS_RETRY_AFTER_MS,
        headers::X_SHOULD_RETRY,
        headers::GRPC_STATUS,
        headers::GRPC_MESSAGE,
        headers::GRPC_RETRY_PUSHBACK_MS,
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
    ])
}

fn header_map() -> impl Strategy<Value = HeaderMap> {
    proptest::collection::vec((header_name(), header_bytes()), 0..10).prop_map(|pairs| {
        let mut map = HeaderMap::new();
        for (name, bytes) in pairs {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                map.append(name, value);
            }
        }
        map
    })
}

fn grpc_content_type() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "application/grpc",
        "application/grpc+proto",
        "application/grpc; charset=utf-8",
        "application/grpc-web+proto",
        "APPLICATION/GRPC",
    ])
}

/// A string field as a hostile provider might fill it: known tokens, or anything.
fn token() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            "insufficient_quota",
            "rate_limit_exceeded",
            "rate_limit_error",
            "overloaded_error",
            "context_length_exceeded",
            "content_filter",
            "RESOURCE_EXHAUSTED",
            "UNAVAILABLE",
            "invalid_request_error",
            "enforced_spend_limit_reached",
            "error",
        ])
        .prop_map(Value::from),
        ".{0,200}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(Value::Null),
        Just(json!([])),
        Just(json!({})),
    ]
}

/// `google.rpc.RetryInfo.retryDelay` values, well formed or not, up to absurd sizes.
fn retry_delay() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[0-9]{1,25}(\\.[0-9]{1,12})?s".prop_map(Value::from),
        "-?[0-9]{0,5}\\.?[0-9]{0,5}[a-z]{0,2}".prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(json!({"seconds": 34})),
    ]
}

/// Error bodies in the shapes of OpenAI, Anthropic and Gemini, with arbitrary field values.
fn provider_body() -> impl Strategy<Value = Value> {
    (
        0usize..4,
        token(),
        token(),
        token(),
        token(),
        retry_delay(),
        ".{0,40}",
    )
        .prop_map(|(shape, kind, code, status, message, delay, quota)| match shape {
            0 => json!({"error": {"message": message, "type": kind, "param": null, "code": code}}),
            1 => json!({"type": "error", "error": {"type": kind, "message": message,
                "details": {"error_code": code}}}),
            2 => json!({"error": {"code": code, "message": message, "status": status, "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaId": quota, "quotaMetric": kind}]},
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": status,
                    "metadata": {"quota_limit": quota}},
            ]}}),
            _ => json!([{"error": {"code": code, "status": status, "message": message,
                "errors": [{"reason": kind}],
                "innererror": {"code": kind},
                "details": [{"@type": "google.rpc.RetryInfo", "retryDelay": delay}]}}]),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn grpc_heads_with_arbitrary_status_and_pushback_are_bounded(
        http_status in prop::sample::select(vec![200_u16, 400, 429, 500, 503, 504]),
        content_type in grpc_content_type(),
        grpc_status in header_bytes(),
        extra in header_map(),
        now in 0_u64..=253_402_300_799,
    ) {
        let mut map = extra;
        map.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Ok(value) = HeaderValue::from_bytes(&grpc_status) {
            map.insert(headers::GRPC_STATUS, value);
        }
        let parts = parts(http_status, map);
        let now = now_from(now);
        let llm = LlmClassifier::default().classify_http_at(&parts, b"", now);
        let grpc = GrpcClassifier.classify_http_at(&parts, now);
        well_formed(llm)?;
        well_formed(grpc)?;
        // The LLM classifier applies the gRPC rules to gRPC responses, body or not.
        prop_assert_eq!(llm, grpc);
        prop_assert_eq!(
            LlmClassifier::default().classify_http_at(&parts, br#"{"error":{"type":"insufficient_quota"}}"#, now),
            grpc
        );
        // A pushback of "stop" is never overridden into a retry. (`x-should-retry: true` on a
        // fatal code is left out here: see
        // `a_stop_pushback_is_not_undone_by_should_retry_on_a_fatal_code`.)
        let says_retry = parts
            .headers
            .get(headers::X_SHOULD_RETRY)
            .and_then(hint::should_retry)
            == Some(true);
        let stops = parts
            .headers
            .get(headers::GRPC_RETRY_PUSHBACK_MS)
            .is_some_and(|pushback| hint::grpc_pushback(pushback) == Pushback::Stop);
        if stops && !says_retry {
            prop_assert!(!grpc.is_retryable());
        }
        if let Ok(value) = HeaderValue::from_bytes(&grpc_status) {
            let code = GrpcCode::from_header(&value);
            prop_assert_eq!(GrpcCode::from_i32(code.as_i32()), Some(code));
        }
    }

    #[test]
    fn provider_bodies_with_arbitrary_fields_never_loosen_the_status(
        status in 400_u16..=599,
        body in provider_body(),
        now in 0_u64..=4_000_000_000,
    ) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let parts = parts(status, HeaderMap::new());
        let outcome = LlmClassifier::default().classify_http_at(&parts, &bytes, now_from(now));
        well_formed(outcome)?;
        prop_assert!(!outcome.is_success());
        // Without headers only the status can make a failure retryable: the body refines the
        // reason or makes it fatal, never the other way round.
        if status_outcome(parts.status).is_fatal() {
            prop_assert!(outcome.is_fatal(), "{status} + {body} became {outcome:?}");
        }
    }

    #[test]
    fn every_header_the_classifiers_read_is_bounded(
        status in prop_oneof![100_u16..=999, Just(429_u16), Just(503_u16), Just(529_u16)],
        map in header_map(),
        body in prop_oneof![
            provider_body().prop_map(|body| serde_json::to_vec(&body).unwrap()),
            proptest::collection::vec(any::<u8>(), 0..256),
        ],
        now in 0_u64..=253_402_300_799,
    ) {
        let parts = parts(status, map);
        let now = now_from(now);
        well_formed(LlmClassifier::default().classify_http_at(&parts, &body, now))?;
        well_formed(HttpClassifier.classify_http_at(&parts, now))?;
        well_formed(GrpcClassifier.classify_http_at(&parts, now))?;
    }
}

fn quota_body(padding: &str) -> String {
    format!(
        r#"{{"error":{{"message":"You exceeded your current quota{padding}","type":"insufficient_quota","code":"insufficient_quota"}}}}"#
    )
}

/// Around the 64 KiB limit: a body is read up to exactly `ERROR_BODY_LIMIT` bytes. An error that
/// fits is understood whatever follows it; one cut by the limit leaves the status to decide.
#[test]
fn error_bodies_around_the_read_limit() {
    let classifier = LlmClassifier::default();
    let parts = parts(429, HeaderMap::new());
    let fatal = (Reason::QuotaExhausted, true);
    let of = |body: &[u8]| {
        let outcome = classifier.classify_http(&parts, body);
        (outcome.reason(), outcome.is_fatal())
    };

    // Exactly at the limit: read whole.
    let at_limit = quota_body(&"x".repeat(ERROR_BODY_LIMIT - quota_body("").len()));
    assert_eq!(at_limit.len(), ERROR_BODY_LIMIT);
    assert_eq!(of(at_limit.as_bytes()), fatal);

    // One byte more in the message: the prefix is cut inside the JSON, the status decides.
    let past_limit = quota_body(&"x".repeat(ERROR_BODY_LIMIT + 1 - quota_body("").len()));
    assert_eq!(of(past_limit.as_bytes()), (Reason::RateLimited, false));

    // A small error followed by 200 KiB of whitespace: the prefix is still valid JSON.
    let padded = format!("{}{}", quota_body(""), " ".repeat(200 * 1024));
    assert_eq!(of(padded.as_bytes()), fatal);

    // 1 MiB of deep but valid-looking nesting after a valid start: never read, never recursed.
    let deep = format!("{}{}", "[".repeat(1 << 20), "]".repeat(1 << 20));
    assert_eq!(of(deep.as_bytes()), (Reason::RateLimited, false));
}

/// A gRPC response whose pushback says "stop" stays fatal even when `x-should-retry: true` and a
/// huge `retry-after` pull the other way; a huge pushback is a hint at the ceiling.
#[test]
fn conflicting_grpc_signals_resolve_to_less_traffic() {
    let mut map = HeaderMap::new();
    map.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    map.insert(headers::GRPC_STATUS, HeaderValue::from_static("14"));
    map.insert(headers::X_SHOULD_RETRY, HeaderValue::from_static("true"));
    map.insert(
        headers::RETRY_AFTER,
        HeaderValue::from_static("99999999999999999999"),
    );
    map.insert(
        headers::GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from_static("-1"),
    );
    let outcome = GrpcClassifier.classify_http_at(&parts(200, map.clone()), now_from(0));
    assert!(outcome.is_fatal());
    assert_eq!(outcome.retry_after(), None);

    map.insert(
        headers::GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from_str(&"9".repeat(40)).unwrap(),
    );
    let outcome = GrpcClassifier.classify_http_at(&parts(200, map), now_from(0));
    assert!(outcome.is_retryable());
    assert_eq!(outcome.retry_after(), Some(HINT_CEILING));
}

/// gRFC A6 pushback "stop" (`-1`) on a code that is fatal on its own (`RESOURCE_EXHAUSTED`
/// without a hint, `UNKNOWN`) must stay fatal when the server also sends `x-should-retry: true`:
/// the crate documents that the signal sending less traffic wins.
#[test]
fn a_stop_pushback_is_not_undone_by_should_retry_on_a_fatal_code() {
    for code in ["8", "2"] {
        let mut map = HeaderMap::new();
        map.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        map.insert(headers::GRPC_STATUS, HeaderValue::from_static(code));
        map.insert(
            headers::GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from_static("-1"),
        );
        map.insert(headers::X_SHOULD_RETRY, HeaderValue::from_static("true"));
        let outcome = GrpcClassifier.classify_http_at(&parts(200, map), now_from(0));
        assert!(
            !outcome.is_retryable(),
            "grpc-status {code} + pushback -1 + x-should-retry: true gave {outcome:?}"
        );
    }
}
