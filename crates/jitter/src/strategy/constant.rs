use std::time::Duration;

use crate::Backoff;

/// The same delay before every retry.
///
/// Deterministic, so it needs no seed. Fixed-interval retries are what synchronises a fleet (500
/// clients rejected at t = 0 all return at t = 1 s, 2 s, ...); offered for tests, for comparison in
/// the storm simulator, and for the rare backend that documents a fixed retry interval.
#[derive(Clone, Debug)]
pub struct Constant {
    delay: Duration,
}

impl Constant {
    /// Always `delay`.
    pub fn new(delay: Duration) -> Self {
        Self { delay }
    }

    /// The delay handed out.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

impl Default for Constant {
    /// 1 s.
    fn default() -> Self {
        Self::new(Duration::from_secs(1))
    }
}

impl Backoff for Constant {
    type Schedule = ConstantSchedule;

    fn schedule(&self) -> ConstantSchedule {
        ConstantSchedule { delay: self.delay }
    }

    fn cap(&self) -> Duration {
        self.delay
    }
}

/// One request's constant delays (see [`Constant`]). Never ends.
#[derive(Clone, Debug)]
pub struct ConstantSchedule {
    delay: Duration,
}

impl Iterator for ConstantSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.delay)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
