//! [`ChaosLayer`]: wraps a service in [`ChaosService`].

use std::fmt;
use std::marker::PhantomData;

use tokio::time::Instant;
use tower_layer::Layer;

use super::ChaosService;
use super::placement::{Client, Server};
use crate::injector::Injector;
use crate::{ChaosSnapshot, Fault};

/// Injects faults into the calls of the services it wraps: see the [crate docs](crate).
///
/// Built empty (it injects nothing), then given its faults one by one. `P` says where it sits:
/// under a client ([`new`](ChaosLayer::new), the default) or in front of a server
/// ([`for_server`](ChaosLayer::for_server)), which decides only how a connection reset is
/// injected. Cheap to clone; clones and the services they make count together
/// ([`snapshot`](Self::snapshot)) and share the layer's seeded sequence of draws.
pub struct ChaosLayer<P = Client> {
    injector: Injector,
    placement: PhantomData<P>,
}

impl<P> Clone for ChaosLayer<P> {
    fn clone(&self) -> Self {
        Self {
            injector: self.injector.clone(),
            placement: PhantomData,
        }
    }
}

impl ChaosLayer<Client> {
    /// A layer for under a client (a hyper, tonic or reqwest service, below stormguard's
    /// `ClientLayer`), with no faults: it injects nothing. Its origin, from which the faults'
    /// schedules count, is now.
    pub fn new() -> Self {
        Self {
            injector: Injector::new(),
            placement: PhantomData,
        }
    }
}

impl Default for ChaosLayer<Client> {
    /// [`ChaosLayer::new`]: under a client, injecting nothing.
    fn default() -> Self {
        Self::new()
    }
}

impl ChaosLayer<Server> {
    /// A layer for in front of a server (an axum `Router`'s `.layer(...)`, a tonic server's),
    /// with no faults: it injects nothing. Its service never fails, as axum asks of a route: a
    /// reset is an answer whose body fails at once. Its origin is now.
    pub fn for_server() -> Self {
        Self {
            injector: Injector::new(),
            placement: PhantomData,
        }
    }
}

impl<P> ChaosLayer<P> {
    /// Adds `fault`, after the faults already added (the order in which faults share the
    /// draws: see [`Fault`]).
    #[must_use]
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.injector.add(fault);
        self
    }

    /// Draws from a source seeded with `seed`: the n-th call gets the same faults on every run.
    /// Unseeded, the draws come from the thread's generator.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.injector.set_seed(seed);
        self
    }

    /// Counts the faults' schedules from `origin` rather than from when the layer was made: no
    /// fault is on before it.
    #[must_use]
    pub fn with_origin(mut self, origin: Instant) -> Self {
        self.injector.set_origin(origin);
        self
    }

    /// The faults, in their order.
    pub fn faults(&self) -> &[Fault] {
        self.injector.faults()
    }

    /// The seed, if the layer has one.
    pub fn seed(&self) -> Option<u64> {
        self.injector.seed()
    }

    /// Where the faults' schedules count from.
    pub fn origin(&self) -> Instant {
        self.injector.origin()
    }

    /// What the layer, its clones and their services have seen and injected so far.
    pub fn snapshot(&self) -> ChaosSnapshot {
        self.injector.snapshot()
    }
}

impl<S, P> Layer<S> for ChaosLayer<P> {
    type Service = ChaosService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        ChaosService::new(inner, self.injector.clone())
    }
}

impl<P> fmt::Debug for ChaosLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosLayer")
            .field("placement", &std::any::type_name::<P>())
            .field("injector", &self.injector)
            .finish()
    }
}
