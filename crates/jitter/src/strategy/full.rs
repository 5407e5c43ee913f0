use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP, exponential_ceiling, uniform};
use crate::Backoff;
use crate::seed::SeedSource;

/// Full jitter: the delay before retry `n + 1` is `U(0, min(cap, base * 2^n))`.
///
/// From the AWS Architecture Blog, "Exponential Backoff And Jitter" (Marc Brooker): of the
/// strategies compared there, full jitter does the least total work and finishes soonest under
/// contention, because it spreads a synchronised fleet over the whole window. The default backoff.
///
/// ```
/// use std::time::Duration;
/// use stormguard_jitter::{Backoff, FullJitter};
///
/// let backoff = FullJitter::new(Duration::from_millis(100), Duration::from_secs(1)).with_seed(7);
/// let delays: Vec<Duration> = backoff.schedule().take(6).collect();
/// for (n, delay) in delays.iter().enumerate() {
///     let ceiling = Duration::from_millis(100 * (1 << n)).min(Duration::from_secs(1));
///     assert!(*delay <= ceiling);
/// }
/// ```
#[derive(Clone, Debug)]
pub struct FullJitter {
    base: Duration,
    cap: Duration,
    seeds: SeedSource,
}

impl FullJitter {
    /// Full jitter growing from `base`, never above `cap` (the cap wins if `cap < base`).
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

impl Default for FullJitter {
    /// Base 500 ms, cap 8 s: the retry delays of OpenAI's official Python and Node SDKs.
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl Backoff for FullJitter {
    type Schedule = FullJitterSchedule;

    fn schedule(&self) -> FullJitterSchedule {
        FullJitterSchedule {
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

/// One request's full-jitter delays (see [`FullJitter`]). Never ends.
#[derive(Clone, Debug)]
pub struct FullJitterSchedule {
    rng: fastrand::Rng,
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Iterator for FullJitterSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = exponential_ceiling(self.base, self.cap, self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        Some(uniform(&mut self.rng, Duration::ZERO, ceiling))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
