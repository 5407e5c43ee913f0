//! Fault injection as tower middleware: [`ChaosLayer`] and [`ChaosService`].
//!
//! Each call draws its faults when it is made ([`Fault`](crate::Fault) says how): an error
//! answer, a silence or a reset is answered in place of the inner service, which is never called;
//! a latency delays the inner call; a stream fault waits for the answer and, if it is an event
//! stream, acts on its body ([`ChaosBody`](crate::ChaosBody)). Every other call goes through
//! untouched, its body too.
//!
//! `poll_ready` passes the inner service's readiness through unchanged, like tower's `Filter`: a
//! call answered in its place leaves the inner service ready for the next one.

mod future;
mod layer;

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use stormguard_classify::BoxError;
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::layer::ChaosLayer;
use self::placement::{Client, Server};
use crate::ChaosBody;
use crate::injector::Injector;

/// Where a chaos layer sits, which decides how a connection reset is injected: the marker
/// types of [`ChaosLayer`]'s and [`ChaosService`]'s `P`.
pub mod placement {
    /// Under a client: a reset is the service's error, an `io::Error` of kind
    /// `ConnectionReset` (the service's error type is a `BoxError`).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Client;

    /// In front of a server: the service fails only as its inner service does (axum's routes
    /// never fail), and a reset is an answer whose body fails at once, so the server aborts
    /// the connection.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Server;
}

/// A service that injects its layer's faults into the calls it passes on: see the
/// [crate docs](crate) and [`ChaosLayer`] to build it.
pub struct ChaosService<S, P = Client> {
    inner: S,
    injector: Injector,
    placement: PhantomData<P>,
}

impl<S, P> ChaosService<S, P> {
    pub(crate) fn new(inner: S, injector: Injector) -> Self {
        Self {
            inner,
            injector,
            placement: PhantomData,
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

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Draws the call's faults and starts it: the inner service is called unless a fault
    /// answers in its place.
    fn start<B>(&mut self, request: Request<B>) -> ResponseFuture<S::Future, P>
    where
        S: Service<Request<B>>,
    {
        let (in_flight, draw) = self.injector.begin();
        ResponseFuture::start(&mut self.inner, request, in_flight, draw)
    }
}

impl<S, B, RB> Service<Request<B>> for ChaosService<S, Client>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ChaosBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, Client>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.start(request)
    }
}

impl<S, B, RB> Service<Request<B>> for ChaosService<S, Server>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ChaosBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, Server>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.start(request)
    }
}

impl<S: Clone, P> Clone for ChaosService<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            injector: self.injector.clone(),
            placement: PhantomData,
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for ChaosService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosService")
            .field("inner", &self.inner)
            .field("placement", &std::any::type_name::<P>())
            .field("injector", &self.injector)
            .finish()
    }
}
