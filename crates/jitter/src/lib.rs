//! Backoff schedules with jitter, server hints, and start-time spreading for tower services.
//!
//! # The problem
//!
//! Retries at fixed intervals synchronise: 500 clients rejected at t = 0 all come back at t = 1 s,
//! again at t = 2 s, and each wave knocks the recovering backend over again. Exponential backoff
//! thins the waves out but keeps them synchronised; *jitter* (a random delay) breaks them up.
//!
//! # The algorithms
//!
//! The strategies are those of the AWS Architecture Blog post "Exponential Backoff And Jitter"
//! (Marc Brooker), plus a smooth variant:
//!
//! | strategy | delay before retry `n + 1` |
//! |---|---|
//! | [`FullJitter`] (default) | `U(0, min(cap, base * 2^n))` |
//! | [`EqualJitter`] | `c/2 + U(0, c/2)` with `c = min(cap, base * 2^n)` |
//! | [`DecorrelatedJitter`] | `min(cap, U(base, 3 * previous))` |
//! | [`SmoothDecorrelatedJitter`] | increments of a smooth exponential curve at randomised points (the idea of Polly's "decorrelated jitter V2") |
//! | [`Exponential`] (no jitter) | `min(cap, base * 2^n)` |
//! | [`Constant`] | `delay` |
//! | [`GrpcBackoff`] | `min(initial * multiplier^n, max) * U(0.8, 1.2)`: a gRPC service config's `retryPolicy` (gRFC A6) |
//!
//! Each implements [`Backoff`], so a retry engine is generic over them: it asks for one
//! [`Backoff::schedule`] per request and takes the n-th item as the delay before retry `n + 1`.
//! No delay ever exceeds [`Backoff::cap`], and no input (attempt 1000, a base near
//! `Duration::MAX`) overflows or panics.
//!
//! Randomness comes from `rand` (its `SmallRng`), through
//! [`stormguard_numbers::random::RandomSource`], the one source every randomised stormguard part
//! draws from. Unseeded, each schedule (and each hint's or start's jitter) gets a generator seeded
//! from the thread's generator; `with_seed(u64)`, on every randomised part here, makes the
//! *sequence of schedules* replay exactly on every run, while successive schedules still differ
//! (requests that failed together must not retry together).
//!
//! A server's own hint (`Retry-After` and friends) replaces the computed delay through
//! [`HintPolicy`]: a small bounded jitter is added (never earlier than the server asked), and a hint
//! above the maximum means "do not retry" ([`HintedDelay::TooLong`]). The default maximum, 60 s,
//! is [`stormguard_classify::hint::DEFAULT_MAX_HINT`].
//!
//! [`SpreadLayer`] spreads *first* attempts as well: it delays each request's start by
//! `U(0, max)`.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_jitter::{Backoff, FullJitter, HintedDelay, HintPolicy};
//!
//! // OpenAI's SDK defaults: 500 ms growing to at most 8 s.
//! let backoff = FullJitter::default().with_seed(1);
//! let delays: Vec<Duration> = backoff.schedule().take(10).collect();
//! assert!(delays.iter().all(|delay| *delay <= Duration::from_secs(8)));
//! assert!(delays[0] <= Duration::from_millis(500));
//!
//! // A server said "retry after 2 s": wait 2 s plus up to 200 ms.
//! let delay = HintPolicy::default().apply(Duration::from_secs(2));
//! assert!(matches!(delay, HintedDelay::RetryAfter(d) if d >= Duration::from_secs(2)));
//! ```

mod hint;
pub mod spread;
mod strategy;

use std::time::Duration;

pub use hint::{DEFAULT_HINT_JITTER_CEILING, DEFAULT_HINT_JITTER_RATIO, HintPolicy, HintedDelay};
pub use spread::{Spread, SpreadLayer};
pub use strategy::{
    Constant, ConstantSchedule, DEFAULT_BASE, DEFAULT_CAP, DecorrelatedJitter, EqualJitter,
    Exponential, ExponentialSchedule, FullJitter, GRPC_JITTER, GrpcBackoff, GrpcSchedule, Jittered,
    JitteredSchedule, SmoothDecorrelatedJitter,
};

/// The shapes a [`Jittered`] backoff draws its delays with, one per strategy, and the trait to
/// write another. Each strategy is named at the crate's root by what it is ([`FullJitter`] is
/// `Jittered<shape::Full>`); every jittered strategy's schedule is a [`JitteredSchedule`] of its
/// shape (`JitteredSchedule<shape::Full>`). The shapes stay here, so that no two names at the
/// root mean one thing.
pub mod shape {
    pub use crate::strategy::{Decorrelated, Equal, Full, Shape, SmoothDecorrelated, SmoothState};
}

/// A backoff strategy: hands out one schedule of delays per request.
///
/// Implementations are cheap to clone. Clones of a randomised backoff share its [`RandomSource`],
/// so clones of a seeded backoff keep handing out distinct schedules.
///
/// [`RandomSource`]: stormguard_numbers::random::RandomSource
pub trait Backoff: Clone + Send + Sync + 'static {
    /// The per-request sequence of delays.
    type Schedule: Iterator<Item = Duration> + Send + 'static;

    /// A fresh per-request schedule: its n-th item (0-based) is the delay before retry `n + 1`.
    /// It never ends.
    fn schedule(&self) -> Self::Schedule;

    /// Upper bound of any delay this backoff hands out.
    fn cap(&self) -> Duration;
}
