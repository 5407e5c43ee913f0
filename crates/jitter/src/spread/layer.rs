use std::time::Duration;

use tower_layer::Layer;

use super::Jitter;
use crate::seed::SeedSource;

/// Delays the start of each request by `U(0, max)`: see the [module docs](crate::spread).
#[derive(Clone, Debug)]
pub struct JitterLayer {
    max: Duration,
    seeds: SeedSource,
}

impl JitterLayer {
    /// Each request starts after a uniform random delay in `[0, max)`.
    pub fn new(max: Duration) -> Self {
        Self {
            max,
            seeds: SeedSource::default(),
        }
    }

    /// Makes the sequence of delays deterministic across runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seeds = SeedSource::with_seed(seed);
        self
    }

    /// The exclusive upper bound of the delay.
    pub fn max(&self) -> Duration {
        self.max
    }
}

impl<S> Layer<S> for JitterLayer {
    type Service = Jitter<S>;

    fn layer(&self, inner: S) -> Jitter<S> {
        Jitter::with_source(inner, self.max, self.seeds.clone())
    }
}
