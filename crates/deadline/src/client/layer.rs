use std::marker::PhantomData;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use super::{ClientDeadline, FromFn, Settings};
use crate::LlmDeadline;
use crate::enforce::{Respond, ReturnError};
use crate::llm::LLM_BODY_LIMIT;
use crate::propagate::DEFAULT_MARGIN;

/// Client side: sets a request's [`Deadline`](crate::Deadline), enforces it and propagates it
/// downstream. See the [module docs](crate::client).
///
/// `T` is where the timeout comes from (a fixed [`Duration`], a [`FromFn`] or an [`LlmDeadline`]);
/// `M` what the service hands back when the deadline passes ([`ReturnError`] or, after
/// [`respond_with_504`](Self::respond_with_504), [`Respond`]).
#[derive(Clone, Debug)]
pub struct DeadlineLayer<T = Duration, M = ReturnError> {
    source: T,
    settings: Settings,
    mode: PhantomData<fn() -> M>,
}

impl DeadlineLayer {
    /// A fixed timeout from the moment the request enters the layer.
    pub fn new(timeout: Duration) -> Self {
        Self::with_source(timeout)
    }

    /// A fixed timeout (same as [`new`](Self::new)).
    pub fn fixed(timeout: Duration) -> Self {
        Self::with_source(timeout)
    }

    /// A timeout computed from the request head; `None` sets no new deadline.
    pub fn from_fn<F>(f: F) -> DeadlineLayer<FromFn<F>>
    where
        F: Fn(&Parts) -> Option<Duration>,
    {
        DeadlineLayer::with_source(FromFn(f))
    }

    /// A timeout estimated from the LLM request's JSON body (see [`LlmDeadline`]). The body is read
    /// (up to 1 MiB, [`LLM_BODY_LIMIT`]) and rebuilt with `B::from(Bytes)`.
    pub fn llm(estimate: LlmDeadline) -> DeadlineLayer<LlmDeadline> {
        DeadlineLayer::with_source(estimate)
    }
}

impl<T> DeadlineLayer<T> {
    fn with_source(source: T) -> Self {
        Self {
            source,
            settings: Settings {
                margin: DEFAULT_MARGIN,
                propagate: true,
                body_limit: LLM_BODY_LIMIT,
            },
            mode: PhantomData,
        }
    }
}

impl<T, M> DeadlineLayer<T, M> {
    /// Safety margin subtracted from the remaining time in the propagation header
    /// (default 50 ms, [`DEFAULT_MARGIN`]).
    pub fn with_margin(mut self, margin: Duration) -> Self {
        self.settings.margin = margin;
        self
    }

    /// Do not stamp `grpc-timeout` / `x-request-timeout-ms` on outgoing requests.
    pub fn without_propagation(mut self) -> Self {
        self.settings.propagate = false;
        self
    }

    /// Answer an expired deadline with a response (HTTP 504, gRPC `DEADLINE_EXCEEDED`) instead of
    /// an error, keeping the inner service's error type (axum needs `Infallible`).
    pub fn respond_with_504(self) -> DeadlineLayer<T, Respond> {
        DeadlineLayer {
            source: self.source,
            settings: self.settings,
            mode: PhantomData,
        }
    }
}

impl<M> DeadlineLayer<LlmDeadline, M> {
    /// Largest body read for the estimate (default 1 MiB); bigger bodies get
    /// [`LlmDeadline::max`].
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.settings.body_limit = limit;
        self
    }
}

impl<S, T: Clone, M> Layer<S> for DeadlineLayer<T, M> {
    type Service = ClientDeadline<S, T, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline::from_parts(inner, self.source.clone(), self.settings)
    }
}
