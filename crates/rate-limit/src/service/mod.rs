//! The limit as tower middleware: [`RateLimitLayer`] and [`RateLimitService`].

mod future;

use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use stormguard_classify::{BoxError, LlmClassifier};
use tower_layer::Layer;
use tower_service::Service;

pub use self::future::ResponseFuture;
use crate::RateLimit;

/// Weighs a request in tokens from its head.
type WeightFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// Paces the requests of a service with a shared [`RateLimit`]: each request reserves its slot,
/// waits for it (within the limit's `max_wait`), or fails at once with
/// [`RateLimited`](crate::RateLimited), boxed. Every answer is shown to the limit, which learns
/// from the provider's headers and 429s (judged by the classifier, from the head).
///
/// The layer does not read bodies: it weighs a request in tokens with
/// [`with_weight`](Self::with_weight) (by default, 0: only requests count). The retry engine's
/// `with_rate_limit` weighs LLM requests by their body (prompt and `max_tokens`), which it buffers
/// anyway. On a gateway's way in, keyed by caller, the layer limits each caller's requests a
/// minute: answer its errors with
/// [`error_response`](stormguard_classify::error_response) (429 and `Retry-After`), for axum
/// through `HandleErrorLayer` (the facade's `tests/ingress.rs` shows the stack).
///
/// The wait happens inside the response future, after `poll_ready`: the service is cloned at
/// each call (the readied one serves the request), like tower's `Buffer` clients.
#[derive(Clone)]
pub struct RateLimitLayer<C = LlmClassifier> {
    limit: RateLimit,
    classifier: C,
    weight: Option<Arc<WeightFn>>,
}

impl RateLimitLayer {
    /// A layer pacing with `limit`, judging answers with the [`LlmClassifier`].
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            classifier: LlmClassifier::default(),
            weight: None,
        }
    }
}

impl<C> RateLimitLayer<C> {
    /// Judge answers (is it a 429?) with `classifier` instead.
    pub fn with_classifier<C2>(self, classifier: C2) -> RateLimitLayer<C2> {
        RateLimitLayer {
            limit: self.limit,
            classifier,
            weight: self.weight,
        }
    }

    /// Weigh each request in tokens with `weight`, from its head.
    pub fn with_weight<F>(mut self, weight: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.weight = Some(Arc::new(weight));
        self
    }

    /// The shared limit.
    pub fn limit(&self) -> &RateLimit {
        &self.limit
    }
}

impl<C> std::fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limit", &self.limit)
            .field("weighed", &self.weight.is_some())
            .finish()
    }
}

impl<S, C: Clone> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            limit: self.limit.clone(),
            classifier: self.classifier.clone(),
            weight: self.weight.clone(),
        }
    }
}

/// A service paced by a [`RateLimit`]: see [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimitService<S, C = LlmClassifier> {
    inner: S,
    limit: RateLimit,
    classifier: C,
    weight: Option<Arc<WeightFn>>,
}

impl<S, C> RateLimitService<S, C> {
    /// The shared limit.
    pub fn limit(&self) -> &RateLimit {
        &self.limit
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug, C> std::fmt::Debug for RateLimitService<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limit", &self.limit)
            .finish()
    }
}

impl<S, C, B, RB> Service<http::Request<B>> for RateLimitService<S, C>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    C: stormguard_classify::Classify + Clone,
{
    type Response = http::Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (head, body) = request.into_parts();
        let tokens = self.weight.as_ref().map_or(0, |weight| weight(&head));
        let deadline = stormguard_deadline::Deadline::from_extensions(&head.extensions)
            .map(|deadline| deadline.instant());
        let mut acquire = self.limit.acquire(&head, tokens, deadline);
        let request = http::Request::from_parts(head, body);
        let classifier = self.classifier.clone();
        let decision = acquire.now();
        if let Some(Err(limited)) = decision {
            return ResponseFuture::refused(limited, classifier);
        }
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        match decision {
            Some(Ok(reservation)) => {
                ResponseFuture::waiting(ready, request, reservation, classifier)
            }
            _ => ResponseFuture::acquiring(ready, request, acquire, classifier),
        }
    }
}
