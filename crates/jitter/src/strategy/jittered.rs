use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use super::{DEFAULT_BASE, DEFAULT_CAP};
use crate::Backoff;
use crate::seed::SeedSource;

/// How a randomised strategy draws its delays: the one thing that tells [`FullJitter`],
/// [`EqualJitter`], [`DecorrelatedJitter`] and [`SmoothDecorrelatedJitter`] apart. Implement it to
/// plug a shape of your own into [`Jittered`] (and so into the retry engine).
///
/// [`FullJitter`]: crate::FullJitter
/// [`EqualJitter`]: crate::EqualJitter
/// [`DecorrelatedJitter`]: crate::DecorrelatedJitter
/// [`SmoothDecorrelatedJitter`]: crate::SmoothDecorrelatedJitter
pub trait Shape: Send + Sync + 'static {
    /// What a schedule remembers between delays (the attempt number, the previous delay).
    type State: Clone + fmt::Debug + Send + 'static;

    /// The state before the first delay.
    fn start(base: Duration) -> Self::State;

    /// The next delay, never above `cap`; advances `state`.
    fn next(
        state: &mut Self::State,
        rng: &mut fastrand::Rng,
        base: Duration,
        cap: Duration,
    ) -> Duration;
}

/// A randomised backoff of shape `K` growing from `base`, never above `cap`. Use it through its
/// aliases: [`FullJitter`](crate::FullJitter) (the default), [`EqualJitter`](crate::EqualJitter),
/// [`DecorrelatedJitter`](crate::DecorrelatedJitter),
/// [`SmoothDecorrelatedJitter`](crate::SmoothDecorrelatedJitter).
pub struct Jittered<K> {
    base: Duration,
    cap: Duration,
    seeds: SeedSource,
    shape: PhantomData<fn() -> K>,
}

impl<K> Jittered<K> {
    /// A backoff growing from `base`, never above `cap` (the cap wins if `cap < base`).
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            seeds: SeedSource::default(),
            shape: PhantomData,
        }
    }

    /// Makes the sequence of schedules deterministic; successive schedules still differ.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seeds = SeedSource::with_seed(seed);
        self
    }

    /// The `base` it was built with: the first ceiling for the exponential shapes, the floor for
    /// decorrelated jitter, the median first delay for the smooth variant.
    pub fn base(&self) -> Duration {
        self.base
    }
}

impl<K> Default for Jittered<K> {
    /// Base 500 ms, cap 8 s: the retry delays of OpenAI's official Python and Node SDKs (see
    /// [`DEFAULT_BASE`](crate::DEFAULT_BASE)).
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP)
    }
}

impl<K> Clone for Jittered<K> {
    fn clone(&self) -> Self {
        Self {
            base: self.base,
            cap: self.cap,
            seeds: self.seeds.clone(),
            shape: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Jittered<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jittered")
            .field("shape", &std::any::type_name::<K>())
            .field("base", &self.base)
            .field("cap", &self.cap)
            .field("seeds", &self.seeds)
            .finish()
    }
}

impl<K: Shape> Backoff for Jittered<K> {
    type Schedule = JitteredSchedule<K>;

    fn schedule(&self) -> JitteredSchedule<K> {
        JitteredSchedule {
            rng: self.seeds.rng(),
            base: self.base,
            cap: self.cap,
            state: K::start(self.base),
        }
    }

    fn cap(&self) -> Duration {
        self.cap
    }
}

/// One request's delays from a [`Jittered`] backoff. Never ends.
pub struct JitteredSchedule<K: Shape> {
    rng: fastrand::Rng,
    base: Duration,
    cap: Duration,
    state: K::State,
}

impl<K: Shape> Iterator for JitteredSchedule<K> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(K::next(&mut self.state, &mut self.rng, self.base, self.cap))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

impl<K: Shape> Clone for JitteredSchedule<K> {
    fn clone(&self) -> Self {
        Self {
            rng: self.rng.clone(),
            base: self.base,
            cap: self.cap,
            state: self.state.clone(),
        }
    }
}

impl<K: Shape> fmt::Debug for JitteredSchedule<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JitteredSchedule")
            .field("shape", &std::any::type_name::<K>())
            .field("base", &self.base)
            .field("cap", &self.cap)
            .field("state", &self.state)
            .finish()
    }
}
