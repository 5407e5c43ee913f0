//! Four OS threads hammering clones of one breaker: counts stay exact, the breaker opens once,
//! the bulkhead's cap holds, and nothing is left in flight.
//!
//! The threads enter a runtime whose clock is paused and never moves: they all read the same
//! instant, so every count lands in one slice of the window and no open wait ever ends.

#![allow(clippy::unwrap_used)]

use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};

use http::HeaderMap;
use stormguard_breaker::{
    BreakerConfig, BreakerSnapshot, CircuitBreaker, OpenCause, Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{Outcome, Reason};

const THREADS: usize = 4;

const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

/// What the threads did, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counted {
    recorded: u64,
    failed: u64,
    dropped: u64,
    open: u64,
    full: u64,
}

impl std::ops::Add for Counted {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            recorded: self.recorded + other.recorded,
            failed: self.failed + other.failed,
            dropped: self.dropped + other.dropped,
            open: self.open + other.open,
            full: self.full + other.full,
        }
    }
}

/// Runs `work` on `THREADS` threads at once, each with its own clone of `breaker`, on a paused
/// clock; returns what they did, summed, and the breaker's snapshot at the end.
fn hammer(
    breaker: &CircuitBreaker,
    work: impl Fn(&CircuitBreaker) -> Counted + Sync,
) -> (Counted, BreakerSnapshot) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let start = Barrier::new(THREADS);
    let handle = runtime.handle();
    let counted = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (breaker, start, work) = (breaker.clone(), &start, &work);
                scope.spawn(move || {
                    let _clock = handle.enter();
                    start.wait();
                    work(&breaker)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .fold(Counted::default(), |sum, counted| sum + counted)
    });
    let _clock = runtime.enter();
    (counted, breaker.snapshot())
}

/// 4 threads, each 50,000 attempts held a few at a time (one in five a 503, one in seven dropped
/// unrecorded): every recorded call and failure is counted exactly, the dropped ones not at all,
/// a 20% failure ratio never opens the breaker, and nothing is left in flight.
#[test]
fn counts_are_exact_under_contention() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(1));
    let (counted, snapshot) = hammer(&breaker, |breaker| {
        let mut counted = Counted::default();
        for round in 0..10_000_u64 {
            let held: Vec<_> = (0..5).map(|_| breaker.try_acquire().unwrap()).collect();
            for (i, permit) in (round * 5..).zip(held) {
                if i % 7 == 6 {
                    counted.dropped += 1;
                    drop(permit);
                } else if i % 5 == 0 {
                    counted.failed += 1;
                    counted.recorded += 1;
                    permit.record(&UNAVAILABLE, &HeaderMap::new());
                } else {
                    counted.recorded += 1;
                    permit.record(&Outcome::success(), &HeaderMap::new());
                }
            }
        }
        counted
    });
    assert_eq!(counted.recorded + counted.dropped, THREADS as u64 * 50_000);
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(snapshot.calls, counted.recorded);
    assert_eq!(snapshot.failures, counted.failed);
    assert_eq!(snapshot.answers, counted.recorded);
    assert_eq!((snapshot.in_flight, snapshot.opened), (0, 0));
}

/// While calls pour in from 4 threads, a failure ratio of 20% never reads as 50%: over 100
/// fresh breakers, each given 2,000 calls by each thread (one in five a 503, from the first call
/// on, when the window is small and grows fastest), none opens.
#[test]
fn a_ratio_below_the_threshold_never_reads_above_it_under_contention() {
    for round in 0..100 {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(round));
        let (counted, snapshot) = hammer(&breaker, |breaker| {
            let mut counted = Counted::default();
            for i in 0..2_000 {
                let outcome = if i % 5 == 0 {
                    counted.failed += 1;
                    UNAVAILABLE
                } else {
                    Outcome::success()
                };
                breaker
                    .try_acquire()
                    .unwrap()
                    .record(&outcome, &HeaderMap::new());
                counted.recorded += 1;
            }
            counted
        });
        assert_eq!(snapshot.opened, 0, "round {round}: {snapshot:?}");
        assert_eq!(
            (snapshot.calls, snapshot.failures),
            (counted.recorded, counted.failed)
        );
    }
}

/// 4 threads recording nothing but failures, 10,000 attempts each: the breaker opens exactly
/// once, every attempt let through before it opened is counted, every later one is refused, and
/// nothing is left in flight.
#[test]
fn under_contention_the_breaker_opens_once() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(2));
    let (counted, snapshot) = hammer(&breaker, |breaker| {
        let mut counted = Counted::default();
        for _ in 0..10_000 {
            match breaker.try_acquire() {
                Ok(permit) => {
                    permit.record(&UNAVAILABLE, &HeaderMap::new());
                    counted.recorded += 1;
                }
                Err(Rejected::Open(open)) => {
                    assert_eq!(open.cause(), OpenCause::Failures);
                    counted.open += 1;
                }
                Err(Rejected::Full(_)) => unreachable!("no bulkhead"),
            }
        }
        counted
    });
    assert_eq!(counted.recorded + counted.open, THREADS as u64 * 10_000);
    assert!(counted.recorded >= 20, "{counted:?}");
    assert_eq!((snapshot.state, snapshot.opened), (State::Open, 1));
    assert_eq!(snapshot.cause, Some(OpenCause::Failures));
    assert_eq!(
        (snapshot.calls, snapshot.failures),
        (counted.recorded, counted.recorded)
    );
    assert_eq!(snapshot.in_flight, 0);
}

/// A bulkhead of 2 under 4 threads: no more than 2 attempts are ever held at once (as counted by
/// the threads themselves, inside each permit's lifetime), refusals are `BulkheadFull`, and every
/// attempt let through is counted.
#[test]
fn under_contention_the_bulkhead_holds() {
    let breaker = CircuitBreaker::new(
        BreakerConfig::default()
            .with_max_in_flight(Some(2))
            .with_seed(3),
    );
    let holding = AtomicU32::new(0);
    let most = AtomicU32::new(0);
    let (counted, snapshot) = hammer(&breaker, |breaker| {
        let mut counted = Counted::default();
        for _ in 0..20_000 {
            match breaker.try_acquire() {
                Ok(permit) => {
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::hint::spin_loop();
                    holding.fetch_sub(1, Ordering::SeqCst);
                    permit.record(&Outcome::success(), &HeaderMap::new());
                    counted.recorded += 1;
                }
                Err(Rejected::Full(full)) => {
                    assert_eq!(full.max_in_flight(), 2);
                    counted.full += 1;
                }
                Err(Rejected::Open(open)) => panic!("{open}"),
            }
        }
        counted
    });
    assert_eq!(counted.recorded + counted.full, THREADS as u64 * 20_000);
    assert!(most.load(Ordering::SeqCst) <= 2);
    assert_eq!(snapshot.calls, counted.recorded);
    assert_eq!((snapshot.in_flight, snapshot.state), (0, State::Closed));
}
