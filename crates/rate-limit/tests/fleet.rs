//! A fleet whose Redis is not there (nothing listens on its port): every decision is made on the
//! local share of the quota, at once, and none fails. The tests with a real Redis are in
//! `examples/tests/fleet*.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_rate_limit::{Fleet, RateLimit, RateLimitConfig};
use tokio::time::Instant;

/// Port 1 on loopback: refused at once.
const NOWHERE: &str = "redis://127.0.0.1:1/";

/// How long after the first each of `starts` comes.
fn after_first(starts: &[Instant]) -> Vec<Duration> {
    starts
        .iter()
        .map(|start| start.saturating_duration_since(starts[0]))
        .collect()
}

#[tokio::test]
async fn without_redis_each_replica_paces_at_its_share_of_the_quota_from_the_start() {
    // 6,000 a minute for 4 replicas: 1,500 each, 25 a second (one every 40 ms).
    let fleet = Fleet::new(NOWHERE).unwrap().with_replicas(Some(4));
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(6_000))
            .with_fleet(fleet.clone()),
    );
    let head = http::Request::new(()).into_parts().0;
    let mut starts = Vec::new();
    for _ in 0..27 {
        let reservation = limit.acquire(&head, 0, None).await.unwrap();
        starts.push(reservation.start());
        let _permit = reservation.send();
    }
    // One at once, then one every 40 ms: never having heard from Redis, the replica cannot know
    // what the fleet took in the last second, so its share's bucket of 25 does not go on top.
    let after = after_first(&starts);
    for (n, pair) in after.windows(2).enumerate() {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(40),
            "{n}: {after:?}"
        );
    }
    assert!(
        after[26] < Duration::from_millis(26 * 40 + 200),
        "{after:?}"
    );
    let snapshot = fleet.snapshot();
    assert!(!snapshot.connected, "{snapshot:?}");
    assert_eq!(snapshot.replicas, 4);
    assert_eq!(snapshot.fleet_decisions, 0);
    assert_eq!(snapshot.local_decisions, 27);
    // Redis is left alone between tries: the decisions did not each wait for it.
    assert!(Instant::now().saturating_duration_since(starts[0]) < Duration::from_millis(500));
}

#[tokio::test]
async fn without_a_configured_count_the_share_is_the_whole_quota_until_redis_counts() {
    let fleet = Fleet::new(NOWHERE).unwrap();
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(600))
            .with_fleet(fleet.clone()),
    );
    let head = http::Request::new(()).into_parts().0;
    let mut starts = Vec::new();
    for _ in 0..10 {
        let reservation = limit.acquire(&head, 0, None).await.unwrap();
        starts.push(reservation.start());
        let _permit = reservation.send();
    }
    // The whole quota's rate, 10 a second, from the start.
    let after = after_first(&starts);
    for (n, pair) in after.windows(2).enumerate() {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(100),
            "{n}: {after:?}"
        );
    }
    assert!(after[9] < Duration::from_millis(900 + 200), "{after:?}");
    assert_eq!(fleet.snapshot().replicas, 1);
}

#[test]
fn an_address_that_is_not_redis_is_a_typed_error() {
    for url in [
        "http://127.0.0.1:6379/",
        "not a url",
        "rediss://127.0.0.1:6379/",
    ] {
        let error = Fleet::new(url).unwrap_err();
        assert!(
            error.to_string().contains("invalid Redis address"),
            "{url}: {error}"
        );
    }
}

#[test]
fn a_fleet_is_set_up_before_it_is_shared() {
    let fleet = Fleet::new("redis://127.0.0.1:6379/")
        .unwrap()
        .with_prefix("gateway:openai")
        .with_timeout(Duration::from_millis(3))
        .with_replicas(Some(0));
    assert_eq!(fleet.prefix(), "gateway:openai");
    assert_eq!(fleet.timeout(), Duration::from_millis(3));
    // At least one replica.
    assert_eq!(fleet.replicas(), Some(1));
    assert_eq!(
        Fleet::new("redis://h/").unwrap().timeout(),
        Fleet::DEFAULT_TIMEOUT
    );
}
