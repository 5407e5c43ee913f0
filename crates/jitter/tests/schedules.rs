//! Behaviour of every backoff strategy: bounds, growth, determinism, and the distribution of full
//! jitter.

use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;
use stormguard_jitter::{
    Backoff, Constant, DecorrelatedJitter, EqualJitter, Exponential, FullJitter,
    SmoothDecorrelatedJitter,
};

const MS: Duration = Duration::from_millis(1);

fn nth<B: Backoff>(backoff: &B, n: usize) -> Duration {
    backoff.schedule().nth(n).unwrap_or(Duration::MAX)
}

#[test]
fn full_jitter_defaults_are_openai_sdk_values() {
    let backoff = FullJitter::default();
    assert_eq!(backoff.base(), Duration::from_millis(500));
    assert_eq!(backoff.cap(), Duration::from_secs(8));
}

#[test]
fn full_jitter_is_uniform_on_zero_to_ceiling() {
    // Attempt index 3: ceiling min(8 s, 500 ms * 2^3) = 4 s.
    let backoff = FullJitter::default().with_seed(2024);
    let ceiling = Duration::from_secs(4);
    let samples: Vec<Duration> = (0..100_000).map(|_| nth(&backoff, 3)).collect();
    assert!(samples.iter().all(|d| *d <= ceiling));

    let mean = samples.iter().map(Duration::as_secs_f64).sum::<f64>() / samples.len() as f64;
    assert!(
        (mean - 2.0).abs() < 0.02 * 2.0,
        "mean {mean} s, expected 2 s"
    );

    let mut deciles = [0u32; 10];
    for sample in &samples {
        let bucket = (sample.as_secs_f64() / ceiling.as_secs_f64() * 10.0) as usize;
        deciles[bucket.min(9)] += 1;
    }
    // 10,000 expected per decile; the standard deviation is ~95, so +-500 is over 5 sigma.
    for (i, count) in deciles.iter().enumerate() {
        assert!((9_500..=10_500).contains(count), "decile {i}: {count}");
    }
}

#[test]
fn full_jitter_ceiling_doubles_up_to_the_cap() {
    let backoff = FullJitter::new(Duration::from_millis(100), Duration::from_secs(1)).with_seed(1);
    // Per attempt, the largest of 2,000 draws lands just under that attempt's ceiling.
    let expected_ms = [100, 200, 400, 800, 1000, 1000];
    for (n, ceiling_ms) in expected_ms.into_iter().enumerate() {
        let ceiling = Duration::from_millis(ceiling_ms);
        let max = (0..2_000)
            .map(|_| nth(&backoff, n))
            .max()
            .unwrap_or_default();
        assert!(max <= ceiling, "attempt {n}: {max:?} > {ceiling:?}");
        assert!(max >= ceiling.mul_f64(0.99), "attempt {n}: {max:?}");
    }
}

#[test]
fn equal_jitter_keeps_half_the_ceiling() {
    let backoff =
        EqualJitter::new(Duration::from_millis(100), Duration::from_secs(10)).with_seed(5);
    for n in 0..6 {
        let ceiling = Duration::from_millis(100 << n);
        let samples: Vec<Duration> = (0..2_000).map(|_| nth(&backoff, n)).collect();
        let min = samples.iter().min().copied().unwrap_or_default();
        let max = samples.iter().max().copied().unwrap_or_default();
        assert!(
            min >= ceiling / 2 && max <= ceiling,
            "attempt {n}: {min:?}..{max:?}"
        );
        assert!(min <= ceiling.mul_f64(0.51) && max >= ceiling.mul_f64(0.99));
    }
}

