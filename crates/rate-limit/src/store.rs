//! The seam between a limit's decisions and a store that shares its state beyond this process:
//! one trait, [`Store`], implemented by the [`Fleet`](crate::Fleet) (Redis, feature `redis`) and
//! by [`NoFleet`] (nothing beyond this process: an empty enum, so a configuration never holds
//! one and every call on it is unreachable and compiled away). The feature picks one, here and
//! nowhere else: [`FleetStore`]. A limit without a fleet decides on its whole bucket in this
//! process; one with a fleet asks the store, and decides on its local share while the store is
//! away.

use std::future::Future;

use crate::gcra::{Gcra, Slot};

/// What a configuration may hold to share its limit: the [`Fleet`](crate::Fleet) with the
/// `redis` feature.
#[cfg(feature = "redis")]
pub(crate) type FleetStore = crate::Fleet;
/// What a configuration may hold to share its limit: nothing ([`NoFleet`]) without the `redis`
/// feature.
#[cfg(not(feature = "redis"))]
pub(crate) type FleetStore = NoFleet;

/// Where the replicas of a fleet decide together, one bucket at a time.
pub(crate) trait Store: Send + Sync + 'static {
    /// Where one bucket (a key's, or the unkeyed one) lives in the store.
    type Keys: Send + Sync;

    /// The keys of the bucket of `key` (`None`: the limit's unkeyed bucket).
    fn keys(&self, key: Option<&[u8]>) -> Self::Keys;
    /// What the local share divides the quota by: the replicas.
    fn share(&self) -> u32;
    /// Counts a decision the store made, which saw `replicas` replicas.
    fn decided(&self, replicas: u32);
    /// Counts a decision made on the local share.
    fn decided_locally(&self);
    /// Asks the store for a slot of `dimensions` (requests, tokens), in a bucket blocked for
    /// `blocked` nanoseconds more per dimension, waiting `max_wait` nanoseconds at most: its
    /// reply, or `None` at once or later (the store is away, slow or failing: decide locally).
    fn reserve(
        &self,
        keys: &Self::Keys,
        blocked: [u64; 2],
        dimensions: &[FleetDimension; 2],
        max_wait: u64,
    ) -> Option<impl Future<Output = Option<Vec<String>>> + Send + 'static>;
    /// The provider said a quota is spent: the bucket is blocked for `blocked` nanoseconds more
    /// per dimension, for every replica (in the background).
    fn block(&self, keys: &Self::Keys, blocked: [u64; 2]);
    /// A slot the store gave was not used: given back (in the background).
    fn give_back(&self, keys: &Self::Keys, dimensions: &[FleetDimension; 2]);
    /// A request's tokens are corrected by `difference`, at `interval` per token (in the
    /// background).
    fn adjust(&self, keys: &Self::Keys, interval: &str, difference: i64);
}

/// No store beyond this process: the [`FleetStore`] without the `redis` feature. It has no value,
/// so no configuration holds one.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "redis", allow(dead_code))]
pub(crate) enum NoFleet {}

impl Store for NoFleet {
    type Keys = Self;

    fn keys(&self, _: Option<&[u8]>) -> Self {
        match *self {}
    }

    fn share(&self) -> u32 {
        match *self {}
    }

    fn decided(&self, _: u32) {
        match *self {}
    }

    fn decided_locally(&self) {
        match *self {}
    }

    fn reserve(
        &self,
        _: &Self,
        _: [u64; 2],
        _: &[FleetDimension; 2],
        _: u64,
    ) -> Option<impl Future<Output = Option<Vec<String>>> + Send + 'static> {
        // Never called: there is no value to call it on.
        None::<std::future::Ready<Option<Vec<String>>>>
    }

    fn block(&self, _: &Self, _: [u64; 2]) {
        match *self {}
    }

    fn give_back(&self, _: &Self, _: &[FleetDimension; 2]) {
        match *self {}
    }

    fn adjust(&self, _: &Self, _: &str, _: i64) {
        match *self {}
    }
}

/// One dimension of a decision in the store, as it takes it and answered it (only a store reads
/// what it takes).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct FleetDimension {
    /// Microseconds per unit, a decimal ("0": no limit).
    pub(crate) interval: String,
    /// Units the bucket holds.
    pub(crate) burst: u64,
    /// Units taken.
    pub(crate) units: u64,
    /// The TAT the decision left ("": none).
    pub(crate) end: String,
    /// What it was charged in this replica's local share, given back with the slot.
    pub(crate) share: Slot,
}

impl FleetDimension {
    /// The shape of taking `units` from `gcra`.
    pub(crate) fn of(gcra: &Gcra, units: u64) -> Self {
        let (interval, burst) = gcra.shape().unwrap_or_default();
        Self {
            interval: micros_per_unit(interval),
            burst,
            units: if interval == 0 { 0 } else { units },
            end: String::new(),
            share: Slot::default(),
        }
    }
}

/// A rate as the store takes it: microseconds per unit, as a decimal (0: no limit).
pub(crate) fn micros_per_unit(interval_nanos: u64) -> String {
    format!("{}.{:03}", interval_nanos / 1_000, interval_nanos % 1_000)
}
