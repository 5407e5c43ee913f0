//! The routes that answer from memory: `/v1/models`, `/healthz`, `/readyz`, `/metrics`.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::response::IntoResponse;
use http::{StatusCode, header};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use stormguard::breaker::State as BreakerState;
use stormguard::failover::Backend;

use super::Shared;

/// The content type of Prometheus' text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

/// `value` as a JSON answer with `status`.
fn json_answer(status: StatusCode, value: &Value) -> impl IntoResponse + use<> {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
}

/// `GET /v1/models`: the configured model names, in OpenAI's list format.
pub(crate) async fn models(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let data: Vec<Value> = shared
        .routes
        .models
        .keys()
        .map(|id| json!({ "id": id, "object": "model", "created": 0, "owned_by": "stormguard-gateway" }))
        .collect();
    json_answer(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

/// `GET /healthz`: the gateway is alive; each deployment's breaker state, whether it was set
/// aside (its provider refused its key: 401 or 403), and its concurrency limit's state when it
/// has one (the limit, the attempts in flight, how often it shrank and grew).
pub(crate) async fn healthz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let routes = shared
        .routes
        .models
        .iter()
        .map(|(name, route)| (name.as_str(), route));
    let pass = shared.routes.pass_through.iter().map(|route| ("*", route));
    let deployments: Vec<Value> = routes
        .chain(pass)
        .flat_map(|(model, route)| {
            route.backends.iter().map(move |backend| {
                let state = match backend.breaker().state() {
                    BreakerState::Closed => "closed",
                    BreakerState::Open => "open",
                    BreakerState::HalfOpen => "half_open",
                };
                let mut entry = json!({
                    "model": model,
                    "deployment": backend.name(),
                    "breaker": state,
                    "set_aside": backend.is_set_aside(),
                });
                if let Some(limit) = backend.concurrency() {
                    let now = limit.snapshot();
                    entry["concurrency"] = json!({
                        "limit": now.limit,
                        "in_flight": now.in_flight,
                        "shrunk": now.shrunk,
                        "grown": now.grown,
                    });
                }
                entry
            })
        })
        .collect();
    json_answer(
        StatusCode::OK,
        &json!({ "status": "alive", "deployments": deployments }),
    )
}

/// `GET /readyz`: 200 when every model has a deployment with its key set and not set aside, else
/// 503 naming the models that have none.
pub(crate) async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let routes = shared
        .routes
        .models
        .iter()
        .map(|(name, route)| (name.as_str(), route));
    let pass = shared
        .routes
        .pass_through
        .iter()
        .map(|route| (route.format.name(), route));
    let unavailable: Vec<&str> = routes
        .chain(pass)
        .filter(|(_, route)| {
            route.upstream.is_none() || route.backends.iter().all(Backend::is_set_aside)
        })
        .map(|(name, _)| name)
        .collect();
    let status = if unavailable.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let ready = unavailable.is_empty();
    json_answer(
        status,
        &json!({ "ready": ready, "unavailable": unavailable }),
    )
}

/// `GET /metrics`: the library's metrics in Prometheus' text format, or 503 when this process
/// already had another recorder.
pub(crate) async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    match &shared.metrics {
        Some(handle) => {
            handle.run_upkeep();
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
                handle.render(),
            )
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            "# another metrics recorder is installed in this process\n".to_owned(),
        ),
    }
}

/// The recorder installed once per process (later calls get the same handle).
static RECORDER: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder as the process's `metrics` recorder, once; `None` if
/// another recorder was installed first.
pub(crate) fn recorder() -> Option<PrometheusHandle> {
    let mut installed = RECORDER.lock().unwrap_or_else(PoisonError::into_inner);
    if installed.is_none() {
        // Each histogram with the library's buckets: a histogram of a fixed size per series, not
        // a summary whose sketches grow with what it sees.
        let mut builder = PrometheusBuilder::new();
        for (name, buckets) in stormguard::metrics::HISTOGRAM_BUCKETS {
            builder = builder
                .set_buckets_for_metric(Matcher::Full((*name).into()), buckets)
                .ok()?;
        }
        let handle = builder.install_recorder().ok()?;
        stormguard::metrics::describe();
        *installed = Some(handle);
    }
    installed.clone()
}
