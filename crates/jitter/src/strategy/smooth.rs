use std::time::Duration;

use rand::RngExt;
use rand::rngs::SmallRng;

use super::jittered::{Jittered, Shape};

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
pub type SmoothDecorrelatedJitter = Jittered<SmoothDecorrelated>;

/// The [`Shape`] of [`SmoothDecorrelatedJitter`]: increments of `f(t) = 2^t * tanh(sqrt(4 t))` at
/// `t_n = n + U(0, 1)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SmoothDecorrelated;

/// Where a smooth schedule is on its curve.
#[derive(Clone, Copy, Debug)]
pub struct SmoothState {
    attempt: u32,
    /// `f(t_{n-1})`, or 0 before the first delay.
    previous: f64,
}

fn curve(t: f64) -> f64 {
    t.exp2() * (P * t).sqrt().tanh()
}

impl Shape for SmoothDecorrelated {
    type State = SmoothState;

    fn start(_base: Duration) -> SmoothState {
        SmoothState {
            attempt: 0,
            previous: 0.0,
        }
    }

    fn next(
        state: &mut SmoothState,
        rng: &mut SmallRng,
        base: Duration,
        cap: Duration,
    ) -> Duration {
        if state.attempt > LAST_COMPUTED_ATTEMPT {
            return cap;
        }
        let t = f64::from(state.attempt) + rng.random::<f64>();
        state.attempt += 1;
        let current = curve(t);
        let increment = current - state.previous;
        state.previous = current;

        let scale = base.as_secs_f64() / curve(0.5);
        let seconds = increment * scale;
        // The curve is increasing, so the increment is never negative; NaN or infinity (a base near
        // `Duration::MAX`) and anything out of `Duration`'s range are beyond the cap.
        let delay = if seconds <= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(seconds).unwrap_or(cap)
        };
        delay.min(cap)
    }
}
