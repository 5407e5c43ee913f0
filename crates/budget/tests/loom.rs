//! Model checking of the budget's lock-free core with loom: every interleaving of two threads
//! (and every value each atomic read may see under the orderings used) is explored. Under the flag
//! both the budget's own `latest` epoch and the sliding window's counters (from
//! `stormguard-classify`) are loom's model atomics.
//!
//! Run with `RUSTFLAGS="--cfg stormguard_loom" cargo test -p stormguard-budget --test loom
//! --release` (a separate target directory avoids rebuilding everything else). Without the flag
//! this file is empty.
//!
//! The models stay within one slice of the window (a 1 h window, read within milliseconds of the
//! budget's creation): the clock is not a loom object. Slice boundaries are covered by the
//! threaded tests (tests/concurrency.rs, tests/robustness.rs), which move a paused clock under
//! racing threads.
//!
//! loom can miss the interleavings in which a thread's plain load sees a write that another
//! thread made after loading the same atomic itself (tokio-rs/loom#166): a withdrawal sums the
//! window with plain loads, a deposit loads its counter and then adds to it. So each model with
//! more than one outcome checks that its executions reached each ([`explore`]), and the thread
//! that only reads is the spawned one, which loom runs second by default, where it sees the race.
#![cfg(stormguard_loom)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loom::thread;
use stormguard_budget::{BudgetConfig, RetryBudget, Ticket};

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

/// A budget with exactly `retries` retries to give: ratio 1, no floor, `retries` successes.
/// A granted retry that is sent: its ticket spent.
fn spend(mut ticket: Ticket) {
    ticket.send();
}

fn budget_of(retries: u32) -> RetryBudget {
    let budget = RetryBudget::new(
        BudgetConfig::default()
            .with_ttl(Duration::from_secs(3600))
            .with_min_per_sec(0)
            .with_ratio(1.0),
    );
    for _ in 0..retries {
        budget.deposit();
    }
    budget
}

#[test]
fn two_threads_racing_for_the_last_retry_get_it_once() {
    let granted_here = explore(|| {
        let budget = budget_of(1);
        let other = budget.clone();
        let racer = thread::spawn(move || other.withdraw());
        let here = budget.withdraw();
        let there = racer.join().unwrap();
        assert!(here ^ there, "granted here {here}, there {there}");
        let snapshot = budget.snapshot();
        assert_eq!((snapshot.withdrawals, snapshot.rejected), (1, 1));
        assert_eq!(snapshot.balance, 0);
        here
    });
    assert_eq!(granted_here, BTreeSet::from([false, true]));
}

#[test]
fn a_withdrawal_racing_a_deposit_is_granted_only_against_it() {
    let granted = explore(|| {
        let budget = budget_of(0);
        let withdrawer = budget.clone();
        let withdrawal = thread::spawn(move || withdrawer.withdraw());
        budget.deposit();
        let granted = withdrawal.join().unwrap();
        let snapshot = budget.snapshot();
        assert_eq!(snapshot.deposits, 1);
        // Granted: the deposit was seen and is now spent. Refused: it is still there.
        let expected = if granted { (1, 0, 0) } else { (0, 1, 1) };
        assert_eq!(
            (snapshot.withdrawals, snapshot.rejected, snapshot.balance),
            expected
        );
        granted
    });
    assert_eq!(granted, BTreeSet::from([false, true]));
}

#[test]
fn a_ticket_given_back_racing_a_withdrawal_never_lets_two_retries_stand() {
    let granted = explore(|| {
        let budget = budget_of(1);
        let first = budget.ticket().unwrap();
        let other = budget.clone();
        let racer = thread::spawn(move || other.ticket().map(spend).is_some());
        drop(first);
        let granted = racer.join().unwrap();
        let snapshot = budget.snapshot();
        // The racer got the retry only if it came after the refund; either way one retry at most
        // stands, and the balance is what is left of the one.
        assert_eq!(snapshot.withdrawals, u64::from(granted));
        assert_eq!(snapshot.rejected, u64::from(!granted));
        assert_eq!(snapshot.balance, u64::from(!granted));
        granted
    });
    assert_eq!(granted, BTreeSet::from([false, true]));
}

#[test]
fn two_threads_withdrawing_two_each_from_three_get_exactly_three() {
    let here = explore(|| {
        let budget = budget_of(3);
        let other = budget.clone();
        let racer =
            thread::spawn(move || u64::from(other.withdraw()) + u64::from(other.withdraw()));
        let here = u64::from(budget.withdraw()) + u64::from(budget.withdraw());
        let there = racer.join().unwrap();
        assert_eq!(here + there, 3);
        let snapshot = budget.snapshot();
        assert_eq!((snapshot.withdrawals, snapshot.rejected), (3, 1));
        here
    });
    assert_eq!(here, BTreeSet::from([1, 2]));
}