#[test]
fn decorrelated_jitter_stays_between_base_and_three_times_the_previous_delay() {
    let base = Duration::from_millis(100);
    let cap = Duration::from_secs(5);
    let backoff = DecorrelatedJitter::new(base, cap).with_seed(11);
    for _ in 0..500 {
        let mut previous = base;
        for delay in backoff.schedule().take(20) {
            assert!(delay >= base, "{delay:?} below base");
            assert!(
                delay <= (previous * 3).min(cap),
                "{delay:?} after {previous:?}"
            );
            previous = delay;
        }
    }
    // The first delay is U(100 ms, 300 ms): mean 200 ms.
    let mean = (0..20_000)
        .map(|_| nth(&backoff, 0).as_secs_f64())
        .sum::<f64>()
        / 20_000.0;
    assert!((mean - 0.2).abs() < 0.004, "mean first delay {mean}");
}

#[test]
fn smooth_decorrelated_jitter_has_median_first_delay_base_and_doubles() {
    let base = Duration::from_millis(200);
    let backoff = SmoothDecorrelatedJitter::new(base, Duration::from_secs(3600)).with_seed(3);
    let mut first: Vec<Duration> = (0..10_001).map(|_| nth(&backoff, 0)).collect();
    first.sort();
    let median = first[5_000];
    assert!(
        median.abs_diff(base) < base / 20,
        "median first delay {median:?}"
    );

    // Mean delay per attempt grows towards 2x per retry, and every delay is positive. The exact
    // growth of the means of `f(t) = 2^t * tanh(sqrt(4 t))` at `t_n = n + U(0, 1)` (numerical
    // integration): 1.33, 1.79, 1.99, then 2.00 to three digits. 10,000 schedules estimate each
    // with a standard error below 0.02.
    let attempts = 8;
    let mut sums = vec![0.0f64; attempts];
    for _ in 0..10_000 {
        for (n, delay) in backoff.schedule().take(attempts).enumerate() {
            assert!(delay > Duration::ZERO);
            sums[n] += delay.as_secs_f64();
        }
    }
    let expected = [1.33, 1.79, 1.99, 2.0, 2.0, 2.0, 2.0];
    for n in 1..attempts {
        let ratio = sums[n] / sums[n - 1];
        let exact = expected[n - 1];
        assert!(
            (ratio - exact).abs() < 0.1,
            "attempt {n}: growth {ratio}, expected {exact}"
        );
    }
}

#[test]
fn exponential_and_constant_are_exact() {
    let exponential: Vec<Duration> =
        Exponential::new(Duration::from_millis(250), Duration::from_secs(3))
            .schedule()
            .take(6)
            .collect();
    let expected: Vec<Duration> = [250, 500, 1000, 2000, 3000, 3000]
        .into_iter()
        .map(Duration::from_millis)
        .collect();
    assert_eq!(exponential, expected);

    let constant = Constant::new(Duration::from_millis(700));
    assert_eq!(constant.cap(), Duration::from_millis(700));
    assert!(
        constant
            .schedule()
            .take(50)
            .all(|d| d == Duration::from_millis(700))
    );
}

fn first_delays<B: Backoff>(backoff: &B, schedules: usize) -> Vec<Vec<Duration>> {
    (0..schedules)
        .map(|_| backoff.schedule().take(5).collect())
        .collect()
}

#[test]
fn seeded_backoffs_replay_across_runs_and_schedules_differ() {
    fn check<B: Backoff>(make: impl Fn() -> B) {
        let a = first_delays(&make(), 50);
        let b = first_delays(&make(), 50);
        assert_eq!(a, b, "same seed, same sequence of schedules");
        let distinct: HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 50, "successive schedules differ");
    }
    let (base, cap) = (Duration::from_millis(100), Duration::from_secs(10));
    check(|| FullJitter::new(base, cap).with_seed(42));
    check(|| EqualJitter::new(base, cap).with_seed(42));
    check(|| DecorrelatedJitter::new(base, cap).with_seed(42));
    check(|| SmoothDecorrelatedJitter::new(base, cap).with_seed(42));
}

