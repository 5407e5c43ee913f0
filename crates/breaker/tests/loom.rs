//! Model checking of the breaker's lock-free paths with loom: every interleaving of two threads
//! (and every value each atomic read may see under the orderings used) is explored. Under the
//! flag the breaker's flags and counts, its state machine's lock and the sliding window's
//! counters (from `stormguard-classify`) are loom's models; the stall's wake-ups stay tokio's.
//!
//! Run with `RUSTFLAGS="--cfg stormguard_loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! stormguard-breaker --test loom --release`. Without the flag this file is empty.
//!
//! The clock is not a loom object: each execution runs on tokio's clock, paused (see
//! [`explore`]), with an hour's window and open waits of an hour or none. Waits, leases and
//! slices that end are covered by the tests on a paused clock (tests/transitions.rs,
//! tests/probes.rs, tests/stall.rs).
//!
//! loom can miss the interleavings in which a thread's plain load sees a write that another
//! thread made after loading the same atomic itself (tokio-rs/loom#166). So each model checks
//! that its executions reached every outcome it expects.
//!
//! Not modelled: the wake-up of an attempt waiting for a stall's cut. It goes through tokio's
//! `Notify`, whose own synchronization loom cannot see: it would let the waiting attempt read
//! the generation from before the cut after the `Notify` told it of the cut, which the
//! `Notify`'s lock rules out. tests/cut.rs races real threads on it.
#![cfg(stormguard_loom)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::HeaderMap;
use loom::thread;
use stormguard_breaker::{BreakerConfig, BreakerPermit, CircuitBreaker, OpenCause, State};
use stormguard_classify::{Outcome, Permit, Reason};
use tokio::runtime::Runtime;

const HOUR: Duration = Duration::from_secs(3600);

/// Runs `model` under loom, on tokio's clock, paused: the outcomes its executions returned,
/// each once.
///
/// loom replays an execution from the start to explore the next and needs each to take the same
/// branches: on the paused clock every instant is the one the model sets. loom runs its threads
/// on the thread that entered the runtime, so they all read that clock.
fn explore<T, F>(model: F) -> BTreeSet<T>
where
    T: Ord + Send + 'static,
    F: Fn(&Runtime) -> T + Sync + Send + 'static,
{
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let record = Arc::clone(&seen);
    loom::model(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = {
            let _clock = runtime.enter();
            model(&runtime)
        };
        record.lock().unwrap().insert(outcome);
    });
    std::mem::take(&mut *seen.lock().unwrap())
}

/// An hour's window, an hour open, no stall detection.
fn config() -> BreakerConfig {
    BreakerConfig::default()
        .with_window(HOUR)
        .with_open_wait(HOUR, HOUR)
        .without_stall_detection()
        .with_seed(1)
}

fn failed(permit: BreakerPermit) {
    permit.record(&Outcome::retryable(Reason::Unavailable), &HeaderMap::new());
}

/// A health failure that is no answer: it leaves the quickest answer and the last answer alone,
/// which keeps the models that race failures small.
fn timed_out(permit: BreakerPermit) {
    permit.record(&Outcome::retryable(Reason::Timeout), &HeaderMap::new());
}

fn succeeded(permit: BreakerPermit) {
    permit.record(&Outcome::success(), &HeaderMap::new());
}

#[test]
fn racing_failures_open_it_once() {
    explore(|_| {
        // Two calls, half of them failures, open it: two failures recorded at once.
        let breaker = CircuitBreaker::new(config().with_min_calls(2));
        let (first, second) = (
            breaker.try_acquire().unwrap(),
            breaker.try_acquire().unwrap(),
        );
        let racer = thread::spawn(move || timed_out(first));
        timed_out(second);
        racer.join().unwrap();
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::Open);
        assert_eq!(snapshot.opened, 1, "opened more than once");
        assert_eq!((snapshot.calls, snapshot.failures), (2, 2));
        assert_eq!(snapshot.in_flight, 0);
    });
}

#[test]
fn a_ratio_read_while_calls_are_recorded_never_overstates_the_failures() {
    explore(|_| {
        // 70% of at least two calls would open it. One failure here, a success then a failure
        // there: 50% of two calls, 67% of three, never 70% however the records interleave.
        let breaker = CircuitBreaker::new(config().with_min_calls(2).with_failure_ratio(0.7));
        let here = breaker.try_acquire().unwrap();
        let there = [
            breaker.try_acquire().unwrap(),
            breaker.try_acquire().unwrap(),
        ];
        let racer = thread::spawn(move || {
            let [success, failure] = there;
            succeeded(success);
            timed_out(failure);
        });
        timed_out(here);
        racer.join().unwrap();
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.opened, 0, "opened at {:?}", snapshot.cause);
        assert_eq!((snapshot.calls, snapshot.failures), (3, 2));
    });
}

