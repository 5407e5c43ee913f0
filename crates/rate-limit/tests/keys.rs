//! Keyed limits on tokio's paused clock: each key has its own quota and learns on its own,
//! requests without a key share one, and the keys held are bounded (idle ones forgotten first,
//! then the least recently used).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use http::request::Parts;
use stormguard_classify::Outcome;
use stormguard_classify::Permit;
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use support::{head, head_with_key, headers, wait_of};

/// One limit per `x-api-key`, 60 a minute each, holding at most `max_keys` keys forgotten
/// after a minute idle.
fn per_api_key(max_keys: usize) -> RateLimit {
    RateLimit::keyed(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_keys(max_keys, Duration::from_secs(60)),
        |head| head.headers.get("x-api-key").cloned(),
    )
}

/// The wait of a request with head `head`, which is sent.
fn take(limit: &RateLimit, head: &Parts) -> Duration {
    let reservation = limit.reserve(head, 0, None).unwrap();
    let wait = wait_of(&reservation);
    drop(reservation.send());
    wait
}

/// Two API keys each get their own quota: one spending its own does not slow the other.
#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_quota() {
    let limit = per_api_key(100);
    let (alice, bob) = (head_with_key("alice"), head_with_key("bob"));
    assert_eq!(take(&limit, &alice), Duration::ZERO);
    assert_eq!(take(&limit, &alice), Duration::from_secs(1));
    assert_eq!(take(&limit, &alice), Duration::from_secs(2));
    assert_eq!(take(&limit, &bob), Duration::ZERO);
    assert_eq!(take(&limit, &bob), Duration::from_secs(1));
    assert!(limit.reserve(&alice, 0, None).is_err());
    assert_eq!(limit.snapshot().keys, 2);
}

/// Requests without a key share one bucket, apart from every key's.
#[tokio::test(start_paused = true)]
async fn requests_without_a_key_share_one_quota() {
    let limit = per_api_key(100);
    assert_eq!(take(&limit, &head()), Duration::ZERO);
    assert_eq!(take(&limit, &head()), Duration::from_secs(1));
    assert_eq!(take(&limit, &head_with_key("alice")), Duration::ZERO);
    assert_eq!(take(&limit, &head()), Duration::from_secs(2));
    // The snapshot is the unkeyed bucket's.
    assert_eq!(limit.snapshot().requests_available, Some(0));
    assert_eq!(limit.snapshot().keys, 1);
}

/// Each key learns on its own: a limit the provider states for one key's answers paces that
/// key only.
#[tokio::test(start_paused = true)]
async fn each_key_learns_on_its_own() {
    let limit = RateLimit::keyed(RateLimitConfig::default(), |head| {
        head.headers.get("x-api-key").cloned()
    });
    let (alice, bob) = (head_with_key("alice"), head_with_key("bob"));
    let permit = limit.reserve(&alice, 0, None).unwrap().send();
    permit.record(
        &Outcome::success(),
        &headers(&[("x-ratelimit-limit-requests", "60")]),
    );
    assert_eq!(take(&limit, &alice), Duration::ZERO);
    assert_eq!(take(&limit, &alice), Duration::from_secs(1));
    for _ in 0..100 {
        assert_eq!(take(&limit, &bob), Duration::ZERO);
        assert_eq!(take(&limit, &head()), Duration::ZERO);
    }
}

/// With room for 3 keys, a 4th forgets the keys idle for a minute: both idle ones go, the one
/// in use stays with its spent quota, the new one starts with a full one.
#[tokio::test(start_paused = true)]
async fn a_new_key_forgets_the_idle_ones_first() {
    let limit = per_api_key(3);
    for key in ["a", "b", "c"] {
        take(&limit, &head_with_key(key));
    }
    assert_eq!(limit.snapshot().keys, 3);
    tokio::time::advance(Duration::from_secs(61)).await;
    // `b` is used again (a full bucket after a minute), and spends it.
    assert_eq!(take(&limit, &head_with_key("b")), Duration::ZERO);
    assert_eq!(take(&limit, &head_with_key("d")), Duration::ZERO);
    assert_eq!(limit.snapshot().keys, 2);
    // `b` kept its state: its next request waits.
    assert_eq!(take(&limit, &head_with_key("b")), Duration::from_secs(1));
}

/// With no key idle, a 4th forgets the least recently used: `b` (`a` came first but was used
/// again since), whose quota starts whole again when it comes back.
#[tokio::test(start_paused = true)]
async fn with_no_idle_key_the_least_recently_used_goes() {
    let limit = per_api_key(3);
    for key in ["a", "b", "c"] {
        take(&limit, &head_with_key(key));
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    // `a` spent its quota: its next slot is 1 s after its first.
    assert!(wait_of(&limit.reserve(&head_with_key("a"), 0, None).unwrap()) > Duration::ZERO);
    // The reservation dropped, `a` was still used last at 300 ms: `b` (100 ms) is the oldest.
    take(&limit, &head_with_key("d"));
    assert_eq!(limit.snapshot().keys, 3);
    assert_eq!(
        take(&limit, &head_with_key("b")),
        Duration::ZERO,
        "b was forgotten"
    );
    assert_eq!(limit.snapshot().keys, 3);
    assert_eq!(
        take(&limit, &head_with_key("d")),
        Duration::from_secs(1),
        "d was kept"
    );
}

/// A thousand callers with room for 100 keys: the limit never holds more than 100.
#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_by_the_keys_held() {
    let limit = per_api_key(100);
    for caller in 0..1_000 {
        take(&limit, &head_with_key(&format!("caller-{caller}")));
        assert!(limit.snapshot().keys <= 100);
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert_eq!(limit.snapshot().keys, 100);
}
