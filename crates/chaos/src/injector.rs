//! [`Injector`]: the faults of a layer, its source of randomness and its origin, shared by the
//! layer and every service it makes; what each call draws from them.

use std::sync::Arc;

use stormguard_numbers::random::RandomSource;
use tokio::time::Instant;

use crate::fault::{Fault, pick};
use crate::snapshot::{ChaosSnapshot, Counters, FaultSnapshot, InFlight};

/// What a layer injects, and what it has done so far. Cheap to clone: clones share the
/// settings until one is changed, and the counters always.
#[derive(Clone, Debug)]
pub(crate) struct Injector {
    settings: Arc<Settings>,
    counters: Arc<Counters>,
}

#[derive(Clone, Debug)]
struct Settings {
    faults: Vec<Fault>,
    random: RandomSource,
    origin: Instant,
}

/// What one call gets: a fault that acts on the call, and one for its answer if that is an
/// event stream. Both drawn when the call is made, so that a seeded layer gives the n-th call
/// the same faults on every run, whenever its answer comes.
#[derive(Debug, Default)]
pub(crate) struct Draw {
    pub(crate) call: Option<Fault>,
    pub(crate) stream: Option<Fault>,
}

impl Injector {
    /// No faults, unseeded, its origin now.
    pub(crate) fn new() -> Self {
        Self {
            settings: Arc::new(Settings {
                faults: Vec::new(),
                random: RandomSource::new(),
                origin: Instant::now(),
            }),
            counters: Arc::default(),
        }
    }

    pub(crate) fn add(&mut self, fault: Fault) {
        Arc::make_mut(&mut self.settings).faults.push(fault);
    }

    pub(crate) fn set_seed(&mut self, seed: u64) {
        Arc::make_mut(&mut self.settings).random = RandomSource::seeded(seed);
    }

    pub(crate) fn set_origin(&mut self, origin: Instant) {
        Arc::make_mut(&mut self.settings).origin = origin;
    }

    pub(crate) fn faults(&self) -> &[Fault] {
        &self.settings.faults
    }

    pub(crate) fn seed(&self) -> Option<u64> {
        self.settings.random.seed()
    }

    pub(crate) fn origin(&self) -> Instant {
        self.settings.origin
    }

    /// A new call, counted in flight, and what it gets. A layer without faults draws nothing,
    /// and no fault is on before the origin.
    pub(crate) fn begin(&self) -> (InFlight, Draw) {
        let in_flight = InFlight::begin(&self.counters);
        let settings = &*self.settings;
        let elapsed = Instant::now().checked_duration_since(settings.origin);
        let Some(elapsed) = elapsed.filter(|_| !settings.faults.is_empty()) else {
            return (in_flight, Draw::default());
        };
        let (call, stream) = (settings.random.f64(), settings.random.f64());
        let draw = Draw {
            call: pick(&settings.faults, elapsed, false, call).cloned(),
            stream: pick(&settings.faults, elapsed, true, stream).cloned(),
        };
        (in_flight, draw)
    }

    pub(crate) fn snapshot(&self) -> ChaosSnapshot {
        let elapsed = Instant::now().checked_duration_since(self.settings.origin);
        let on = |fault: &Fault| elapsed.is_some_and(|elapsed| fault.is_on(elapsed));
        ChaosSnapshot {
            calls: self.counters.calls(),
            in_flight: self.counters.in_flight(),
            faults: self
                .settings
                .faults
                .iter()
                .map(|fault| FaultSnapshot::of(fault, on(fault)))
                .collect(),
        }
    }
}
