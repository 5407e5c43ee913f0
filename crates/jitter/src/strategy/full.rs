use std::time::Duration;

use rand::rngs::SmallRng;

use super::jittered::{Jittered, Shape};
use super::{exponential_ceiling, uniform};

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
pub type FullJitter = Jittered<Full>;

/// The [`Shape`] of [`FullJitter`]: `U(0, min(cap, base * 2^n))`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Full;

impl Shape for Full {
    /// The attempt number `n`.
    type State = u32;

    fn start(_base: Duration) -> u32 {
        0
    }

    fn next(attempt: &mut u32, rng: &mut SmallRng, base: Duration, cap: Duration) -> Duration {
        let ceiling = exponential_ceiling(base, cap, *attempt);
        *attempt = attempt.saturating_add(1);
        uniform(rng, Duration::ZERO, ceiling)
    }
}
