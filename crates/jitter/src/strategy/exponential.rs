use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP, exponential_ceiling};
use crate::Backoff;

/// Plain exponential backoff, without jitter: the delay before retry `n + 1` is
/// `min(cap, base * 2^n)`.
///
/// Deterministic, so it needs no seed. Clients that fail together retry together with it: use it
/// only where a single client retries alone (or in tests and comparisons).
#[derive(Clone, Debug)]
pub struct Exponential {
    base: Duration,
    cap: Duration,
}

impl Exponential {
    /// Doubling from `base`, never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// The first delay.
    pub fn base(&self) -> Duration {
        self.base
    }
}

impl Default for Exponential {
    /// Base 500 ms, cap 8 s (see [`DEFAULT_BASE`](crate::DEFAULT_BASE)).
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl Backoff for Exponential {
    type Schedule = ExponentialSchedule;

    fn schedule(&self) -> ExponentialSchedule {
        ExponentialSchedule {
            base: self.base,
            cap: self.cap,
            attempt: 0,
        }
    }

    fn cap(&self) -> Duration {
        self.cap
    }
}

/// One request's exponential delays (see [`Exponential`]). Never ends.
#[derive(Clone, Debug)]
pub struct ExponentialSchedule {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Iterator for ExponentialSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = exponential_ceiling(self.base, self.cap, self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        Some(delay)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
