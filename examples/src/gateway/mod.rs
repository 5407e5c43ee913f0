//! The axum gateway of the `axum_gateway` example, as a library so that tests can start it
//! in-process: `stormguard::ServerLayer` on its two LLM routes (OpenAI's
//! `/v1/chat/completions`, Anthropic's `/v1/messages`, each relayed to the same path of the
//! provider), `stormguard::ClientLayer` on its upstream hyper client to a [`mock`] provider, and
//! two routes of its own that never reach the provider:
//!
//! - `GET /metrics`: the engine's metrics ([`stormguard::metrics`]) in Prometheus' text format,
//!   from the process's recorder ([`prometheus`]);
//! - `GET /healthz`: the snapshots of what the gateway's clients share (retry budget, each
//!   provider's throttle, breaker and rate limit, the fleet), as JSON, with a `status` that says
//!   whether a provider is being refused locally ([`Health`]).
//!
//! Both sit outside the `ServerLayer` (a health check is never shed) and outside the client
//! pipeline (they answer from memory).
//!
//! Under the `ClientLayer`, between it and the hyper client, sits a `stormguard::chaos` layer:
//! it injects nothing ([`ChaosLayer::new`]) unless the gateway is started with faults
//! ([`Running::start_with`]), as the `game_day` example and the soak test do, so that the
//! provider fails the way providers fail, on a schedule.
//!
//! ```no_run
//! use stormguard_examples::gateway::{Route, Running};
//! use stormguard_examples::mock::MockConfig;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let gateway = Running::start("mock", MockConfig::default(), Route::Direct).await?;
//! println!("POST {}; GET http://{}/metrics", gateway.url, gateway.addr);
//! let (provider, _) = gateway.stop().await;
//! println!("the provider got {} attempts", provider.attempts);
//! # Ok(())
//! # }
//! ```

mod health;
pub mod prometheus;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Response, StatusCode, Uri, header};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::ClientLayer;
use stormguard::breaker::CircuitBreaker;
use stormguard::chaos::{ChaosLayer, ChaosService};
use stormguard::classify::Reason;
use stormguard::classify::headers::X_STORMGUARD_BACKEND;
use stormguard::failover::{Adapter, Backend, Degraded, Failover};
use stormguard::jitter::FullJitter;
use stormguard::rate_limit::{Fleet, RateLimit};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};

pub use health::{DEGRADED_DROP_PROBABILITY, Health, ProviderHealth};

use crate::mock::{self, CHAT_COMPLETIONS, MESSAGES, MockConfig, MockHandle, StatsSnapshot};

/// The path of the metrics in Prometheus' text format.
pub const METRICS: &str = "/metrics";
/// The path of the health snapshot in JSON.
pub const HEALTHZ: &str = "/healthz";

/// How the gateway reaches its provider.
pub enum Route {
    /// Straight to the provider.
    Direct,
    /// Paced by a rate limit (with a fleet, if its config has one: pass it too, for `/healthz`).
    Quota(RateLimit, Option<Fleet>),
    /// Failing over to a second provider started with this config, asked for another model
    /// (`backup-large`). The two backends are named `openai` and `backup`.
    Failover(MockConfig),
}

/// A gateway serving on 127.0.0.1 (ephemeral port) in front of its mock provider (and, behind a
/// failover, its backup).
pub struct Running {
    /// The gateway's chat completions URL (its messages route is beside it, at [`MESSAGES`]).
    pub url: String,
    /// Where the gateway listens: `/metrics` and `/healthz` are there too.
    pub addr: SocketAddr,
    /// Requests the gateway received on its LLM routes.
    pub received: Arc<AtomicU64>,
    /// Upstream calls the gateway answered itself, and who answered the others.
    pub refused: Arc<Refused>,
    /// What `/healthz` reports.
    pub health: Health,
    /// The faults injected into the upstream calls, and what they injected so far.
    pub chaos: ChaosLayer,
    backend: MockHandle,
    backup: Option<MockHandle>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    upkeep: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts a mock provider with `config` and a gateway reaching it by `route`. `provider` names
    /// the upstream `ClientLayer` (the `gen_ai.provider.name` label of its metrics and its name in
    /// `/healthz`) on the direct routes; a failover names its backends itself. Installs the
    /// Prometheus recorder if this process has none yet ([`prometheus::install`]).
    pub async fn start(
        provider: &str,
        config: MockConfig,
        route: Route,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_on(loopback, provider, config, route).await
    }

    /// [`start`](Self::start), with the gateway listening on `listen` (the provider still on an
    /// ephemeral loopback port): for callers in another process, such as a Python SDK, which
    /// must know where to connect before the gateway starts.
    pub async fn start_on(
        listen: SocketAddr,
        provider: &str,
        config: MockConfig,
        route: Route,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(listen, provider, config, route, ChaosLayer::new()).await
    }

