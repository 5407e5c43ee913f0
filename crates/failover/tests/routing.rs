//! The routing state on a paused clock, against providers scripted in memory (a service that
//! answers by the request's host): the return to a recovered primary through its probes, one
//! deadline across backends, a failover the deadline cannot fit, cancellation.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use stormguard_breaker::{BreakerConfig, CircuitBreaker, State};
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::{LocalAnswer, Reason};
use stormguard_failover::{Adapter, Answered, Backend, Degraded, Failover};
use stormguard_jitter::Constant;
use stormguard_retry::ClientLayer;
use support::{MS, Providers, request};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

fn layer(budget: &RetryBudget) -> ClientLayer<stormguard_classify::LlmClassifier, Constant> {
    ClientLayer::default()
        .with_budget(budget.clone())
        .with_backoff(Constant::new(10 * MS))
        .without_throttle()
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

#[tokio::test(start_paused = true)]
async fn traffic_returns_to_a_recovered_primary_through_its_probes() {
    let providers = Providers::new(503, 200);
    let budget = RetryBudget::default();
    let primary = Backend::new("primary");
    let breaker = primary.breaker().clone();
    let client = Failover::new(layer(&budget))
        .with_backend(primary)
        .with_backend(secondary())
        .layer(providers.service());
    let response = client.clone().oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(breaker.state(), State::Open);

    // The primary recovers; it answers in 500 ms. Once its breaker is half-open, one probe goes
    // to it (the next may follow a third of the lease later) and everything else still to the
    // secondary.
    providers.set("primary.test", 200, 500 * MS);
    tokio::time::advance(Backend::DEFAULT_MAX_OPEN_WAIT).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    let before = providers.hits();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = client.clone();
        calls.spawn(async move { answered_by(&client.oneshot(request()).await.unwrap()) });
    }
    let mut by = HashMap::<String, u32>::new();
    while let Some(name) = calls.join_next().await {
        *by.entry(name.unwrap()).or_default() += 1;
    }
    assert_eq!(by["primary"], 1, "{by:?}");
    assert_eq!(by["secondary"], 7, "{by:?}");
    let after = providers.hits();
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 7));
    // The probes closed it: the primary takes everything again.
    assert_eq!(breaker.state(), State::Closed);
    for _ in 0..4 {
        let response = client.clone().oneshot(request()).await.unwrap();
        assert_eq!(answered_by(&response), "primary");
    }
}

#[tokio::test(start_paused = true)]
async fn every_backend_shares_the_one_deadline() {
    let providers = Providers::new(503, 200);
    providers.set("primary.test", 503, 2_000 * MS);
    let budget = RetryBudget::default();
    let client = Failover::new(layer(&budget).with_timeout(Duration::from_secs(10)))
        .with_backend(Backend::new("primary"))
        .with_backend(secondary())
        .layer(providers.service());
    let started = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
    // Three attempts of 2 s on the primary and two backoffs of 10 ms, then the secondary: what
    // it was told is left is what remained of the 10 s (less the 50 ms margin), not 10 s anew.
    let secondary = providers.get("secondary.test");
    assert_eq!(secondary.time_left.len(), 1);
    let left = secondary.time_left[0];
    assert!((3_900..=3_980).contains(&left), "{left}");
    assert!(started.elapsed() >= Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn a_failover_the_deadline_cannot_fit_is_not_tried() {
    let providers = Providers::new(503, 200);
    providers.set("primary.test", 503, 700 * MS);
    let budget = RetryBudget::default();
    let quick_to_open =
        CircuitBreaker::new(BreakerConfig::default().with_consecutive_failures(Some(1)));
    let client = Failover::new(layer(&budget).with_timeout(Duration::from_secs(1)))
        .with_backend(Backend::new("primary").with_breaker(quick_to_open))
        .with_backend(secondary())
        .with_degraded(Degraded::new(|_, _| {
            Response::new(Bytes::from_static(b"later"))
        }))
        .layer(providers.service());
    let response = client.oneshot(request()).await.unwrap();
    // The primary's breaker opened on its 503, so its retry was refused at once; the secondary
    // was not tried: 300 ms were left, less than the primary's 700 ms attempt took.
    let why = response
        .extensions()
        .get::<LocalAnswer>()
        .unwrap()
        .outcome();
    assert_eq!(why.reason(), Reason::BreakerOpen);
    assert_eq!(providers.hits(), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_on_the_secondary_sends_nothing_more() {
    let providers = Providers::new(503, 0);
    let budget = RetryBudget::new(BudgetConfig::default());
    let quick_to_open =
        CircuitBreaker::new(BreakerConfig::default().with_consecutive_failures(Some(1)));
    let client = Failover::new(layer(&budget))
        .with_backend(Backend::new("primary").with_breaker(quick_to_open))
        .with_backend(secondary())
        .layer(providers.service());
    let call = tokio::spawn(client.oneshot(request()));
    tokio::time::sleep(100 * MS).await;
    // On the secondary, which never answers.
    assert_eq!(providers.hits(), (1, 1));
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // The failover was sent: it stays drawn from the budget (the engine's retry on the
    // primary, refused by its open breaker, was given back).
    let snapshot = budget.snapshot();
    assert_eq!(snapshot.withdrawals, 1, "{snapshot:?}");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(providers.hits(), (1, 1));
}

/// A series recorded by `metrics-util`'s debugging recorder: its key, unit, description, value.
#[cfg(feature = "metrics")]
type Series = (
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    metrics_util::debugging::DebugValue,
);

/// What is recorded, on a paused clock, while the primary fails three times in a row (its
/// breaker opens) and the request moves on to the secondary; the next request goes to the
/// secondary at once; then the secondary fails too and a third request gets the degraded answer.
#[cfg(feature = "metrics")]
fn recorded_by_two_failovers() -> Vec<Series> {
    use metrics_util::debugging::DebuggingRecorder;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let providers = Providers::new(503, 200);
            let budget = RetryBudget::default();
            let client = Failover::new(layer(&budget))
                .with_backend(Backend::new("primary"))
                .with_backend(secondary())
                .with_degraded(Degraded::new(|_, _| {
                    Response::new(Bytes::from_static(b"later"))
                }))
                .layer(providers.service());
            // The primary fails three times in a row (its breaker opens): on to the secondary;
            // the next request goes to the secondary at once.
            for _ in 0..2 {
                let response = client.clone().oneshot(request()).await.unwrap();
                assert_eq!(answered_by(&response), "secondary");
            }
            // The secondary fails too: the degraded answer.
            providers.set("secondary.test", 503, Duration::ZERO);
            let response = client.oneshot(request()).await.unwrap();
            assert!(response.extensions().get::<LocalAnswer>().is_some());
        });
    });
    snapshotter.snapshot().into_vec()
}

