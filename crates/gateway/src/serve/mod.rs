//! Serving: the axum app, its routes and its listener.
//!
//! ```text
//! /v1/chat/completions, /v1/completions,   ─▶ ServerLayer ─▶ caller key ─▶ relay ─▶ route's Failover ─▶ provider
//! /v1/embeddings, /v1/responses, /v1/messages     (deadline     (401)        (413, 400, 404)  (ranks of deployments)
//! /v1/models                                       cap, shed)
//! /healthz, /readyz, /metrics              ─▶ answered from memory, no key
//! ```
//!
//! A [`Running`] gateway is stopped by [`Running::drain`] (the binary's SIGTERM and SIGINT) and
//! takes a new config with [`Running::reload`] (the binary's SIGHUP).
//!
//! `/metrics` renders a Prometheus recorder that [`app`] installs as the process's `metrics`
//! recorder, once; a process that installed another one first gets a 503 there.

mod access;
mod degraded;
mod drain;
mod forward;
mod headers;
mod listen;
mod ops;
mod refusal;
mod reload;
mod routes;
#[cfg(unix)]
mod signals;
mod summary;
mod upstream;
mod workers;

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
pub use reload::ReloadError;
pub use routes::DEFAULT_ANTHROPIC_VERSION;
#[cfg(unix)]
pub use signals::{Signals, serve_until_signalled};
pub use workers::Workers;

use crate::config::Config;
use crate::format::{MODELS, RELAYED};
use drain::Ending;
use listen::{Current, Limits};
use routes::Routes;

/// What the handlers share: one config's routes and limits, and the drain (shared by every
/// config the gateway serves in turn).
pub(crate) struct Shared {
    routes: Routes,
    max_body_bytes: usize,
    metrics: Option<PrometheusHandle>,
    failures: summary::Failures,
    ending: Ending,
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
    app_with(config, Ending::new().1)
}

/// The app for `config`, its requests ended by `ending`.
fn app_with(config: &Config, ending: Ending) -> Result<(Router, CallerKeys), StartError> {
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
        ending,
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
    /// The listen address its config asked for (a reload cannot change it).
    listen: SocketAddr,
    /// Connections served at once (a reload cannot change it).
    max_connections: usize,
    stop: tokio::sync::oneshot::Sender<Duration>,
    task: tokio::task::JoinHandle<std::io::Result<Drained>>,
    current: tokio::sync::watch::Sender<Current>,
    ending: Ending,
}

/// How a drain went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Requests in flight (streams included) when it began.
    pub in_flight: u64,
    /// Those that finished within the grace.
    pub finished: u64,
    /// Those its end answered: a 503, or a stream's in-band error event.
    pub ended: u64,
    /// Those still open when the connections were closed, 1 s after the grace: a caller that
    /// did not read its answer.
    pub cut: u64,
    /// How long it took, on tokio's clock.
    pub took: Duration,
}

impl Running {
    /// Drains with a grace of 1 s.
    pub async fn stop(self) {
        let _ = self.drain_within(Duration::from_secs(1)).await;
    }

    /// Drains: the listener closes at once, requests and streams in flight get the config's
    /// `drain_grace` to finish; then a request still waiting is answered 503 (`x-should-retry:
    /// true`, `Retry-After: 1`) and a stream still open ends with an in-band error event in its
    /// provider's format. Returns once every connection is closed (at most 1 s after the
    /// grace).
    pub async fn drain(self) -> Drained {
        let grace = self.current.borrow().grace;
        self.drain_within(grace).await
    }

    /// [`drain`](Running::drain) with `grace`.
    pub async fn drain_within(self, grace: Duration) -> Drained {
        let _ = self.stop.send(grace);
        match self.task.await {
            Ok(Ok(drained)) => drained,
            _ => Drained::default(),
        }
    }

    /// Serves until the process ends.
    pub async fn wait(self) -> std::io::Result<()> {
        let _keep = self.stop;
        self.task
            .await
            .unwrap_or(Ok(Drained::default()))
            .map(|_| ())
    }
}

/// Starts serving `config` on its listen address, after checking it may listen there; its
/// connections are served on the runtime this is called from.
pub async fn start(config: &Config) -> Result<Running, StartError> {
    start_on(config, None).await
}

/// [`start`], with each connection served on one of `workers` (the binary's: one thread a core)
/// when some are given.
pub async fn start_on(
    config: &Config,
    workers: Option<Arc<Workers>>,
) -> Result<Running, StartError> {
    let (end, ending) = Ending::new();
    let (app, keys) = app_with(config, ending.clone())?;
    let listen = config.server.listen;
    check_listen(listen, &keys, config.server.allow_unauthenticated).map_err(StartError::Listen)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(StartError::Bind)?;
    let addr = listener.local_addr().map_err(StartError::Bind)?;
    let (current, requests) = tokio::sync::watch::channel(current(config, app));
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let parts = listen::Listen {
        listener,
        max_connections: config.server.max_connections,
        current: requests,
        ending: ending.clone(),
        end,
        workers,
    };
    let task = tokio::spawn(listen::serve(parts, stopped));
    tracing::info!(%addr, source = %config.source, models = config.models.len(), "stormguard-gateway listening");
    Ok(Running {
        addr,
        listen,
        max_connections: config.server.max_connections,
        stop,
        task,
        current,
        ending,
    })
}

/// What serves the requests of `config` with `app`.
fn current(config: &Config, app: Router) -> Current {
    Current {
        app,
        limits: Limits {
            header_read_timeout: config.server.header_read_timeout,
            max_header_bytes: config.server.max_header_bytes,
        },
        grace: config.server.drain_grace,
    }
}