#[test]
fn racing_half_open_admissions_lease_one_probe_and_a_probe_dropped_untold_frees_it() {
    let probes = explore(|_| {
        // One failure opens it, with no wait: the next attempt is a probe, one at a time, a
        // lease of an hour apart.
        let breaker = CircuitBreaker::new(
            config()
                .with_consecutive_failures(Some(1))
                .with_open_wait(Duration::ZERO, Duration::ZERO)
                .with_probes(1, HOUR),
        );
        failed(breaker.try_acquire().unwrap());
        let other = breaker.clone();
        // Each drops its probe, if it got one, untold: the caller gave up on it.
        let racer = thread::spawn(move || other.try_acquire().map(|probe| probe.is_probe()));
        let here = breaker.try_acquire().map(|probe| probe.is_probe());
        let there = racer.join().unwrap();
        assert!(
            matches!((&here, &there), (Ok(true), Err(_)) | (Err(_), Ok(true))),
            "here {here:?}, there {there:?}"
        );
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::HalfOpen);
        assert_eq!((snapshot.probes, snapshot.in_flight), (0, 0));
        assert_eq!(snapshot.opened, 1);
        here.is_ok()
    });
    assert_eq!(probes, BTreeSet::from([false, true]));
}

#[test]
fn the_bulkhead_never_lets_more_in_than_its_cap_and_in_flight_returns_to_zero() {
    let admitted = explore(|_| {
        // One attempt in flight at most. One thread tells its permit, the other drops it.
        let breaker = CircuitBreaker::new(config().with_max_in_flight(Some(1)));
        // Attempts holding a permit, counted outside the model.
        let holding = Arc::new(AtomicU32::new(0));
        let (other, held) = (breaker.clone(), Arc::clone(&holding));
        let racer = thread::spawn(move || {
            let permit = other.try_acquire().ok()?;
            hold(&held);
            succeeded(permit);
            Some(())
        });
        let here = breaker.try_acquire().ok().map(|permit| {
            hold(&holding);
            drop(permit);
        });
        let there = racer.join().unwrap();
        let admitted = u64::from(here.is_some()) + u64::from(there.is_some());
        assert!(admitted >= 1, "an empty bulkhead refused both");
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.in_flight, 0);
        // A told permit counts, a dropped one does not.
        assert_eq!(snapshot.calls, u64::from(there.is_some()));
        admitted
    });
    assert_eq!(admitted, BTreeSet::from([1, 2]));
}

/// Counts an attempt in while it holds its permit (the caller lets go of the permit next).
fn hold(holding: &AtomicU32) {
    let others = holding.fetch_add(1, SeqCst);
    assert_eq!(others, 0, "two attempts in flight past a cap of one");
    holding.fetch_sub(1, SeqCst);
}

#[test]
fn an_attempt_let_in_while_a_stall_opens_the_breaker_is_cut() {
    let admitted = explore(|runtime| {
        // Stall detection from the first nanosecond of silence after one answer, cutting.
        let breaker =
            CircuitBreaker::new(config().with_stall_detection(Duration::ZERO, f64::MIN_POSITIVE));
        succeeded(breaker.try_acquire().unwrap());
        let mut in_flight = breaker.try_acquire().unwrap();
        runtime.block_on(tokio::time::advance(Duration::from_millis(1)));
        // Two attempts find the backend silent for a millisecond with one in flight: one of
        // them opens the breaker on a stall, and the other is refused, or let in before the
        // stall and cut with the attempts in flight.
        let other = breaker.clone();
        let racer = thread::spawn(move || other.try_acquire().ok());
        let mut here = breaker.try_acquire().ok();
        let mut there = racer.join().unwrap();
        let noop = &mut Context::from_waker(Waker::noop());
        for permit in [Some(&mut in_flight), here.as_mut(), there.as_mut()]
            .into_iter()
            .flatten()
        {
            match permit.poll_cut(noop) {
                Poll::Ready(open) => assert_eq!(open.cause(), OpenCause::Stall),
                Poll::Pending => panic!("an attempt in flight was not cut"),
            }
        }
        let admitted = u8::from(here.is_some()) + u8::from(there.is_some());
        // Cut, a permit is settled: telling it now counts nothing.
        failed(in_flight);
        drop((here, there));
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.opened, snapshot.cause),
            (1, Some(OpenCause::Stall))
        );
        assert_eq!((snapshot.in_flight, snapshot.calls), (0, 1));
        admitted
    });
    assert_eq!(admitted, BTreeSet::from([0, 1]));
}
