use std::marker::PhantomData;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use super::{ClientDeadline, FromFn, Settings};
use crate::enforce::{Respond, ReturnError};
use crate::propagate::DEFAULT_MARGIN;

/// Client side: sets a request's [`Deadline`](crate::Deadline), enforces it and propagates it
/// downstream. See the [module docs](crate::client).
///
/// `T` is where the timeout comes from (a fixed [`Duration`] or a [`FromFn`]); `M` what the
/// service hands back when the deadline passes ([`ReturnError`] or, after
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

    /// A timeout computed from the request head; `None` sets no new deadline.
    pub fn from_fn<F>(f: F) -> DeadlineLayer<FromFn<F>>
    where
        F: Fn(&Parts) -> Option<Duration>,
    {
        DeadlineLayer::with_source(FromFn::new(f))
    }
}

impl<T> DeadlineLayer<T> {
    fn with_source(source: T) -> Self {
        Self {
            source,
            settings: Settings {
                margin: DEFAULT_MARGIN,
                propagation: true,
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

    /// The safety margin subtracted from the remaining time in the propagation header.
    pub fn margin(&self) -> Duration {
        self.settings.margin
    }

    /// Outgoing requests are no longer stamped with `grpc-timeout` / `x-request-timeout-ms` (by
    /// default they are).
    #[must_use]
    pub fn without_propagation(mut self) -> Self {
        self.settings.propagation = false;
        self
    }

    /// Whether outgoing requests are stamped with the time left.
    pub fn propagation(&self) -> bool {
        self.settings.propagation
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

impl<S, T: Clone, M> Layer<S> for DeadlineLayer<T, M> {
    type Service = ClientDeadline<S, T, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline::from_parts(inner, self.source.clone(), self.settings)
    }
}
