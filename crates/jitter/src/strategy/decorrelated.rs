use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP, uniform};
use crate::Backoff;
use crate::seed::SeedSource;

/// Decorrelated jitter: `delay = min(cap, U(base, 3 * previous))`, starting from
/// `previous = base`.
///
/// From the AWS Architecture Blog, "Exponential Backoff And Jitter". Each delay depends on the
/// previous one rather than on the attempt number, so the schedule grows by about 1.5x per retry on
/// average and can also shrink. Its first delays are longer than full jitter's, and any delay can
/// drop back towards `base`.
#[derive(Clone, Debug)]
pub struct DecorrelatedJitter {
    base: Duration,
    cap: Duration,
    seeds: SeedSource,
}

impl DecorrelatedJitter {
    /// Decorrelated jitter with floor `base`, never above `cap` (the cap wins if `cap < base`).
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

    /// The floor of every delay (unless the cap is lower).
    pub fn base(&self) -> Duration {
        self.base
    }
}

impl Default for DecorrelatedJitter {
    /// Base 500 ms, cap 8 s (see [`DEFAULT_BASE`](crate::DEFAULT_BASE)).
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl Backoff for DecorrelatedJitter {
    type Schedule = DecorrelatedSchedule;

    fn schedule(&self) -> DecorrelatedSchedule {
        DecorrelatedSchedule {
            rng: self.seeds.rng(),
            base: self.base,
            cap: self.cap,
            previous: self.base,
        }
    }

    fn cap(&self) -> Duration {
        self.cap
    }
}

/// One request's decorrelated-jitter delays (see [`DecorrelatedJitter`]). Never ends.
#[derive(Clone, Debug)]
pub struct DecorrelatedSchedule {
    rng: fastrand::Rng,
    base: Duration,
    cap: Duration,
    previous: Duration,
}

impl Iterator for DecorrelatedSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let low = self.base.min(self.cap);
        let high = self.previous.saturating_mul(3).max(low);
        let delay = uniform(&mut self.rng, low, high).min(self.cap);
        self.previous = delay;
        Some(delay)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
