//! Server side: honour the caller's deadline.
//!
//! [`ServerDeadlineLayer`] sits in front of handlers (an axum `Router::layer`, a tonic server). For
//! each incoming request it:
//!
//! 1. **reads** the caller's timeout: the tightest valid value of `grpc-timeout`,
//!    `x-request-timeout-ms` and `x-envoy-expected-rq-timeout-ms`
//!    ([`propagate::incoming_timeout`](crate::propagate::incoming_timeout)). Malformed or hostile values are
//!    ignored (as if absent), never a panic;
//! 2. **caps** it at a maximum (default 600 s, [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)): a
//!    client must not pin the server for a day; without a header the default applies (300 s,
//!    [`DEFAULT_SERVER_TIMEOUT`]);
//! 3. **sheds** a request that arrives already expired (or with less than the configured minimum
//!    left) without calling the handler: HTTP `504`, or for gRPC a trailers-only `200` with
//!    `grpc-status: 4` (`DEADLINE_EXCEEDED`), both marked "do not retry" (see
//!    [`enforce::Respond`](crate::enforce::Respond));
//! 4. **stores** the [`Deadline`] in the request extensions, so the handler's own outgoing calls
//!    inherit it (axum: `Extension<Deadline>`; wrap the outgoing client in a
//!    [`DeadlineLayer`](crate::DeadlineLayer) and apply the deadline to the outgoing request: an
//!    incoming 2 s deadline leaves ~2 s, not a fresh 30 s, for the upstream call);
//! 5. **times out** a handler that overruns, with the same 504 / gRPC 4 response.
//!
//! It always answers with a response, never an error: the service's error type is the inner one's
//! (`Infallible` under axum), and its response is `http::Response<RB>` with `RB: Default` (axum's
//! `Body`, tonic's body).
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Extension, Router, routing::post};
//! use stormguard_deadline::{Deadline, ServerDeadlineLayer};
//!
//! async fn chat(Extension(deadline): Extension<Deadline>) -> String {
//!     format!("{} ms left", deadline.remaining().as_millis())
//! }
//!
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(chat))
//!     .layer(ServerDeadlineLayer::new().with_default(Duration::from_secs(120)));
//! ```

mod layer;

pub use layer::{DEFAULT_SERVER_TIMEOUT, ServerDeadlineLayer};

use std::task::{Context, Poll};

use http::{Request, Response};
use layer::ServerSettings;
use stormguard_classify::is_grpc;
use tower_service::Service;

use crate::Deadline;
use crate::enforce::{Respond, ResponseFuture};
use crate::propagate::incoming_timeout;

/// The service of [`ServerDeadlineLayer`]. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct ServerDeadline<S> {
    inner: S,
    settings: ServerSettings,
}

impl<S> ServerDeadline<S> {
    /// Wraps `inner` with the default settings.
    pub fn new(inner: S) -> Self {
        tower_layer::Layer::layer(&ServerDeadlineLayer::default(), inner)
    }

    pub(crate) fn from_settings(inner: S, settings: ServerSettings) -> Self {
        Self { inner, settings }
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

impl<S, B, RB> Service<Request<B>> for ServerDeadline<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, Respond>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let settings = self.settings;
        let timeout = incoming_timeout(request.headers())
            .unwrap_or(settings.default)
            .min(settings.max);
        // A tighter deadline set by an outer layer is kept.
        let own = Deadline::after(timeout);
        let deadline = Deadline::of(&request).map_or(own, |outer| outer.min(own));
        deadline.apply_to(&mut request);
        let grpc = is_grpc(request.headers());
        let remaining = deadline.remaining();
        if remaining.is_zero() || remaining < settings.min_remaining {
            return ResponseFuture::expired(grpc);
        }
        ResponseFuture::new(self.inner.call(request), Some(deadline), grpc)
    }
}
