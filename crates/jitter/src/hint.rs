//! Server hints combined with the backoff schedule: see [`HintPolicy`].

use std::time::Duration;

use stormguard_classify::hint::DEFAULT_MAX_HINT;
use stormguard_numbers::random::RandomSource;

use crate::strategy::{from_nanos, uniform};

/// Default share of the hint added as jitter, at most: 10%.
pub const DEFAULT_HINT_JITTER_RATIO: f64 = 0.1;

/// Default ceiling of the jitter added to a hint: 1 s.
pub const DEFAULT_HINT_JITTER_CEILING: Duration = Duration::from_secs(1);

/// How a server hint (`Retry-After`, `retry-after-ms`, `grpc-retry-pushback-ms`, ...) replaces the
/// computed backoff delay.
///
/// A server that says "retry in 3 s" knows more than any client-side formula, so its hint replaces
/// the computed delay. Two rules keep that safe:
///
/// - **Never earlier than asked, but not all at once.** A fleet told "3 s" must not come back at
///   3.000 s together, so a small bounded jitter is *added*: `hint + U(0, min(10% of hint, 1 s))`.
///   The result is never below the hint. (A hint of zero gets no extra delay: the server asked for
///   an immediate retry.)
/// - **A hint above the maximum means "do not retry"** ([`HintedDelay::TooLong`]), never a silently
///   shortened wait: a retry sent before the server's stated time is one it has announced it will
///   reject. The default maximum is 60 s ([`stormguard_classify::hint::DEFAULT_MAX_HINT`], where
///   the choice is explained). The result of a hint at or below
///   the maximum never exceeds the maximum either: the added jitter is clipped there.
///
/// ```
/// use std::time::Duration;
/// use stormguard_jitter::{HintedDelay, HintPolicy};
///
/// let policy = HintPolicy::default().with_seed(1);
/// match policy.apply(Duration::from_secs(3)) {
///     HintedDelay::RetryAfter(delay) => {
///         assert!(delay >= Duration::from_secs(3));
///         assert!(delay <= Duration::from_millis(3300));
///     }
///     HintedDelay::TooLong { .. } => unreachable!(),
/// }
/// assert!(policy.apply(Duration::from_secs(120)).is_too_long());
/// ```
#[derive(Clone, Debug)]
pub struct HintPolicy {
    max: Duration,
    ratio: f64,
    ceiling: Duration,
    random: RandomSource,
}

impl Default for HintPolicy {
    /// Maximum 60 s ([`DEFAULT_MAX_HINT`]); jitter
    /// `U(0, min(10% of hint, 1 s))` ([`DEFAULT_HINT_JITTER_RATIO`],
    /// [`DEFAULT_HINT_JITTER_CEILING`]); unseeded.
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_HINT,
            ratio: DEFAULT_HINT_JITTER_RATIO,
            ceiling: DEFAULT_HINT_JITTER_CEILING,
            random: RandomSource::new(),
        }
    }
}

impl HintPolicy {
    /// The default policy (see [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Hints above `max` are reported as [`HintedDelay::TooLong`].
    pub fn with_max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// The added jitter is `U(0, min(ratio * hint, ceiling))`. `ratio` is clamped to `[0, 1]`
    /// (NaN counts as 0); `ratio = 0` or `ceiling = 0` turns the added jitter off.
    pub fn with_jitter(mut self, ratio: f64, ceiling: Duration) -> Self {
        self.ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        self.ceiling = ceiling;
        self
    }

    /// Makes the added jitter deterministic across runs (successive hints still differ).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.random = RandomSource::seeded(seed);
        self
    }

    /// The longest hint that is still followed.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The jitter's `(ratio, ceiling)`, the ratio as clamped by [`with_jitter`](Self::with_jitter).
    pub fn jitter(&self) -> (f64, Duration) {
        (self.ratio, self.ceiling)
    }

    /// The seed given to [`with_seed`](Self::with_seed), if any.
    pub fn seed(&self) -> Option<u64> {
        self.random.seed()
    }

    /// Turns a server hint into a delay, or into "do not retry".
    pub fn apply(&self, hint: Duration) -> HintedDelay {
        if hint > self.max {
            return HintedDelay::TooLong {
                hint,
                max: self.max,
            };
        }
        // `ratio` is within [0, 1], so the product is finite and at most `hint`; rounded down to
        // whole nanoseconds, so the jitter never exceeds its share (3.5 ns of a 35 ns hint is 3).
        let share_nanos = (hint.as_nanos() as f64 * self.ratio).floor();
        let share = from_nanos(share_nanos as u128).min(hint);
        let spread = share.min(self.ceiling);
        let extra = if spread.is_zero() {
            Duration::ZERO
        } else {
            uniform(&mut self.random.rng(), Duration::ZERO, spread)
        };
        // `hint <= max`, so clipping at `max` never goes below the hint.
        HintedDelay::RetryAfter(hint.saturating_add(extra).min(self.max))
    }
}

