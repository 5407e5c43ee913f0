//! Where each schedule's random numbers come from.
//!
//! A seeded backoff must replay the same sequence of schedules on every run (tests, the storm
//! simulator), yet two requests must never share one schedule: requests that failed together would
//! then retry together, which is the synchronisation jitter exists to break. So a seeded source
//! keeps the seed plus a shared counter, and schedule `k` draws from `mix(seed, k)`. Clones share the
//! counter, so clones of one backoff keep handing out distinct schedules.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hands out one random number generator per schedule.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeedSource {
    seeded: Option<Seeded>,
}

#[derive(Clone, Debug)]
struct Seeded {
    seed: u64,
    issued: Arc<AtomicU64>,
}

impl SeedSource {
    /// A deterministic source: the k-th generator it hands out is the same on every run.
    pub(crate) fn with_seed(seed: u64) -> Self {
        Self {
            seeded: Some(Seeded {
                seed,
                issued: Arc::new(AtomicU64::new(0)),
            }),
        }
    }

    /// A generator for one schedule (or one draw).
    pub(crate) fn rng(&self) -> fastrand::Rng {
        match &self.seeded {
            // Relaxed is enough: the counter only has to hand out distinct numbers.
            Some(seeded) => {
                let k = seeded.issued.fetch_add(1, Ordering::Relaxed);
                fastrand::Rng::with_seed(mix(seeded.seed, k))
            }
            // Seeded from fastrand's thread-local generator, itself seeded from the OS.
            None => fastrand::Rng::new(),
        }
    }
}

/// SplitMix64 finaliser over `seed + k * golden ratio`: nearby `(seed, k)` pairs give unrelated
/// generator states.
fn mix(seed: u64, k: u64) -> u64 {
    let mut z = seed.wrapping_add(k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sources_replay_and_successive_generators_differ() {
        let a = SeedSource::with_seed(7);
        let b = SeedSource::with_seed(7);
        let first: Vec<u64> = (0..4).map(|_| a.rng().u64(..)).collect();
        let again: Vec<u64> = (0..4).map(|_| b.rng().u64(..)).collect();
        assert_eq!(first, again);
        let distinct: std::collections::HashSet<_> = first.iter().collect();
        assert_eq!(distinct.len(), 4);
    }

    #[test]
    fn clones_share_the_counter() {
        let a = SeedSource::with_seed(1);
        let b = a.clone();
        assert_ne!(a.rng().u64(..), b.rng().u64(..));
    }
}