    /// [`start_on`](Self::start_on), with `chaos` under the gateway's upstream client: the
    /// provider (and the backup) fail as its faults say, on their schedule. For staging and
    /// tests only.
    pub async fn start_with(
        listen: SocketAddr,
        provider: &str,
        config: MockConfig,
        route: Route,
        chaos: ChaosLayer,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let metrics = prometheus::install()?;
        let backend = mock::spawn(config).await?;
        let (upstream, health, backup) = upstream(provider, route, chaos.clone()).await?;
        let received = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(Refused::default());
        let (addr, stop, task) = serve(
            listen,
            routes(Gateway {
                upstream,
                backend: backend.addr,
                received: received.clone(),
                refused: refused.clone(),
                health: health.clone(),
                metrics: metrics.clone(),
            }),
        )
        .await?;
        Ok(Self {
            url: format!("http://{addr}{CHAT_COMPLETIONS}"),
            addr,
            received,
            refused,
            health,
            chaos,
            backend,
            backup,
            stop,
            task,
            upkeep: tokio::spawn(prometheus::upkeep(metrics)),
        })
    }

    /// What the provider has seen so far.
    pub fn provider_stats(&self) -> StatsSnapshot {
        self.backend.stats.snapshot()
    }

    /// Stops the gateway and its providers: what the provider and the backup saw.
    pub async fn stop(self) -> (StatsSnapshot, Option<StatsSnapshot>) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
        self.upkeep.abort();
        let stats = self.backend.stats.snapshot();
        self.backend.shutdown().await;
        let backup = match self.backup {
            Some(backup) => {
                let stats = backup.stats.snapshot();
                backup.shutdown().await;
                Some(stats)
            }
            None => None,
        };
        (stats, backup)
    }
}

type Upstream = BoxCloneSyncService<Request, Response<Body>, stormguard::Error>;

/// Connections to a provider kept open while idle, for the next requests. A burst opens as many
/// as it needs; past the burst, all but these are closed rather than kept for the pool's 90 s, so
/// that the gateway's memory follows its load, not the largest burst of the last minute and a
/// half.
const IDLE_CONNECTIONS: usize = 64;

/// What the gateway's `ClientLayer` calls: the hyper client, under the chaos layer.
type ProviderClient = ChaosService<Client<HttpConnector, Body>>;

/// The upstream client `route` asks for, with `chaos` under it, what `/healthz` reports of it,
/// and, behind a failover, the backup provider it started. `provider` names the `ClientLayer` of
/// the direct routes.
async fn upstream(
    provider: &str,
    route: Route,
    chaos: ChaosLayer,
) -> Result<(Upstream, Health, Option<MockHandle>), Box<dyn std::error::Error>> {
    // Delays are scaled down from the defaults (500 ms .. 8 s) so that the example ends in
    // seconds.
    let client_layer = ClientLayer::default()
        .with_name(provider)
        .with_backoff(FullJitter::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
        ))
        .with_timeout(Duration::from_secs(5));
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_CONNECTIONS)
        .build(HttpConnector::new());
    let hyper = chaos.layer(client);
    Ok(match route {
        Route::Direct => {
            let (upstream, health) = direct(provider, client_layer, None, hyper);
            (upstream, health, None)
        }
        Route::Quota(quota, fleet) => {
            let client_layer = client_layer.with_rate_limit(quota);
            let (upstream, health) = direct(provider, client_layer, fleet, hyper);
            (upstream, health, None)
        }
        Route::Failover(config) => {
            let (upstream, health, backup) = failover(client_layer, config, hyper).await?;
            (upstream, health, Some(backup))
        }
    })
}

/// Straight to the provider: `client_layer`, with a breaker, on `hyper`, and its health.
fn direct(
    provider: &str,
    client_layer: ClientLayer,
    fleet: Option<Fleet>,
    hyper: ProviderClient,
) -> (Upstream, Health) {
    let client_layer = client_layer.with_breaker(CircuitBreaker::default());
    let health = Health::new(client_layer.budget().clone(), fleet)
        .with_provider(ProviderHealth::of(provider, &client_layer));
    let upstream = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(client_layer)
            .service(hyper)
            .map_response(|response| response.map(Body::new)),
    );
    (upstream, health)
}

