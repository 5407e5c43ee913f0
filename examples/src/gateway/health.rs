//! `GET /healthz`: the snapshots of what the gateway's upstream clients share, as JSON.
//!
//! ```json
//! {
//!   "budget": { "balance": 10, "deposits": 0, "rejected": 0, "withdrawals": 0 },
//!   "fleet": null,
//!   "providers": [
//!     {
//!       "breaker": { "state": "open", "cause": "probe_failed", "opened": 3, "failures": 5, ... },
//!       "name": "mock-outage",
//!       "rate_limit": null,
//!       "throttle": { "accepts": 0, "probability": 0.0, "requests": 0, "window_ms": 2000 }
//!     }
//!   ],
//!   "status": "degraded"
//! }
//! ```
//!
//! (Keys come in alphabetical order, indented; durations are in milliseconds; a guard the client
//! does not have is `null`. A failover lists each of its backends under `providers`.)
//!
//! `status` is `"degraded"` when a provider is being refused on this side most of the time: its
//! breaker is not closed (open, or half-open: all but its probes are refused), or its throttle
//! drops more than [`DEGRADED_DROP_PROBABILITY`] of its requests. It is `"ok"` otherwise. The
//! answer is `200 OK` either way: a gateway whose provider is down still answers every request at
//! once (refusals marked `x-should-retry: false`), and taking it out of a load balancer's rotation
//! would send its traffic to replicas in front of the same provider. A fleet on its local share
//! (Redis away) is not degraded: it still admits its share of the quota.
//!
//! The library's snapshot types do not implement `Serialize`; the JSON is written here, field by
//! field.

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use stormguard::ClientLayer;
use stormguard::breaker::{CircuitBreaker, State as BreakerState};
use stormguard::budget::RetryBudget;
use stormguard::classify::Classify;
use stormguard::failover::Backend;
use stormguard::jitter::Backoff;
use stormguard::rate_limit::{Fleet, RateLimit};
use stormguard::throttle::AdaptiveThrottle;

use super::Gateway;

/// Above this drop probability a provider's throttle marks the gateway degraded: 0.5. With the
/// throttle's `K = 2`, the probability is `(requests - 2 × accepts) / (requests + 1)`; above one
/// half the provider accepts fewer than a quarter of the requests sent to it, and the throttle
/// refuses more of them than it lets through.
pub const DEGRADED_DROP_PROBABILITY: f64 = 0.5;

/// What `/healthz` reports: the retry budget the gateway's clients share, each provider's own
/// guards, and the fleet its rate limit shares, if any. Clones share the objects.
#[derive(Clone)]
pub struct Health {
    budget: RetryBudget,
    providers: Vec<ProviderHealth>,
    fleet: Option<Fleet>,
}

/// One provider's guards, as its client holds them.
#[derive(Clone)]
pub struct ProviderHealth {
    name: String,
    throttle: Option<AdaptiveThrottle>,
    breaker: Option<CircuitBreaker>,
    rate_limit: Option<RateLimit>,
}

impl ProviderHealth {
    /// The guards of the provider named `name` that `layer` calls.
    pub fn of<C: Classify, Bk: Backoff>(name: &str, layer: &ClientLayer<C, Bk>) -> Self {
        Self {
            name: name.to_owned(),
            throttle: layer.throttle().cloned(),
            breaker: layer.breaker().cloned(),
            rate_limit: layer.rate_limit().cloned(),
        }
    }

    /// The guards of a failover's backend.
    pub fn of_backend(backend: &Backend) -> Self {
        Self {
            name: backend.name().to_owned(),
            throttle: backend.throttle().cloned(),
            breaker: Some(backend.breaker().clone()),
            rate_limit: backend.rate_limit().cloned(),
        }
    }

    /// Whether this provider degrades the gateway: its breaker is not closed, or its throttle
    /// drops more than [`DEGRADED_DROP_PROBABILITY`] of its requests.
    fn degraded(&self) -> bool {
        let breaker = self
            .breaker
            .as_ref()
            .is_some_and(|breaker| breaker.state() != BreakerState::Closed);
        let throttle = self
            .throttle
            .as_ref()
            .is_some_and(|throttle| throttle.probability() > DEGRADED_DROP_PROBABILITY);
        breaker || throttle
    }

