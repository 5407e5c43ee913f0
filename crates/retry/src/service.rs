//! [`ClientService`]: the engine wrapped around a service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use tower_service::Service;

use crate::body::ReplayBody;
use crate::continuing::{ContinueBy, make_continuer};
use crate::error::Error;
use crate::future::ResponseFuture;
use crate::layer::Config;
use stormguard_stream::Continuer;

/// The client pipeline around `S`: made by [`ClientLayer`](crate::ClientLayer), which says what
/// it does to each request.
pub struct ClientService<S, C = LlmClassifier, Bk = FullJitter> {
    inner: S,
    config: Arc<Config<C, Bk>>,
}

impl<S, C, Bk> ClientService<S, C, Bk> {
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
}

impl<S, C, Bk> ClientService<S, C, Bk> {
    /// Readies the inner service (what [`Service::poll_ready`] does).
    pub fn poll_engine_ready<B>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>
    where
        S: Service<Request<B>>,
        S::Error: Into<BoxError>,
        C: Classify,
    {
        self.inner.poll_ready(cx).map_err(|error| {
            let error: BoxError = error.into();
            let outcome = self.config.classifier.classify_error(&*error);
            Error::failed(outcome, error, 0)
        })
    }

    /// Sends `request` through the engine, as [`Service::call`] does, except that an event
    /// stream cut after content is never continued (it ends with its in-band error event and
    /// `StreamInterrupted`): for an inner service that lives only as long as the call (the
    /// reqwest adapter's middleware chain), which a continuation, sent later, could not use.
    pub fn call_without_continuation<B, RB>(
        &mut self,
        request: Request<B>,
    ) -> ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        RB: Body,
        B: ReplayBody,
        C: Classify,
        Bk: Backoff,
    {
        self.ready_call(request, None)
    }

    /// Sends `request` through the engine, its event streams continued by `continuer` instead
    /// of through this engine: for a layer above that chooses where a continuation goes (a
    /// failover sends it to its next backend). Needs no `'static` service, like
    /// [`call_without_continuation`](Self::call_without_continuation).
    pub fn call_continuing_with<B, RB>(
        &mut self,
        request: Request<B>,
        continuer: Continuer,
    ) -> ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        RB: Body,
        B: ReplayBody,
        C: Classify,
        Bk: Backoff,
    {
        self.ready_call(request, Some(ContinueBy::Given(continuer)))
    }

    /// Whether this engine's backend was found to reject an assistant prefill (it answered a
    /// continuation 400): a layer that sends continuations itself asks before sending one here.
    pub fn rejects_prefill(&self) -> bool {
        self.config.prefill.rejected()
    }

    /// Tells this engine that its backend rejected an assistant prefill.
    pub fn reject_prefill(&self) {
        self.config.prefill.reject();
    }

    #[inline]
    fn ready_call<B, RB>(
        &mut self,
        request: Request<B>,
        continuer: Option<ContinueBy<S, C, Bk>>,
    ) -> ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        RB: Body,
        B: ReplayBody,
        C: Classify,
        Bk: Backoff,
    {
        // The readied service serves the request; its clone stays for the next call.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::new(ready, Arc::clone(&self.config), request, continuer)
    }
}

/// Event streams cut after content are continued through a clone of the inner service (see
/// [`ClientLayer::with_continuation`](crate::ClientLayer::with_continuation)), which a
/// continuation sent later must be able to own: hence `'static` and `Send`.
impl<S, C, Bk, B, RB> Service<Request<B>> for ClientService<S, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Send + Sync + 'static,
    Bk: Backoff + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = Error;
    type Future = ResponseFuture<S, B, RB, C, Bk>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.poll_engine_ready(cx)
    }

    // Inlined where it is called, so that the future is built in its caller's place rather
    // than returned and moved.
    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let continuer = ContinueBy::Engine(make_continuer::<S, B, RB, C, Bk>);
        self.ready_call(request, Some(continuer))
    }
}

impl<S: Clone, C, Bk> Clone for ClientService<S, C, Bk> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for ClientService<S, C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
