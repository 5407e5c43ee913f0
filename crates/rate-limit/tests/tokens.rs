//! Tokens-per-minute pacing on tokio's paused clock: requests weigh their tokens; one heavier
//! than the 1 s bucket waits for a full bucket and leaves it in debt; one heavier than a
//! minute's quota is refused at once; `Usage::settle` corrects a weight after the fact, never
//! past a minute's quota; and a request waits for the later of its two slots (requests and
//! tokens).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use stormguard_rate_limit::{RateLimit, RateLimitCause, RateLimitConfig};
use support::{head, take};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// 6,000 tokens a minute: 100 a second, a bucket of 100, a token every 10 ms.
fn six_thousand_tokens_a_minute() -> RateLimit {
    RateLimit::new(RateLimitConfig::default().with_tokens_per_minute(Some(6_000)))
}

/// Requests of 60, 40, 50, 25, 100 and 10 tokens at one instant: the first two fill the bucket
/// and go at once; each later one goes when the bucket holds its weight again, first come
/// first served: at 500 ms, 750 ms, 1.75 s (100 tokens: a full bucket) and 1.85 s.
#[tokio::test(start_paused = true)]
async fn requests_are_paced_by_their_weight_in_tokens() {
    let limit = six_thousand_tokens_a_minute();
    assert!(limit.weighs_tokens(&head()));
    let waits: Vec<Duration> = [60, 40, 50, 25, 100, 10]
        .into_iter()
        .map(|tokens| take(&limit, tokens))
        .collect();
    assert_eq!(
        waits,
        [0, 0, 500, 750, 1_750, 1_850].map(|ms| ms * MS).to_vec()
    );
}

/// A steady flow of 150-token requests, 3 a second against a quota of 100 tokens a second,
/// for 5 minutes: the tokens sent are 5 minutes of quota (30,000) and the bucket (100), at most
/// one request's weight off.
#[tokio::test(start_paused = true)]
async fn a_steady_overload_sends_the_token_quota() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_tokens_per_minute(Some(6_000))
            .with_max_wait(Duration::from_secs(5)),
    );
    let origin = Instant::now();
    let five_minutes = Duration::from_secs(300);
    let mut sent_tokens = 0_u64;
    for i in 0..3 * 300 {
        tokio::time::sleep_until(origin + Duration::from_millis(333) * i).await;
        if let Ok(reservation) = limit.reserve(&head(), 150, None)
            && reservation.start() - origin < five_minutes
        {
            sent_tokens += reservation.send().tokens();
        }
    }
    assert!(
        (30_100 - 150..=30_100).contains(&sent_tokens),
        "{sent_tokens} tokens in 5 minutes"
    );
}

/// With a full bucket of 100, a request of 300 goes at once and leaves 2 s of debt: nothing
/// goes for 2 s, a 1-token request is then 2.01 s away, beyond the 2 s wait.
#[tokio::test(start_paused = true)]
async fn a_request_heavier_than_the_bucket_goes_from_a_full_one_and_leaves_debt() {
    let limit = six_thousand_tokens_a_minute();
    assert_eq!(take(&limit, 300), Duration::ZERO);
    assert_eq!(limit.snapshot().tokens_available, Some(0));
    let limited = limit.reserve(&head(), 1, None).unwrap_err();
    assert_eq!(limited.cause(), RateLimitCause::Wait);
    assert_eq!(limited.retry_after(), 2_010 * MS);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(limit.snapshot().tokens_available, Some(0));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(limit.snapshot().tokens_available, Some(100));
}

/// With 50 tokens in the bucket, a request of 300 waits until it is full (500 ms), not until
/// 300 tokens could have refilled.
#[tokio::test(start_paused = true)]
async fn a_request_heavier_than_the_bucket_waits_for_a_full_one() {
    let limit = six_thousand_tokens_a_minute();
    take(&limit, 50);
    assert_eq!(take(&limit, 300), 500 * MS);
}

