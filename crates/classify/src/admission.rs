//! [`Permit`]: how every guard lets an attempt through.
//!
//! A guard that admits attempts (the rate limit, the circuit breaker, the adaptive throttle)
//! answers a request to send one with a permit, or a typed refusal. The permit is held while the
//! attempt is in flight and then told how it ended, once, with [`record`](Permit::record). Dropped
//! untold, it records what an abandoned attempt means to its guard: its place in flight is freed,
//! a throttle counts it as not accepted (a backend that hangs must not look healthy), a reserved
//! rate-limit slot that never went out is given back. So no caller keeps a flag saying that an
//! outcome is still owed: whoever holds the permit owes it, and dropping it settles it. tower's
//! concurrency limit works the same way with its semaphore permit.

use http::HeaderMap;

use crate::Outcome;

/// An attempt one guard let through: see the [module docs](self).
pub trait Permit: Send {
    /// The attempt ended with `outcome`; `headers` are its answer's (empty when there was none),
    /// for a guard that learns from them (a rate limit reads the provider's quota headers).
    fn record(self, outcome: &Outcome, headers: &HeaderMap);
}