/// The values of the series named `name` whose labels include all of `labels`.
#[cfg(feature = "metrics")]
fn labelled<'a>(
    series: &'a [Series],
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a metrics_util::debugging::DebugValue> {
    (series.iter())
        .filter(|(key, ..)| {
            key.key().name() == name
                && labels.iter().all(|(label, value)| {
                    (key.key().labels()).any(|l| l.key() == *label && l.value() == *value)
                })
        })
        .map(|(.., value)| value)
        .collect()
}

/// The failovers counted under all of `labels`.
#[cfg(feature = "metrics")]
fn failovers_counted(series: &[Series], labels: &[(&str, &str)]) -> u64 {
    use metrics_util::debugging::DebugValue;
    use stormguard_retry::metrics::FAILOVERS;

    (labelled(series, FAILOVERS, labels).into_iter())
        .map(|value| match value {
            DebugValue::Counter(count) => *count,
            other => panic!("{other:?}"),
        })
        .sum()
}

/// The attempts of each request recorded by the engine of the backend named `provider`.
#[cfg(feature = "metrics")]
fn attempts_recorded(series: &[Series], provider: &str) -> Vec<f64> {
    use metrics_util::debugging::DebugValue;
    use stormguard_retry::metrics::REQUEST_ATTEMPTS;

    let labels = [("gen_ai.provider.name", provider)];
    (labelled(series, REQUEST_ATTEMPTS, &labels).into_iter())
        .flat_map(|value| match value {
            DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// What a failover counts (feature `metrics`), read through `metrics-util`'s recorder: each move
/// by its route and reason, and each backend's engine under its own name.
#[cfg(feature = "metrics")]
#[test]
fn failovers_are_counted_by_route_and_each_backend_by_name() {
    let series = recorded_by_two_failovers();
    let moved = [
        ("from", "primary"),
        ("to", "secondary"),
        ("reason", "unavailable"),
    ];
    assert_eq!(failovers_counted(&series, &moved), 1);
    let degraded = [
        ("from", "secondary"),
        ("to", "degraded"),
        ("reason", "unavailable"),
    ];
    assert_eq!(failovers_counted(&series, &degraded), 1);
    assert_eq!(failovers_counted(&series, &[]), 2);
    assert_eq!(attempts_recorded(&series, "primary"), [3.0]);
    // Two answers, then three failed attempts before the degraded answer.
    let mut secondary = attempts_recorded(&series, "secondary");
    secondary.sort_by(f64::total_cmp);
    assert_eq!(secondary, [1.0, 1.0, 3.0]);
}
