//! [`BreakerLayer`]: wraps a service in [`BreakerService`].

use stormguard_classify::LlmClassifier;
use tower_layer::Layer;

use super::BreakerService;
use crate::{CircuitBreaker, Fallback};

/// Puts a circuit breaker in front of a service: see [`BreakerService`].
///
/// Every service this layer wraps shares the layer's [`CircuitBreaker`]: one breaker per
/// backend. Hand the same breaker (a cheap clone) to every client of that backend.
///
/// Responses are judged as the retry engine judges them, from the head and, for a failure, the
/// start of its error body (the caller still reads all of it). A call dropped before it ends (its
/// caller gave up) counts for nothing: put an attempt timeout *inside* this layer, so that a
/// timed-out attempt comes back as a timeout, a health failure.
#[derive(Clone, Debug)]
pub struct BreakerLayer<C = LlmClassifier> {
    breaker: CircuitBreaker,
    classifier: C,
    fallback: Option<Fallback>,
}

impl BreakerLayer {
    /// A layer in front of `breaker`, judging outcomes with the default [`LlmClassifier`], with
    /// no fallback (refusals are errors).
    pub fn new(breaker: CircuitBreaker) -> Self {
        Self {
            breaker,
            classifier: LlmClassifier::default(),
            fallback: None,
        }
    }
}

impl Default for BreakerLayer {
    /// A layer with its own [`CircuitBreaker::default`].
    fn default() -> Self {
        Self::new(CircuitBreaker::default())
    }
}

impl<C> BreakerLayer<C> {
    /// Judge outcomes with `classifier` instead: any
    /// [`Classify`](stormguard_classify::Classify), or a
    /// [`MakeClassify`](stormguard_classify::MakeClassify) that picks one per request.
    pub fn with_classifier<C2>(self, classifier: C2) -> BreakerLayer<C2> {
        BreakerLayer {
            breaker: self.breaker,
            classifier,
            fallback: self.fallback,
        }
    }

    /// Answer refused and cut requests with `fallback` instead of an error.
    pub fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// The shared breaker, e.g. to read its [`snapshot`](CircuitBreaker::snapshot).
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// The fallback, if any.
    pub fn fallback(&self) -> Option<&Fallback> {
        self.fallback.as_ref()
    }
}

impl<S, C: Clone> Layer<S> for BreakerLayer<C> {
    type Service = BreakerService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        BreakerService {
            inner,
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            fallback: self.fallback.clone(),
        }
    }
}
