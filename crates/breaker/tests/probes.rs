//! Half-open probes, on a paused clock: spaced a lease apart divided among the slots, at most
//! three in flight, each holding its slot for its lease at most, so that a probe that never
//! finishes cannot keep the breaker from finding the backend's return.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::HeaderMap;
use stormguard_breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, CircuitBreaker, OpenCause, Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{Outcome, Reason};

/// The default lease (2 s) divided among the default 3 slots, to the nanosecond.
const SPACING: Duration = Duration::from_nanos(666_666_666);

const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

/// A breaker that 20 failures opened, at the end of its open wait: the next attempt is a probe.
async fn half_open(seed: u64) -> CircuitBreaker {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(seed));
    for _ in 0..20 {
        breaker
            .try_acquire()
            .unwrap()
            .record(&UNAVAILABLE, &HeaderMap::new());
    }
    tokio::time::advance(breaker.snapshot().retry_after.unwrap()).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    breaker
}

fn probe(breaker: &CircuitBreaker) -> BreakerPermit {
    let permit = breaker.try_acquire().unwrap();
    assert!(permit.is_probe());
    permit
}

fn refusal(breaker: &CircuitBreaker) -> BreakerOpen {
    match breaker.try_acquire() {
        Err(Rejected::Open(open)) => open,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// With 3 probes and a 2 s lease, probes go 2 s / 3 apart, and a refusal says when the next may
/// go. Three are in flight at most: when the spacing would allow a fourth 2 ns before the first
/// lease ends, it waits those 2 ns. The first probe, that never answered, gives its slot up at
/// the end of its lease without opening the breaker again, carries on, and its late success
/// closes the breaker; the failures of the other probes, after that, change nothing.
#[tokio::test(start_paused = true)]
async fn probes_go_a_third_of_the_lease_apart_three_at_most() {
    let breaker = half_open(1).await;
    let first = probe(&breaker);
    assert_eq!(refusal(&breaker).retry_after(), SPACING);
    tokio::time::advance(SPACING - Duration::from_nanos(1)).await;
    assert_eq!(refusal(&breaker).retry_after(), Duration::from_nanos(1));
    tokio::time::advance(Duration::from_nanos(1)).await;
    let second = probe(&breaker);
    tokio::time::advance(SPACING).await;
    let third = probe(&breaker);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.probes, snapshot.in_flight), (3, 3));

    tokio::time::advance(SPACING).await;
    let full = refusal(&breaker);
    assert_eq!(full.retry_after(), Duration::from_nanos(2));
    assert_eq!(full.cause(), OpenCause::Failures);
    tokio::time::advance(Duration::from_nanos(2)).await;
    let fourth = probe(&breaker);
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::HalfOpen);
    assert_eq!((snapshot.probes, snapshot.in_flight), (3, 4));
    assert_eq!(snapshot.opened, 1);

    first.record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
    for late in [second, third, fourth] {
        late.record(&UNAVAILABLE, &HeaderMap::new());
    }
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.state, snapshot.opened), (State::Closed, 1));
    assert_eq!((snapshot.in_flight, snapshot.probes), (0, 0));
}

/// A probe dropped without a verdict (its caller gave up) frees its slot at once: with the three
/// slots taken, the fourth probe goes as soon as the first is dropped, not 2 ns later at the end
/// of its lease. The dropped probe decides nothing: the breaker stays half-open.
#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot_at_once() {
    let breaker = half_open(2).await;
    let mut probes = vec![probe(&breaker)];
    for _ in 0..2 {
        tokio::time::advance(SPACING).await;
        probes.push(probe(&breaker));
    }
    tokio::time::advance(SPACING).await;
    assert_eq!(refusal(&breaker).retry_after(), Duration::from_nanos(2));
    drop(probes.remove(0));
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.probes, snapshot.in_flight), (2, 2));
    assert_eq!((snapshot.state, snapshot.opened), (State::HalfOpen, 1));
    probes.push(probe(&breaker));
    assert_eq!(breaker.snapshot().probes, 3);
    // The spacing still holds for the next one.
    drop(probes.pop());
    assert_eq!(refusal(&breaker).retry_after(), SPACING);
    drop(probes);
    let snapshot = breaker.snapshot();
    // Only the 20 failures that opened the breaker are counted.
    assert_eq!(
        (snapshot.probes, snapshot.in_flight, snapshot.calls),
        (0, 0, 20)
    );
}

/// Into a black hole, probes never answer and never fail: over 10 s of half-open, asked every
/// millisecond, the breaker lets 15 probes through (one every 667 ms, the spacing rounded up to
/// the millisecond), never more than 3 within their leases, and never opens again. When the
/// backend is back, the next probe's success closes it within 667 ms.
#[tokio::test(start_paused = true)]
async fn into_a_black_hole_probes_keep_going_until_one_answers() {
    let breaker = half_open(3).await;
    let mut lost = Vec::new();
    let mut most_probes = 0;
    for _ in 0..10_000 {
        if let Ok(permit) = breaker.try_acquire() {
            assert!(permit.is_probe());
            lost.push(permit);
        }
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.state, snapshot.opened), (State::HalfOpen, 1));
        most_probes = most_probes.max(snapshot.probes);
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert_eq!(lost.len(), 15);
    assert_eq!(most_probes, 3);
    assert_eq!(breaker.snapshot().in_flight, 15);

    // The backend is back: the next probe answers.
    let mut waited = Duration::ZERO;
    loop {
        if let Ok(permit) = breaker.try_acquire() {
            permit.record(&Outcome::success(), &HeaderMap::new());
            break;
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        waited += Duration::from_millis(1);
    }
    assert_eq!(breaker.state(), State::Closed);
    assert!(waited <= Duration::from_millis(667), "{waited:?}");
}

/// A probe that fails opens the breaker again, for twice as long; a probe of the same half-open
/// period, sent before that failure and failing after the new wait is over, does not open it a
/// third time: it says nothing the first failure did not. The next probe's failure does.
#[tokio::test(start_paused = true)]
async fn a_late_failure_of_an_earlier_probe_does_not_open_again() {
    let breaker = half_open(4).await;
    let first = probe(&breaker);
    tokio::time::advance(SPACING).await;
    let second = probe(&breaker);
    first.record(&UNAVAILABLE, &HeaderMap::new());
    let snapshot = breaker.snapshot();
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (2, Some(OpenCause::ProbeFailed))
    );
    let wait = snapshot.retry_after.unwrap();
    assert!(wait >= Duration::from_secs(2) && wait < Duration::from_millis(2_500));

    tokio::time::advance(wait).await;
    second.record(&UNAVAILABLE, &HeaderMap::new());
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.state, snapshot.opened), (State::HalfOpen, 2));
    assert_eq!(snapshot.probes, 0);

    probe(&breaker).record(&UNAVAILABLE, &HeaderMap::new());
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.opened, 3);
    let wait = snapshot.retry_after.unwrap();
    assert!(
        wait >= Duration::from_secs(4) && wait < Duration::from_secs(5),
        "{wait:?}"
    );
}

/// The late success of a probe from an earlier half-open period closes the breaker, once probes
/// may go: the backend answers again.
#[tokio::test(start_paused = true)]
async fn a_late_success_of_an_earlier_probe_closes() {
    let breaker = half_open(5).await;
    let first = probe(&breaker);
    tokio::time::advance(SPACING).await;
    let second = probe(&breaker);
    first.record(&UNAVAILABLE, &HeaderMap::new());
    let wait = breaker.snapshot().retry_after.unwrap();
    tokio::time::advance(wait).await;
    second.record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
}
