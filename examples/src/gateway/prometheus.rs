//! `GET /metrics`: the engine's metrics ([`stormguard::metrics`]) in Prometheus' text format
//! (version 0.0.4), rendered by `metrics-exporter-prometheus` inside the gateway's own route (the
//! exporter's listener, push gateway and TLS are not built).
//!
//! The exporter turns the dots of the names and labels into underscores
//! (`stormguard.request.attempts` is `stormguard_request_attempts`, `gen_ai.provider.name` is
//! `gen_ai_provider_name`) and adds no unit suffix. The histograms get the buckets the library
//! sizes for them ([`HISTOGRAM_BUCKETS`]), so they are rendered as Prometheus histograms
//! (`_bucket`, `_sum`, `_count`), not summaries.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use stormguard::metrics::HISTOGRAM_BUCKETS;

use super::Gateway;

/// The content type of Prometheus' text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// How often the recorder's histograms are drained into their buckets between scrapes: 5 s, the
/// exporter's own upkeep interval (a scrape drains them too).
const UPKEEP: Duration = Duration::from_secs(5);

/// The recorder this module installed, once per process.
static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs a Prometheus recorder as the process's global `metrics` recorder (once: later calls
/// return the same handle), with the library's buckets for its histograms, and describes the
/// library's metrics to it ([`stormguard::metrics::describe`]).
///
/// Fails if another recorder was installed first: a process has one.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in HISTOGRAM_BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).into()), buckets)?;
    }
    let handle = builder.install_recorder()?;
    stormguard::metrics::describe();
    *installed = Some(handle.clone());
    Ok(handle)
}

/// Drains the histograms every [`UPKEEP`], so that their samples do not pile up between scrapes
/// (`install_recorder` leaves this to its caller). Runs until its task is aborted.
pub(super) async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

impl FromRef<Gateway> for PrometheusHandle {
    fn from_ref(gateway: &Gateway) -> Self {
        gateway.metrics.clone()
    }
}

/// The sum of the samples of `name` (exactly: `name_count` is another name) whose labels include
/// every pair of `labels`, in Prometheus' text format (`text`, as [`render`] writes it): how a
/// reader of `/metrics` totals a series over the labels it leaves out. A sample whose value does
/// not parse counts for nothing.
///
/// ```
/// use stormguard_examples::gateway::prometheus::sum;
///
/// let text = "# TYPE stormguard_retries counter\n\
///             stormguard_retries{gen_ai_provider_name=\"a\",reason=\"overloaded\"} 3\n\
///             stormguard_retries{gen_ai_provider_name=\"b\",reason=\"overloaded\"} 4\n";
/// assert_eq!(sum(text, "stormguard_retries", &[]), 7.0);
/// assert_eq!(sum(text, "stormguard_retries", &[("gen_ai_provider_name", "b")]), 4.0);
/// ```
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let has = |(key, value): &(&str, &str)| rest.contains(&format!("{key}=\"{value}\""));
            (metric == name && labels.iter().all(has)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// `GET /metrics`: everything the recorder holds, in Prometheus' text format.
pub(super) async fn render(State(handle): State<PrometheusHandle>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], handle.render())
}
