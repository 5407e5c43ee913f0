//! Limits learned from the provider's answers, on tokio's paused clock: OpenAI's
//! `x-ratelimit-*` and Anthropic's `anthropic-ratelimit-*` headers (a stated limit paces, a spent
//! quota blocks until its reset), a 429's `Retry-After`; configured numbers are never replaced;
//! hostile values change nothing and never panic.
//!
//! Anthropic's resets are RFC 3339 times read against the wall clock (`SystemTime::now()`), not
//! the paused clock: the tests write them relative to the wall clock and allow the few
//! milliseconds the wall clock moves while they run.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use stormguard_classify::{LlmClassifier, Outcome, Permit, Reason};
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use support::{head, headers, take, wait_of, wall_clock_in};

const MS: Duration = Duration::from_millis(1);

/// Sends one request through `limit` and shows it `answer`'s headers, with `outcome`.
fn answer(limit: &RateLimit, answer: &HeaderMap, outcome: &Outcome) {
    let permit = limit.reserve(&head(), 0, None).unwrap().send();
    permit.record(outcome, answer);
}

/// What the LLM classifier makes of a response with `status` and `headers`.
fn classified(status: u16, headers: &HeaderMap) -> Outcome {
    let mut response = http::Response::builder().status(status).body(()).unwrap();
    *response.headers_mut() = headers.clone();
    LlmClassifier::default().classify_http(&response.into_parts().0, b"")
}

/// The wait of the next request, which is sent (its slot spent).
fn next_wait(limit: &RateLimit) -> Duration {
    take(limit, 0)
}

/// `RateLimit::default()` knows no limit until OpenAI says `x-ratelimit-limit-requests: 120`:
/// then 2 a second, a bucket of 2.
#[tokio::test(start_paused = true)]
async fn an_openai_limit_of_120_paces_at_2_a_second() {
    let limit = RateLimit::default();
    for _ in 0..100 {
        assert_eq!(next_wait(&limit), Duration::ZERO);
    }
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-requests", "120"),
            ("x-ratelimit-remaining-requests", "119"),
            ("x-ratelimit-reset-requests", "500ms"),
        ]),
        &Outcome::success(),
    );
    assert_eq!(limit.snapshot().requests_per_minute, Some(120));
    let waits: Vec<Duration> = (0..6).map(|_| next_wait(&limit)).collect();
    assert_eq!(waits, [0, 0, 500, 1_000, 1_500, 2_000].map(|ms| ms * MS));
}

/// `x-ratelimit-limit-tokens: 6000`: the limit now weighs requests in tokens, 100 a second.
#[tokio::test(start_paused = true)]
async fn an_openai_token_limit_makes_requests_weigh_their_tokens() {
    let limit = RateLimit::default();
    assert!(!limit.weighs_tokens(&head()));
    answer(
        &limit,
        &headers(&[("x-ratelimit-limit-tokens", "6000")]),
        &Outcome::success(),
    );
    assert!(limit.weighs_tokens(&head()));
    assert_eq!(limit.snapshot().tokens_per_minute, Some(6_000));
    assert_eq!(take(&limit, 100), Duration::ZERO);
    assert_eq!(take(&limit, 50), 500 * MS);
}

/// `x-ratelimit-remaining-requests: 0` with a reset in Go's duration syntax: nothing goes
/// before the reset, even with no limit known (no `x-ratelimit-limit-requests`); a reset
/// beyond the 2 s wait refuses requests with the time until it.
#[tokio::test(start_paused = true)]
async fn a_spent_openai_quota_blocks_until_its_reset() {
    for (reset, after) in [
        ("1.5s", 1_500 * MS),
        ("12ms", 12 * MS),
        ("1s500ms", 1_500 * MS),
        ("0.25s", 250 * MS),
        ("6m0s", Duration::from_secs(360)),
        ("1h2m3s", Duration::from_secs(3_723)),
    ] {
        let limit = RateLimit::default();
        answer(
            &limit,
            &headers(&[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", reset),
            ]),
            &Outcome::success(),
        );
        match limit.reserve(&head(), 0, None) {
            Ok(reservation) => assert_eq!(wait_of(&reservation), after, "{reset}"),
            Err(limited) => {
                assert!(after > Duration::from_secs(2), "{reset}: {limited}");
                assert_eq!(limited.retry_after(), after, "{reset}");
            }
        }
    }
}

/// A spent quota with its limit stated: nothing before the reset, then the stated pace from an
/// empty bucket (120 a minute: one at the reset, the next 500 ms later, the one after beyond
/// the 2 s wait).
#[tokio::test(start_paused = true)]
async fn a_spent_quota_with_its_limit_paces_from_the_reset() {
    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-requests", "120"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.5s"),
        ]),
        &Outcome::success(),
    );
    assert_eq!(next_wait(&limit), 1_500 * MS);
    assert_eq!(next_wait(&limit), 2_000 * MS);
    let limited = limit.reserve(&head(), 0, None).unwrap_err();
    assert_eq!(limited.retry_after(), 2_500 * MS);
}

