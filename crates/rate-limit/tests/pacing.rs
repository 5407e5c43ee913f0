//! Requests-per-minute pacing on tokio's paused clock: the configured rate is what goes out
//! under a constant overload, within 1% over 10 minutes; a request waits for its slot up to
//! `max_wait` and its deadline, and beyond them is refused at once with the time until its slot.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_rate_limit::{RateLimit, RateLimitCause, RateLimitConfig};
use support::{head, take, wait_of};
use tokio::task::JoinSet;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn per_minute(requests: u32) -> RateLimit {
    RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(requests)))
}

/// 600 a minute, offered 20 a second for 10 minutes: each request reserves, waits for its slot
/// and goes; those whose slot is more than 2 s away are refused. The requests that went in the
/// 10 minutes are 6,000 and the 1 s burst (10), within 1%; none went before its slot, no 100 ms
/// ever saw more than the bucket (10) and the 1 request its interval refills, and every request
/// whose wait was within 2 s was admitted.
#[tokio::test(start_paused = true)]
async fn six_hundred_a_minute_send_six_thousand_in_ten_minutes_under_overload() {
    let limit = per_minute(600);
    let origin = Instant::now();
    let ten_minutes = Duration::from_secs(600);
    let started = Arc::new(Mutex::new(Vec::new()));
    let mut refused = 0_u32;
    let mut waiting = JoinSet::new();
    for i in 0..20 * 600 {
        tokio::time::sleep_until(origin + 50 * MS * i).await;
        match limit.reserve(&head(), 0, None) {
            Ok(reservation) => {
                assert!(wait_of(&reservation) <= Duration::from_secs(2));
                let started = Arc::clone(&started);
                waiting.spawn(async move {
                    tokio::time::sleep_until(reservation.start()).await;
                    let slot = reservation.start();
                    let permit = reservation.send();
                    started.lock().unwrap().push((slot, Instant::now()));
                    permit.record(&Outcome::success(), &http::HeaderMap::new());
                });
            }
            Err(limited) => {
                assert_eq!(limited.cause(), RateLimitCause::Wait);
                assert!(limited.retry_after() > Duration::from_secs(2), "{limited}");
                refused += 1;
            }
        }
    }
    while waiting.join_next().await.is_some() {}

    let mut started = started.lock().unwrap().clone();
    started.sort();
    assert!(started.iter().all(|(slot, sent)| sent >= slot));
    let in_ten_minutes = started
        .iter()
        .filter(|(_, sent)| *sent - origin < ten_minutes)
        .count();
    let expected = 6_000.0;
    let error = (in_ten_minutes as f64 - expected).abs() / expected;
    assert!(error < 0.01, "{in_ten_minutes} sent in 10 min");
    assert!(
        (6_000..=6_011).contains(&in_ten_minutes),
        "{in_ten_minutes}: 6,000 and the burst of 10"
    );
    // Never more than the bucket and what refills: in any 100 ms, at most 10 + 1.
    let sends: Vec<Instant> = started.iter().map(|(_, sent)| *sent).collect();
    for (i, first) in sends.iter().enumerate() {
        let within = sends[i..]
            .iter()
            .take_while(|sent| **sent - *first < 100 * MS)
            .count();
        assert!(within <= 11, "{within} sent within 100 ms of {first:?}");
    }
    assert_eq!(started.len() + refused as usize, 12_000);
    println!(
        "pacing: {in_ten_minutes} of 6,000 in 10 min ({:+.3}%), {} in all, {refused} refused",
        100.0 * (in_ten_minutes as f64 - expected) / expected,
        started.len()
    );
}

/// 600 a minute: after the burst of 10, slots come every 100 ms; the 20 slots up to 2 s away
/// are given, the 21st (2.1 s) is refused with exactly that wait as its `retry_after`, and
/// nothing is taken by the refusal: 100 ms later the same request gets a slot 2 s away.
#[tokio::test(start_paused = true)]
async fn a_slot_beyond_the_maximum_wait_is_refused_with_the_time_until_it() {
    let limit = per_minute(600);
    for _ in 0..10 {
        assert_eq!(take(&limit, 0), Duration::ZERO);
    }
    for n in 1..=20 {
        assert_eq!(take(&limit, 0), 100 * MS * n);
    }
    for _ in 0..3 {
        let limited = limit.reserve(&head(), 0, None).unwrap_err();
        assert_eq!(limited.cause(), RateLimitCause::Wait);
        assert_eq!(limited.retry_after(), 2_100 * MS);
        let outcome = limited.outcome();
        assert_eq!(outcome.reason(), Reason::RateLimitedLocally);
        assert!(!outcome.is_retryable() && !outcome.is_accepted());
        assert_eq!(outcome.retry_after(), Some(2_100 * MS));
    }
    tokio::time::advance(100 * MS).await;
    assert_eq!(take(&limit, 0), Duration::from_secs(2));
}

