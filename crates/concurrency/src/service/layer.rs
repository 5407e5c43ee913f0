//! [`ConcurrencyLayer`]: wraps a service in [`ConcurrencyService`].

use stormguard_classify::LlmClassifier;
use tower_layer::Layer;

use super::ConcurrencyService;
use crate::ConcurrencyLimit;

/// Puts an adaptive concurrency limit in front of a service: see [`ConcurrencyService`].
///
/// Every service this layer wraps shares the layer's [`ConcurrencyLimit`]: one limit per backend.
/// Hand the same limit (a cheap clone) to every client of that backend.
#[derive(Clone, Debug)]
pub struct ConcurrencyLayer<C = LlmClassifier> {
    limit: ConcurrencyLimit,
    classifier: C,
}

impl ConcurrencyLayer {
    /// A layer in front of `limit`, judging answers with the default [`LlmClassifier`].
    pub fn new(limit: ConcurrencyLimit) -> Self {
        Self {
            limit,
            classifier: LlmClassifier::default(),
        }
    }
}

impl Default for ConcurrencyLayer {
    /// A layer with its own [`ConcurrencyLimit::default`].
    fn default() -> Self {
        Self::new(ConcurrencyLimit::default())
    }
}

impl<C> ConcurrencyLayer<C> {
    /// Judge answers with `classifier` instead: any
    /// [`Classify`](stormguard_classify::Classify), or a
    /// [`MakeClassify`](stormguard_classify::MakeClassify) that picks one per request.
    pub fn with_classifier<C2>(self, classifier: C2) -> ConcurrencyLayer<C2> {
        ConcurrencyLayer {
            limit: self.limit,
            classifier,
        }
    }

    /// The shared limit.
    pub fn limit(&self) -> &ConcurrencyLimit {
        &self.limit
    }
}

impl<S, C: Clone> Layer<S> for ConcurrencyLayer<C> {
    type Service = ConcurrencyService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyService::new(inner, self.limit.clone(), self.classifier.clone())
    }
}
