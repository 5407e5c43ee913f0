//! The server pipeline: [`ServerLayer`].

use std::time::Duration;

use stormguard_budget::{RetryBudget, ShedRetries, ShedRetriesLayer};
use stormguard_deadline::ServerDeadlineLayer;
use stormguard_deadline::server::ServerDeadline;
use tower_layer::Layer;

/// The server pipeline for axum and tonic servers, as one [`Layer`]:
///
/// ```text
/// request ─▶ ServerDeadline ─▶ ShedRetries ─▶ handler
///            read grpc-timeout /     shed retries beyond
///            x-request-timeout-ms,   the budget (503 +
///            cap, shed expired,      x-should-retry: false)
///            time out the handler
/// ```
///
/// * **Deadline** ([`ServerDeadlineLayer`]): reads the caller's deadline (`grpc-timeout`,
///   `x-request-timeout-ms`, `x-envoy-expected-rq-timeout-ms`), caps it (default 600 s), applies a
///   default when none is sent (300 s), answers requests that arrive with no time left with 504
///   (gRPC `DEADLINE_EXCEEDED`) without running the handler, and stores the
///   [`Deadline`](stormguard_deadline::Deadline) in the request extensions so the handler's own
///   outgoing calls through a [`ClientLayer`](crate::ClientLayer) inherit it.
/// * **Retry shedding** ([`ShedRetriesLayer`]): deposits the server's successes in a retry budget
///   and sheds retried requests (`x-retry-attempt`, `grpc-previous-rpc-attempts`,
///   `x-stainless-retry-count`, `x-envoy-attempt-count`) beyond 10% of them, with 503 and
///   `x-should-retry: false` (gRPC: `UNAVAILABLE` with `grpc-retry-pushback-ms: -1`).
///
/// The deadline sits outside the shedding so that an expired request is shed before it can spend
/// a retry. Both answer with responses, never errors, so the stack fits axum's `Router::layer`,
/// which needs `Infallible`.
///
/// ```
/// use axum::{Router, routing::post};
/// use stormguard::ServerLayer;
///
/// let app: Router = Router::new()
///     .route("/v1/chat/completions", post(|| async { "ok" }))
///     .layer(ServerLayer::default());
/// # let _ = app;
/// ```
#[derive(Clone, Debug, Default)]
pub struct ServerLayer {
    deadline: ServerDeadlineLayer,
    shed: ShedRetriesLayer,
}

impl ServerLayer {
    /// The default pipeline: 300 s default deadline, 600 s cap, retries shed beyond 10% of the
    /// successes of the last 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the deadline part.
    pub fn with_deadline(mut self, deadline: ServerDeadlineLayer) -> Self {
        self.deadline = deadline;
        self
    }

    /// Timeout for requests that carry no deadline header.
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = self.deadline.with_default(timeout);
        self
    }

    /// Longest deadline a caller may ask for.
    pub fn with_max_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = self.deadline.with_max(timeout);
        self
    }

    /// Shed retries against `budget`, which may be shared with other routes or read for metrics.
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.shed = ShedRetriesLayer::new(budget);
        self
    }

    /// The deadline part.
    pub fn deadline(&self) -> &ServerDeadlineLayer {
        &self.deadline
    }

    /// The retry budget retries are shed against.
    pub fn budget(&self) -> &RetryBudget {
        self.shed.budget()
    }
}

impl<S> Layer<S> for ServerLayer {
    type Service = ServerDeadline<ShedRetries<S>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.deadline.layer(self.shed.layer(inner))
    }
}
