//! [`ClientService`]: the engine wrapped around a service.

use std::fmt;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_stream::{AnswerFuture, Continuer};
use tower_service::Service;

use crate::body::ReplayBody;
use crate::config::Config;
use crate::continuing::{Continue, Continuing, NotContinuing, continued_body};
use crate::error::Error;
use crate::future::ResponseFuture;
use crate::ledger::Output;
use crate::route::{Report, Route};

/// The client pipeline around `S`: made by [`ClientLayer`](crate::ClientLayer), which says what
/// it does to each request. `K` says whether it continues the event streams it hands back
/// through itself ([`Continuing`], the default), which asks its inner service to be `Send` and
/// `'static` (a continuation is sent after the answer was handed back), or not
/// ([`NotContinuing`]), which asks no more than any tower retry does.
pub struct ClientService<S, C = LlmClassifier, Bk = FullJitter, K = Continuing> {
    inner: S,
    config: Arc<Config<C, Bk>>,
    continues: PhantomData<fn() -> K>,
}

impl<S, C, Bk, K> ClientService<S, C, Bk, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<C, Bk>>) -> Self {
        Self {
            inner,
            config,
            continues: PhantomData,
        }
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

    /// Readies the inner service: what [`Service::poll_ready`] does.
    fn poll_inner_ready<B>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>
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

    /// The readied service for a request; its clone stays for the next.
    #[inline]
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let fresh = self.inner.clone();
        std::mem::replace(&mut self.inner, fresh)
    }

    /// Sends `request` through the engine for a router above it (a failover over several
    /// backends): as [`Service::call`] does (the service must be ready), with what `route`
    /// says, and the engine's [`Report`](crate::Report) handed back with the answer.
    pub fn route<B, RB>(&mut self, request: Request<B>, route: Route) -> Routed<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        RB: Body,
        B: ReplayBody,
        C: Classify,
        Bk: Backoff,
    {
        let ready = self.take_ready();
        let config = Arc::clone(&self.config);
        let future = ResponseFuture::new(ready, config, request, Continue::Never, Some(route));
        Routed { inner: future }
    }
}

/// Event streams cut after content are continued through a clone of the inner service (see
/// [`ClientLayer::without_continuation`](crate::ClientLayer::without_continuation) for a layer
/// that does not), which a continuation, sent later, must be able to own: hence `'static` and
/// `Send`.
impl<S, C, Bk, B, RB> Service<Request<B>> for ClientService<S, C, Bk, Continuing>
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
        self.poll_inner_ready(cx)
    }

    // Inlined where it is called, so that the future is built in its caller's place rather
    // than returned and moved.
    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let continuer = Continue::Engine(make_continuer::<S, B, RB, C, Bk>);
        let ready = self.take_ready();
        ResponseFuture::new(ready, Arc::clone(&self.config), request, continuer, None)
    }
}

/// Event streams cut after content end with their in-band error event and `StreamInterrupted`:
/// nothing is sent later, so the inner service needs no more than `Clone`.
impl<S, C, Bk, B, RB> Service<Request<B>> for ClientService<S, C, Bk, NotContinuing>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify,
    Bk: Backoff,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = Error;
    type Future = ResponseFuture<S, B, RB, C, Bk>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.poll_inner_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let ready = self.take_ready();
        ResponseFuture::new(
            ready,
            Arc::clone(&self.config),
            request,
            Continue::Never,
            None,
        )
    }
}

/// A continuer that sends each continuation request through the engine over a clone of
/// `service`: paid for with a ticket of the retry budget (a spent budget continues nothing), the
/// answer's body if it is an event stream. A 400 teaches the layer that its backend takes no
/// prefill; the caller is told the original interruption, never the 400.
fn make_continuer<S, B, RB, C, Bk>(service: &S, config: &Arc<Config<C, Bk>>) -> Continuer
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
    let service = service.clone();
    let config = Arc::clone(config);
    Box::new(move |request: Request<Bytes>| -> AnswerFuture {
        let Some(ticket) = config.policy.budget.ticket() else {
            return Box::pin(std::future::ready(None));
        };
        let mut client: ClientService<S, C, Bk, NotContinuing> =
            ClientService::from_config(service.clone(), Arc::clone(&config));
        let prefill = Arc::clone(&config.prefill);
        Box::pin(async move {
            poll_fn(|cx| client.poll_inner_ready(cx)).await.ok()?;
            let route = Route::new().with_ticket(ticket).as_continuation();
            let (answer, _) = client.route(request.map(B::from_bytes), route).await;
            let response = answer.ok()?;
            if response.status() == StatusCode::BAD_REQUEST {
                prefill.reject();
                return None;
            }
            continued_body(response)
        })
    })
}

impl<S: Clone, C, Bk, K> Clone for ClientService<S, C, Bk, K> {
    fn clone(&self) -> Self {
        Self::from_config(self.inner.clone(), Arc::clone(&self.config))
    }
}

impl<S: fmt::Debug, C: fmt::Debug, Bk: fmt::Debug, K> fmt::Debug for ClientService<S, C, Bk, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

pin_project! {
    /// The future of [`ClientService::route`]: the engine's answer to a router above, with its
    /// [`Report`].
    pub struct Routed<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        inner: ResponseFuture<S, B, RB, C, Bk>,
    }
}

impl<S, B, RB, C, Bk> Routed<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// Ends the turn as the loser of a race for the same answer (another backend answered
    /// first): each of its attempts in flight is cancelled as a loser (the throttle forgets it,
    /// the breaker frees its place, its ticket and slot stay spent: it was sent), not as one
    /// its caller abandoned. Polling it afterwards panics.
    pub fn lose(self: Pin<&mut Self>) {
        self.project().inner.lose();
    }
}

impl<S, B, RB, C, Bk> Future for Routed<S, B, RB, C, Bk>
where
    ResponseFuture<S, B, RB, C, Bk>: Future<Output = Output<RB>>,
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    type Output = (Output<RB>, Report);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.project().inner;
        let output = ready!(inner.as_mut().poll(cx));
        let report = inner.report(&output);
        Poll::Ready((output, report))
    }
}

impl<S, B, RB, C, Bk> fmt::Debug for Routed<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Routed").field(&self.inner).finish()
    }
}
