//! The variants measured side by side (see `docs/PERFORMANCE.md` for the table of what each is).
//!
//! Two of them are floors rather than products: `tower_retry_contract` and
//! `tower_client_contract` put on tower's own retry exactly what stormguard's contract makes the
//! engine write on every request (an `Idempotency-Key` on a POST and `x-retry-attempt`; for the
//! client, also the deadline in the request's extensions and `x-request-timeout-ms`), with
//! stormguard's own functions, and nothing else. The targets compare stormguard with them.

use std::convert::Infallible;
use std::fmt;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use stormguard::ClientLayer;
use stormguard::breaker::CircuitBreaker;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::concurrency::ConcurrencyLimit;
use stormguard::deadline::{DEFAULT_TIMEOUT, Deadline, propagate};
use stormguard::failover::{Backend, Failover};
use stormguard::jitter::Constant;
use stormguard::retry::{Hedging, ensure_idempotency_key, stamp_attempt};
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use tower::retry::Policy;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service, ServiceExt};
use tower_resilience::circuitbreaker::CircuitBreakerLayer;
use tower_resilience::retry::{
    RetryBudget as ResilienceBudget, RetryBudgetBuilder, RetryLayer as ResilienceRetryLayer,
};

use crate::requests::{Req, Res};

/// Which path a set of variants is built for. The failure path gets budgets that never refuse
/// (every request retries once, far above any sane ratio) and zero-length backoffs, so that it
/// measures the machinery of a retry and not a budget's refusal or a sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The backend answers 200 at once.
    Success,
    /// The backend answers 503, then 200 on the retry.
    Failure,
}

/// Something that benchmarks (or profiles) one variant.
pub trait Visit {
    /// Measures `service` under `name`.
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug;
}

/// Every variant over `inner`, for `path`. The failure path leaves out the bare service (it does
/// not retry), the contract floors (they describe the success path) and the circuit breaker (a
/// 50% failure rate is what it exists to trip on).
pub fn each_variant<I, V>(inner: I, path: Path, visit: &mut V)
where
    I: Service<Req, Response = Res, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
    V: Visit,
{
    if path == Path::Success {
        visit.variant("bare", inner.clone());
    }
    visit.variant(
        "tower_retry_tps",
        tower::retry::RetryLayer::new(TpsPolicy::new(path)).layer(inner.clone()),
    );
    if path == Path::Success {
        contract_floors(&inner, visit);
    }
    resilience(&inner, path, visit);
    stormguard(inner, path, visit);
}

/// tower's retry writing what stormguard's contract writes, and nothing else.
fn contract_floors<I, V>(inner: &I, visit: &mut V)
where
    I: Service<Req, Response = Res, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
    V: Visit,
{
    let retry = tower::retry::RetryLayer::new(TpsPolicy::new(Path::Success));
    visit.variant(
        "tower_retry_contract",
        retry.layer(inner.clone()).map_request(|mut request: Req| {
            ensure_idempotency_key(request.headers_mut());
            stamp_attempt(request.headers_mut(), 0, false);
            request
        }),
    );
    let retry = tower::retry::RetryLayer::new(TpsPolicy::new(Path::Success));
    visit.variant(
        "tower_client_contract",
        retry.layer(inner.clone()).map_request(|mut request: Req| {
            Deadline::after(DEFAULT_TIMEOUT).apply_to(&mut request);
            propagate::stamp(&mut request, propagate::DEFAULT_MARGIN);
            ensure_idempotency_key(request.headers_mut());
            stamp_attempt(request.headers_mut(), 0, false);
            request
        }),
    );
}

/// tower-resilience's retry (3 attempts, no backoff, its token-bucket budget), and on the success
/// path the same over its circuit breaker.
fn resilience<I, V>(inner: &I, path: Path, visit: &mut V)
where
    I: Service<Req, Response = Res, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
    V: Visit,
{
    let token_bucket = || {
        match path {
            Path::Success => RetryBudgetBuilder::new().token_bucket().build(),
            Path::Failure => RetryBudgetBuilder::new()
                .token_bucket()
                .tokens_per_second(1e9)
                .max_tokens(1_000_000_000)
                .build(),
        }
        .expect("valid token bucket")
    };
    visit.variant(
        "resilience_retry",
        resilience_retry(token_bucket()).layer(inner.clone()),
    );
    if path == Path::Success {
        let (breaker, _handle) = CircuitBreakerLayer::builder()
            .failure_classifier(|result: &Result<Res, Infallible>| {
                result.as_ref().is_ok_and(is_server_error)
            })
            .build_with_handle()
            .expect("valid breaker");
        visit.variant(
            "resilience_retry_breaker",
            resilience_retry(token_bucket()).layer(breaker.layer(inner.clone())),
        );
    }
}

