//! Server hints of any size through `HintPolicy::apply`, under any policy: a hint above the
//! maximum is refused as it came (never shortened), any other hint is delayed by at most its
//! jitter share and never past the maximum, and nothing panics or overflows, up to
//! `Duration::MAX`.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use stormguard_jitter::{HintPolicy, HintedDelay};

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=120_000).prop_map(Duration::from_millis),
        (0u64..=1_000_000).prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        (0u32..1_000_000_000).prop_map(|nanos| Duration::new(u64::MAX, nanos)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

fn ratio() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0..=1.0,
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
    ]
}

/// The ratio `HintPolicy::with_jitter` documents: NaN is 0, the rest is clamped to `0..=1`.
fn effective(ratio: f64) -> f64 {
    if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn any_hint_under_any_policy_is_refused_whole_or_delayed_within_bounds(
        hint in duration(),
        max in duration(),
        ratio in ratio(),
        ceiling in duration(),
        seed in any::<u64>(),
    ) {
        let policy = HintPolicy::default()
            .with_max(max)
            .with_jitter(ratio, ceiling)
            .with_seed(seed);
        prop_assert_eq!(policy.max(), max);
        let decision = policy.apply(hint);
        if hint > max {
            prop_assert_eq!(decision, HintedDelay::TooLong { hint, max });
            prop_assert!(decision.is_too_long());
            prop_assert_eq!(decision.delay(), None);
            return Ok(());
        }
        let Some(delay) = decision.delay() else {
            return Err(TestCaseError::fail(format!("{hint:?} <= {max:?} refused")));
        };
        prop_assert!(!decision.is_too_long());
        prop_assert!(delay >= hint, "{delay:?} shorter than the hint {hint:?}");
        prop_assert!(delay <= max, "{delay:?} above the maximum {max:?}");
        // The extra jitter is at most min(ceiling, hint x ratio), give or take the rounding of
        // the f64 product (a few ULPs of the hint).
        let share = hint.as_secs_f64() * effective(ratio);
        let extra = (delay - hint).as_secs_f64();
        prop_assert!(
            extra <= ceiling.as_secs_f64().min(share) * (1.0 + 1e-9) + 1e-9,
            "extra {extra} s above min({ceiling:?}, {share} s)"
        );
    }

    #[test]
    fn a_default_policy_never_waits_past_sixty_seconds(hint in duration(), seed in any::<u64>()) {
        let decision = HintPolicy::default().with_seed(seed).apply(hint);
        match decision {
            HintedDelay::RetryAfter(delay) => {
                prop_assert!(hint <= Duration::from_secs(60));
                prop_assert!(delay >= hint && delay <= Duration::from_secs(60));
                // Default jitter: at most 10 % of the hint and at most 1 s.
                prop_assert!(delay - hint <= (hint / 10).min(Duration::from_secs(1)));
            }
            HintedDelay::TooLong { hint: refused, max } => {
                prop_assert_eq!(refused, hint);
                prop_assert_eq!(max, Duration::from_secs(60));
                prop_assert!(hint > max);
            }
        }
    }
}

/// The largest hints there are, with the loosest policy: no overflow in `hint + jitter`, and the
/// result is still clipped to the maximum.
#[test]
fn duration_max_hints_with_an_unbounded_policy_saturate_at_the_maximum() {
    let policy = HintPolicy::default()
        .with_max(Duration::MAX)
        .with_jitter(1.0, Duration::MAX)
        .with_seed(7);
    for hint in [
        Duration::MAX,
        Duration::MAX - Duration::from_nanos(1),
        Duration::new(u64::MAX, 0),
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(1 << 53),
    ] {
        let delay = policy.apply(hint).delay().unwrap();
        assert!(delay >= hint, "{hint:?} -> {delay:?}");
    }
    assert_eq!(
        policy.apply(Duration::MAX),
        HintedDelay::RetryAfter(Duration::MAX)
    );
    // A maximum of zero refuses everything but a zero hint, which stays zero.
    let none = HintPolicy::default().with_max(Duration::ZERO);
    assert_eq!(
        none.apply(Duration::ZERO),
        HintedDelay::RetryAfter(Duration::ZERO)
    );
    assert!(none.apply(Duration::from_nanos(1)).is_too_long());
}
