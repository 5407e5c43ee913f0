//! The backoff strategies and the arithmetic they share.
//!
//! All arithmetic on durations is done on `u128` nanoseconds with saturation, so no base, cap or
//! attempt number (attempt 1000, a base near `Duration::MAX`) can overflow or panic.

mod constant;
mod decorrelated;
mod equal;
mod exponential;
mod full;
mod grpc;
mod jittered;
mod smooth;

pub use constant::{Constant, ConstantSchedule};
pub use decorrelated::{Decorrelated, DecorrelatedJitter};
pub use equal::{Equal, EqualJitter};
pub use exponential::{Exponential, ExponentialSchedule};
pub use full::{Full, FullJitter};
pub use grpc::{GRPC_JITTER, GrpcBackoff, GrpcSchedule};
pub use jittered::{Jittered, JitteredSchedule, Shape};
pub use smooth::{SmoothDecorrelated, SmoothDecorrelatedJitter, SmoothState};

use std::time::Duration;

use rand::RngExt;
use rand::rngs::SmallRng;

/// Default first delay of every exponential strategy: 500 ms, the initial retry delay of OpenAI's
/// official Python and Node SDKs (the AWS SDKs start at 1 s).
pub const DEFAULT_BASE: Duration = Duration::from_millis(500);

/// Default upper bound of every strategy: 8 s, the maximum retry delay of OpenAI's official Python
/// and Node SDKs (the AWS SDKs' "standard" mode caps at 20 s).
pub const DEFAULT_CAP: Duration = Duration::from_secs(8);

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// `min(cap, base * 2^attempt)`, saturating.
pub(crate) fn exponential_ceiling(base: Duration, cap: Duration, attempt: u32) -> Duration {
    // 2^127 fits in u128; any larger factor saturates the product just the same.
    let factor = 1u128 << attempt.min(127);
    let nanos = base.as_nanos().saturating_mul(factor);
    from_nanos(nanos.min(cap.as_nanos()))
}

/// A uniform draw from `[low, high]` (inclusive), `low` when `high <= low`.
pub(crate) fn uniform(rng: &mut SmallRng, low: Duration, high: Duration) -> Duration {
    if high <= low {
        return low;
    }
    from_nanos(rng.random_range(low.as_nanos()..=high.as_nanos()))
}

/// `u128` nanoseconds back to a `Duration`, saturating at `Duration::MAX`.
pub(crate) fn from_nanos(nanos: u128) -> Duration {
    let secs = nanos / NANOS_PER_SEC;
    // `nanos % 1e9` is below 1e9 and fits a u32.
    let subsec = (nanos % NANOS_PER_SEC) as u32;
    match u64::try_from(secs) {
        Ok(secs) => Duration::new(secs, subsec),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_then_stops_at_the_cap() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(8);
        let ceilings: Vec<u64> = (0..7)
            .map(|n| exponential_ceiling(base, cap, n).as_millis() as u64)
            .collect();
        assert_eq!(ceilings, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
    }

    #[test]
    fn ceiling_never_overflows() {
        let cap = Duration::MAX;
        assert_eq!(exponential_ceiling(Duration::MAX, cap, 1000), Duration::MAX);
        assert_eq!(
            exponential_ceiling(Duration::from_nanos(1), cap, 200),
            Duration::MAX
        );
        assert_eq!(
            exponential_ceiling(Duration::ZERO, cap, u32::MAX),
            Duration::ZERO
        );
    }

    #[test]
    fn nanos_round_trip() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1_500_000_001),
            Duration::MAX,
        ] {
            assert_eq!(from_nanos(d.as_nanos()), d);
        }
        assert_eq!(from_nanos(u128::MAX), Duration::MAX);
    }
}
