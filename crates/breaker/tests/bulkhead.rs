//! The bulkhead: a cap on the attempts in flight to one backend, whatever the breaker's state.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::HeaderMap;
use stormguard_breaker::{
    BreakerConfig, BreakerPermit, BulkheadFull, CircuitBreaker, Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{Outcome, Reason};

const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

fn full(breaker: &CircuitBreaker) -> BulkheadFull {
    match breaker.try_acquire() {
        Err(Rejected::Full(full)) => full,
        other => panic!("expected the bulkhead to be full, got {other:?}"),
    }
}

/// With at most 3 in flight, the 4th attempt is refused with `BulkheadFull` (final, not
/// accepted, never counted) until one of the three ends: dropped or recorded, its place is free
/// at once.
#[tokio::test(start_paused = true)]
async fn the_attempt_beyond_the_cap_is_refused_until_a_place_frees() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_max_in_flight(Some(3)));
    let mut held: Vec<BreakerPermit> = (0..3).map(|_| breaker.try_acquire().unwrap()).collect();
    let refused = full(&breaker);
    assert_eq!(refused.max_in_flight(), 3);
    let outcome = Rejected::Full(refused).outcome();
    assert_eq!(outcome.reason(), Reason::BulkheadFull);
    assert!(outcome.is_fatal() && !outcome.is_accepted());
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.calls), (3, 0));

    drop(held.pop());
    held.push(breaker.try_acquire().unwrap());
    full(&breaker);
    held.pop()
        .unwrap()
        .record(&Outcome::success(), &HeaderMap::new());
    held.push(breaker.try_acquire().unwrap());
    full(&breaker);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.calls), (3, 1));
    drop(held);
    assert_eq!(breaker.snapshot().in_flight, 0);
    // Refusals by the bulkhead do not count as failures either: 100 of them leave it closed.
    let held: Vec<BreakerPermit> = (0..3).map(|_| breaker.try_acquire().unwrap()).collect();
    for _ in 0..100 {
        full(&breaker);
    }
    assert_eq!(breaker.snapshot().state, State::Closed);
    drop(held);
}

/// Half-open, the cap holds for probes too: with 2 attempts from before the opening still in
/// flight and a probe, a cap of 3 refuses the next probe with `BulkheadFull`; a refused probe takes
/// no probe slot and no turn, so once a place frees the next probe goes at once. Open, the
/// breaker refuses first.
#[tokio::test(start_paused = true)]
async fn half_open_the_cap_holds_and_a_refused_probe_costs_no_turn() {
    let breaker = CircuitBreaker::new(
        BreakerConfig::default()
            .with_max_in_flight(Some(3))
            .with_seed(1),
    );
    let mut early: Vec<BreakerPermit> = (0..2).map(|_| breaker.try_acquire().unwrap()).collect();
    for _ in 0..20 {
        breaker
            .try_acquire()
            .unwrap()
            .record(&UNAVAILABLE, &HeaderMap::new());
    }
    assert!(matches!(breaker.try_acquire(), Err(Rejected::Open(_))));

    tokio::time::advance(breaker.snapshot().retry_after.unwrap()).await;
    let probe = breaker.try_acquire().unwrap();
    assert!(probe.is_probe());
    tokio::time::advance(Duration::from_millis(667)).await;
    full(&breaker);
    let snapshot = breaker.snapshot();
    assert_eq!(
        (snapshot.state, snapshot.probes, snapshot.in_flight),
        (State::HalfOpen, 1, 3)
    );

    drop(early.pop());
    let second = breaker.try_acquire().unwrap();
    assert!(second.is_probe());
    second.record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
    drop((early, probe));
    assert_eq!(breaker.snapshot().in_flight, 0);
}
