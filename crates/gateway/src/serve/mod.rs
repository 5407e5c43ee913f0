//! Serving: the axum app, its routes and its listener.
//!
//! ```text
//! /v1/chat/completions, /v1/completions,   ─▶ ServerLayer ─▶ caller key ─▶ relay ─▶ route's Failover ─▶ provider
//! /v1/embeddings, /v1/responses, /v1/messages     (deadline     (401)        (413, 400, 404)  (ranks of deployments)
//! /v1/models                                       cap, shed)
//! /healthz, /readyz, /metrics              ─▶ answered from memory, no key
//! ```
//!
//! `/metrics` renders a Prometheus recorder that [`app`] installs as the process's `metrics`
//! recorder, once; a process that installed another one first gets a 503 there.

mod access;
mod degraded;
mod forward;
mod headers;
mod listen;
mod ops;
mod refusal;
mod routes;
mod summary;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use stormguard::ServerLayer;

pub use access::{CallerKeys, ListenRefused, check_listen, constant_time_eq};
pub use headers::{X_STORMGUARD_ATTEMPTS, strip};
pub use ops::PROMETHEUS_TEXT;
pub use refusal::Refusal;
pub use routes::DEFAULT_ANTHROPIC_VERSION;

use crate::config::Config;
use crate::format::{MODELS, RELAYED};
use routes::Routes;

/// What the handlers share.
pub(crate) struct Shared {
    routes: Routes,
    max_body_bytes: usize,
    metrics: Option<PrometheusHandle>,
    failures: summary::Failures,
}

/// Why the gateway does not start.
#[derive(Debug)]
pub enum StartError {
    /// The listen address is refused (see [`check_listen`]).
    Listen(ListenRefused),
    /// A caller key's variable is not set: starting would let in callers the config meant to keep
    /// out.
    MissingCallerKey(String),
    /// The connection to providers or a provider key could not be set up.
    Upstream(String),
    /// The address could not be bound.
    Bind(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Listen(refused) => refused.fmt(f),
            Self::MissingCallerKey(var) => write!(f, "caller key ${var} is not set"),
            Self::Upstream(message) => f.write_str(message),
            Self::Bind(error) => write!(f, "cannot listen: {error}"),
        }
    }
}

impl std::error::Error for StartError {}

/// The gateway's app for `config`, and the caller keys it requires.
pub fn app(config: &Config) -> Result<(Router, CallerKeys), StartError> {
    let mut keys = Vec::new();
    for secret in &config.server.caller_keys {
        let value = secret
            .value()
            .ok_or_else(|| StartError::MissingCallerKey(secret.var().to_owned()))?;
        keys.push(value.to_owned());
    }
    let keys = CallerKeys::new(keys);
    let connection = upstream::connection().map_err(StartError::Upstream)?;
    let routes = Routes::build(config, &connection).map_err(StartError::Upstream)?;
    let shared = Arc::new(Shared {
        routes,
        max_body_bytes: config.server.max_body_bytes,
        metrics: ops::recorder(),
        failures: summary::Failures::default(),
    });
    // The default deadline (for callers that send none) is capped by the maximum too.
    let server = ServerLayer::default().with_max_timeout(config.server.max_deadline);
    let mut api = Router::new().route(MODELS, get(ops::models));
    for (path, format) in RELAYED {
        api = api.route(
            path,
            post(move |state, request| forward::relay(state, format, request)),
        );
    }
    let api = api
        .layer(axum::middleware::from_fn_with_state(
            keys.clone(),
            access::require_key,
        ))
        .layer(server)
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .with_state(shared);
    Ok((api, keys))
}

/// A gateway serving in this process.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Stops listening and waits (at most 1 s) for requests in flight.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
    }

    /// Serves until the process ends (the binary has no signal handling yet).
    pub async fn wait(self) -> std::io::Result<()> {
        let _keep = self.stop;
        self.task.await.unwrap_or(Ok(()))
    }
}

/// Starts serving `config` on its listen address, after checking it may listen there.
pub async fn start(config: &Config) -> Result<Running, StartError> {
    let (app, keys) = app(config)?;
    let listen = config.server.listen;
    check_listen(listen, &keys, config.server.allow_unauthenticated).map_err(StartError::Listen)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(StartError::Bind)?;
    let addr = listener.local_addr().map_err(StartError::Bind)?;
    let limits = listen::Limits {
        header_read_timeout: config.server.header_read_timeout,
        max_header_bytes: config.server.max_header_bytes,
        max_connections: config.server.max_connections,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(listen::serve(listener, app, limits, stopped));
    tracing::info!(%addr, source = %config.source, models = config.models.len(), "stormguard-gateway listening");
    Ok(Running { addr, stop, task })
}
