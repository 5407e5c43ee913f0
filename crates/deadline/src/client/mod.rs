//! Client side: set a request's deadline, enforce it, and send the time left downstream.
//!
//! [`DeadlineLayer`] wraps an outgoing client (a hyper client, a tonic channel). For each request
//! it:
//!
//! 1. **sets** the [`Deadline`]: a fixed timeout ([`DeadlineLayer::new`]) or a function of the
//!    request head ([`DeadlineLayer::from_fn`]). A deadline already on the request (from an
//!    incoming request, from an outer layer) is kept when it is tighter;
//! 2. **propagates** the time left minus a safety margin (default 50 ms,
//!    [`DEFAULT_MARGIN`](crate::propagate::DEFAULT_MARGIN)): `grpc-timeout` for gRPC requests,
//!    `x-request-timeout-ms` for HTTP (see [`propagate`](crate::propagate));
//! 3. **enforces** it: a request whose deadline has already passed is not sent, and one still
//!    running at its deadline is abandoned. The result is a [`DeadlineExceeded`](crate::DeadlineExceeded)
//!    error, or with [`DeadlineLayer::respond_with_504`] a 504 / gRPC `DEADLINE_EXCEEDED` response
//!    (see [`enforce`](crate::enforce)).
//!
//! The layer reads no request body. A timeout sized from an LLM request body
//! ([`LlmDeadline`](crate::LlmDeadline)) is set by the client retry engine (`stormguard-retry`'s
//! `ClientLayer`), which buffers the body for replay anyway and also stamps every attempt with the
//! time left: a body is read once. Any [`TimeoutSource`] serves both.
//!
//! With a retry layer of another kind, put this layer *outside* it: one deadline spans all
//! attempts.
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

mod layer;
mod source;

pub use layer::DeadlineLayer;
pub use source::{FromFn, TimeoutSource};

use std::marker::PhantomData;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use stormguard_classify::is_grpc;
use tokio::time::Instant;
use tower_service::Service;

use crate::Deadline;
use crate::enforce::{OnExpiry, ResponseFuture, ReturnError};
use crate::propagate::write_timeout;

/// The service of [`DeadlineLayer`]. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct ClientDeadline<S, T = Duration, M = ReturnError> {
    inner: S,
    source: T,
    settings: Settings,
    mode: PhantomData<fn() -> M>,
}

/// The settings of a [`DeadlineLayer`], shared with its services.
#[derive(Clone, Copy, Debug)]
struct Settings {
    margin: Duration,
    propagation: bool,
}

impl<S, T, M> ClientDeadline<S, T, M> {
    fn from_parts(inner: S, source: T, settings: Settings) -> Self {
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
        // One clock reading for setting, checking and stamping the deadline.
        let now = Instant::now();
        if let Some(timeout) = self.source.timeout(&parts, None) {
            Deadline::after_from(now, timeout).apply_to_extensions(&mut parts.extensions);
        }
        let grpc = is_grpc(&parts.headers);
        let deadline = Deadline::from_extensions(&parts.extensions);
        if let Some(deadline) = deadline {
            let left = deadline.instant().saturating_duration_since(now);
            if left.is_zero() {
                return ResponseFuture::expired(grpc);
            }
            if self.settings.propagation {
                let timeout = left.saturating_sub(self.settings.margin);
                write_timeout(&mut parts.headers, timeout, grpc);
            }
        }
        let future = self.inner.call(Request::from_parts(parts, body));
        ResponseFuture::new(future, deadline, grpc)
    }
}
