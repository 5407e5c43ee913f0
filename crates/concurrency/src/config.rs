//! [`ConcurrencyConfig`]: the bounds and the steps of a [`ConcurrencyLimit`](crate::ConcurrencyLimit).

use std::time::Duration;

/// How a [`ConcurrencyLimit`](crate::ConcurrencyLimit) starts, moves and waits. Every setter
/// changes one thing; [`Default`] has the values below, each with its source.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcurrencyConfig {
    initial: u32,
    min: u32,
    max: u32,
    backoff: f64,
    used: f64,
    max_wait: Duration,
}

impl ConcurrencyConfig {
    /// The limit before anything was learned: 20, Netflix concurrency-limits' `AIMDLimit` and
    /// palantir/dialogue's limiter both start there. A provider that holds fewer is found by its
    /// first overload answers.
    pub const DEFAULT_INITIAL: u32 = 20;
    /// The floor: 3 attempts in flight at least, Envoy's adaptive concurrency filter's
    /// `min_concurrency` (raised from 1 in envoyproxy/envoy PR #9007). A floor of one would let a
    /// single slow answer hold the backend's only probe; with three, answers keep coming back
    /// to grow the limit again once the provider recovers (Envoy #38338 is a limit that never
    /// did).
    pub const DEFAULT_MIN: u32 = 3;
    /// The ceiling: 1,000, Envoy's `max_concurrency_limit` and Netflix's Vegas `maxConcurrency`.
    pub const DEFAULT_MAX: u32 = 1_000;
    /// What a shrink multiplies the limit by: 0.9, the backoff of Netflix's `AIMDLimit`,
    /// palantir/dialogue's limiter and Vector's adaptive request concurrency alike. Gentler than
    /// halving (llm-d's batch gateway, TCP): a provider that answers 429 over its slots is full,
    /// not gone, and a cut by half would leave half of it idle until the limit grows back.
    pub const DEFAULT_BACKOFF: f64 = 0.9;
    /// The share of the limit that must be in flight for an answer to count towards growth:
    /// 0.9, palantir/dialogue's `inflight >= floor(0.9 * limit)`. Below it the client is
    /// application-limited and an answer says nothing about more room (Netflix's `AIMDLimit`
    /// asks for half, which lets an idle limit drift to twice the load).
    pub const DEFAULT_USED: f64 = 0.9;
    /// How long an attempt waits for a slot before it is refused: 2 s, as long as the rate limit
    /// waits for its slot, and never past the request's deadline.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(2);

    /// A limit that never moves: `limit` attempts in flight (at least 1), a bulkhead that holds
    /// a place until the answer's body ends. The other settings keep their defaults.
    pub fn fixed(limit: u32) -> Self {
        Self::default()
            .with_initial(limit)
            .with_bounds(limit, limit)
    }

    /// Start at `initial` attempts in flight (clamped to the bounds).
    pub fn with_initial(mut self, initial: u32) -> Self {
        self.initial = initial;
        self
    }

    /// Keep the limit between `min` and `max` attempts in flight. `min` is at least 1 (a limit
    /// of none would never learn again) and `max` at least `min`.
    pub fn with_bounds(mut self, min: u32, max: u32) -> Self {
        self.min = min.max(1);
        self.max = max.max(self.min);
        self
    }

    /// Multiply the limit by `backoff` on an overload signal (clamped to 0.5 to 0.99, the range
    /// Netflix's `AIMDLimit` accepts).
    pub fn with_backoff(mut self, backoff: f64) -> Self {
        self.backoff = if backoff.is_nan() {
            Self::DEFAULT_BACKOFF
        } else {
            backoff.clamp(0.5, 0.99)
        };
        self
    }

    /// Count an answer towards growth only when at least `used` of the limit (0 to 1) was in
    /// flight as its attempt was admitted or as it ends.
    pub fn with_used(mut self, used: f64) -> Self {
        self.used = if used.is_nan() {
            Self::DEFAULT_USED
        } else {
            used.clamp(0.0, 1.0)
        };
        self
    }

    /// Wait at most `max_wait` for a slot (zero: refuse at once when full).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The limit before anything was learned, within the bounds.
    pub fn initial(&self) -> u32 {
        self.initial.clamp(self.min, self.max)
    }

    /// The bounds: `(min, max)`.
    pub fn bounds(&self) -> (u32, u32) {
        (self.min, self.max)
    }

    /// What a shrink multiplies the limit by.
    pub fn backoff(&self) -> f64 {
        self.backoff
    }

    /// The share of the limit in flight for an answer to count towards growth.
    pub fn used(&self) -> f64 {
        self.used
    }

    /// How long an attempt waits for a slot at most.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        Self {
            initial: Self::DEFAULT_INITIAL,
            min: Self::DEFAULT_MIN,
            max: Self::DEFAULT_MAX,
            backoff: Self::DEFAULT_BACKOFF,
            used: Self::DEFAULT_USED,
            max_wait: Self::DEFAULT_MAX_WAIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_values_are_clamped() {
        let config = ConcurrencyConfig::default()
            .with_bounds(0, 0)
            .with_backoff(f64::NAN)
            .with_used(7.0)
            .with_initial(u32::MAX);
        assert_eq!(config.bounds(), (1, 1));
        assert_eq!(config.backoff(), 0.9);
        assert_eq!(config.used(), 1.0);
        assert_eq!(config.initial(), 1);
        assert_eq!(
            ConcurrencyConfig::default().with_backoff(0.1).backoff(),
            0.5
        );
    }
}