    fn to_json(&self) -> Value {
        let throttle = self.throttle.as_ref().map(|throttle| {
            let snapshot = throttle.snapshot();
            json!({
                "requests": snapshot.requests,
                "accepts": snapshot.accepts,
                "probability": snapshot.probability,
                "window_ms": millis(snapshot.window),
            })
        });
        let breaker = self.breaker.as_ref().map(|breaker| {
            let snapshot = breaker.snapshot();
            json!({
                "state": snapshot.state.as_str(),
                "calls": snapshot.calls,
                "failures": snapshot.failures,
                "answers": snapshot.answers,
                "in_flight": snapshot.in_flight,
                "probes": snapshot.probes,
                "opened": snapshot.opened,
                "cause": snapshot.cause.map(|cause| cause.as_str()),
                "retry_after_ms": snapshot.retry_after.map(millis),
                "window_ms": millis(snapshot.window),
            })
        });
        let rate_limit = self.rate_limit.as_ref().map(|limit| {
            let snapshot = limit.snapshot();
            json!({
                "requests_per_minute": snapshot.requests_per_minute,
                "tokens_per_minute": snapshot.tokens_per_minute,
                "requests_available": snapshot.requests_available,
                "tokens_available": snapshot.tokens_available,
                "keys": snapshot.keys,
            })
        });
        json!({
            "name": self.name,
            "throttle": throttle,
            "breaker": breaker,
            "rate_limit": rate_limit,
        })
    }
}

impl Health {
    /// The health of clients sharing `budget` (and `fleet`, when their rate limit has one), with
    /// no provider yet.
    pub fn new(budget: RetryBudget, fleet: Option<Fleet>) -> Self {
        Self {
            budget,
            providers: Vec::new(),
            fleet,
        }
    }

    /// Adds a provider, after those already added.
    #[must_use]
    pub fn with_provider(mut self, provider: ProviderHealth) -> Self {
        self.providers.push(provider);
        self
    }

    /// The retry budget the gateway's clients share.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The first provider's throttle, if it has one.
    pub fn throttle(&self) -> Option<&AdaptiveThrottle> {
        self.providers.first()?.throttle.as_ref()
    }

    /// `"degraded"` when a provider's breaker is not closed or its throttle drops more than
    /// [`DEGRADED_DROP_PROBABILITY`] of its requests, `"ok"` otherwise.
    pub fn status(&self) -> &'static str {
        if self.providers.iter().any(ProviderHealth::degraded) {
            "degraded"
        } else {
            "ok"
        }
    }

    /// The `/healthz` document, as of now.
    pub fn to_json(&self) -> Value {
        let budget = self.budget.snapshot();
        let fleet = self.fleet.as_ref().map(|fleet| {
            let snapshot = fleet.snapshot();
            json!({
                "connected": snapshot.connected,
                "replicas": snapshot.replicas,
                "fleet_decisions": snapshot.fleet_decisions,
                "local_decisions": snapshot.local_decisions,
            })
        });
        json!({
            "status": self.status(),
            "budget": {
                "balance": budget.balance,
                "deposits": budget.deposits,
                "withdrawals": budget.withdrawals,
                "rejected": budget.rejected,
            },
            "providers": self.providers.iter().map(ProviderHealth::to_json).collect::<Vec<_>>(),
            "fleet": fleet,
        })
    }
}

impl FromRef<Gateway> for Health {
    fn from_ref(gateway: &Gateway) -> Self {
        gateway.health.clone()
    }
}

/// `GET /healthz`: [`Health::to_json`], `200 OK` whatever the status.
pub(super) async fn render(State(health): State<Health>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        // Indented: read by people with curl as much as by probes.
        format!("{:#}\n", health.to_json()),
    )
}

/// A duration in whole milliseconds (saturating).
fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
