use std::time::Duration;

use stormguard_numbers::random::RandomSource;
use tower_layer::Layer;

use super::Spread;
use crate::strategy::uniform;

/// Delays the start of each request by `U(0, max)`: see the [module docs](crate::spread).
///
/// Cheap to clone; every clone, and every service it builds, draws from one [`RandomSource`], so a
/// seeded layer hands its services distinct delays that replay on every run.
#[derive(Clone, Debug)]
pub struct SpreadLayer {
    max: Duration,
    random: RandomSource,
}

impl SpreadLayer {
    /// Each request starts after a uniform random delay in `[0, max)`.
    pub fn new(max: Duration) -> Self {
        Self {
            max,
            random: RandomSource::new(),
        }
    }

    /// Makes the sequence of delays deterministic across runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.random = RandomSource::seeded(seed);
        self
    }

    /// The seed given to [`with_seed`](Self::with_seed), if any.
    pub fn seed(&self) -> Option<u64> {
        self.random.seed()
    }

    /// The exclusive upper bound of the delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// One start delay, uniform in `[0, max)`.
    pub(super) fn draw(&self) -> Duration {
        let Some(below_max) = self.max.checked_sub(Duration::from_nanos(1)) else {
            return Duration::ZERO;
        };
        uniform(&mut self.random.rng(), Duration::ZERO, below_max)
    }
}

impl<S> Layer<S> for SpreadLayer {
    type Service = Spread<S>;

    fn layer(&self, inner: S) -> Spread<S> {
        Spread {
            inner,
            spread: self.clone(),
        }
    }
}
