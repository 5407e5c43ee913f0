//! A failover's hedges on a paused clock, against providers scripted in memory: a slow backend
//! hedged to the next, the first answer handed back and the other hop cancelled, a hop that
//! fails while the other is in flight, the budget's brake, the request dropped mid-race.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use http::Response;
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_breaker::State;
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_failover::{Adapter, Answered, Backend, Failover};
use stormguard_jitter::Constant;
use stormguard_retry::{ClientLayer, Hedging};
use support::{MS, Providers, request};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const SECOND: Duration = Duration::from_secs(1);

/// A budget of ten retries, moves or hedges and nothing more (a floor of 1 a second over 10 s).
fn ten() -> RetryBudget {
    RetryBudget::new(BudgetConfig::default().with_ratio(0.0))
}

fn layer(budget: &RetryBudget) -> ClientLayer<stormguard_classify::LlmClassifier, Constant> {
    ClientLayer::default()
        .with_budget(budget.clone())
        .with_backoff(Constant::new(10 * MS))
        .with_timeout(Duration::from_secs(60))
}

fn secondary() -> Backend {
    Backend::new("secondary")
        .with_adapter(Adapter::new().with_origin("http://secondary.test".parse().unwrap()))
}

fn answered_by<B>(response: &Response<B>) -> String {
    response
        .extensions()
        .get::<Answered>()
        .map(|answered| answered.backend().to_owned())
        .unwrap_or_default()
}

/// The primary would take 10 s; at 1 s the hedge goes to the secondary, which answers 100 ms
/// later. The primary's hop is cancelled as a loser: its breaker frees its place, its throttle
/// forgets it; the hedge is one withdrawal, spent.
#[tokio::test(start_paused = true)]
async fn a_slow_backend_is_hedged_to_the_next_which_answers() {
    let providers = Providers::new(200, 200);
    providers.set("primary.test", 200, 10 * SECOND);
    providers.set("secondary.test", 200, 100 * MS);
    let budget = ten();
    let primary = Backend::new("primary").with_throttle(AdaptiveThrottle::default());
    let (breaker, throttle) = (
        primary.breaker().clone(),
        primary.throttle().cloned().unwrap(),
    );
    let client = Failover::new(layer(&budget))
        .with_backend(primary)
        .with_backend(secondary())
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());

    let start = Instant::now();
    let response = client.oneshot(request()).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(start.elapsed(), 1100 * MS);
    assert_eq!(providers.hits(), (1, 1));
    assert_eq!(budget.snapshot().withdrawals, 1);
    assert_eq!(breaker.snapshot().in_flight, 0);
    let counted = throttle.snapshot();
    assert_eq!(
        (counted.requests, counted.accepts),
        (0, 0),
        "a loser is forgotten"
    );
}

/// The primary answers at 1.5 s, before the hedge sent to the secondary at 1 s: the hedge is
/// cancelled.
#[tokio::test(start_paused = true)]
async fn the_first_backend_answering_first_cancels_the_hedge() {
    let providers = Providers::new(200, 200);
    providers.set("primary.test", 200, 1500 * MS);
    providers.set("secondary.test", 200, 10 * SECOND);
    let budget = ten();
    let backup = secondary();
    let breaker = backup.breaker().clone();
    let client = Failover::new(layer(&budget))
        .with_backend(Backend::new("primary"))
        .with_backend(backup)
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());

    let start = Instant::now();
    let response = client.oneshot(request()).await.unwrap();

    assert_eq!(answered_by(&response), "primary");
    assert_eq!(start.elapsed(), 1500 * MS);
    assert_eq!(providers.hits(), (1, 1));
    assert_eq!(breaker.snapshot().in_flight, 0);
    assert_eq!(budget.snapshot().withdrawals, 1);
}

/// The hedge fails at once (503) while the primary is in flight: the primary answers at 3 s,
/// and the hedge's failure moves the request nowhere.
#[tokio::test(start_paused = true)]
async fn a_failed_hedge_leaves_the_first_backend_to_answer() {
    let providers = Providers::new(200, 503);
    providers.set("primary.test", 200, 3 * SECOND);
    let budget = ten();
    let client = Failover::new(layer(&budget).with_max_attempts(1))
        .with_backend(Backend::new("primary"))
        .with_backend(secondary())
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());
    let start = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(start.elapsed(), 3 * SECOND);
    assert_eq!(providers.hits(), (1, 1));
}

