use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use rand::rngs::SmallRng;
use stormguard_numbers::random::RandomSource;

use super::{DEFAULT_BASE, DEFAULT_CAP};
use crate::Backoff;

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

    /// The next delay, never above `cap`; advances `state`. `rng` is the schedule's own generator,
    /// from the backoff's [`RandomSource`] (draw with `rand::RngExt`).
    fn next(state: &mut Self::State, rng: &mut SmallRng, base: Duration, cap: Duration)
    -> Duration;
}

/// A randomised backoff of shape `K` growing from `base`, never above `cap`. Use it through its
/// aliases: [`FullJitter`](crate::FullJitter) (the default), [`EqualJitter`](crate::EqualJitter),
/// [`DecorrelatedJitter`](crate::DecorrelatedJitter),
/// [`SmoothDecorrelatedJitter`](crate::SmoothDecorrelatedJitter).
pub struct Jittered<K> {
    base: Duration,
    cap: Duration,
    random: RandomSource,
    shape: PhantomData<fn() -> K>,
}

impl<K> Jittered<K> {
    /// A backoff growing from `base`, never above `cap` (the cap wins if `cap < base`).
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            random: RandomSource::new(),
            shape: PhantomData,
        }
    }

    /// Makes the sequence of schedules deterministic (the same on every run); successive
    /// schedules still differ. Unseeded, each schedule is seeded from the thread's generator.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.random = RandomSource::seeded(seed);
        self
    }

    /// The seed given to [`with_seed`](Self::with_seed), if any.
    pub fn seed(&self) -> Option<u64> {
        self.random.seed()
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
            random: self.random.clone(),
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
            .field("random", &self.random)
            .finish()
    }
}

impl<K: Shape> Backoff for Jittered<K> {
    type Schedule = JitteredSchedule<K>;

    fn schedule(&self) -> JitteredSchedule<K> {
        JitteredSchedule {
            rng: self.random.rng(),
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
    rng: SmallRng,
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