/// A longer `max_wait` queues further; a zero one never waits.
#[tokio::test(start_paused = true)]
async fn the_maximum_wait_is_configurable() {
    let patient = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_max_wait(Duration::from_secs(10)),
    );
    for n in 0..=10 {
        assert_eq!(take(&patient, 0), Duration::from_secs(n));
    }
    let limited = patient.reserve(&head(), 0, None).unwrap_err();
    assert_eq!(limited.retry_after(), Duration::from_secs(11));

    let impatient = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_max_wait(Duration::ZERO),
    );
    assert_eq!(take(&impatient, 0), Duration::ZERO);
    let limited = impatient.reserve(&head(), 0, None).unwrap_err();
    assert_eq!(limited.retry_after(), Duration::from_secs(1));
}

/// A request's deadline bounds its wait below `max_wait`: with the next slot 1 s away, a request
/// due in 500 ms is refused (its `retry_after` the time until the slot) and takes nothing; one
/// due at the slot gets it; one due in an hour still waits no more than 2 s.
#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait() {
    // 60 a minute, a bucket of one: the first goes now, the next in 1 s.
    let limit = per_minute(60);
    let now = Instant::now();
    let first = limit.reserve(&head(), 0, Some(now)).unwrap();
    assert_eq!(wait_of(&first), Duration::ZERO, "a slot now needs no time");
    drop(first.send());

    let limited = limit.reserve(&head(), 0, Some(now + 500 * MS)).unwrap_err();
    assert_eq!(limited.cause(), RateLimitCause::Wait);
    assert_eq!(limited.retry_after(), Duration::from_secs(1));
    let due_at_the_slot = limit
        .reserve(&head(), 0, Some(now + Duration::from_secs(1)))
        .unwrap();
    assert_eq!(wait_of(&due_at_the_slot), Duration::from_secs(1));
    drop(due_at_the_slot.send());
    // A deadline far away is still bounded by the 2 s wait.
    let far = Some(now + Duration::from_secs(3_600));
    assert_eq!(
        wait_of(&limit.reserve(&head(), 0, far).unwrap()),
        Duration::from_secs(2)
    );
    // (That reservation was dropped unsent: its slot at 2 s is free again.)
    assert_eq!(take(&limit, 0), Duration::from_secs(2));
    let limited = limit.reserve(&head(), 0, far).unwrap_err();
    assert_eq!(limited.retry_after(), Duration::from_secs(3));
}

/// A limit with no numbers and nothing learned paces nothing: 10,000 requests go at once.
#[tokio::test(start_paused = true)]
async fn no_limit_sends_everything_at_once() {
    let limit = RateLimit::default();
    for _ in 0..10_000 {
        assert_eq!(take(&limit, 1_000_000), Duration::ZERO);
    }
    let snapshot = limit.snapshot();
    assert_eq!(snapshot.requests_per_minute, None);
    assert_eq!(snapshot.tokens_per_minute, None);
    assert_eq!(snapshot.requests_available, None);
}

/// A bucket refills at the rate: 120 a minute, emptied at once (2), holds 1 after 500 ms and
/// is full (2) again after 1 s, never more, however long it is left alone.
#[tokio::test(start_paused = true)]
async fn the_bucket_refills_at_the_rate_up_to_one_second_of_it() {
    let limit = per_minute(120);
    assert_eq!(limit.snapshot().requests_available, Some(2));
    take(&limit, 0);
    take(&limit, 0);
    assert_eq!(limit.snapshot().requests_available, Some(0));
    tokio::time::advance(250 * MS).await;
    assert_eq!(limit.snapshot().requests_available, Some(0));
    tokio::time::advance(250 * MS).await;
    assert_eq!(limit.snapshot().requests_available, Some(1));
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(limit.snapshot().requests_available, Some(2));
    assert_eq!(take(&limit, 0), Duration::ZERO);
    assert_eq!(take(&limit, 0), Duration::ZERO);
    assert_eq!(take(&limit, 0), 500 * MS);
}

/// A burst of 5 s lets 5 s worth go at once (60 a minute: 5), then paces.
#[tokio::test(start_paused = true)]
async fn the_burst_is_configurable() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_burst(Duration::from_secs(5)),
    );
    for _ in 0..5 {
        assert_eq!(take(&limit, 0), Duration::ZERO);
    }
    assert_eq!(take(&limit, 0), Duration::from_secs(1));
    assert_eq!(take(&limit, 0), Duration::from_secs(2));
}