/// tower-resilience's retry of a 5xx: 3 attempts, no backoff, on `budget`.
fn resilience_retry<E>(budget: Arc<dyn ResilienceBudget>) -> ResilienceRetryLayer<Req, Res, E> {
    ResilienceRetryLayer::builder()
        .max_attempts(3)
        .fixed_backoff(Duration::ZERO)
        .retry_on_response(is_server_error)
        .budget(budget)
        .build()
}

/// stormguard's engine: retries only (no throttle, no deadline of its own), the whole client
/// pipeline as `ClientLayer::default()` builds it, and on the success path the same with a
/// circuit breaker, with hedging on, and with an adaptive concurrency limit.
fn stormguard<I, V>(inner: I, path: Path, visit: &mut V)
where
    I: Service<Req, Response = Res, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
    V: Visit,
{
    match path {
        Path::Success => {
            let retry = ClientLayer::default().without_throttle().without_timeout();
            visit.variant("stormguard_retry", retry.layer(inner.clone()));
            visit.variant(
                "stormguard_client",
                ClientLayer::default().layer(inner.clone()),
            );
            let breaker = ClientLayer::default().with_breaker(CircuitBreaker::default());
            visit.variant("stormguard_client_breaker", breaker.layer(inner.clone()));
            // Hedging on: an answer that comes at once never arms the hedge's clock.
            let hedged = ClientLayer::default().with_hedging(Hedging::default());
            visit.variant("stormguard_client_hedged", hedged.layer(inner.clone()));
            // The adaptive concurrency limit on: a place taken per attempt and given back when
            // the answer's body ends (here at once: the answer is whole).
            let limited = ClientLayer::default().with_concurrency(ConcurrencyLimit::default());
            visit.variant(
                "stormguard_client_concurrency",
                limited.layer(inner.clone()),
            );
            failovers(inner, visit);
        }
        Path::Failure => {
            // Every request is rejected once: with the default K = 2 the throttle's drop
            // probability sits exactly at its threshold and random-walks (a drop counts as a
            // request without an accept), so the failure path gets K = 3, as it gets budgets
            // that never refuse.
            let generous = || {
                RetryBudget::new(
                    BudgetConfig::default()
                        .with_min_per_sec(u32::MAX)
                        .with_ratio(1000.0),
                )
            };
            let client = ClientLayer::default()
                .with_budget(generous())
                .with_throttle(AdaptiveThrottle::new(ThrottleConfig::default().with_k(3.0)))
                .with_backoff(Constant::new(Duration::ZERO));
            let retry = client
                .clone()
                .with_budget(generous())
                .without_throttle()
                .without_timeout();
            visit.variant("stormguard_retry", retry.layer(inner.clone()));
            visit.variant("stormguard_client", client.layer(inner));
        }
    }
}

/// stormguard's failover over three backends (the same service): in order (each a rank of its
/// own, the first answers), and as one rank the balancer chooses in; the difference is the cost
/// of choosing a backend.
fn failovers<I, V>(inner: I, visit: &mut V)
where
    I: Service<Req, Response = Res, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
    V: Visit,
{
    let names = ["east", "west", "eu"];
    let ordered = names
        .iter()
        .fold(Failover::new(ClientLayer::default()), |failover, name| {
            failover.with_backend(Backend::new(name))
        });
    visit.variant("stormguard_failover", ordered.layer(inner.clone()));
    let balanced = Failover::new(ClientLayer::default())
        .with_rank(names.map(Backend::new))
        .with_seed(1);
    visit.variant("stormguard_failover_balanced", balanced.layer(inner));
}

/// tower's retry with the `TpsBudget` and the simplest useful policy: retry a 5xx at most twice
/// (three attempts, as the others) while the budget allows, deposit on success.
#[derive(Clone)]
struct TpsPolicy {
    budget: Arc<TpsBudget>,
    retries_left: u32,
}

impl TpsPolicy {
    fn new(path: Path) -> Self {
        let budget = match path {
            Path::Success => TpsBudget::default(),
            Path::Failure => TpsBudget::new(Duration::from_secs(10), 1_000_000, 1000.0),
        };
        Self {
            budget: Arc::new(budget),
            retries_left: 2,
        }
    }
}

impl<B: Clone, RB, E> Policy<Request<B>, Response<RB>, E> for TpsPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _request: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(response) if response.status().is_server_error() => {
                if self.retries_left > 0 && self.budget.withdraw() {
                    self.retries_left -= 1;
                    Some(ready(()))
                } else {
                    None
                }
            }
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        Some(request.clone())
    }
}

fn is_server_error<B>(response: &Response<B>) -> bool {
    response.status().is_server_error()
}
