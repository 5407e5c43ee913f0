//! [`AdaptiveThrottleLayer`]: wraps a service in [`AdaptiveThrottleService`].

use stormguard_classify::LlmClassifier;
use tower_layer::Layer;

use super::AdaptiveThrottleService;
use crate::AdaptiveThrottle;

/// Applies client-side adaptive throttling to a service: see [`AdaptiveThrottleService`].
///
/// Every service this layer wraps shares the layer's [`AdaptiveThrottle`]. Hand the same throttle
/// to several layers (it is a cheap clone) when several clients talk to one backend and should
/// throttle together.
#[derive(Clone, Debug)]
pub struct AdaptiveThrottleLayer<C = LlmClassifier> {
    throttle: AdaptiveThrottle,
    classifier: C,
}

impl AdaptiveThrottleLayer {
    /// A layer drawing against `throttle`, deciding "accepted" with the default [`LlmClassifier`].
    pub fn new(throttle: AdaptiveThrottle) -> Self {
        Self {
            throttle,
            classifier: LlmClassifier::default(),
        }
    }
}

impl Default for AdaptiveThrottleLayer {
    /// A layer with its own [`AdaptiveThrottle::default`] and the [`LlmClassifier`].
    fn default() -> Self {
        Self::new(AdaptiveThrottle::default())
    }
}

impl<C> AdaptiveThrottleLayer<C> {
    /// Decide which results count as accepted with `classifier` instead: any
    /// [`Classify`](stormguard_classify::Classify), or a
    /// [`MakeClassify`](stormguard_classify::MakeClassify) that picks one per request.
    pub fn with_classifier<C2>(self, classifier: C2) -> AdaptiveThrottleLayer<C2> {
        AdaptiveThrottleLayer {
            throttle: self.throttle,
            classifier,
        }
    }

    /// The shared throttle, e.g. to read its [`snapshot`](AdaptiveThrottle::snapshot).
    pub fn throttle(&self) -> &AdaptiveThrottle {
        &self.throttle
    }
}

impl<S, C: Clone> Layer<S> for AdaptiveThrottleLayer<C> {
    type Service = AdaptiveThrottleService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveThrottleService::new(inner, self.throttle.clone(), self.classifier.clone())
    }
}
