//! Opening on a stall cuts the attempts in flight (`BreakerPermit::poll_cut`), on a paused clock: a
//! black hole must not hold thousands of connections until their deadlines.

#![allow(clippy::unwrap_used)]

use std::future::poll_fn;
use std::time::Duration;

use http::HeaderMap;
use stormguard_breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, CircuitBreaker, OpenCause, Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{Outcome, Reason};
use tokio_test::task::spawn;
use tokio_test::{assert_pending, assert_ready};

/// A breaker that has seen 1,000 quick answers just now: 100 a second over its 10 s window, so
/// a silence of more than 2 s while attempts are in flight is a stall. One missed answer is
/// enough for these tests, which hold a handful of attempts (by default, 20 must be in flight).
fn warmed(config: BreakerConfig) -> CircuitBreaker {
    let breaker = CircuitBreaker::new(config.with_stall_detection(Duration::from_secs(2), 1.0));
    answer_quickly(&breaker, 1_000);
    breaker
}

fn answer_quickly(breaker: &CircuitBreaker, answers: u32) {
    for _ in 0..answers {
        breaker
            .try_acquire()
            .unwrap()
            .record(&Outcome::success(), &HeaderMap::new());
    }
}

fn acquire(breaker: &CircuitBreaker, count: usize) -> Vec<BreakerPermit> {
    (0..count).map(|_| breaker.try_acquire().unwrap()).collect()
}

/// The refusal of the next attempt, which must be refused because the breaker is open.
fn refusal(breaker: &CircuitBreaker) -> BreakerOpen {
    match breaker.try_acquire() {
        Err(Rejected::Open(open)) => open,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The silence passes 2 s with five attempts in flight: the next stall check, when an attempt
/// asks for a permit, opens the breaker (cause `Stall`), and every attempt in flight is cut: the four waiting on `poll_cut`
/// are woken, and each, like one first polled afterwards, gets `BreakerOpen` saying it was sent,
/// with the open wait as its `retry_after`. Then none is in flight; recording them afterwards
/// counts nothing.
#[tokio::test(start_paused = true)]
async fn a_stall_cuts_every_attempt_in_flight() {
    let breaker = warmed(BreakerConfig::default().with_seed(1));
    let mut held = acquire(&breaker, 5);
    let mut cuts: Vec<_> = held[..4]
        .iter_mut()
        .map(|permit| spawn(poll_fn(move |cx| permit.poll_cut(cx))))
        .collect();
    for cut in &mut cuts {
        assert_pending!(cut.poll());
    }

    // Exactly 2 s of silence is no stall yet.
    tokio::time::advance(Duration::from_secs(2)).await;
    let mut late = breaker.try_acquire().unwrap();
    assert!(cuts.iter().all(|cut| !cut.is_woken()));
    assert_eq!(breaker.snapshot().in_flight, 6);

    // The next check, 50 ms later (checks run at most every 50 ms).
    tokio::time::advance(Duration::from_millis(50)).await;
    let refused = refusal(&breaker);
    assert_eq!(refused.cause(), OpenCause::Stall);
    assert!(!refused.was_sent());
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Stall))
    );
    assert_eq!(snapshot.in_flight, 6, "cut when polled, not before");
    let wait = snapshot.retry_after.unwrap();
    assert!(wait >= Duration::from_secs(1) && wait < Duration::from_millis(1_250));

    for cut in &mut cuts {
        assert!(cut.is_woken());
        let open = assert_ready!(cut.poll());
        assert_eq!(open.cause(), OpenCause::Stall);
        assert!(open.was_sent());
        assert_eq!(open.retry_after(), wait);
        let outcome = open.outcome();
        assert_eq!(outcome.reason(), Reason::BreakerOpen);
        assert!(outcome.is_fatal() && !outcome.is_accepted());
    }
    drop(cuts);
    assert_eq!(breaker.snapshot().in_flight, 2);
    for permit in [&mut held[4], &mut late] {
        let open = assert_ready!(spawn(poll_fn(|cx| permit.poll_cut(cx))).poll());
        assert!(open.was_sent());
    }
    assert_eq!(breaker.snapshot().in_flight, 0);

    for permit in held.into_iter().chain([late]) {
        permit.record(&Outcome::success(), &HeaderMap::new());
    }
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (1_000, 0));
}

