//! Model checking of the throttle's lock-free counts with loom: every interleaving of two threads
//! (and every value each atomic read may see under the orderings used) is explored. Under the
//! flag the recovery run's counter and flag, and the sliding window's counters (from
//! `stormguard-classify`), are loom's models.
//!
//! Run with `RUSTFLAGS="--cfg stormguard_loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! stormguard-adaptive-throttle --test loom --release`. Without the flag this file is empty.
//!
//! The clock is not a loom object: the window is an hour, so the microseconds a model takes stay
//! in its first slice, and each execution starts from a new throttle. Slices that end under
//! racing threads are covered by the window's own models (`crates/numbers/tests/loom.rs`) and
//! by the threaded tests on a paused clock (tests/concurrency.rs).
//!
//! loom can miss the interleavings in which a thread's plain load sees a write that another
//! thread made after loading the same atomic itself (tokio-rs/loom#166): a snapshot only loads
//! the counters, a record loads each and then adds to it. So the models check that their
//! executions reached every outcome they expect ([`explore`]), and the thread that only reads is
//! the spawned one, which loom runs second by default, where it sees the race.
#![cfg(stormguard_loom)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use loom::thread;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, ThrottlePermit};
use stormguard_classify::{Outcome, Permit, Reason};

/// Runs `model` under loom: the outcomes its executions returned, each once.
fn explore<T, F>(model: F) -> BTreeSet<T>
where
    T: Ord + Send + 'static,
    F: Fn() -> T + Sync + Send + 'static,
{
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let record = Arc::clone(&seen);
    loom::model(move || {
        let outcome = model();
        record.lock().unwrap().insert(outcome);
    });
    std::mem::take(&mut *seen.lock().unwrap())
}

/// An hour's window, drops at any rate, seeded.
fn config() -> ThrottleConfig {
    ThrottleConfig::default()
        .with_window(Duration::from_secs(3600))
        .with_min_rate(0.0)
        .with_seed(1)
}

fn accepted(permit: ThrottlePermit) {
    permit.record(&Outcome::success(), &HeaderMap::new());
}

fn rejected(permit: ThrottlePermit) {
    permit.record(
        &Outcome::retryable(Reason::Overloaded).with_accepted(false),
        &HeaderMap::new(),
    );
}

/// Requests and accepts over the window.
fn counts(throttle: &AdaptiveThrottle) -> (u64, u64) {
    let snapshot = throttle.snapshot();
    (snapshot.requests, snapshot.accepts)
}

#[test]
fn racing_records_count_each_request_once_and_a_forgotten_one_not_at_all() {
    explore(|| {
        let throttle = AdaptiveThrottle::new(config());
        let permits: Vec<_> = (0..3).map(|_| throttle.try_acquire().unwrap()).collect();
        let [told, forgotten, dropped] = <[_; 3]>::try_from(permits).unwrap();
        // One told the backend accepted it and one forgotten there; one dropped untold here,
        // which counts as not accepted.
        let racer = thread::spawn(move || {
            accepted(told);
            forgotten.forget();
        });
        drop(dropped);
        racer.join().unwrap();
        assert_eq!(counts(&throttle), (2, 1));
    });
}

#[test]
fn a_snapshot_racing_records_never_reads_more_accepts_than_requests() {
    let seen = explore(|| {
        let throttle = AdaptiveThrottle::new(config());
        let permits = [
            throttle.try_acquire().unwrap(),
            throttle.try_acquire().unwrap(),
        ];
        let reader = throttle.clone();
        let racer = thread::spawn(move || counts(&reader));
        for permit in permits {
            accepted(permit);
        }
        let (requests, accepts) = racer.join().unwrap();
        // Read while two accepted requests are recorded: every accept read is a request read,
        // and at most one request read (the one being recorded) is missing its accept.
        assert!(
            accepts <= requests,
            "{accepts} accepts of {requests} requests"
        );
        assert!(
            requests - accepts <= 1,
            "{accepts} accepts of {requests} requests"
        );
        (requests, accepts)
    });
    assert!(seen.contains(&(0, 0)) && seen.contains(&(2, 2)), "{seen:?}");
}

#[test]
fn an_accept_run_racing_an_accept_clears_the_window_once() {
    explore(|| {
        // One rejection puts the drop probability above zero (capped at a billionth, so that
        // nothing is dropped): from then on two accepts in a row clear the window.
        let throttle =
            AdaptiveThrottle::new(config().with_max_probability(1e-9).with_recovery_run(2));
        rejected(throttle.try_acquire().unwrap());
        let [here, there] = [
            throttle.try_acquire().unwrap(),
            throttle.try_acquire().unwrap(),
        ];
        let racer = thread::spawn(move || accepted(there));
        accepted(here);
        racer.join().unwrap();
        // The accept that completes the run clears the window: the rejection, and both accepts
        // of the run, each counted before its step of the run.
        assert_eq!(counts(&throttle), (0, 0), "the window was not cleared");
        assert_eq!(throttle.probability(), 0.0);
    });
}