/// A spent token quota blocks requests that weigh tokens until its reset, from which the bucket
/// fills at the stated rate (60,000 a minute: a token a millisecond).
#[tokio::test(start_paused = true)]
async fn a_spent_openai_token_quota_blocks_until_its_reset() {
    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-tokens", "60000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "800ms"),
        ]),
        &Outcome::success(),
    );
    assert_eq!(take(&limit, 1), 800 * MS);
    assert_eq!(take(&limit, 100), 900 * MS);
}

/// Anthropic: `anthropic-ratelimit-requests-limit: 60` paces at one a second, and
/// `-remaining: 0` with an RFC 3339 `-reset` 1.5 s away blocks until then.
#[tokio::test(start_paused = true)]
async fn anthropic_request_headers_pace_and_block() {
    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("anthropic-ratelimit-requests-limit", "60"),
            ("anthropic-ratelimit-requests-remaining", "59"),
            (
                "anthropic-ratelimit-requests-reset",
                &wall_clock_in(Duration::from_secs(1)),
            ),
        ]),
        &Outcome::success(),
    );
    assert_eq!(limit.snapshot().requests_per_minute, Some(60));
    assert_eq!(next_wait(&limit), Duration::ZERO);
    assert_eq!(next_wait(&limit), Duration::from_secs(1));

    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("anthropic-ratelimit-requests-limit", "60"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            (
                "anthropic-ratelimit-requests-reset",
                &wall_clock_in(1_500 * MS),
            ),
        ]),
        &Outcome::success(),
    );
    let wait = next_wait(&limit);
    assert!(
        (1_400 * MS..=1_500 * MS).contains(&wait),
        "{wait:?}: the reset, less what the wall clock moved"
    );
}

/// Anthropic's token limits: `anthropic-ratelimit-tokens-*` when present, else
/// `anthropic-ratelimit-input-tokens-*`; a spent one blocks token-weighing requests until its
/// reset.
#[tokio::test(start_paused = true)]
async fn anthropic_token_headers_state_the_token_limit() {
    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("anthropic-ratelimit-tokens-limit", "80000"),
            ("anthropic-ratelimit-tokens-remaining", "79000"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ]),
        &Outcome::success(),
    );
    assert_eq!(limit.snapshot().tokens_per_minute, Some(80_000));

    let limit = RateLimit::default();
    answer(
        &limit,
        &headers(&[
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                &wall_clock_in(Duration::from_secs(1)),
            ),
        ]),
        &Outcome::success(),
    );
    assert_eq!(limit.snapshot().tokens_per_minute, Some(40_000));
    assert!(limit.weighs_tokens(&head()));
    let wait = take(&limit, 1);
    assert!((900 * MS..=1_000 * MS).contains(&wait), "{wait:?}");
}

/// A 429 with `retry-after: 2`, to a limit with no numbers that had been sending 20 a second:
/// nothing goes before 2 s, however fast the rate learned from the 429 is.
#[tokio::test(start_paused = true)]
async fn a_429_blocks_until_its_retry_after() {
    let limit = RateLimit::default();
    for _ in 0..20 {
        answer(&limit, &HeaderMap::new(), &Outcome::success());
        tokio::time::advance(50 * MS).await;
    }
    let throttled = headers(&[("retry-after", "2")]);
    let outcome = classified(429, &throttled);
    assert_eq!(outcome.reason(), Reason::RateLimited);
    assert_eq!(outcome.retry_after(), Some(Duration::from_secs(2)));
    answer(&limit, &throttled, &outcome);
    assert_eq!(next_wait(&limit), Duration::from_secs(2));

    // The same with a configured limit, and with `retry-after-ms`.
    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(6_000)));
    let throttled = headers(&[("retry-after-ms", "750")]);
    answer(&limit, &throttled, &classified(429, &throttled));
    assert_eq!(next_wait(&limit), 750 * MS);
    assert_eq!(next_wait(&limit), 760 * MS);
}

/// A `Retry-After` on an answer that is not a 429 (a 503) is the retry engine's business, not
/// the rate limit's: it blocks nothing.
#[tokio::test(start_paused = true)]
async fn a_retry_after_on_a_503_blocks_nothing() {
    let limit = RateLimit::default();
    let unavailable = headers(&[("retry-after", "5")]);
    answer(&limit, &unavailable, &classified(503, &unavailable));
    assert_eq!(next_wait(&limit), Duration::ZERO);
    assert_eq!(limit.snapshot().requests_per_minute, None);
}

