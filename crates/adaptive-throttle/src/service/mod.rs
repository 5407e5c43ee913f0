//! The throttle as tower middleware: [`AdaptiveThrottleLayer`] and [`AdaptiveThrottleService`].
//!
//! Before each call the service draws against the shared [`AdaptiveThrottle`]. A drop returns
//! [`Throttled`](crate::Throttled) at once, without calling the inner service; otherwise the
//! request goes through and, when it completes, the classifier's
//! [`is_accepted`](stormguard_classify::Outcome::is_accepted) answer for it is recorded.
//!
//! Responses are judged the way the retry engine judges them, by
//! [`classify_response`](stormguard_classify::body::classify_response): from the head, and also
//! from the first [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) bytes of the body
//! when the classifier asks for them ([`needs_body`](stormguard_classify::Classify::needs_body):
//! by default, failed responses that are not gRPC). So a `429` whose body says `insufficient_quota` is an accept (the backend answered:
//! the quota is spent), while a `429` rate limit is a rejection. The caller receives the whole
//! response all the same, its body as a [`ResponseBody`]. Errors are judged with the classifier's
//! `classify_error`.
//!
//! `poll_ready` passes the inner service's readiness through unchanged, like tower's `Filter`:
//! a request that is then dropped leaves the inner service ready for the next call.

mod future;
mod layer;

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, LlmClassifier, MakeClassify};
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::layer::AdaptiveThrottleLayer;
use crate::AdaptiveThrottle;

/// A service that drops requests locally while its backend rejects most of them: see the
/// [crate docs](crate) for the formula and [`AdaptiveThrottleLayer`] to build it.
#[derive(Clone, Debug)]
pub struct AdaptiveThrottleService<S, C = LlmClassifier> {
    inner: S,
    throttle: AdaptiveThrottle,
    classifier: C,
}

impl<S, C> AdaptiveThrottleService<S, C> {
    /// Wrap `inner`, drawing against `throttle` and recording with `classifier` (a
    /// [`Classify`](stormguard_classify::Classify), or a [`MakeClassify`] that picks one per
    /// request).
    pub fn new(inner: S, throttle: AdaptiveThrottle, classifier: C) -> Self {
        Self {
            inner,
            throttle,
            classifier,
        }
    }

    /// The shared throttle.
    pub fn throttle(&self) -> &AdaptiveThrottle {
        &self.throttle
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C, B, RB> Service<http::Request<B>> for AdaptiveThrottleService<S, C>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    C: MakeClassify,
    RB: Body<Data = Bytes>,
{
    type Response = http::Response<ResponseBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C::Classifier, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.throttle.try_acquire() {
            Ok(permit) => {
                let classifier = self.classifier.make_classifier(&request);
                ResponseFuture::called(self.inner.call(request), permit, classifier)
            }
            Err(_throttled) => ResponseFuture::dropped(),
        }
    }
}