/// The primary fails at 1.5 s (503, one attempt) while the hedge sent at 1 s is in flight: the
/// hedge answers at 2 s.
#[tokio::test(start_paused = true)]
async fn a_failed_first_backend_leaves_the_hedge_to_answer() {
    let providers = Providers::new(503, 200);
    providers.set("primary.test", 503, 1500 * MS);
    providers.set("secondary.test", 200, SECOND);
    let budget = ten();
    let client = Failover::new(layer(&budget).with_max_attempts(1))
        .with_backend(Backend::new("primary"))
        .with_backend(secondary())
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());
    let start = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(start.elapsed(), 2 * SECOND);
    assert_eq!(providers.hits(), (1, 1));
}

/// The secondary's breaker is open: the hedge goes to the primary itself, a second attempt of
/// the same backend.
#[tokio::test(start_paused = true)]
async fn with_no_other_healthy_backend_the_hedge_goes_to_the_same_one() {
    let providers = Providers::new(200, 200);
    providers.set("primary.test", 200, 5 * SECOND);
    let budget = ten();
    let backup = secondary();
    for _ in 0..3 {
        if let Ok(permit) = backup.breaker().try_acquire() {
            let failed = Outcome::retryable(Reason::Unavailable).with_accepted(false);
            permit.record(&failed, &http::HeaderMap::new());
        }
    }
    assert_eq!(backup.breaker().state(), State::Open);
    let client = Failover::new(layer(&budget))
        .with_backend(Backend::new("primary"))
        .with_backend(backup)
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(providers.hits(), (2, 0));
    assert_eq!(budget.snapshot().withdrawals, 1);
}

/// A spent budget sends no hedge.
#[tokio::test(start_paused = true)]
async fn a_spent_budget_sends_no_hedge() {
    let providers = Providers::new(200, 200);
    providers.set("primary.test", 200, 5 * SECOND);
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let client = Failover::new(layer(&budget))
        .with_backend(Backend::new("primary"))
        .with_backend(secondary())
        .with_hedging(Hedging::after(SECOND))
        .layer(providers.service());
    let start = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(start.elapsed(), 5 * SECOND);
    assert_eq!(providers.hits(), (1, 0));
}

/// The layer's hedging is the failover's: hedges cross backends, and no backend's engine
/// hedges on its own (the primary sees one attempt).
#[tokio::test(start_paused = true)]
async fn a_failover_made_from_a_hedging_layer_hedges_across_its_backends() {
    let providers = Providers::new(200, 200);
    providers.set("primary.test", 200, 10 * SECOND);
    providers.set("secondary.test", 200, 100 * MS);
    let budget = ten();
    let failover = Failover::new(layer(&budget).with_hedging(Hedging::after(SECOND)))
        .with_backend(Backend::new("primary"))
        .with_backend(secondary());
    assert!(failover.hedging().is_some());
    let response = failover
        .layer(providers.service())
        .oneshot(request())
        .await
        .unwrap();
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(providers.hits(), (1, 1));
}

/// Dropped before the hedge, and with both hops in flight: nothing in flight with either
/// breaker, the budget charged for the hedge sent only.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_mid_race_leaks_nothing() {
    for (after, hedges) in [(500 * MS, 0_u32), (1500 * MS, 1)] {
        let providers = Providers::new(200, 200);
        providers.set("primary.test", 200, 10 * SECOND);
        providers.set("secondary.test", 200, 10 * SECOND);
        let budget = ten();
        let (primary, backup) = (Backend::new("primary"), secondary());
        let breakers = [primary.breaker().clone(), backup.breaker().clone()];
        let client = Failover::new(layer(&budget))
            .with_backend(primary)
            .with_backend(backup)
            .with_hedging(Hedging::after(SECOND))
            .layer(providers.service());
        let outcome = tokio::time::timeout(after, client.oneshot(request())).await;
        assert!(outcome.is_err());
        assert_eq!(providers.hits(), (1, hedges), "at {after:?}");
        assert_eq!(
            budget.snapshot().withdrawals,
            u64::from(hedges),
            "at {after:?}"
        );
        for breaker in &breakers {
            assert_eq!(breaker.snapshot().in_flight, 0, "at {after:?}");
        }
    }
}