/// Configured numbers are never replaced by the provider's: 60 requests and 6,000 tokens a
/// minute stay so after headers stating 6,000 and 1,000,000, and after a 429 with no hint
/// (no CUBIC cut); a quota the provider says is spent is still obeyed until its reset.
#[tokio::test(start_paused = true)]
async fn configured_numbers_are_never_replaced() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_tokens_per_minute(Some(6_000)),
    );
    let generous = headers(&[
        ("x-ratelimit-limit-requests", "6000"),
        ("x-ratelimit-limit-tokens", "1000000"),
        ("anthropic-ratelimit-requests-limit", "6000"),
    ]);
    let permit = limit.reserve(&head(), 0, None).unwrap().send();
    permit.record(&Outcome::success(), &generous);
    // The next request, sent at its slot a second later, is answered 429.
    tokio::time::advance(Duration::from_secs(1)).await;
    let permit = limit.reserve(&head(), 0, None).unwrap().send();
    permit.record(&classified(429, &HeaderMap::new()), &HeaderMap::new());
    let snapshot = limit.snapshot();
    assert_eq!(snapshot.requests_per_minute, Some(60));
    assert_eq!(snapshot.tokens_per_minute, Some(6_000));
    assert_eq!(next_wait(&limit), Duration::from_secs(1));
    assert_eq!(next_wait(&limit), Duration::from_secs(2));

    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(600)));
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-requests", "6000"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.2s"),
        ]),
        &Outcome::success(),
    );
    assert_eq!(limit.snapshot().requests_per_minute, Some(600));
    assert_eq!(next_wait(&limit), 1_200 * MS);
}

/// With learning off, neither headers nor 429s change anything.
#[tokio::test(start_paused = true)]
async fn a_limit_that_does_not_learn_ignores_the_provider() {
    let limit = RateLimit::new(RateLimitConfig::default().without_learning());
    let spent = headers(&[
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "30s"),
        ("retry-after", "30"),
    ]);
    for _ in 0..10 {
        answer(&limit, &spent, &classified(429, &spent));
    }
    assert_eq!(limit.snapshot().requests_per_minute, None);
    assert_eq!(next_wait(&limit), Duration::ZERO);
}

/// The headers the limit reads, OpenAI's and Anthropic's (`retry-after` aside).
const LIMIT_HEADERS: [&str; 15] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];

/// Values no provider sends: negative, huge, not numbers, empty, `1e9`, resets far in the
/// future or in the past, bytes that are not UTF-8, Arabic-Indic digits, 10 KB.
fn hostile_values() -> Vec<HeaderValue> {
    let long = "9".repeat(10_000);
    let mut values: Vec<HeaderValue> = [
        "-1",
        "-5s",
        "1e9",
        "1e9s",
        "",
        " ",
        "abc",
        "12abc",
        "0x10",
        "NaN",
        "inf",
        "99999999999999999999999999",
        "18446744073709551616",
        "100000h",
        "999999999999999999s",
        "9999-12-31T23:59:59Z",
        "1999-01-01T00:00:00Z",
        "2026-13-45T99:99:99Z",
        long.as_str(),
    ]
    .into_iter()
    .map(|value| HeaderValue::from_str(value).unwrap())
    .collect();
    values.push(HeaderValue::from_bytes(&[0xff, 0xfe, 0x80]).unwrap());
    values.push(HeaderValue::from_bytes("١٢٠".as_bytes()).unwrap());
    values
}

/// The answers carrying `value`: every header at once (and `retry-after`); and each reset with
/// `remaining: 0`.
fn answers_carrying(value: &HeaderValue) -> [HeaderMap; 2] {
    let mut all: HeaderMap = LIMIT_HEADERS
        .iter()
        .map(|name| (HeaderName::from_static(name), value.clone()))
        .collect();
    all.insert("retry-after", value.clone());
    let mut spent = HeaderMap::new();
    for name in LIMIT_HEADERS.iter().filter(|name| name.ends_with("reset")) {
        spent.insert(HeaderName::from_static(name), value.clone());
        let remaining = name.replace("reset", "remaining");
        let remaining = HeaderName::from_bytes(remaining.as_bytes()).unwrap();
        spent.insert(remaining, HeaderValue::from_static("0"));
    }
    [all, spent]
}

