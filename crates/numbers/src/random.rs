//! Where stormguard's randomised parts draw their numbers: one seeding scheme for all of them.
//!
//! Backoff schedules, the jitter added to server hints, start spreading and the adaptive throttle's
//! drops all draw from a [`RandomSource`]: `rand`'s [`SmallRng`], seeded either from the thread's
//! generator (`rand::rng()`, itself seeded from the operating system) or from a seed the user
//! gives with `with_seed(u64)`, the same method on every randomised part.
//!
//! A seeded source must replay the same numbers on every run (tests, the storm simulator), yet two
//! requests must never share one stream: requests that failed together would then retry together,
//! the synchronisation jitter exists to break. So a seeded source keeps the seed and a counter
//! shared by its clones, and its `k`-th generator is `SmallRng::seed_from_u64(seed + k * φ)`
//! (φ = 2^64 / golden ratio, so that nearby seeds and counts give unrelated streams).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// 2^64 divided by the golden ratio: successive generators of one seed start far apart.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Hands out random number generators: unseeded (from the thread's generator) or seeded (the
/// same sequence of generators on every run). Cheap to clone; clones of a seeded source share its
/// counter, so they keep handing out distinct generators.
///
/// ```
/// use rand::RngExt;
/// use stormguard_numbers::random::RandomSource;
///
/// let a = RandomSource::seeded(7);
/// let b = RandomSource::seeded(7);
/// let first: u64 = a.rng().random();
/// assert_eq!(first, b.rng().random::<u64>()); // replays
/// assert_ne!(first, a.rng().random::<u64>()); // the next generator differs
/// ```
#[derive(Clone, Debug, Default)]
pub struct RandomSource {
    seeded: Option<Seeded>,
}

#[derive(Clone, Debug)]
struct Seeded {
    seed: u64,
    issued: Arc<AtomicU64>,
}

impl RandomSource {
    /// An unseeded source: every generator is seeded from the thread's generator.
    pub fn new() -> Self {
        Self::default()
    }

    /// A source seeded with `seed` if there is one ([`seeded`](Self::seeded)), else unseeded
    /// ([`new`](Self::new)): what a configuration's optional seed makes.
    pub fn from_seed(seed: Option<u64>) -> Self {
        seed.map_or_else(Self::new, Self::seeded)
    }

    /// A seeded source: the `k`-th generator it hands out is the same on every run.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seeded: Some(Seeded {
                seed,
                issued: Arc::new(AtomicU64::new(0)),
            }),
        }
    }

    /// The seed, for a seeded source.
    pub fn seed(&self) -> Option<u64> {
        self.seeded.as_ref().map(|seeded| seeded.seed)
    }

    /// A generator for one schedule or one burst of draws.
    pub fn rng(&self) -> SmallRng {
        match &self.seeded {
            // Relaxed is enough: the counter only has to hand out distinct numbers.
            Some(seeded) => {
                let k = seeded.issued.fetch_add(1, Ordering::Relaxed);
                SmallRng::seed_from_u64(seeded.seed.wrapping_add(k.wrapping_mul(GOLDEN_GAMMA)))
            }
            None => rand::make_rng(),
        }
    }

    /// One uniform draw from `[0, 1)`.
    pub fn f64(&self) -> f64 {
        match self.seeded {
            Some(_) => self.rng().random(),
            // The thread's generator directly: no generator to seed for a single draw.
            None => rand::random(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sources_replay_and_successive_generators_differ() {
        let a = RandomSource::seeded(7);
        let b = RandomSource::seeded(7);
        let first: Vec<u64> = (0..4).map(|_| a.rng().random()).collect();
        let again: Vec<u64> = (0..4).map(|_| b.rng().random()).collect();
        assert_eq!(first, again);
        let distinct: std::collections::HashSet<_> = first.iter().collect();
        assert_eq!(distinct.len(), 4);
        assert_eq!(a.seed(), Some(7));
        assert_eq!(RandomSource::new().seed(), None);
    }

    #[test]
    fn clones_share_the_counter_and_draws_stay_in_range() {
        let a = RandomSource::seeded(1);
        let b = a.clone();
        assert_ne!(a.rng().random::<u64>(), b.rng().random::<u64>());
        for source in [a, RandomSource::new()] {
            for _ in 0..1_000 {
                let draw = source.f64();
                assert!((0.0..1.0).contains(&draw), "{draw}");
            }
        }
    }
}
