//! Model checking of the sliding window's counters with loom: every interleaving of two threads
//! (and every value each atomic read may see) is explored. Under the flag the window's counters
//! are loom's model atomics; the retry budget's model (`crates/budget/tests/loom.rs`) checks the
//! protocol it builds on them, and these models check the counters alone, as the adaptive
//! throttle uses them.
//!
//! Run with `RUSTFLAGS="--cfg stormguard_loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! stormguard-numbers --test loom --release`. Without the flag this file is empty.
//!
//! Epochs are passed in, not read from the clock: a model can put two threads in two slices.
//!
//! loom can miss the interleavings in which a thread's plain load sees a write that another
//! thread made after loading the same atomic itself (tokio-rs/loom#166). So the model with more
//! than one outcome checks that its executions reached each ([`explore`]).
#![cfg(stormguard_loom)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loom::thread;
use stormguard_numbers::window::SlidingWindow;

const SLICES: usize = 4;

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

fn window() -> Arc<SlidingWindow<1>> {
    Arc::new(SlidingWindow::new(Duration::from_secs(4), SLICES))
}

#[test]
fn two_increments_in_one_slice_both_count() {
    loom::model(|| {
        let window = window();
        let other = Arc::clone(&window);
        let racer = thread::spawn(move || other.add(7, 0));
        window.add(7, 0);
        racer.join().unwrap();
        assert_eq!(window.sum(7, 0), 2);
    });
}

#[test]
fn a_rotation_racing_an_increment_loses_neither() {
    let new = explore(|| {
        // Slice 3 holds an old count; slice 7 reuses its slot. One thread counts late into slice
        // 3 while another opens slice 7: the late event counts in whichever slice the slot holds
        // when it lands, and the old count is gone.
        let window = window();
        window.add(3, 0);
        window.add(3, 0);
        let other = Arc::clone(&window);
        let late = thread::spawn(move || other.add(3, 0));
        window.add(7, 0);
        late.join().unwrap();
        let new = window.counter(7, 0).load().count_at(7);
        let old = window.counter(3, 0).load().count_at(3);
        // Either the late event landed before the rotation (old slice: 3, then replaced: new 1)
        // or after it (counted in the new slice: 2).
        assert!(new == 1 || new == 2, "new slice holds {new}");
        assert_eq!(old, 0, "the old slice left the slot");
        new
    });
    assert_eq!(new, BTreeSet::from([1, 2]));
}

#[test]
fn a_decrement_racing_a_rotation_never_touches_the_new_slice() {
    loom::model(|| {
        let window = window();
        window.add(3, 0);
        let other = Arc::clone(&window);
        let taker = thread::spawn(move || other.counter(3, 0).decrement(3));
        window.add(7, 0);
        taker.join().unwrap();
        assert_eq!(window.counter(7, 0).load().count_at(7), 1);
    });
}
