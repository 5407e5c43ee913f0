//! Hostile input: header values and bodies from the network never panic, overflow or hang, and
//! never turn into a hint longer than the ceiling.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, Response};
use proptest::prelude::*;
use stormguard_classify::hint::{self, HINT_CEILING, Pushback};
use stormguard_classify::{Classify, ERROR_BODY_LIMIT, LlmClassifier, Reason, Verdict};

/// Every header a classifier reads.
const HEADERS: [&str; 14] = [
    "retry-after",
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "x-should-retry",
    "grpc-status",
    "grpc-retry-pushback-ms",
    "content-type",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-requests-reset",
];

fn now_from(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn within_ceiling(hint: Option<Duration>) -> bool {
    hint.is_none_or(|hint| hint <= HINT_CEILING)
}

/// Runs every header parser on one value; all must return a bounded answer.
fn check_all_parsers(value: &HeaderValue, now: SystemTime) {
    assert!(within_ceiling(hint::retry_after(value, now)));
    assert!(within_ceiling(hint::retry_after_ms(value)));
    assert!(within_ceiling(hint::go_duration(value.as_bytes())));
    assert!(within_ceiling(hint::reset_at(value, now)));
    assert!(within_ceiling(hint::protobuf_duration(
        &String::from_utf8_lossy(value.as_bytes())
    )));
    let _ = hint::rfc3339(value.as_bytes());
    let _ = hint::should_retry(value);
    if let Pushback::After(delay) = hint::grpc_pushback(value) {
        assert!(delay <= HINT_CEILING);
    }
    let _ = stormguard_classify::GrpcCode::from_header(value);
}

fn status_strategy() -> impl Strategy<Value = u16> {
    prop_oneof![100_u16..=999, Just(429_u16), Just(503_u16), Just(200_u16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn header_parsers_are_total_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..12_000),
        now in 0_u64..=253_402_300_799,
    ) {
        // Skip values the http crate itself rejects (control characters).
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            check_all_parsers(&value, now_from(now));
        }
    }

    #[test]
    fn grpc_content_type_matches_a_plain_lowercase_comparison(
        text in "[aA][pP]{2}[lL][iI][cC][aA][tT][iI][oO][nN][/\\.][gG][rR][pP][cCdD]([+;\\- \t][a-zA-Z]{0,5})?|[ -~]{0,20}",
    ) {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_str(&text).unwrap());
        let lower = text.to_ascii_lowercase();
        let expected = lower.strip_prefix("application/grpc").is_some_and(|rest| {
            rest.is_empty() || rest.starts_with(['+', ';', ' ', '\t']) || rest.starts_with("-web")
        });
        prop_assert_eq!(stormguard_classify::is_grpc(&headers), expected, "{:?}", text);
    }

    #[test]
    fn header_parsers_are_total_on_number_like_text(
        text in "[ ]{0,2}[-+]?([0-9]{0,40})(\\.[0-9]{0,40})?(e[-+]?[0-9]{1,4})?(ns|us|µs|ms|s|m|h|d)?[ ]{0,2}|[-+]?(inf|Infinity|NaN|nan)",
        now in 0_u64..=4_000_000_000,
    ) {
        let value = HeaderValue::from_str(&text).unwrap();
        check_all_parsers(&value, now_from(now));
        // retry-after: exactly the 64-bit delay-seconds give a hint.
        let trimmed = text.trim();
        let expected = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
            trimmed.parse::<u64>().ok().map(|secs| Duration::from_secs(secs).min(HINT_CEILING))
        } else {
            None
        };
        prop_assert_eq!(hint::retry_after(&value, now_from(now)), expected);
    }

    #[test]
    fn go_durations_never_overflow(
        text in "([0-9]{0,25}(\\.[0-9]{0,25})?(ns|us|µs|μs|ms|s|m|h|x)?){1,6}",
    ) {
        prop_assert!(within_ceiling(hint::go_duration(text.as_bytes())));
    }

    #[test]
    fn rfc3339_agrees_with_httpdate(
        year in 1970_u64..=9999,
        month in 1_u64..=12,
        day in 1_u64..=28,
        hour in 0_u64..24,
        minute in 0_u64..60,
        second in 0_u64..60,
        fraction in proptest::option::of("[0-9]{1,12}"),
    ) {
        let fraction = fraction.map(|digits| format!(".{digits}")).unwrap_or_default();
        let text = format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}Z");
        let parsed = hint::rfc3339(text.as_bytes()).unwrap();
        const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        let formatted = httpdate::fmt_http_date(parsed);
        let month_name = MONTHS[usize::try_from(month - 1).unwrap()];
        let expected = format!("{day:02} {month_name} {year:04} {hour:02}:{minute:02}:{second:02} GMT");
        prop_assert!(formatted.ends_with(&expected), "{} vs {}", formatted, expected);
    }

    #[test]
    fn rfc3339_is_total_on_near_misses(
        text in "[0-9]{1,5}-[0-9]{1,3}-[0-9]{1,3}[Tt ][0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{0,30})?([Zz]|[-+][0-9]{1,3}:[0-9]{1,3})?",
        now in 0_u64..=4_000_000_000,
    ) {
        let _ = hint::rfc3339(text.as_bytes());
        let value = HeaderValue::from_str(&text).unwrap();
        prop_assert!(within_ceiling(hint::reset_at(&value, now_from(now))));
    }

    #[test]
    fn classifier_is_total_on_arbitrary_responses(
        status in status_strategy(),
        headers in proptest::collection::vec(
            (0..HEADERS.len(), proptest::collection::vec(any::<u8>(), 0..64)),
            0..8,
        ),
        body in proptest::collection::vec(any::<u8>(), 0..2_048),
        now in 0_u64..=4_000_000_000,
    ) {
        let mut map = HeaderMap::new();
        for (index, bytes) in headers {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                map.append(HeaderName::from_static(HEADERS[index]), value);
            }
        }
        let mut response = Response::builder().status(status).body(()).unwrap();
        *response.headers_mut() = map;
        let (parts, ()) = response.into_parts();
        let classifier = LlmClassifier::default();
        let outcome = classifier.classify_http_at(&parts, &body, now_from(now));
        prop_assert!(within_ceiling(outcome.retry_after()));
        if !outcome.is_retryable() {
            prop_assert_eq!(outcome.retry_after(), None);
        }
        if outcome.is_success() {
            prop_assert!(outcome.is_accepted());
        }
        let _ = classifier.classify_http(&parts, &body);
        let _ = classifier.needs_body(&parts);
    }

    #[test]
    fn non_json_bodies_never_change_the_status_verdict(
        status in 400_u16..=599,
        body in proptest::collection::vec(any::<u8>(), 0..4_096),
    ) {
        // Bytes that do not start a JSON object or array are not read at all.
        prop_assume!(body.iter().find(|b| !b.is_ascii_whitespace()).is_none_or(|b| *b != b'{' && *b != b'['));
        let (parts, ()) = Response::builder().status(status).body(()).unwrap().into_parts();
        let with_body = LlmClassifier::default().classify_http(&parts, &body);
        let without = LlmClassifier::default().classify_http(&parts, b"");
        prop_assert_eq!(with_body, without);
    }

    #[test]
    fn truncated_provider_bodies_fall_back_to_the_status(cut in 0_usize..400, which in 0_usize..4) {
        let bodies = [
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            r#"{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34s"}]}}"#,
            r#"[{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}}]"#,
        ];
        let body = bodies[which].as_bytes();
        let cut = cut.min(body.len());
        let (parts, ()) = Response::builder().status(429).body(()).unwrap().into_parts();
        let classifier = LlmClassifier::default();
        let whole = classifier.classify_http(&parts, body);
        let status_only = classifier.classify_http(&parts, b"");
        let truncated = classifier.classify_http(&parts, &body[..cut]);
        prop_assert!(truncated == whole || truncated == status_only);
        if cut < body.len() {
            // No prefix of these bodies is valid JSON: the status decides.
            prop_assert_eq!(truncated, status_only);
        }
    }
}

