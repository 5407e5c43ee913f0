//! [`Cooldowns`]: a backend's breaker opening, shared by the replicas of a fleet, so that the
//! others stop sending to it within one decision instead of each finding out by its own
//! failures.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Where the failovers of a fleet's replicas share their backends' cooldowns
/// ([`Failover::with_cooldowns`](crate::Failover::with_cooldowns)).
///
/// When a backend's breaker opens on one replica, the failover writes how long it lets no probe
/// through; every replica sharing the cooldowns leaves that backend for that long, as if its own
/// breaker had opened (it does open, [`OpenCause::Told`](stormguard_breaker::OpenCause::Told),
/// so that every replica comes back by its breaker's probes, and the first probe to fail shares
/// the next cooldown before the others send theirs). Without shared
/// cooldowns, each of `n` replicas sends its own failures (by default three in a row) to a
/// backend that died before its breaker opens: `n` times the attempts.
///
/// - [`Cooldowns::local`]: replicas in one process (several failovers of one gateway, tests,
///   the storm simulator's fleet);
/// - `Cooldowns::fleet` (feature `redis`): replicas in several processes, through the Redis of
///   a `stormguard_rate_limit::Fleet` (the one their rate limits share, or another):
///   a cooldown is written in the background, and each decision reads what the others wrote in
///   the background too (one read in flight at a time), so a decision never waits for Redis
///   and knows of another replica's cooldown one round trip after it was written. With Redis
///   away, each replica leaves a backend by its own breaker, as without; the fleet's rules hold
///   (a short timeout, no stall, the outage logged once).
#[derive(Clone)]
pub struct Cooldowns {
    store: Arc<dyn Store>,
}

/// Where cooldowns are kept: one trait, implemented by [`Local`] (a map in this process) and,
/// with the `redis` feature, by a [fleet](stormguard_rate_limit::Fleet) (in Redis, for every
/// replica). Which one is the caller's choice at run time ([`Cooldowns::local`],
/// `Cooldowns::fleet`), off the success path: a decision asks only when cooldowns are shared.
trait Store: Send + Sync + 'static {
    /// The backend named `backend` is left for `wait`.
    fn publish(&self, backend: &str, wait: Duration);
    /// Whether the backend named `backend` is left now.
    fn cooling(&self, backend: &str) -> bool;
    /// What the store is, for `Debug`.
    fn kind(&self) -> &'static str;
}

/// Cooldowns kept in this process: each backend's name and when its cooldown ends.
#[derive(Default)]
struct Local(Mutex<HashMap<String, Instant>>);

impl Store for Local {
    fn publish(&self, backend: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut cooldowns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let known = cooldowns.entry(backend.to_owned()).or_insert(until);
        *known = (*known).max(until);
    }

    fn cooling(&self, backend: &str) -> bool {
        let cooldowns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        cooldowns
            .get(backend)
            .is_some_and(|until| Instant::now() < *until)
    }

    fn kind(&self) -> &'static str {
        "local"
    }
}

#[cfg(feature = "redis")]
impl Store for stormguard_rate_limit::Fleet {
    fn publish(&self, backend: &str, wait: Duration) {
        self.publish_cooldown(backend, wait);
    }

    fn cooling(&self, backend: &str) -> bool {
        stormguard_rate_limit::Fleet::cooling(self, backend)
    }

    fn kind(&self) -> &'static str {
        "fleet"
    }
}

impl Cooldowns {
    /// Cooldowns shared by the failovers of one process that are given clones of these.
    pub fn local() -> Self {
        Self {
            store: Arc::new(Local::default()),
        }
    }

    /// Cooldowns shared by every replica whose failover is given the same Redis and prefix.
    #[cfg(feature = "redis")]
    pub fn fleet(fleet: stormguard_rate_limit::Fleet) -> Self {
        Self {
            store: Arc::new(fleet),
        }
    }

    /// The backend named `backend` is left for `wait`.
    pub fn publish(&self, backend: &str, wait: Duration) {
        self.store.publish(backend, wait);
    }

    /// Whether the backend named `backend` is left now.
    pub fn cooling(&self, backend: &str) -> bool {
        self.store.cooling(backend)
    }
}

impl fmt::Debug for Cooldowns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cooldowns")
            .field("store", &self.store.kind())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_cooldown_holds_for_its_wait_and_a_longer_one_wins() {
        let cooldowns = Cooldowns::local();
        let replica = cooldowns.clone();
        assert!(!replica.cooling("primary"));
        cooldowns.publish("primary", Duration::from_secs(2));
        cooldowns.publish("primary", Duration::from_secs(1));
        assert!(replica.cooling("primary") && !replica.cooling("backup"));
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(replica.cooling("primary"));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!replica.cooling("primary"));
    }
}
