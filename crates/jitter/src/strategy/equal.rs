use std::time::Duration;

use rand::rngs::SmallRng;

use super::jittered::{Jittered, Shape};
use super::{exponential_ceiling, uniform};

/// Equal jitter: with `c = min(cap, base * 2^n)`, the delay before retry `n + 1` is
/// `c/2 + U(0, c/2)`.
///
/// From the AWS Architecture Blog, "Exponential Backoff And Jitter": keeps half of the exponential
/// delay as a floor, so no retry comes back almost at once, at the price of a narrower spread than
/// [`FullJitter`](crate::FullJitter).
pub type EqualJitter = Jittered<Equal>;

/// The [`Shape`] of [`EqualJitter`]: `c/2 + U(0, c/2)` with `c = min(cap, base * 2^n)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Equal;

impl Shape for Equal {
    /// The attempt number `n`.
    type State = u32;

    fn start(_base: Duration) -> u32 {
        0
    }

    fn next(attempt: &mut u32, rng: &mut SmallRng, base: Duration, cap: Duration) -> Duration {
        let ceiling = exponential_ceiling(base, cap, *attempt);
        *attempt = attempt.saturating_add(1);
        let half = ceiling / 2;
        // `half + U(0, ceiling - half)` rather than `2 * half`, so an odd nanosecond count still
        // reaches the ceiling and never exceeds it.
        half + uniform(rng, Duration::ZERO, ceiling - half)
    }
}
