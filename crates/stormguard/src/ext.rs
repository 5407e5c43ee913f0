//! [`ServiceBuilderExt`]: stacks that read like the pipeline.

use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, AdaptiveThrottleLayer};
use stormguard_breaker::{BreakerLayer, CircuitBreaker};
use stormguard_budget::{RetryBudget, ShedRetriesLayer};
use stormguard_deadline::{DeadlineLayer, ServerDeadlineLayer};
use stormguard_jitter::SpreadLayer;
use stormguard_rate_limit::{RateLimit, RateLimitLayer};
use tower::ServiceBuilder;
use tower_layer::Stack;

use crate::{ClientLayer, ServerLayer};

/// Extension methods on [`tower::ServiceBuilder`] for stormguard's layers, so a stack reads in the
/// order requests flow through it (outermost first). None of them shares a name with one of
/// `ServiceBuilder`'s own methods (its `retry` and `timeout` are tower's layers, not these).
///
/// ```
/// use std::time::Duration;
/// use stormguard::{ClientLayer, ServiceBuilderExt};
/// use tower::ServiceBuilder;
///
/// # #[derive(Clone)] struct Backend;
/// # impl tower::Service<http::Request<http_body_util::Full<bytes::Bytes>>> for Backend {
/// #     type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
/// #     type Error = std::convert::Infallible;
/// #     type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
/// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> { std::task::Poll::Ready(Ok(())) }
/// #     fn call(&mut self, _: http::Request<http_body_util::Full<bytes::Bytes>>) -> Self::Future { std::future::ready(Ok(http::Response::default())) }
/// # }
/// let client = ServiceBuilder::new()
///     .spread(Duration::from_millis(100)) // spread the start of synchronised callers
///     .stormguard_client(ClientLayer::default()) // deadline, retries, throttle
///     .service(Backend);
/// # let _ = client;
/// ```
pub trait ServiceBuilderExt<L>: Sized {
    /// The whole client pipeline ([`ClientLayer`]).
    fn stormguard_client<C, Bk>(
        self,
        layer: ClientLayer<C, Bk>,
    ) -> ServiceBuilder<Stack<ClientLayer<C, Bk>, L>>;

    /// The whole server pipeline ([`ServerLayer`]).
    fn stormguard_server(self, layer: ServerLayer) -> ServiceBuilder<Stack<ServerLayer, L>>;

    /// A fixed deadline, enforced and propagated downstream ([`DeadlineLayer::new`]), for stacks
    /// without the client pipeline (whose own deadline spans its attempts).
    fn deadline(self, timeout: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>>;

    /// Client-side adaptive throttling on `throttle` ([`AdaptiveThrottleLayer::new`]), for stacks
    /// without the client pipeline (which throttles every attempt itself).
    fn adaptive_throttle(
        self,
        throttle: AdaptiveThrottle,
    ) -> ServiceBuilder<Stack<AdaptiveThrottleLayer, L>>;

    /// A circuit breaker on `breaker` ([`BreakerLayer::new`]), for stacks without the client
    /// pipeline (whose [`with_breaker`](ClientLayer::with_breaker) asks it for every attempt).
    fn circuit_breaker(self, breaker: CircuitBreaker) -> ServiceBuilder<Stack<BreakerLayer, L>>;

    /// Pace requests with `limit` ([`RateLimitLayer::new`]; tower's own `rate_limit` is a fixed
    /// window without a wait bound), for stacks without the client pipeline, or per caller on a
    /// gateway's way in.
    fn pace(self, limit: RateLimit) -> ServiceBuilder<Stack<RateLimitLayer, L>>;

    /// Delay each request's start by `U(0, max)` ([`SpreadLayer`]).
    fn spread(self, max: Duration) -> ServiceBuilder<Stack<SpreadLayer, L>>;

    /// Server side: read, cap and enforce the caller's deadline ([`ServerDeadlineLayer`]).
    fn server_deadline(
        self,
        layer: ServerDeadlineLayer,
    ) -> ServiceBuilder<Stack<ServerDeadlineLayer, L>>;

    /// Server side: shed retries beyond `budget` ([`ShedRetriesLayer`]).
    fn shed_retries(self, budget: RetryBudget) -> ServiceBuilder<Stack<ShedRetriesLayer, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn stormguard_client<C, Bk>(
        self,
        layer: ClientLayer<C, Bk>,
    ) -> ServiceBuilder<Stack<ClientLayer<C, Bk>, L>> {
        self.layer(layer)
    }

    fn stormguard_server(self, layer: ServerLayer) -> ServiceBuilder<Stack<ServerLayer, L>> {
        self.layer(layer)
    }

    fn deadline(self, timeout: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>> {
        self.layer(DeadlineLayer::new(timeout))
    }

    fn adaptive_throttle(
        self,
        throttle: AdaptiveThrottle,
    ) -> ServiceBuilder<Stack<AdaptiveThrottleLayer, L>> {
        self.layer(AdaptiveThrottleLayer::new(throttle))
    }

    fn circuit_breaker(self, breaker: CircuitBreaker) -> ServiceBuilder<Stack<BreakerLayer, L>> {
        self.layer(BreakerLayer::new(breaker))
    }

    fn pace(self, limit: RateLimit) -> ServiceBuilder<Stack<RateLimitLayer, L>> {
        self.layer(RateLimitLayer::new(limit))
    }

    fn spread(self, max: Duration) -> ServiceBuilder<Stack<SpreadLayer, L>> {
        self.layer(SpreadLayer::new(max))
    }

    fn server_deadline(
        self,
        layer: ServerDeadlineLayer,
    ) -> ServiceBuilder<Stack<ServerDeadlineLayer, L>> {
        self.layer(layer)
    }

    fn shed_retries(self, budget: RetryBudget) -> ServiceBuilder<Stack<ShedRetriesLayer, L>> {
        self.layer(ShedRetriesLayer::new(budget))
    }
}
