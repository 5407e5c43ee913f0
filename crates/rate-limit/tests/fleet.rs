//! A fleet whose Redis is not there (nothing listens on its port): every decision is made on the
//! local share of the quota, at once, and none fails. The tests with a real Redis are in
//! `examples/tests/fleet*.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_rate_limit::{Fleet, RateLimit, RateLimitConfig};
use tokio::time::Instant;

/// Port 1 on loopback: refused at once.
const NOWHERE: &str = "redis://127.0.0.1:1/";

#[tokio::test]
async fn without_redis_each_replica_takes_its_share_of_the_quota() {
    // 6,000 a minute for 4 replicas: 1,500 each, 25 a second with a bucket of 25.
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
    let first = starts[0];
    let after = |n: usize| starts[n].saturating_duration_since(first);
    // The share's bucket at once, then one every 40 ms.
    assert!(after(24) < Duration::from_millis(20), "{:?}", after(24));
    assert!(after(25) >= Duration::from_millis(20), "{:?}", after(25));
    assert!(after(26) >= Duration::from_millis(60), "{:?}", after(26));
    let snapshot = fleet.snapshot();
    assert!(!snapshot.connected, "{snapshot:?}");
    assert_eq!(snapshot.replicas, 4);
    assert_eq!(snapshot.fleet_decisions, 0);
    assert_eq!(snapshot.local_decisions, 27);
    // Redis is left alone between tries: the decisions did not each wait for it.
    assert!(Instant::now().saturating_duration_since(first) < Duration::from_millis(500));
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
    // 10 a second, a bucket of 10: the whole of it.
    for _ in 0..10 {
        let reservation = limit.acquire(&head, 0, None).await.unwrap();
        assert!(reservation.start() <= Instant::now() + Duration::from_millis(5));
    }
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