/// What to do with a server hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintedDelay {
    /// Retry after this delay: the hint plus a small jitter, never less than the hint.
    RetryAfter(Duration),
    /// The server asked for a wait above the policy's maximum: do not retry.
    TooLong {
        /// What the server asked for.
        hint: Duration,
        /// The policy's maximum.
        max: Duration,
    },
}

impl HintedDelay {
    /// The delay, if a retry should follow.
    pub fn delay(&self) -> Option<Duration> {
        match self {
            Self::RetryAfter(delay) => Some(*delay),
            Self::TooLong { .. } => None,
        }
    }

    /// Whether the hint was above the maximum.
    pub fn is_too_long(&self) -> bool {
        matches!(self, Self::TooLong { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_second_hint_is_spread_over_three_to_three_point_three() {
        let policy = HintPolicy::default().with_seed(42);
        let delays: Vec<Duration> = (0..1000)
            .filter_map(|_| policy.apply(Duration::from_secs(3)).delay())
            .collect();
        assert_eq!(delays.len(), 1000);
        let min = delays.iter().min().copied().unwrap_or_default();
        let max = delays.iter().max().copied().unwrap_or_default();
        assert!(min >= Duration::from_secs(3));
        assert!(max <= Duration::from_millis(3300));
        // Spread over the window, not clumped: the extremes sit near both ends.
        assert!(min < Duration::from_millis(3010), "min {min:?}");
        assert!(max > Duration::from_millis(3290), "max {max:?}");
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 990);
    }

    #[test]
    fn jitter_is_at_most_one_second_for_long_hints() {
        let policy = HintPolicy::default().with_seed(3);
        for _ in 0..1000 {
            let delay = policy.apply(Duration::from_secs(30)).delay();
            let delay = delay.unwrap_or_default();
            assert!(delay >= Duration::from_secs(30) && delay <= Duration::from_secs(31));
        }
    }

    #[test]
    fn defaults_are_sixty_seconds_and_ten_percent_up_to_one_second() {
        let policy = HintPolicy::default();
        assert_eq!(policy.max(), DEFAULT_MAX_HINT);
        assert_eq!(policy.max(), Duration::from_secs(60));
        assert_eq!(policy.jitter(), (0.1, Duration::from_secs(1)));
        let custom = policy.with_jitter(7.0, Duration::from_millis(5));
        assert_eq!(custom.jitter(), (1.0, Duration::from_millis(5)));
    }

    #[test]
    fn hint_above_max_is_too_long_never_shortened() {
        let policy = HintPolicy::default();
        assert_eq!(
            policy.apply(Duration::from_secs(61)),
            HintedDelay::TooLong {
                hint: Duration::from_secs(61),
                max: Duration::from_secs(60)
            }
        );
        let strict = HintPolicy::default().with_max(Duration::from_secs(5));
        assert!(strict.apply(Duration::from_millis(5001)).is_too_long());
        assert!(!strict.apply(Duration::from_secs(5)).is_too_long());
        assert!(policy.apply(Duration::MAX).is_too_long());
    }

    #[test]
    fn hint_at_max_stays_within_max() {
        let policy = HintPolicy::default().with_seed(9);
        for _ in 0..100 {
            assert_eq!(
                policy.apply(Duration::from_secs(60)),
                HintedDelay::RetryAfter(Duration::from_secs(60))
            );
        }
    }

    #[test]
    fn the_jitter_of_a_tiny_hint_stays_within_its_share() {
        // 10% of 35 ns is 3.5 ns: the jitter is at most 3 ns, never the 4 a rounding would give.
        let policy = HintPolicy::default().with_seed(11);
        let hint = Duration::from_nanos(35);
        let extras: Vec<Duration> = (0..1000)
            .filter_map(|_| policy.apply(hint).delay())
            .map(|delay| delay - hint)
            .collect();
        assert_eq!(extras.len(), 1000);
        assert!(extras.iter().all(|extra| *extra <= Duration::from_nanos(3)));
        assert!(extras.contains(&Duration::from_nanos(3)));
    }

    #[test]
    fn zero_hint_and_disabled_jitter_return_the_hint() {
        let policy = HintPolicy::default();
        assert_eq!(policy.apply(Duration::ZERO).delay(), Some(Duration::ZERO));
        let exact = HintPolicy::default().with_jitter(f64::NAN, Duration::from_secs(1));
        assert_eq!(
            exact.apply(Duration::from_secs(2)).delay(),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn seeded_policies_replay() {
        let a = HintPolicy::default().with_seed(5);
        let b = HintPolicy::default().with_seed(5);
        assert_eq!((a.seed(), HintPolicy::default().seed()), (Some(5), None));
        for _ in 0..10 {
            assert_eq!(
                a.apply(Duration::from_secs(4)),
                b.apply(Duration::from_secs(4))
            );
        }
    }
}
