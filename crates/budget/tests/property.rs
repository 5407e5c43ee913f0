//! Property: whatever the sequence of deposits, withdrawals and clock moves, the retries granted in
//! the window that ends at any grant stay within `ratio × deposits + min_per_sec × ttl` (exactly:
//! the fixed-point units need no +1 for rounding at these ratios), and the budget is not stingier
//! than that either.
#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use stormguard_budget::{BudgetConfig, RetryBudget};

#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(Duration),
    Deposit(u32),
    Withdraw(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u64..4_000).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        1 => (0u64..3).prop_map(|s| Op::Advance(Duration::from_secs(s * 5))),
        3 => (0u32..60).prop_map(Op::Deposit),
        3 => (0u32..25).prop_map(Op::Withdraw),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    ttl: Duration,
    min_per_sec: u32,
    ratio: f32,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![
            Duration::from_secs(1),
            Duration::from_millis(2_500),
            Duration::from_secs(10),
        ]),
        0u32..4,
        prop::sample::select(vec![0.0f32, 0.05, 0.1, 0.2, 0.333, 0.6, 0.7, 1.0, 2.5]),
        prop::collection::vec(op(), 1..80),
    )
        .prop_map(|(ttl, min_per_sec, ratio, ops)| Case {
            ttl,
            min_per_sec,
            ratio,
            ops,
        })
}

/// Events per slice, as the test sees them.
#[derive(Default, Clone, Copy)]
struct Slice {
    deposits: u64,
    granted: u64,
}

/// Runs one case on a paused clock; returns the largest `granted - bound` over every window that
/// ends at a grant.
fn check(case: &Case) -> Result<f64, TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let budget = RetryBudget::new(
            BudgetConfig::default()
                .with_ttl(case.ttl)
                .with_min_per_sec(case.min_per_sec)
                .with_ratio(case.ratio),
        );
        let slice = case.ttl / 10;
        let floor = f64::from(case.min_per_sec) * case.ttl.as_secs_f64();
        // The decimal the caller wrote (0.7, not the f32 nearest to it, 0.69999998...).
        let ratio: f64 = case.ratio.to_string().parse().unwrap();
        let mut elapsed = Duration::ZERO;
        let mut slices: Vec<Slice> = Vec::new();
        let mut worst = f64::NEG_INFINITY;

        for op in &case.ops {
            let epoch = (elapsed.as_nanos() / slice.as_nanos()) as usize;
            if slices.len() <= epoch {
                slices.resize(epoch + 1, Slice::default());
            }
            match *op {
                Op::Advance(by) => {
                    tokio::time::advance(by).await;
                    elapsed += by;
                }
                Op::Deposit(n) => {
                    for _ in 0..n {
                        budget.deposit();
                    }
                    slices[epoch].deposits += u64::from(n);
                }
                Op::Withdraw(n) => {
                    for _ in 0..n {
                        let window = &slices[epoch.saturating_sub(9)..=epoch];
                        let deposits: u64 = window.iter().map(|s| s.deposits).sum();
                        let granted: u64 = window.iter().map(|s| s.granted).sum();
                        let bound = ratio * deposits as f64 + floor;
                        if budget.withdraw() {
                            slices[epoch].granted += 1;
                            let after = (granted + 1) as f64;
                            worst = worst.max(after - bound);
                            prop_assert!(after <= bound + 1e-9, "granted {after} > bound {bound}");
                        } else {
                            // Refused only when one more retry would not fit.
                            prop_assert!(
                                (granted + 1) as f64 > bound - 1e-9,
                                "refused at {granted} granted, bound {bound}"
                            );
                        }
                    }
                }
            }
            // The snapshot agrees with the test's own count of the window.
            let epoch = (elapsed.as_nanos() / slice.as_nanos()) as usize;
            let start = epoch.saturating_sub(9);
            let in_window = |f: fn(&Slice) -> u64| -> u64 {
                slices
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| (start..=epoch).contains(i))
                    .map(|(_, s)| f(s))
                    .sum()
            };
            let snapshot = budget.snapshot();
            prop_assert_eq!(snapshot.deposits, in_window(|s| s.deposits));
            prop_assert_eq!(snapshot.withdrawals, in_window(|s| s.granted));
        }
        Ok(worst)
    })
}

#[test]
fn granted_never_exceeds_ratio_times_deposits_plus_floor() {
    let worst = Mutex::new(f64::NEG_INFINITY);
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&case(), |case| {
            let seen = check(&case)?;
            let mut worst = worst.lock().unwrap();
            *worst = worst.max(seen);
            Ok(())
        })
        .unwrap();
    let worst = *worst.lock().unwrap();
    println!("largest granted - (ratio x deposits + floor) over all windows: {worst:.9}");
    // Whole retries only: the budget can never grant a fraction beyond the bound.
    assert!(worst <= 1e-9, "granted exceeded the exact bound by {worst}");
}