#[test]
fn deeply_nested_bodies_are_refused_by_the_parser_not_the_stack() {
    let classifier = LlmClassifier::default();
    let (parts, ()) = Response::builder()
        .status(503)
        .body(())
        .unwrap()
        .into_parts();
    let expected = (Verdict::Retryable, Reason::Unavailable);
    for depth in [127, 128, 129, 1_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = format!("{}1{}", r#"{"error":"#.repeat(depth), "}".repeat(depth));
        let open_only = "[".repeat(depth);
        for body in [arrays, objects, open_only] {
            let outcome = classifier.classify_http(&parts, body.as_bytes());
            assert_eq!(
                (outcome.verdict(), outcome.reason()),
                expected,
                "depth {depth}"
            );
        }
    }
    // Nesting inside the fields we read is fine too.
    let nested_detail = format!(
        r#"{{"error":{{"status":"UNAVAILABLE","details":[{}]}}}}"#,
        "[".repeat(120) + &"]".repeat(120)
    );
    let outcome = classifier.classify_http(&parts, nested_detail.as_bytes());
    assert_eq!(outcome.reason(), Reason::Unavailable);
}

#[test]
fn bodies_beyond_the_limit_are_cut_not_read() {
    let classifier = LlmClassifier::default();
    let (parts, ()) = Response::builder()
        .status(429)
        .body(())
        .unwrap()
        .into_parts();
    // 1 MiB of a valid JSON array of quota errors: only the first 64 KiB are looked at, which is
    // not valid JSON, so the status decides.
    let item = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}},"#;
    let mut body = String::from("[");
    while body.len() < 1024 * 1024 {
        body.push_str(item);
    }
    body.pop();
    body.push(']');
    assert!(body.len() > ERROR_BODY_LIMIT);
    let outcome = classifier.classify_http(&parts, body.as_bytes());
    assert_eq!(outcome.reason(), Reason::RateLimited);
    assert!(outcome.is_retryable());
}

#[test]
fn ten_kilobyte_and_non_utf8_header_values_give_no_hint() {
    let now = now_from(784_111_777);
    let long = HeaderValue::from_str(&"9".repeat(10 * 1024)).unwrap();
    let latin1 = HeaderValue::from_bytes(b"\xff\xfe 5").unwrap();
    let mu = HeaderValue::from_bytes(b"250\xb5s").unwrap();
    for value in [&long, &latin1, &mu] {
        assert_eq!(hint::retry_after(value, now), None);
        assert_eq!(hint::retry_after_ms(value), None);
        assert_eq!(hint::go_duration(value.as_bytes()), None);
        assert_eq!(hint::reset_at(value, now), None);
        assert_eq!(hint::should_retry(value), None);
    }
    // An absurd pushback still means "wait", never an overflow.
    assert_eq!(hint::grpc_pushback(&long), Pushback::After(HINT_CEILING));
    let classifier = LlmClassifier::default();
    let (parts, ()) = Response::builder()
        .status(503)
        .header("retry-after", long.clone())
        .header("retry-after-ms", latin1)
        .body(())
        .unwrap()
        .into_parts();
    let outcome = classifier.classify_http_at(&parts, b"", now);
    assert!(outcome.is_retryable());
    assert_eq!(outcome.retry_after(), None);
}
