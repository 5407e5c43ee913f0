use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP, exponential_ceiling, uniform};
use crate::Backoff;
use crate::seed::SeedSource;

/// Equal jitter: with `c = min(cap, base * 2^n)`, the delay before retry `n + 1` is
/// `c/2 + U(0, c/2)`.
///
/// From the AWS Architecture Blog, "Exponential Backoff And Jitter": keeps half of the exponential
/// delay as a floor, so no retry comes back almost at once, at the price of a narrower spread than
/// [`FullJitter`](crate::FullJitter).
#[derive(Clone, Debug)]
pub struct EqualJitter {
    base: Duration,
    cap: Duration,
    seeds: SeedSource,
}

impl EqualJitter {
    /// Equal jitter growing from `base`, never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            seeds: SeedSource::default(),
        }
    }

    /// Makes the sequence of schedules deterministic; successive schedules still differ.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seeds = SeedSource::with_seed(seed);
        self
    }

    /// The first ceiling, `base * 2^0`.
    pub fn base(&self) -> Duration {
        self.base
    }
}

impl Default for EqualJitter {
    /// Base 500 ms, cap 8 s (see [`DEFAULT_BASE`](crate::DEFAULT_BASE)).
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl Backoff for EqualJitter {
    type Schedule = EqualJitterSchedule;

    fn schedule(&self) -> EqualJitterSchedule {
        EqualJitterSchedule {
            rng: self.seeds.rng(),
            base: self.base,
            cap: self.cap,
            attempt: 0,
        }
    }

    fn cap(&self) -> Duration {
        self.cap
    }
}

/// One request's equal-jitter delays (see [`EqualJitter`]). Never ends.
#[derive(Clone, Debug)]
pub struct EqualJitterSchedule {
    rng: fastrand::Rng,
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Iterator for EqualJitterSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = exponential_ceiling(self.base, self.cap, self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        // `half + U(0, ceiling - half)` rather than `2 * half`, so an odd nanosecond count still
        // reaches the ceiling and never exceeds it.
        Some(half + uniform(&mut self.rng, Duration::ZERO, ceiling - half))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
