//! [`Retry`]: the retry engine wrapped around a service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use stormguard_budget::RetryBudget;
use stormguard_classify::{BoxError, Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use tower_layer::Layer;
use tower_service::Service;

use crate::RetryLayer;
use crate::body::{ReplayBody, ResponseBody};
use crate::future::ResponseFuture;
use crate::layer::Config;

/// A service that retries retryable failures of `S` within attempts, budget, hints and deadline
/// (see the [crate docs](crate)). Made by [`RetryLayer`].
pub struct Retry<S, C = LlmClassifier, Bk = FullJitter> {
    inner: S,
    config: Arc<Config<C, Bk>>,
}

impl<S> Retry<S> {
    /// `inner` with the engine's defaults (see [`RetryLayer`]), and a budget of its own.
    pub fn new(inner: S) -> Self {
        RetryLayer::new().layer(inner)
    }
}

impl<S, C, Bk> Retry<S, C, Bk> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<C, Bk>>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The budget retries are drawn from (for [`snapshot`](RetryBudget::snapshot)s).
    pub fn retry_budget(&self) -> &RetryBudget {
        &self.config.budget
    }
}

impl<S, C, Bk, B, RB> Service<Request<B>> for Retry<S, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    C: Classify,
    Bk: Backoff,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B, RB, C, Bk>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The readied service serves the first attempt; its clone stays for the next call.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::new(ready, Arc::clone(&self.config), request)
    }
}

impl<S: Clone, C, Bk> Clone for Retry<S, C, Bk> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for Retry<S, C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