/// With `without_cancel_on_stall()` the stall still opens the breaker, but the attempts in
/// flight carry on: not woken, not cut, still in flight, and counted when they end.
#[tokio::test(start_paused = true)]
async fn without_cancel_on_stall_attempts_in_flight_carry_on() {
    let breaker = warmed(
        BreakerConfig::default()
            .without_cancel_on_stall()
            .with_seed(2),
    );
    let mut held = acquire(&breaker, 5);
    let mut cuts: Vec<_> = held
        .iter_mut()
        .map(|permit| spawn(poll_fn(move |cx| permit.poll_cut(cx))))
        .collect();
    for cut in &mut cuts {
        assert_pending!(cut.poll());
    }
    tokio::time::advance(Duration::from_millis(2_001)).await;
    assert_eq!(refusal(&breaker).cause(), OpenCause::Stall);
    for cut in &mut cuts {
        assert!(!cut.is_woken());
        assert_pending!(cut.poll());
    }
    drop(cuts);
    assert_eq!(breaker.snapshot().in_flight, 5);
    for permit in held {
        permit.record(&Outcome::retryable(Reason::Timeout), &HeaderMap::new());
    }
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (1_005, 0));
}

/// A stall cuts only what was let through before it, and never a probe. An attempt from before
/// the first stall is cut even when first polled after the breaker closed again; one let through
/// after that is not, until a second stall cuts it; a probe still in flight then is not cut.
#[tokio::test(start_paused = true)]
async fn only_attempts_let_through_before_the_stall_are_cut() {
    let breaker = warmed(BreakerConfig::default().with_seed(3));
    let mut before = acquire(&breaker, 2).pop().unwrap();
    tokio::time::advance(Duration::from_millis(2_001)).await;
    assert_eq!(refusal(&breaker).cause(), OpenCause::Stall);

    // Half-open: two probes; the second one's success closes the breaker.
    tokio::time::advance(breaker.snapshot().retry_after.unwrap()).await;
    let mut probe = breaker.try_acquire().unwrap();
    assert!(probe.is_probe());
    tokio::time::advance(Duration::from_nanos(666_666_666)).await;
    let second = breaker.try_acquire().unwrap();
    assert!(second.is_probe());
    second.record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);

    let mut after = breaker.try_acquire().unwrap();
    let mut after_cut = spawn(poll_fn(|cx| after.poll_cut(cx)));
    assert_pending!(after_cut.poll());
    let mut probe_cut = spawn(poll_fn(|cx| probe.poll_cut(cx)));
    assert_pending!(probe_cut.poll());
    let open = assert_ready!(spawn(poll_fn(|cx| before.poll_cut(cx))).poll());
    assert!(open.was_sent());
    assert_eq!(
        open.retry_after(),
        Duration::ZERO,
        "the breaker is closed again"
    );
    assert_eq!(breaker.snapshot().in_flight, 2);

    // A second stall: the window starts over when the breaker closes, so it needs answers again.
    answer_quickly(&breaker, 1_000);
    tokio::time::advance(Duration::from_millis(2_001)).await;
    assert_eq!(refusal(&breaker).cause(), OpenCause::Stall);
    assert_eq!(breaker.snapshot().opened, 2);
    assert!(after_cut.is_woken());
    assert!(assert_ready!(after_cut.poll()).was_sent());
    assert_pending!(probe_cut.poll());
    drop((after_cut, probe_cut));
    assert_eq!(breaker.snapshot().in_flight, 1);
    drop(probe);
    assert_eq!(breaker.snapshot().in_flight, 0);
}