/// A request heavier than a minute's quota could never go: refused at once with `TooHeavy`,
/// even with a wait of an hour allowed and a full bucket, and nothing is taken. One exactly a
/// minute's quota goes.
#[tokio::test(start_paused = true)]
async fn a_request_heavier_than_a_minute_is_refused_at_once() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_tokens_per_minute(Some(6_000))
            .with_max_wait(Duration::from_secs(3_600)),
    );
    let limited = limit.reserve(&head(), 6_001, None).unwrap_err();
    assert_eq!(
        limited.cause(),
        RateLimitCause::TooHeavy {
            tokens: 6_001,
            per_minute: 6_000,
        }
    );
    assert_eq!(limited.retry_after(), Duration::from_secs(60));
    assert_eq!(limit.snapshot().tokens_available, Some(100));
    assert_eq!(take(&limit, 6_000), Duration::ZERO);
    // It left a minute of debt, less the bucket.
    assert_eq!(take(&limit, 1), 59_010 * MS);
}

/// `settle` corrects the weight: a request weighed at 100 that used 30 gives 70 back; one that
/// used 250 takes 150 more, which the next request waits for. Without usage correction there is
/// nothing to settle.
#[tokio::test(start_paused = true)]
async fn settling_gives_back_or_takes_the_difference() {
    let permit = six_thousand_tokens_a_minute().reserve(&head(), 100, None);
    assert!(permit.unwrap().send().usage().is_none());

    let correcting = || {
        let config = RateLimitConfig::default().with_tokens_per_minute(Some(6_000));
        RateLimit::new(config.with_usage_correction())
    };
    let limit = correcting();
    let permit = limit.reserve(&head(), 100, None).unwrap().send();
    assert_eq!(permit.tokens(), 100);
    assert_eq!(limit.snapshot().tokens_available, Some(0));
    permit.usage().unwrap().settle(30);
    assert_eq!(limit.snapshot().tokens_available, Some(70));

    let limit = correcting();
    let permit = limit.reserve(&head(), 100, None).unwrap().send();
    permit.usage().unwrap().settle(250);
    // 250 tokens taken: the bucket is whole again after 2.5 s; one token fits after 1.51 s.
    assert_eq!(take(&limit, 1), 1_510 * MS);
}

/// A usage above a minute's quota counts as the minute's quota: an answer that says it used
/// 2^64 - 1 tokens leaves a minute of debt, as the heaviest request would, not 584 years.
#[tokio::test(start_paused = true)]
async fn a_usage_above_a_minute_s_quota_counts_as_the_minute_s_quota() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_tokens_per_minute(Some(6_000))
            .with_usage_correction(),
    );
    let permit = limit.reserve(&head(), 100, None).unwrap().send();
    permit.usage().unwrap().settle(u64::MAX);
    // 6,000 tokens taken: the next token fits after a minute, less the bucket's 990 ms.
    let limited = limit.reserve(&head(), 1, None).unwrap_err();
    assert_eq!(limited.cause(), RateLimitCause::Wait);
    assert_eq!(limited.retry_after(), 59_010 * MS);
}

/// A request waits for the later of its two slots, and a refusal in tokens gives its request
/// slot back.
#[tokio::test(start_paused = true)]
async fn a_request_waits_for_both_limits_and_a_refusal_takes_neither() {
    // 60 requests and 6,000 tokens a minute: the request slot is the later one.
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_tokens_per_minute(Some(6_000)),
    );
    assert_eq!(take(&limit, 1), Duration::ZERO);
    assert_eq!(take(&limit, 1), Duration::from_secs(1));

    // 120 requests and 600 tokens a minute (2 and 10 a second): the token slot is the later one.
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(120))
            .with_tokens_per_minute(Some(600)),
    );
    assert_eq!(take(&limit, 10), Duration::ZERO);
    // 25 tokens: a request slot now, a full bucket of tokens in 1 s (then 1.5 s of debt).
    assert_eq!(take(&limit, 25), Duration::from_secs(1));
    // 30 tokens: a request slot at 500 ms, but tokens only at 3.5 s: refused.
    let limited = limit.reserve(&head(), 30, None).unwrap_err();
    assert_eq!(limited.retry_after(), 3_500 * MS);
    // Its request slot was given back: 1 s on, both requests of the bucket are free again.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(limit.snapshot().requests_available, Some(2));
    assert_eq!(limit.snapshot().tokens_available, Some(0));
}

/// With no tokens-per-minute limit, a request's weight is ignored: it does not count, and a
/// request heavier than any quota is not refused.
#[tokio::test(start_paused = true)]
async fn without_a_token_limit_weights_are_ignored() {
    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(60)));
    assert!(!limit.weighs_tokens(&head()));
    let permit = limit.reserve(&head(), 10_000_000, None).unwrap().send();
    assert_eq!(permit.tokens(), 0);
    assert_eq!(limit.snapshot().tokens_available, None);
}
