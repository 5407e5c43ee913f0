//! A fleet's shared cooldowns: a failover's backend whose breaker opened on one replica is left
//! by every replica (`stormguard-failover` asks, through `Cooldowns::fleet`), until its breaker
//! would let a probe through.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{LazyLock, MutexGuard, PoisonError};
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;

use super::Fleet;

/// The script of the cooldowns: a hash of backend names and when each one's cooldown ends.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("cooldowns.lua")));

impl Fleet {
    /// Tells the fleet that the backend named `backend` is left for `wait` (its breaker opened
    /// and lets no probe through before then): written to Redis in the background, and known
    /// here at once. Lost if Redis is away: each replica then finds out by its own breaker.
    pub fn publish_cooldown(&self, backend: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut cooldowns = self.cooldowns();
        let known = cooldowns.entry(backend.to_owned()).or_insert(until);
        *known = (*known).max(until);
        drop(cooldowns);
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let mut invocation = SCRIPT.key(self.cooldowns_key());
        invocation.arg("set").arg(backend).arg(millis);
        self.spawn(invocation);
    }

    /// Whether the backend named `backend` is left by the fleet now, as this replica last read
    /// it. Each call asks Redis again in the background when no read is in flight, so that a
    /// cooldown another replica wrote is known here within one decision (a round trip) of it;
    /// the answer never waits for Redis.
    pub fn cooling(&self, backend: &str) -> bool {
        self.read_cooldowns();
        let cooldowns = self.cooldowns();
        cooldowns
            .get(backend)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Reads the fleet's cooldowns in the background, if no read is in flight and Redis is to
    /// be asked.
    fn read_cooldowns(&self) {
        let state = &self.state;
        if state.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut invocation = SCRIPT.key(self.cooldowns_key());
        invocation.arg("get");
        let runtime = tokio::runtime::Handle::try_current();
        let (Ok(runtime), Some(call)) = (runtime, self.call(invocation)) else {
            state.reading.store(false, Ordering::Release);
            return;
        };
        let fleet = self.clone();
        runtime.spawn(async move {
            if let Some(reply) = call.await {
                fleet.read(&reply);
            }
            fleet.state.reading.store(false, Ordering::Release);
        });
    }

    /// What Redis said: each backend still cooling down and for how long (milliseconds), in
    /// pairs. It replaces what was known: a cooldown that ended there ended here.
    fn read(&self, reply: &[String]) {
        let now = Instant::now();
        let read: HashMap<String, Instant> = reply
            .chunks_exact(2)
            .filter_map(|pair| {
                let left = pair[1].parse::<u64>().ok()?;
                Some((
                    pair[0].clone(),
                    now + Duration::from_millis(left.min(3_600_000)),
                ))
            })
            .collect();
        *self.cooldowns() = read;
    }

    fn cooldowns(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.state
            .cooldowns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The Redis key of the cooldowns: one hash per prefix.
    fn cooldowns_key(&self) -> Vec<u8> {
        let mut key = self.prefix.as_bytes().to_vec();
        key.extend_from_slice(b":cooldowns");
        key
    }
}
