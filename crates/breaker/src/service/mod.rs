//! The breaker as tower middleware: [`BreakerLayer`] and [`BreakerService`].
//!
//! Before each call the service asks the shared [`CircuitBreaker`] for a permit. A refusal
//! answers at once, without calling the inner service: with the layer's [`Fallback`] if it has
//! one, else with the error ([`BreakerOpen`](crate::BreakerOpen) or
//! [`BulkheadFull`](crate::BulkheadFull), boxed). Otherwise the call goes through and, when it
//! completes, its outcome is recorded: a response is judged as the retry engine judges it, by
//! [`classify_response`](stormguard_classify::body::classify_response) (the head, and the start
//! of a failed response's body when the classifier asks for it), an error by the classifier's
//! `classify_error`. While the call is in flight (or its error body is read), a stall that opens the
//! breaker cuts it: the
//! inner future is dropped and the request answered as if it had been refused.
//!
//! A call dropped before it completes (its caller gave up) counts for nothing: a caller's
//! impatience says nothing about the backend. Put the attempt's timeout *inside* this layer, so
//! that an attempt that times out comes back as a timeout, a health failure.

mod future;
mod layer;

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, LlmClassifier, MakeClassify};
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::layer::BreakerLayer;
use crate::{CircuitBreaker, Fallback};

/// A service behind a circuit breaker: each call asks the shared [`CircuitBreaker`] first (a
/// refusal is answered at once, by the fallback or with the error), records its outcome, and is
/// cut by a stall while in flight. [`BreakerLayer`] builds it; the [crate docs](crate) have the
/// algorithm.
#[derive(Clone, Debug)]
pub struct BreakerService<S, C = LlmClassifier> {
    inner: S,
    breaker: CircuitBreaker,
    classifier: C,
    fallback: Option<Fallback>,
}

impl<S, C> BreakerService<S, C> {
    /// The shared breaker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
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

impl<S, C, B, RB> Service<http::Request<B>> for BreakerService<S, C>
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
        match self.breaker.try_acquire() {
            Ok(permit) => {
                let classifier = self.classifier.make_classifier(&request);
                // The head is kept only for a fallback to answer a cut call with.
                let (request, head) = match &self.fallback {
                    Some(fallback) => {
                        let (head, body) = request.into_parts();
                        let kept = (fallback.clone(), head.clone());
                        (http::Request::from_parts(head, body), Some(kept))
                    }
                    None => (request, None),
                };
                ResponseFuture::called(self.inner.call(request), classifier, permit, head)
            }
            Err(rejected) => ResponseFuture::refused(match &self.fallback {
                Some(fallback) => Ok(fallback.answer(&request.into_parts().0, &rejected)),
                None => Err(rejected.into_error()),
            }),
        }
    }
}
