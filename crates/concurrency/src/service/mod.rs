//! The limit as tower middleware: [`ConcurrencyLayer`] and [`ConcurrencyService`].
//!
//! `poll_ready` takes a slot, waiting while the limit is full, for the configured
//! [`max_wait`](crate::ConcurrencyConfig::max_wait) at most (tower's `ConcurrencyLimit` waits
//! without end); a wait that runs out is answered by `call` with [`ConcurrencyFull`] at once,
//! without calling the inner service. The answer's head is judged by the classifier: a failure
//! (429, 503, 529...) gives its slot back with what it says; a success keeps its slot in its body
//! ([`ConcurrencyBody`]) until the body's last frame, an error or a drop. An inner error is judged
//! by the classifier's `classify_error` (a timeout shrinks the limit).
//!
//! A call dropped before it completes counts for nothing: put the attempt's timeout *inside*
//! this layer, so that a timed-out attempt comes back as a timeout. In-band errors of an event
//! stream (Anthropic's `overloaded_error` event after a 200) are read by the retry engine's stream
//! guard, which tells the limit: behind the engine
//! ([`ClientLayer::with_concurrency`](https://docs.rs/stormguard-retry)), not with this layer
//! alone.

mod body;
mod future;
mod layer;

use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::Body;
use stormguard_classify::{BoxError, LlmClassifier, MakeClassify};
use tower_service::Service;

pub use self::body::ConcurrencyBody;
pub use self::future::ResponseFuture;
pub use self::layer::ConcurrencyLayer;
use crate::{Acquire, ConcurrencyFull, ConcurrencyLimit, ConcurrencyPermit};

/// A service behind an adaptive concurrency limit: see the [module docs](self).
pub struct ConcurrencyService<S, C = LlmClassifier> {
    inner: S,
    limit: ConcurrencyLimit,
    classifier: C,
    /// The slot taken by `poll_ready` for the next call, or the refusal it ended with.
    ready: Option<Result<ConcurrencyPermit, ConcurrencyFull>>,
    /// The wait for a slot, while the limit is full.
    waiting: Option<Acquire>,
}

impl<S, C> ConcurrencyService<S, C> {
    /// `inner` behind `limit`, judging answers with `classifier`.
    pub fn new(inner: S, limit: ConcurrencyLimit, classifier: C) -> Self {
        Self {
            inner,
            limit,
            classifier,
            ready: None,
            waiting: None,
        }
    }

    /// The shared limit.
    pub fn limit(&self) -> &ConcurrencyLimit {
        &self.limit
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

/// A clone shares the limit and holds no slot (as tower's `ConcurrencyLimit`).
impl<S: Clone, C: Clone> Clone for ConcurrencyService<S, C> {
    fn clone(&self) -> Self {
        Self::new(
            self.inner.clone(),
            self.limit.clone(),
            self.classifier.clone(),
        )
    }
}

impl<S: std::fmt::Debug, C> std::fmt::Debug for ConcurrencyService<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyService")
            .field("inner", &self.inner)
            .field("limit", &self.limit)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<S, C, B, RB> Service<http::Request<B>> for ConcurrencyService<S, C>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    C: MakeClassify,
    RB: Body<Data = Bytes>,
{
    type Response = http::Response<ConcurrencyBody<RB, C::Classifier>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C::Classifier>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.ready.is_none() {
            let taken = match &mut self.waiting {
                Some(waiting) => ready!(std::pin::Pin::new(waiting).poll(cx)),
                None => match self.limit.try_acquire() {
                    Ok(permit) => Ok(permit),
                    Err(_) => {
                        self.waiting = Some(self.limit.acquire(None));
                        return self.poll_ready(cx);
                    }
                },
            };
            self.waiting = None;
            self.ready = Some(taken);
        }
        match &self.ready {
            // The refusal is answered by `call`, without the inner service.
            Some(Err(_)) => Poll::Ready(Ok(())),
            _ => self.inner.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // A caller that did not wait for readiness gets a slot only if one is free now.
        let taken = self
            .ready
            .take()
            .unwrap_or_else(|| self.limit.try_acquire());
        match taken {
            Ok(permit) => {
                let classifier = self.classifier.make_classifier(&request);
                ResponseFuture::called(self.inner.call(request), permit, classifier)
            }
            Err(full) => ResponseFuture::refused(full),
        }
    }
}