/// A failover on `hyper` from the provider (`openai`) to a backup started with `config`
/// (`backup`, asked for `backup-large`), built on `client_layer`: the upstream client, the
/// health of both backends, and the backup.
async fn failover(
    client_layer: ClientLayer,
    config: MockConfig,
    hyper: ProviderClient,
) -> Result<(Upstream, Health, MockHandle), Box<dyn std::error::Error>> {
    let server = mock::spawn(config).await?;
    let origin = format!("http://{}", server.addr).parse()?;
    let busy = Degraded::new(|_, _| {
        let body = r#"{"error":{"message":"busy, retry later","type":"degraded"}}"#;
        http::Response::new(axum::body::Bytes::from_static(body.as_bytes()))
    });
    let failover = Failover::new(client_layer)
        .with_backend(Backend::new("openai"))
        .with_backend(
            Backend::new("backup").with_adapter(
                Adapter::new()
                    .with_origin(origin)
                    .with_model("backup-large"),
            ),
        )
        .with_degraded(busy);
    let health = failover.backends().iter().fold(
        Health::new(failover.policy().budget().clone(), None),
        |health, backend| health.with_provider(ProviderHealth::of_backend(backend)),
    );
    let upstream = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(failover)
            .service(hyper)
            .map_response(|response| response.map(Body::new)),
    );
    Ok((upstream, health, server))
}

/// The gateway's routes: the two LLM routes behind the `ServerLayer`, `/metrics` and
/// `/healthz`.
fn routes(gateway: Gateway) -> Router {
    Router::new()
        .route(CHAT_COMPLETIONS, post(forward))
        .route(MESSAGES, post(forward))
        .layer(stormguard::ServerLayer::default())
        // Added after the ServerLayer, so outside it: never shed, never given a deadline.
        .route(METRICS, get(prometheus::render))
        .route(HEALTHZ, get(health::render))
        .with_state(gateway)
}

/// Serves `app` on `listen` until told to stop: where it listens, what tells it to stop, and its
/// task.
async fn serve(
    listen: SocketAddr,
    app: Router,
) -> std::io::Result<(
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    // Relayed streams are many small writes: sent at once, not held back by Nagle's
    // algorithm until the caller acknowledges the last one.
    let listener = listener.tap_io(|connection| {
        let _ = connection.set_nodelay(true);
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Ok((addr, stop, task))
}

/// What the gateway's handlers share.
#[derive(Clone)]
struct Gateway {
    upstream: Upstream,
    backend: SocketAddr,
    received: Arc<AtomicU64>,
    refused: Arc<Refused>,
    health: Health,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// Upstream calls that ended without a response, which the gateway answered itself (and, behind
/// a failover, which provider answered the others).
#[derive(Debug, Default)]
pub struct Refused {
    throttled: AtomicU64,
    breaker_open: AtomicU64,
    rate_limited: AtomicU64,
    deadline: AtomicU64,
    failed: AtomicU64,
    by_provider: Mutex<BTreeMap<String, u64>>,
}

impl Refused {
    /// Dropped by the adaptive throttle.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Refused by an open breaker.
    pub fn breaker_open(&self) -> u64 {
        self.breaker_open.load(Ordering::Relaxed)
    }

    /// Over the gateway's own rate limit.
    pub fn rate_limited(&self) -> u64 {
        self.rate_limited.load(Ordering::Relaxed)
    }

    /// Past the request's deadline.
    pub fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }

    /// Failed otherwise (given up on after the provider's failures).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// All of the above.
    pub fn total(&self) -> u64 {
        self.throttled()
            + self.breaker_open()
            + self.rate_limited()
            + self.deadline()
            + self.failed()
    }

    /// Answers by provider (behind a failover: the `x-stormguard-backend` of each answer).
    pub fn answered_by(&self) -> BTreeMap<String, u64> {
        self.by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn answered(&self, provider: &str) {
        let mut by = self
            .by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *by.entry(provider.to_owned()).or_default() += 1;
    }

    fn count(&self, error: &stormguard::Error) {
        let counter = match error.reason() {
            Reason::Throttled => &self.throttled,
            Reason::BreakerOpen => &self.breaker_open,
            Reason::RateLimitedLocally => &self.rate_limited,
            Reason::DeadlineExceeded => &self.deadline,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends the request on to the backend through the protected upstream client. The deadline the
/// `ServerLayer` read from the caller travels in the request's extensions, so the upstream
/// attempts share it. An upstream call that ends without a response returns its
/// `stormguard::Error`, which answers the caller (throttled or breaker open: 503, deadline: 504,
/// failed: 502, each with `x-should-retry: false`). The body handed on is the engine's, not the
/// provider's: a stream cut after content reaches the caller with its continuation spliced in,
/// or with its in-band error event when it cannot be completed.
async fn forward(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response<Body>, stormguard::Error> {
    gateway.received.fetch_add(1, Ordering::Relaxed);
    let (mut parts, body) = request.into_parts();
    let uri = format!("http://{}{}", gateway.backend, parts.uri.path());
    parts.uri = match uri.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return Ok(response);
        }
    };
    parts.headers.remove(header::HOST);
    let response = gateway
        .upstream
        .oneshot(Request::from_parts(parts, body))
        .await
        .inspect_err(|error| gateway.refused.count(error))?;
    if let Some(backend) = response.headers().get(X_STORMGUARD_BACKEND) {
        gateway.refused.answered(backend.to_str().unwrap_or("?"));
    }
    Ok(response)
}
