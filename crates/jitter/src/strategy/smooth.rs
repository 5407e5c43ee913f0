use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP};
use crate::Backoff;
use crate::seed::SeedSource;

/// Steepness of the curve's start: `tanh(sqrt(P * t))` rises from 0 to ~1 within the first retry.
const P: f64 = 4.0;

/// Attempts beyond this are at the cap for any base of at least a nanosecond (2^64 ns is 584 years);
/// stopping here also keeps `2^t` far from `f64` overflow.
const LAST_COMPUTED_ATTEMPT: u32 = 128;

/// Smooth decorrelated jitter: exponential growth on average, randomised per retry, without the
/// clumps and the collapses back to `base` of [`DecorrelatedJitter`](crate::DecorrelatedJitter).
///
/// The idea is the "decorrelated jitter V2" backoff of the .NET resilience library Polly (its
/// `Backoff.DecorrelatedJitterBackoffV2`): walk a smooth, strictly increasing curve
/// `f(t) = 2^t * tanh(sqrt(4 t))` at randomised points `t_n = n + U(0, 1)` and use the increments
/// `f(t_n) - f(t_{n-1})` as delays. Because every `t_n` lies in its own unit interval, the delays keep
/// the exponential trend (about 2x per retry), every retry gets fresh randomness, and a delay is
/// never negative. The scale is chosen here so that the *median first delay* equals `base`
/// (`f(0.5)` maps to `base`). Delays above `cap` are clamped to it (as Polly does), so at the cap this
/// variant loses its spread: when most retries hit the cap, prefer [`FullJitter`](crate::FullJitter).
#[derive(Clone, Debug)]
pub struct SmoothDecorrelatedJitter {
    base: Duration,
    cap: Duration,
    seeds: SeedSource,
}

impl SmoothDecorrelatedJitter {
    /// Median first delay `base`, never above `cap`.
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

    /// The median first delay.
    pub fn base(&self) -> Duration {
        self.base
    }
}

impl Default for SmoothDecorrelatedJitter {
    /// Median first delay 500 ms, cap 8 s (see [`DEFAULT_BASE`](crate::DEFAULT_BASE)).
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl Backoff for SmoothDecorrelatedJitter {
    type Schedule = SmoothDecorrelatedSchedule;

    fn schedule(&self) -> SmoothDecorrelatedSchedule {
        SmoothDecorrelatedSchedule {
            rng: self.seeds.rng(),
            base: self.base,
            cap: self.cap,
            attempt: 0,
            previous: 0.0,
        }
    }

    fn cap(&self) -> Duration {
        self.cap
    }
}

/// One request's smooth decorrelated delays (see [`SmoothDecorrelatedJitter`]). Never ends.
#[derive(Clone, Debug)]
pub struct SmoothDecorrelatedSchedule {
    rng: fastrand::Rng,
    base: Duration,
    cap: Duration,
    attempt: u32,
    /// `f(t_{n-1})`, or 0 before the first delay.
    previous: f64,
}

fn curve(t: f64) -> f64 {
    t.exp2() * (P * t).sqrt().tanh()
}

impl Iterator for SmoothDecorrelatedSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.attempt > LAST_COMPUTED_ATTEMPT {
            return Some(self.cap);
        }
        let t = f64::from(self.attempt) + self.rng.f64();
        self.attempt += 1;
        let current = curve(t);
        let increment = current - self.previous;
        self.previous = current;

        let scale = self.base.as_secs_f64() / curve(0.5);
        let seconds = increment * scale;
        // The curve is increasing, so the increment is never negative; NaN or infinity (a base near
        // `Duration::MAX`) and anything out of `Duration`'s range are beyond the cap.
        let delay = if seconds <= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(seconds).unwrap_or(self.cap)
        };
        Some(delay.min(self.cap))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