#[test]
fn different_seeds_and_unseeded_backoffs_differ() {
    let (base, cap) = (Duration::from_millis(100), Duration::from_secs(10));
    let one = first_delays(&FullJitter::new(base, cap).with_seed(1), 10);
    let two = first_delays(&FullJitter::new(base, cap).with_seed(2), 10);
    assert_ne!(one, two);
    let unseeded = FullJitter::new(base, cap);
    assert_eq!(unseeded.seed(), None);
    assert_eq!(FullJitter::new(base, cap).with_seed(2).seed(), Some(2));
    let distinct: HashSet<_> = first_delays(&unseeded, 20).into_iter().collect();
    assert_eq!(distinct.len(), 20);
}

#[test]
fn clones_keep_handing_out_distinct_schedules() {
    let backoff = FullJitter::default().with_seed(9);
    let clone = backoff.clone();
    let a: Vec<Duration> = backoff.schedule().take(5).collect();
    let b: Vec<Duration> = clone.schedule().take(5).collect();
    assert_ne!(a, b);
}

#[test]
fn attempt_one_thousand_and_huge_bases_stay_within_the_cap() {
    let cap = Duration::from_secs(30);
    let huge = Duration::MAX - MS;
    let backoffs: Vec<(&str, Vec<Duration>)> = vec![
        (
            "full",
            FullJitter::new(huge, cap).schedule().take(1001).collect(),
        ),
        (
            "equal",
            EqualJitter::new(huge, cap).schedule().take(1001).collect(),
        ),
        (
            "decorrelated",
            DecorrelatedJitter::new(huge, cap)
                .schedule()
                .take(1001)
                .collect(),
        ),
        (
            "smooth",
            SmoothDecorrelatedJitter::new(huge, cap)
                .schedule()
                .take(1001)
                .collect(),
        ),
        (
            "none",
            Exponential::new(huge, cap).schedule().take(1001).collect(),
        ),
    ];
    for (name, delays) in backoffs {
        assert!(delays.iter().all(|d| *d <= cap), "{name}");
    }
    let uncapped = FullJitter::new(MS, Duration::MAX).schedule().nth(1000);
    assert!(uncapped.is_some());
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=10_000_000_000).prop_map(Duration::from_nanos),
        (0u64..=86_400_000).prop_map(Duration::from_millis),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_delay_ever_exceeds_the_cap(
        base in duration(),
        cap in duration(),
        seed in any::<u64>(),
        skip in 0usize..1000,
    ) {
        fn check<B: Backoff>(backoff: B, skip: usize) -> Result<(), TestCaseError> {
            let cap = backoff.cap();
            for delay in backoff.schedule().skip(skip).take(40) {
                prop_assert!(delay <= cap, "{delay:?} > {cap:?}");
            }
            Ok(())
        }
        check(FullJitter::new(base, cap).with_seed(seed), skip)?;
        check(EqualJitter::new(base, cap).with_seed(seed), skip)?;
        check(DecorrelatedJitter::new(base, cap).with_seed(seed), skip)?;
        check(SmoothDecorrelatedJitter::new(base, cap).with_seed(seed), skip)?;
        check(Exponential::new(base, cap), skip)?;
        check(Constant::new(base), skip)?;
    }

    #[test]
    fn full_jitter_stays_under_the_exponential_ceiling(
        base_ms in 0u64..10_000,
        cap_ms in 0u64..100_000,
        seed in any::<u64>(),
    ) {
        let (base, cap) = (Duration::from_millis(base_ms), Duration::from_millis(cap_ms));
        let backoff = FullJitter::new(base, cap).with_seed(seed);
        for (n, delay) in backoff.schedule().take(64).enumerate() {
            let ceiling = base.checked_mul(1u32.checked_shl(n as u32).unwrap_or(u32::MAX))
                .unwrap_or(Duration::MAX)
                .min(cap);
            prop_assert!(delay <= ceiling, "attempt {n}: {delay:?} > {ceiling:?}");
        }
    }
}
