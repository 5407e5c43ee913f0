//! Contention and hostile configuration: four threads mixing deposits and withdrawals while the
//! window turns under them account for every event exactly and never overdraw; any constructor
//! arguments give a working budget.
#![allow(clippy::unwrap_used)]

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use stormguard_budget::{BudgetConfig, BudgetSnapshot, RetryBudget};

const THREADS: u64 = 4;
const OPS: u64 = 20_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    deposits: u64,
    granted: u64,
    refused: u64,
    refunded: u64,
}

/// Four threads, each doing `OPS` rounds of "deposit, and every other round try a retry" (giving
/// back every `refund_every`-th retry granted, if set), on a paused clock that the main thread
/// moves 1 s forward eight times while they run (10 s window, so every event stays inside it).
fn mixed_run(ratio: f32, refund_every: Option<u64>) -> (BudgetSnapshot, Tally) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let handle = runtime.handle();
    let budget = {
        let _clock = handle.enter();
        RetryBudget::new(
            BudgetConfig::default()
                .with_min_per_sec(0)
                .with_ratio(ratio),
        )
    };
    let progress = AtomicU64::new(0);
    let start = Barrier::new(THREADS as usize + 1);
    let tally = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (budget, progress, start) = (budget.clone(), &progress, &start);
                scope.spawn(move || {
                    let _clock = handle.enter();
                    let mut tally = Tally::default();
                    start.wait();
                    for round in 0..OPS {
                        budget.deposit();
                        tally.deposits += 1;
                        if round % 2 == 0 {
                            match budget.ticket() {
                                Some(mut ticket) => {
                                    tally.granted += 1;
                                    if refund_every.is_some_and(|n| tally.granted % n == 0) {
                                        // Dropped unsent: given back.
                                        tally.refunded += 1;
                                    } else {
                                        ticket.send();
                                    }
                                }
                                None => tally.refused += 1,
                            }
                        }
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    tally
                })
            })
            .collect();
        start.wait();
        for step in 1..=8 {
            // Move the clock once the threads are `step` ninths through their work.
            while progress.load(Ordering::Relaxed) < step * THREADS * OPS / 9 {
                thread::yield_now();
            }
            runtime.block_on(tokio::time::advance(Duration::from_secs(1)));
        }
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .fold(Tally::default(), |sum, tally| Tally {
                deposits: sum.deposits + tally.deposits,
                granted: sum.granted + tally.granted,
                refused: sum.refused + tally.refused,
                refunded: sum.refunded + tally.refunded,
            })
    });
    // The budget's clock is the runtime's: read it there.
    let _clock = runtime.enter();
    (budget.snapshot(), tally)
}

/// Every deposit, grant and refusal is counted exactly once; the retries granted never exceed
/// `ratio x deposits`; and what is left is exactly the rest of the budget.
#[test]
fn mixed_deposits_and_withdrawals_from_four_threads_account_exactly() {
    for (ratio, expected_total) in [(0.25_f32, 20_000_u64), (0.1, 8_000), (1.0, 80_000)] {
        let (snapshot, tally) = mixed_run(ratio, None);
        assert_eq!(tally.deposits, THREADS * OPS);
        assert_eq!(tally.granted + tally.refused, THREADS * OPS / 2);
        assert!(
            tally.granted <= expected_total,
            "ratio {ratio}: {} granted of {expected_total}",
            tally.granted
        );
        assert_eq!(snapshot.deposits, tally.deposits, "ratio {ratio}");
        assert_eq!(snapshot.withdrawals, tally.granted, "ratio {ratio}");
        assert_eq!(snapshot.rejected, tally.refused, "ratio {ratio}");
        // The budget is not stingier than the rule either: the rest is still there.
        assert_eq!(
            snapshot.balance,
            expected_total - tally.granted,
            "ratio {ratio}"
        );
    }
}

/// Refunds racing grants: every third retry granted is given back at once. The retries that stand
/// (granted minus refunded) never exceed `ratio x deposits`, the snapshot counts exactly those,
/// and the refunded ones are available again (more are granted than without refunds).
#[test]
fn refunds_from_four_threads_give_back_exactly_what_they_took() {
    for (ratio, expected_total) in [(0.25_f32, 20_000_u64), (0.1, 8_000)] {
        let (snapshot, tally) = mixed_run(ratio, Some(3));
        let standing = tally.granted - tally.refunded;
        assert!(tally.refunded > 0, "ratio {ratio}: nothing refunded");
        assert_eq!(tally.granted + tally.refused, THREADS * OPS / 2);
        assert!(
            standing <= expected_total,
            "ratio {ratio}: {standing} standing of {expected_total}"
        );
        assert!(
            tally.granted > expected_total,
            "ratio {ratio}: refunds were not reused"
        );
        assert_eq!(snapshot.withdrawals, standing, "ratio {ratio}");
        assert_eq!(snapshot.rejected, tally.refused, "ratio {ratio}");
        assert_eq!(snapshot.balance, expected_total - standing, "ratio {ratio}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any arguments (zero, huge, NaN, infinite, negative) give a budget that grants a bounded
    /// number of retries and reports itself without panicking.
    #[test]
    fn any_configuration_gives_a_working_budget(
        ttl_nanos in prop_oneof![Just(0_u64), 1_u64..=10_000_000_000, Just(u64::MAX)],
        min_per_sec in prop_oneof![0_u32..10, Just(u32::MAX)],
        ratio in prop_oneof![
            0.0_f32..=2.0,
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(f32::MAX),
            Just(-1.0_f32),
        ],
        deposits in 0_u32..200,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let _clock = runtime.enter();
        let budget = RetryBudget::new(BudgetConfig::default().with_ttl(Duration::from_nanos(ttl_nanos)).with_min_per_sec(min_per_sec).with_ratio(ratio));
        prop_assert!(budget.ratio() >= 0.0 && budget.ratio() <= 1000.0);
        prop_assert!(budget.ttl() >= Duration::from_millis(10));
        prop_assert!(budget.ttl() <= Duration::from_secs(3600));
        for _ in 0..deposits {
            budget.deposit();
        }
        let before = budget.snapshot();
        prop_assert_eq!(before.deposits, u64::from(deposits));
        // Bounded: the rule's credit, and never more than 1,000 tries here.
        let mut granted = 0_u64;
        while granted < 1_000 && budget.withdraw() {
            granted += 1;
        }
        let credit = f64::from(budget.ratio()) * f64::from(deposits)
            + f64::from(budget.min_per_sec()) * budget.ttl().as_secs_f64();
        prop_assert!(granted as f64 <= credit + 1e-6, "{granted} granted of {credit}");
        let after = budget.snapshot();
        prop_assert_eq!(after.withdrawals, granted);
        if granted < 1_000 {
            prop_assert_eq!(after.balance, 0);
            prop_assert_eq!(after.rejected, 1);
        }
        let _ = format!("{budget:?}");
    }
}
