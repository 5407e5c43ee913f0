use std::time::Duration;

use rand::rngs::SmallRng;

use super::jittered::{Jittered, Shape};
use super::uniform;

/// Decorrelated jitter: `delay = min(cap, U(base, 3 * previous))`, starting from
/// `previous = base`.
///
/// From the AWS Architecture Blog, "Exponential Backoff And Jitter". Each delay depends on the
/// previous one rather than on the attempt number, so the schedule grows by about 1.5x per retry on
/// average and can also shrink. Its first delays are longer than full jitter's, and any delay can
/// drop back towards `base`.
pub type DecorrelatedJitter = Jittered<Decorrelated>;

/// The [`Shape`] of [`DecorrelatedJitter`]: `min(cap, U(base, 3 * previous))`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Decorrelated;

impl Shape for Decorrelated {
    /// The previous delay (`base` before the first).
    type State = Duration;

    fn start(base: Duration) -> Duration {
        base
    }

    fn next(
        previous: &mut Duration,
        rng: &mut SmallRng,
        base: Duration,
        cap: Duration,
    ) -> Duration {
        let low = base.min(cap);
        let high = previous.saturating_mul(3).max(low);
        let delay = uniform(rng, low, high).min(cap);
        *previous = delay;
        delay
    }
}
