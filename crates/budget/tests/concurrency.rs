//! Concurrent withdrawals never overdraw the budget, also while the window rotates under them.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use stormguard_budget::{BudgetConfig, RetryBudget};

const THREADS: usize = 4;

/// Every thread withdraws until refused; returns the total granted.
fn race_to_empty(budget: &RetryBudget) -> u64 {
    let granted = Arc::new(AtomicU64::new(0));
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (budget, granted, start) = (budget.clone(), granted.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                while budget.withdraw() {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    granted.load(Ordering::Relaxed)
}

#[test]
fn four_threads_get_exactly_the_budget() {
    // (min_per_sec, ratio, deposits, expected = floor(ratio × deposits + min_per_sec × 10 s))
    let cases = [
        (0, 0.1, 1000, 100),
        (1, 0.1, 1000, 110),
        (0, 0.6, 1001, 600),
        (0, 0.2, 5, 1),
        (3, 2.5, 400, 1030),
    ];
    for round in 0..50 {
        for (min_per_sec, ratio, deposits, expected) in cases {
            // Real clock, 10 s window: the whole race happens well inside one window.
            let budget = RetryBudget::new(
                BudgetConfig::default()
                    .with_min_per_sec(min_per_sec)
                    .with_ratio(ratio),
            );
            for _ in 0..deposits {
                budget.deposit();
            }
            let granted = race_to_empty(&budget);
            assert_eq!(
                granted, expected,
                "round {round}: min {min_per_sec}, ratio {ratio}, {deposits} deposits"
            );
            let snapshot = budget.snapshot();
            assert_eq!(snapshot.withdrawals, expected);
            assert_eq!(snapshot.balance, 0);
            // Each thread stopped at its first refusal.
            assert!(snapshot.rejected >= THREADS as u64);
        }
    }
}

#[test]
fn concurrent_deposits_are_all_counted() {
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let budget = budget.clone();
            thread::spawn(move || {
                for _ in 0..25_000 {
                    budget.deposit();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let snapshot = budget.snapshot();
    assert_eq!(snapshot.deposits, 100_000);
    assert_eq!(snapshot.balance, 10_000);
}

/// Threads withdraw on tokio's paused clock while the main thread moves it across slice
/// boundaries, so withdrawals keep racing the window's rotation (and the take-back of withdrawals
/// that land in a slice that another thread already left behind).
#[test]
fn no_overdraw_while_the_window_rotates() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    for round in 0..40 {
        // 10 s window, 1 s slices; 9 boundaries crossed, so every deposit stays in the window.
        let budget = {
            let _clock = handle.enter();
            RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.5))
        };
        // Far more budget than the workers use before the last boundary, so withdrawals are
        // granted (not refused) while the slices turn.
        {
            let _clock = handle.enter();
            for _ in 0..20_000 {
                budget.deposit();
            }
        }
        let expected = 10_000;

        let granted = Arc::new(AtomicU64::new(0));
        let tries = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (budget, granted, tries, stop) =
                    (budget.clone(), granted.clone(), tries.clone(), stop.clone());
                let handle = handle.clone();
                thread::spawn(move || {
                    let _clock = handle.enter();
                    while !stop.load(Ordering::Relaxed) {
                        if budget.withdraw() {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                        tries.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();

        for _ in 0..9 {
            // Let the workers run a while in this slice (measured in tries, not in time), then
            // move to the next slice.
            let seen = tries.load(Ordering::Relaxed);
            while tries.load(Ordering::Relaxed) < seen + 500 {
                thread::yield_now();
            }
            runtime.block_on(tokio::time::advance(Duration::from_secs(1)));
        }
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }

        let _clock = handle.enter();
        let mut total = granted.load(Ordering::Relaxed);
        assert!(
            total <= expected,
            "round {round}: {total} granted of {expected}"
        );
        while budget.withdraw() {
            total += 1;
        }
        assert_eq!(total, expected, "round {round}");
        assert_eq!(budget.snapshot().withdrawals, expected);
    }
}

/// The last retries of the budget are fought over exactly while the clock crosses a slice
/// boundary: a withdrawal that counted itself into the old slice after another thread summed the
/// window from the new slice must take itself back, or both would get the last retry.
#[test]
fn no_overdraw_at_a_slice_boundary() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    for round in 0..2_000 {
        let _clock = handle.enter();
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.5));
        for _ in 0..16 {
            budget.deposit();
        }
        let start = Arc::new(std::sync::Barrier::new(THREADS + 1));
        let granted = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (budget, granted, start) = (budget.clone(), granted.clone(), start.clone());
                let handle = handle.clone();
                thread::spawn(move || {
                    let _clock = handle.enter();
                    start.wait();
                    for _ in 0..4 {
                        if budget.withdraw() {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        start.wait();
        runtime.block_on(tokio::time::advance(Duration::from_secs(1)));
        for worker in workers {
            worker.join().unwrap();
        }
        let mut total = granted.load(Ordering::Relaxed);
        assert!(total <= 8, "round {round}: {total} granted of 8");
        while budget.withdraw() {
            total += 1;
        }
        assert_eq!(total, 8, "round {round}");
    }
}
