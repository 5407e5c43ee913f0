//! Client side: set a request's deadline, enforce it, and send the time left downstream.
//!
//! [`DeadlineLayer`] wraps an outgoing client (a hyper client, a tonic channel, a retry stack). For
//! each request it:
//!
//! 1. **sets** the [`Deadline`]: a fixed timeout ([`DeadlineLayer::new`]), a function of the request
//!    head ([`DeadlineLayer::from_fn`]), or an estimate from the LLM request body
//!    ([`DeadlineLayer::llm`], see [`LlmDeadline`]). A deadline already on the request (from an
//!    incoming request, from an outer layer) is kept when it is tighter;
//! 2. **propagates** the time left minus a safety margin (default 50 ms,
//!    [`DEFAULT_MARGIN`](crate::propagate::DEFAULT_MARGIN)): `grpc-timeout` for gRPC requests,
//!    `x-request-timeout-ms` for HTTP (see [`propagate`](crate::propagate));
//! 3. **enforces** it: a request whose deadline has already passed is not sent, and one still
//!    running at its deadline is abandoned. The result is a [`DeadlineExceeded`](crate::DeadlineExceeded)
//!    error, or with [`DeadlineLayer::respond_with_504`] a 504 / gRPC `DEADLINE_EXCEEDED` response
//!    (see [`enforce`](crate::enforce)).
//!
//! Put it *outside* the retry layer: one deadline spans all attempts.
//!
//! # Reading the body for the LLM estimate
//!
//! The estimate needs the JSON body, so the LLM variant requires `B: http_body::Body + From<Bytes>`
//! (as `http_body_util::Full<Bytes>` and axum's `Body` are). A body whose size hint promises at
//! most the limit (1 MiB by default) is read whole, estimated, and rebuilt with `B::from(bytes)`
//! (trailers are dropped; JSON requests have none). A body that may be larger, or whose length is
//! unknown (a stream), is left untouched and gets [`LlmDeadline::max`]. A body that fails while
//! being read, or turns out longer than the limit despite its size hint, fails the request (an
//! error, or HTTP 400 / gRPC `INVALID_ARGUMENT` in respond mode). Because the body is read before
//! the call, the service made ready in `poll_ready` is moved into the future (`S: Clone`, tower's
//! clone-and-swap idiom).
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard_deadline::{Deadline, DeadlineExceeded, DeadlineLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let backend = service_fn(|request: http::Request<()>| async move {
//!     // What the next hop is told:
//!     assert_eq!(request.headers()["x-request-timeout-ms"], "1950");
//!     tokio::time::sleep(Duration::from_secs(5)).await;
//!     Ok::<_, std::convert::Infallible>(http::Response::new(()))
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(2)))
//!     .service(backend);
//! let error = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
//! assert!(error.is::<DeadlineExceeded>());
//! # }
//! ```

mod future;
mod layer;
mod source;

pub use future::EstimateFuture;
pub use layer::DeadlineLayer;
pub use source::{FromFn, TimeoutSource};

use std::marker::PhantomData;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;
use tower_service::Service;

use crate::enforce::{BoxError, OnExpiry, ResponseFuture, ReturnError};
use crate::propagate::{is_grpc, stamp_parts};
use crate::{Deadline, LlmDeadline};

/// The service of [`DeadlineLayer`]. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct ClientDeadline<S, T = Duration, M = ReturnError> {
    inner: S,
    source: T,
    settings: Settings,
    mode: PhantomData<fn() -> M>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) margin: Duration,
    pub(crate) propagate: bool,
    pub(crate) body_limit: usize,
}

impl<S, T, M> ClientDeadline<S, T, M> {
    pub(crate) fn from_parts(inner: S, source: T, settings: Settings) -> Self {
        Self {
            inner,
            source,
            settings,
            mode: PhantomData,
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
}

/// A request head made ready to send.
pub(crate) enum Prepared {
    /// Its deadline has already passed: do not send it.
    Expired { grpc: bool },
    /// Send it; enforce `deadline` if there is one.
    Ready {
        deadline: Option<Deadline>,
        grpc: bool,
    },
}

/// Sets the deadline from `timeout` (keeping a tighter one), checks it, and stamps the
/// propagation header.
pub(crate) fn prepare(
    parts: &mut Parts,
    timeout: Option<Duration>,
    settings: Settings,
) -> Prepared {
    // One clock reading for setting, checking and stamping the deadline.
    let now = Instant::now();
    if let Some(timeout) = timeout {
        Deadline::after_from(now, timeout).apply_to_extensions(&mut parts.extensions);
    }
    let grpc = is_grpc(&parts.headers);
    let deadline = Deadline::from_extensions(&parts.extensions);
    if deadline.is_some_and(|deadline| now >= deadline.instant()) {
        return Prepared::Expired { grpc };
    }
    if settings.propagate {
        stamp_parts(
            &mut parts.headers,
            &mut parts.extensions,
            settings.margin,
            now,
            grpc,
        );
    }
    Prepared::Ready { deadline, grpc }
}

impl<S, T, M, B> Service<Request<B>> for ClientDeadline<S, T, M>
where
    S: Service<Request<B>>,
    T: TimeoutSource,
    M: OnExpiry<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = M::Error;
    type Future = ResponseFuture<S::Future, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner_error)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let timeout = self.source.timeout(&parts);
        match prepare(&mut parts, timeout, self.settings) {
            Prepared::Expired { grpc } => ResponseFuture::expired(grpc),
            Prepared::Ready { deadline, grpc } => {
                let future = self.inner.call(Request::from_parts(parts, body));
                ResponseFuture::new(future, deadline, grpc)
            }
        }
    }
}

impl<S, M, B> Service<Request<B>> for ClientDeadline<S, LlmDeadline, M>
where
    S: Service<Request<B>> + Clone,
    B: Body + From<Bytes>,
    B::Error: Into<BoxError>,
    M: OnExpiry<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = M::Error;
    type Future = EstimateFuture<S, B, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner_error)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let limit = self.settings.body_limit;
        let readable = body
            .size_hint()
            .upper()
            .is_some_and(|upper| upper <= u64::try_from(limit).unwrap_or(u64::MAX));
        let already_expired = Deadline::from_extensions(&parts.extensions)
            .is_some_and(|deadline| deadline.is_expired());
        if !readable || already_expired {
            let future = match prepare(&mut parts, Some(self.source.max), self.settings) {
                Prepared::Expired { grpc } => ResponseFuture::expired(grpc),
                Prepared::Ready { deadline, grpc } => {
                    let future = self.inner.call(Request::from_parts(parts, body));
                    ResponseFuture::new(future, deadline, grpc)
                }
            };
            return EstimateFuture::running(future);
        }
        let fresh = self.inner.clone();
        let readied = std::mem::replace(&mut self.inner, fresh);
        EstimateFuture::reading(
            Limited::new(body, limit).collect(),
            readied,
            parts,
            self.source,
            self.settings,
        )
    }
}
