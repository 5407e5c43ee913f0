//! Several OS threads hammering one throttle: counts stay exact, nothing panics.
//!
//! The threads enter a runtime whose clock is paused, so they all read the same clock; the main
//! thread moves it forward while they run, so slices roll over under contention.

#![allow(clippy::unwrap_used)]

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, ThrottleSnapshot};

mod support;
use support::answer;

const THREADS: usize = 4;
const PER_THREAD: u64 = 50_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counted {
    attempts: u64,
    passed: u64,
    accepted: u64,
}

/// Run `THREADS` threads of acquire/record pairs (at least `PER_THREAD` each, and until the clock
/// has advanced by `advance` in 1 ms steps); `accepts(i)` says whether a thread's i-th passed
/// request is accepted.
/// Returns what the threads did and the throttle's snapshot at the end.
fn hammer(
    throttle: &AdaptiveThrottle,
    advance: Duration,
    accepts: fn(u64) -> bool,
) -> (Counted, ThrottleSnapshot) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let start = Barrier::new(THREADS + 1);
    let clock_done = AtomicBool::new(false);
    let handle = runtime.handle();
    let counted = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (throttle, start, clock_done) = (throttle.clone(), &start, &clock_done);
                scope.spawn(move || {
                    let _clock = handle.enter();
                    let mut counted = Counted::default();
                    start.wait();
                    while counted.attempts < PER_THREAD || !clock_done.load(Ordering::Relaxed) {
                        counted.attempts += 1;
                        if let Ok(permit) = throttle.try_acquire() {
                            let accepted = accepts(counted.passed);
                            answer(permit, accepted);
                            counted.passed += 1;
                            counted.accepted += u64::from(accepted);
                        }
                    }
                    counted
                })
            })
            .collect();
        start.wait();
        runtime.block_on(async {
            let mut moved = Duration::ZERO;
            while moved < advance {
                tokio::time::advance(Duration::from_millis(1)).await;
                moved += Duration::from_millis(1);
            }
        });
        clock_done.store(true, Ordering::Relaxed);
        workers.into_iter().fold(Counted::default(), |sum, worker| {
            let c = worker.join().unwrap();
            Counted {
                attempts: sum.attempts + c.attempts,
                passed: sum.passed + c.passed,
                accepted: sum.accepted + c.accepted,
            }
        })
    });
    let _clock = runtime.enter();
    let snapshot = throttle.snapshot();
    println!("{counted:?} -> {snapshot:?}");
    (counted, snapshot)
}

/// Two thirds accepted: nothing is dropped, and the window holds exactly every attempt and every
/// accept, although slices rolled over while the threads were counting (the clock moved 1.5 s of
/// the 2 s window).
#[test]
fn counts_are_exact_under_contention() {
    let throttle = AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_k(2.0)
            .with_window(Duration::from_secs(2)),
    );
    let (counted, snapshot) = hammer(&throttle, Duration::from_millis(1_500), |i| i % 3 != 0);
    assert!(counted.attempts >= THREADS as u64 * PER_THREAD);
    assert_eq!(counted.passed, counted.attempts);
    assert_eq!(snapshot.requests, counted.attempts);
    assert_eq!(snapshot.accepts, counted.accepted);
    assert_eq!(snapshot.probability, 0.0);
}

/// A dead backend under contention: drops counted as requests, exactly, and the probability at
/// the cap.
#[test]
fn drops_are_counted_exactly_under_contention() {
    let throttle = AdaptiveThrottle::default();
    let (counted, snapshot) = hammer(&throttle, Duration::from_millis(1_500), |_| false);
    assert_eq!(snapshot.requests, counted.attempts);
    assert_eq!(snapshot.accepts, 0);
    assert_eq!(
        snapshot.probability,
        ThrottleConfig::DEFAULT_MAX_PROBABILITY
    );
    // Once past the minimum rate (10 requests) everything is drawn at 99%.
    let passed = counted.passed as f64 / counted.attempts as f64;
    assert!((0.008..0.012).contains(&passed), "{passed}");
}
