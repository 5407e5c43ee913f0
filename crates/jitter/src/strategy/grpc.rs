use std::fmt;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::SmallRng;
use stormguard_numbers::random::RandomSource;

use super::from_nanos;
use crate::Backoff;

/// How far a [`GrpcBackoff`] delay strays from its ceiling: ±20%, gRPC's jitter (gRPC core's
/// retry filter builds its backoff with a jitter of 0.2, as its connection backoff,
/// `doc/connection-backoff.md`, does).
pub const GRPC_JITTER: f64 = 0.2;

/// The backoff of a gRPC service config's `retryPolicy` (gRFC A6, "Exponential Backoff"): the
/// delay before retry `n` is
///
/// ```text
/// min(initialBackoff × backoffMultiplier^(n-1), maxBackoff) × U(0.8, 1.2)
/// ```
///
/// The ceiling is gRFC A6's. The jitter is gRPC core's (a ±[`GRPC_JITTER`] spread around the
/// ceiling); the gRFC's text, and grpc-go and grpc-java, draw `U(0, ceiling)` instead (full
/// jitter, [`FullJitter`](crate::FullJitter) with a multiplier of 2). Both spread clients that
/// failed together; this one keeps every delay near what the service config says, so a delay
/// is never much shorter than `initialBackoff`.
///
/// Arithmetic is in floating point on nanoseconds, clamped to `maxBackoff` before the jitter:
/// no multiplier, attempt number or duration overflows, and a non-finite or non-positive
/// multiplier is taken as 1 (a service config that says so is refused before it gets here).
///
/// ```
/// use std::time::Duration;
/// use stormguard_jitter::{Backoff, GrpcBackoff};
///
/// // initialBackoff 0.1s, maxBackoff 1s, backoffMultiplier 2.
/// let backoff = GrpcBackoff::new(Duration::from_millis(100), Duration::from_secs(1), 2.0);
/// let delays: Vec<Duration> = backoff.schedule().take(6).collect();
/// for (n, ceiling) in [100, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
///     let ms = delays[n].as_secs_f64() * 1000.0;
///     assert!(ms >= ceiling as f64 * 0.8 - 1e-6 && ms <= ceiling as f64 * 1.2 + 1e-6);
/// }
/// assert_eq!(backoff.cap(), Duration::from_millis(1200));
/// ```
#[derive(Clone)]
pub struct GrpcBackoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    random: RandomSource,
}

impl GrpcBackoff {
    /// `initialBackoff`, `maxBackoff` and `backoffMultiplier` of a `retryPolicy`.
    pub fn new(initial: Duration, max: Duration, multiplier: f64) -> Self {
        let multiplier = if multiplier.is_finite() && multiplier > 0.0 {
            multiplier
        } else {
            1.0
        };
        Self {
            initial,
            max,
            multiplier,
            random: RandomSource::new(),
        }
    }

    /// Makes the sequence of schedules deterministic (the same on every run); successive
    /// schedules still differ.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.random = RandomSource::seeded(seed);
        self
    }

    /// `initialBackoff`: the ceiling of the first delay.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// `maxBackoff`: the largest ceiling.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// `backoffMultiplier`: how much each ceiling grows over the one before.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }
}

impl fmt::Debug for GrpcBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcBackoff")
            .field("initial", &self.initial)
            .field("max", &self.max)
            .field("multiplier", &self.multiplier)
            .field("random", &self.random)
            .finish()
    }
}

impl Backoff for GrpcBackoff {
    type Schedule = GrpcSchedule;

    fn schedule(&self) -> GrpcSchedule {
        GrpcSchedule {
            rng: self.random.rng(),
            ceiling: self.initial.as_nanos() as f64,
            max: self.max.as_nanos() as f64,
            multiplier: self.multiplier,
        }
    }

    fn cap(&self) -> Duration {
        from_nanos(jittered(self.max.as_nanos() as f64, 1.0 + GRPC_JITTER))
    }
}

/// `ceiling × factor` nanoseconds as an integer, saturating (`as` saturates a float).
fn jittered(ceiling: f64, factor: f64) -> u128 {
    (ceiling * factor) as u128
}

/// One call's delays from a [`GrpcBackoff`]. Never ends.
#[derive(Clone, Debug)]
pub struct GrpcSchedule {
    rng: SmallRng,
    /// The next delay's ceiling, in nanoseconds, not yet clamped to `max`.
    ceiling: f64,
    max: f64,
    multiplier: f64,
}

impl Iterator for GrpcSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = self.ceiling.min(self.max);
        // Past the maximum the ceiling stays there: growing it further could only reach
        // infinity.
        self.ceiling = (self.ceiling * self.multiplier).min(self.max);
        let factor = self
            .rng
            .random_range((1.0 - GRPC_JITTER)..=(1.0 + GRPC_JITTER));
        Some(from_nanos(jittered(ceiling, factor)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn each_delay_is_its_ceiling_within_twenty_percent() {
        let backoff = GrpcBackoff::new(100 * MS, 1000 * MS, 3.0).with_seed(3);
        for _ in 0..200 {
            let delays: Vec<f64> = backoff
                .schedule()
                .take(5)
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect();
            for (delay, ceiling) in delays.iter().zip([100.0, 300.0, 900.0, 1000.0, 1000.0]) {
                assert!(
                    (ceiling * 0.8 - 1e-6..=ceiling * 1.2 + 1e-6).contains(delay),
                    "{delay} ms around {ceiling} ms"
                );
            }
        }
    }

    #[test]
    fn the_jitter_spreads_over_the_whole_range() {
        let backoff = GrpcBackoff::new(1000 * MS, 1000 * MS, 1.0).with_seed(9);
        let firsts: Vec<Duration> = (0..500).filter_map(|_| backoff.schedule().next()).collect();
        assert!(firsts.iter().any(|d| *d < 850 * MS));
        assert!(firsts.iter().any(|d| *d > 1150 * MS));
    }

    #[test]
    fn hostile_numbers_neither_overflow_nor_panic() {
        for multiplier in [f64::NAN, f64::INFINITY, -2.0, 0.0, 1e300] {
            let backoff = GrpcBackoff::new(Duration::MAX, Duration::MAX, multiplier);
            let delays: Vec<Duration> = backoff.schedule().take(2000).collect();
            assert!(delays.iter().all(|d| *d <= backoff.cap()));
        }
        let zero = GrpcBackoff::new(Duration::ZERO, Duration::ZERO, 2.0);
        assert!(zero.schedule().take(10).all(|d| d == Duration::ZERO));
        assert_eq!(GrpcBackoff::new(MS, MS, f64::NAN).multiplier(), 1.0);
    }

    #[test]
    fn a_seeded_backoff_replays() {
        let a: Vec<Duration> = GrpcBackoff::new(MS, 10 * MS, 2.0)
            .with_seed(1)
            .schedule()
            .take(5)
            .collect();
        let b: Vec<Duration> = GrpcBackoff::new(MS, 10 * MS, 2.0)
            .with_seed(1)
            .schedule()
            .take(5)
            .collect();
        assert_eq!(a, b);
    }
}
