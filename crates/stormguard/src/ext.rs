//! [`ServiceBuilderExt`]: stacks that read like the pipeline.

use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, AdaptiveThrottleLayer};
use stormguard_budget::{RetryBudget, RetryBudgetLayer};
use stormguard_deadline::{DeadlineLayer, ServerDeadlineLayer};
use stormguard_jitter::JitterLayer;
use stormguard_retry::RetryLayer;
use tower::ServiceBuilder;
use tower_layer::Stack;

use crate::{ClientLayer, ServerLayer};

/// Extension methods on [`tower::ServiceBuilder`] for stormguard's layers, so a stack reads in the
/// order requests flow through it (outermost first).
///
/// ```
/// use std::time::Duration;
/// use stormguard::ServiceBuilderExt;
/// use stormguard::throttle::AdaptiveThrottle;
/// use tower::ServiceBuilder;
///
/// let throttle = AdaptiveThrottle::default();
/// let stack = ServiceBuilder::new()
///     .deadline(Duration::from_secs(30)) // one deadline for all attempts
///     .retry(stormguard::retry::RetryLayer::new()) // classify + budget + jitter
///     .adaptive_throttle(throttle); // every attempt, inside the retry
/// # let _ = stack;
/// ```
pub trait ServiceBuilderExt<L>: Sized {
    /// The whole client pipeline ([`ClientLayer`]).
    fn stormguard_client<C, Bk, T>(
        self,
        layer: ClientLayer<C, Bk, T>,
    ) -> ServiceBuilder<Stack<ClientLayer<C, Bk, T>, L>>;

    /// The whole server pipeline ([`ServerLayer`]).
    fn stormguard_server(self, layer: ServerLayer) -> ServiceBuilder<Stack<ServerLayer, L>>;

    /// A fixed deadline across all attempts, propagated downstream ([`DeadlineLayer::new`]).
    fn deadline(self, timeout: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>>;

    /// The retry engine ([`RetryLayer`]).
    fn retry<C, Bk>(self, layer: RetryLayer<C, Bk>) -> ServiceBuilder<Stack<RetryLayer<C, Bk>, L>>;

    /// Client-side adaptive throttling on `throttle` ([`AdaptiveThrottleLayer::new`]).
    fn adaptive_throttle(
        self,
        throttle: AdaptiveThrottle,
    ) -> ServiceBuilder<Stack<AdaptiveThrottleLayer, L>>;

    /// Delay each request's start by `U(0, max)` ([`JitterLayer`]).
    fn start_jitter(self, max: Duration) -> ServiceBuilder<Stack<JitterLayer, L>>;

    /// Server side: read, cap and enforce the caller's deadline ([`ServerDeadlineLayer`]).
    fn server_deadline(
        self,
        layer: ServerDeadlineLayer,
    ) -> ServiceBuilder<Stack<ServerDeadlineLayer, L>>;

    /// Server side: shed retries beyond `budget` ([`RetryBudgetLayer`]).
    fn shed_retries(self, budget: RetryBudget) -> ServiceBuilder<Stack<RetryBudgetLayer, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn stormguard_client<C, Bk, T>(
        self,
        layer: ClientLayer<C, Bk, T>,
    ) -> ServiceBuilder<Stack<ClientLayer<C, Bk, T>, L>> {
        self.layer(layer)
    }

    fn stormguard_server(self, layer: ServerLayer) -> ServiceBuilder<Stack<ServerLayer, L>> {
        self.layer(layer)
    }

    fn deadline(self, timeout: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>> {
        self.layer(DeadlineLayer::new(timeout))
    }

    fn retry<C, Bk>(self, layer: RetryLayer<C, Bk>) -> ServiceBuilder<Stack<RetryLayer<C, Bk>, L>> {
        self.layer(layer)
    }

    fn adaptive_throttle(
        self,
        throttle: AdaptiveThrottle,
    ) -> ServiceBuilder<Stack<AdaptiveThrottleLayer, L>> {
        self.layer(AdaptiveThrottleLayer::new(throttle))
    }

    fn start_jitter(self, max: Duration) -> ServiceBuilder<Stack<JitterLayer, L>> {
        self.layer(JitterLayer::new(max))
    }

    fn server_deadline(
        self,
        layer: ServerDeadlineLayer,
    ) -> ServiceBuilder<Stack<ServerDeadlineLayer, L>> {
        self.layer(layer)
    }

    fn shed_retries(self, budget: RetryBudget) -> ServiceBuilder<Stack<RetryBudgetLayer, L>> {
        self.layer(RetryBudgetLayer::new(budget))
    }
}