/// A limit that learns, shown `hostile` on a success, sets no limit under 2^32 a minute and
/// blocks none of 100 requests.
fn assert_nothing_learned(hostile: &HeaderMap, value: &HeaderValue) {
    let learning = RateLimit::default();
    answer(&learning, hostile, &Outcome::success());
    let snapshot = learning.snapshot();
    let capped = |n: Option<u64>| n.is_none_or(|n| n >= u64::from(u32::MAX));
    assert!(
        capped(snapshot.requests_per_minute),
        "{value:?}: {snapshot:?}"
    );
    assert!(
        capped(snapshot.tokens_per_minute),
        "{value:?}: {snapshot:?}"
    );
    for _ in 0..100 {
        assert_eq!(take(&learning, 100), Duration::ZERO, "{value:?}");
    }
}

/// A configured limit, shown `hostile` on a 429 (which does not slow a configured limit down:
/// only the values could), keeps its numbers and blocks none of 100 requests.
fn assert_configured_limit_kept(hostile: &HeaderMap, value: &HeaderValue) {
    let configured = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60_000))
            .with_tokens_per_minute(Some(600_000)),
    );
    answer(&configured, hostile, &classified(429, hostile));
    let snapshot = configured.snapshot();
    assert_eq!(snapshot.requests_per_minute, Some(60_000), "{value:?}");
    assert_eq!(snapshot.tokens_per_minute, Some(600_000), "{value:?}");
    for _ in 0..100 {
        assert_eq!(take(&configured, 100), Duration::ZERO, "{value:?}");
    }
}

/// Values no provider sends, in every header the limit reads (and `retry-after` on a 429):
/// negative, huge, not numbers, empty, `1e9`, resets far in the future or in the past, bytes
/// that are not UTF-8, 10 KB. None sets a limit (a huge one is capped at 2^32 a minute, which
/// paces nothing) or blocks a request.
#[tokio::test(start_paused = true)]
async fn hostile_values_change_nothing() {
    for value in &hostile_values() {
        for hostile in answers_carrying(value) {
            assert_nothing_learned(&hostile, value);
            assert_configured_limit_kept(&hostile, value);
        }
    }
}

proptest! {
    /// Any bytes in any of the headers the limit reads, on any answer, never panic; whatever
    /// is learned, the next request gets a slot within the 2 s wait or a refusal that says when
    /// to come back, less than a day away; a learned limit is at most 2^32 a minute.
    #[test]
    fn any_header_bytes_are_survived(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 16),
        status in prop_oneof![Just(200_u16), Just(429), Just(503)],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let _clock = runtime.enter();
        let hostile: HeaderMap = LIMIT_HEADERS
            .iter()
            .chain(&["retry-after"])
            .zip(&values)
            .filter_map(|(name, bytes)| {
                Some((HeaderName::from_static(name), HeaderValue::from_bytes(bytes).ok()?))
            })
            .collect();
        let limit = RateLimit::default();
        answer(&limit, &hostile, &classified(status, &hostile));
        let snapshot = limit.snapshot();
        prop_assert!(snapshot.requests_per_minute.is_none_or(|n| n <= u64::from(u32::MAX)));
        prop_assert!(snapshot.tokens_per_minute.is_none_or(|n| n <= u64::from(u32::MAX)));
        match limit.reserve(&head(), 1, None) {
            Ok(reservation) => prop_assert!(wait_of(&reservation) <= Duration::from_secs(2)),
            Err(limited) => {
                prop_assert!(limited.retry_after() > Duration::from_secs(2));
                prop_assert!(limited.retry_after() < Duration::from_secs(24 * 3_600));
            }
        }
    }
}

/// The headroom a balancer reads: 1 with nothing known; what the provider says is left, until
/// its reset; the limit's own pacing (its bucket's level), whichever is lower.
#[tokio::test(start_paused = true)]
async fn headroom_is_the_lower_of_the_quota_left_and_the_buckets_level() {
    let limit = RateLimit::default();
    assert_eq!(limit.headroom(), 1.0);
    // 6,000 a minute (a bucket of 100), 10% left for 2 s.
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-requests", "6000"),
            ("x-ratelimit-remaining-requests", "600"),
            ("x-ratelimit-reset-requests", "2s"),
        ]),
        &Outcome::success(),
    );
    assert!(
        (limit.headroom() - 0.1).abs() < 1e-9,
        "{}",
        limit.headroom()
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(limit.headroom(), 1.0);
    // Its own pacing: 75 of the bucket's 100 sent at once leave a quarter.
    for _ in 0..75 {
        next_wait(&limit);
    }
    assert!(
        (limit.headroom() - 0.25).abs() < 1e-9,
        "{}",
        limit.headroom()
    );
    // A hostile remaining above the limit reads as all of it, never more.
    tokio::time::advance(Duration::from_secs(1)).await;
    answer(
        &limit,
        &headers(&[
            ("x-ratelimit-limit-requests", "6000"),
            ("x-ratelimit-remaining-requests", "99999999999999"),
        ]),
        &Outcome::success(),
    );
    assert!(limit.headroom() <= 1.0);
}
