//! [`ChaosSnapshot`]: what a chaos layer has done so far, and the count of calls in flight that
//! it keeps for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Fault, FaultKind};

/// What a chaos layer has seen and injected, at one moment
/// ([`ChaosLayer::snapshot`](crate::ChaosLayer::snapshot)).
#[derive(Clone, Debug, PartialEq)]
pub struct ChaosSnapshot {
    /// Calls made through the layer (and its clones, and the services they made).
    pub calls: u64,
    /// Calls whose answer has not ended yet: the future, then its body, until it ends or is
    /// dropped. A silence or a stall stays in flight until its caller gives up on it, so once
    /// the callers are done, anything left here was never let go of.
    pub in_flight: u64,
    /// Each fault, in the order it was added, with what it injected.
    pub faults: Vec<FaultSnapshot>,
}

impl ChaosSnapshot {
    /// Injections of every fault together.
    pub fn injected(&self) -> u64 {
        self.faults.iter().map(|fault| fault.injected).sum()
    }
}

/// One fault of a [`ChaosSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultSnapshot {
    /// What it does.
    pub kind: FaultKind,
    /// Its rate.
    pub rate: f64,
    /// Whether it is on now.
    pub on: bool,
    /// Calls (streams, for a stream fault) it was injected into. A stream fault counts when it
    /// acts: a cut after 10 events counts nothing in a stream of 8.
    pub injected: u64,
}

impl FaultSnapshot {
    pub(crate) fn of(fault: &Fault, on: bool) -> Self {
        Self {
            kind: fault.kind(),
            rate: fault.rate(),
            on,
            injected: fault.injected(),
        }
    }
}

/// The calls a layer and its clones have seen, and those in flight.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    calls: AtomicU64,
    in_flight: AtomicU64,
}

impl Counters {
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// One call in flight: counted when made, let go of when dropped (with its future, or with the
/// body it moved into).
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Counters>);

impl InFlight {
    /// Counts a new call.
    pub(crate) fn begin(counters: &Arc<Counters>) -> Self {
        counters.calls.fetch_add(1, Ordering::Relaxed);
        counters.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(counters.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
