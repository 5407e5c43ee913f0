//! An LLM gateway in axum: `stormguard::ServerLayer` on its routes, `stormguard::ClientLayer` on
//! its upstream hyper client to the mock LLM server. Fires a bounded burst of requests through it,
//! first at a flaky provider, then at one in a total outage, prints what the backend paid for
//! each and exits.
//!
//! The callers retry too (reqwest with `StormguardMiddleware`): two layers retry, and yet the
//! backend sees about 1.1x the offered load, not 3 x 3 = 9x, because the gateway retries within
//! its budget and marks what it gives up on with `x-should-retry: false`, which the callers
//! honour.
//!
//! The gateway's handler returns `Result<_, stormguard::Error>`: when its upstream call ends
//! without a response (throttled locally, deadline exceeded, given up on), `?` answers for it
//! with 503, 504 or 502 and `x-should-retry: false`.
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway
//! ```
//!
//! With `--failover`, it runs one phase instead: its OpenAI-style provider is in a total outage,
//! and a second mock provider, asked for another model (`backup-large`), takes the traffic
//! through `stormguard::failover` (the answers say which provider and model answered):
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway -- --failover
//! ```
//!
//! With `--stream`, it runs one phase instead: the callers ask for streamed answers
//! (`"stream": true`) and the gateway relays the provider's `text/event-stream` through its
//! `ClientLayer`, chunk by chunk. A few percent of the provider's streams fail after their `200`:
//! an error frame before any content, which the gateway retries (its callers only ever see clean
//! streams), or a cut mid-stream, never restarted: the callers get the content sent before the
//! cut, then their bodies end with `StreamInterrupted`:
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway -- --stream
//! ```
//!
//! With `--redis URL`, it runs one phase instead: a healthy provider whose quota, 1,200 requests
//! a minute, is shared through Redis by every gateway started with the same URL. Start two at
//! once and together they send the quota upstream once, not once each:
//!
//! ```text
//! redis-server --port 6379 --save '' &
//! cargo run -p stormguard-examples --bin axum_gateway -- --redis redis://127.0.0.1:6379/ &
//! cargo run -p stormguard-examples --bin axum_gateway -- --redis redis://127.0.0.1:6379/
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Response, StatusCode, Uri, header};
use axum::routing::post;
use axum::serve::ListenerExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::ClientLayer;
use stormguard::budget::RetryBudget;
use stormguard::classify::Reason;
use stormguard::classify::headers::X_STORMGUARD_BACKEND;
use stormguard::failover::{Adapter, Backend, Degraded, Failover};
use stormguard::jitter::FullJitter;
use stormguard::rate_limit::{Fleet, RateLimit, RateLimitConfig};
use stormguard::reqwest::StormguardMiddleware;
use stormguard::stream::StreamInterrupted;
use stormguard::throttle::AdaptiveThrottle;
use stormguard_examples::mock::{
    self, CHAT_COMPLETIONS, Fault, MockConfig, MockHandle, StatsSnapshot, Transcript,
};
use stormguard_examples::throttled;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// Requests arrive at this pace whatever happens to the earlier ones (an open loop, like users):
/// 200 per second.
const INTERVAL: Duration = Duration::from_millis(5);
const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;
/// The same request, asking for a streamed answer.
const STREAM_BODY: &str = r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16,"stream":true}"#;

type Upstream = BoxCloneSyncService<Request, Response<Body>, stormguard::Error>;

#[derive(Clone)]
struct Gateway {
    upstream: Upstream,
    backend: SocketAddr,
    received: Arc<AtomicU64>,
    refused: Arc<Refused>,
}

/// The quota the gateways started with `--redis` share: 1,200 requests a minute.
const SHARED_QUOTA: u32 = 1_200;

/// Upstream calls that ended without a response, which the gateway answered itself (and, behind
/// a failover, which provider answered the others).
#[derive(Default)]
struct Refused {
    throttled: AtomicU64,
    rate_limited: AtomicU64,
    deadline: AtomicU64,
    failed: AtomicU64,
    by_provider: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Refused {
    fn answered(&self, provider: &str) {
        let mut by = self
            .by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *by.entry(provider.to_owned()).or_default() += 1;
    }

    fn answered_by(&self) -> std::collections::BTreeMap<String, u64> {
        self.by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn count(&self, error: &stormguard::Error) {
        let counter = match error.reason() {
            Reason::Throttled => &self.throttled,
            Reason::RateLimitedLocally => &self.rate_limited,
            Reason::DeadlineExceeded => &self.deadline,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("--redis"), Some(url)) => return shared_quota(&url).await,
        (Some("--failover"), None) => return failover().await,
        (Some("--stream"), None) => return streams().await,
        (None, _) => {}
        _ => return Err("usage: axum_gateway [--failover | --stream | --redis URL]".into()),
    }
    let flaky = MockConfig {
        error_rate: 0.1,
        faults: vec![
            (
                Fault::RateLimited {
                    retry_after: Duration::from_millis(100),
                },
                2,
            ),
            (Fault::Unavailable, 1),
            (Fault::Overloaded, 1),
        ],
        ..MockConfig::default()
    };
    phase("flaky provider (10% errors)", flaky, 400, Route::Direct).await?;
    phase(
        "total outage (100% 503)",
        MockConfig::outage(Fault::Unavailable),
        400,
        Route::Direct,
    )
    .await?;
    Ok(())
}

/// How the gateway reaches the provider.
enum Route {
    Direct,
    /// Paced by a rate limit.
    Quota(RateLimit),
    /// Failing over to a second provider, asked for another model.
    Failover(MockConfig),
}

/// The OpenAI-style provider is down; the backup takes its traffic, asked for its own model.
async fn failover() -> Result<(), Box<dyn std::error::Error>> {
    let name = "failover: the primary in a total outage, a backup with another model";
    phase(
        name,
        MockConfig::outage(Fault::Unavailable),
        400,
        Route::Failover(MockConfig::healthy()),
    )
    .await
}

/// A healthy provider whose quota the gateways share through the Redis at `url`: 1,000
/// requests in 5 s, five times the quota's pace.
async fn shared_quota(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let fleet = Fleet::new(url)?.with_prefix("stormguard:example:axum_gateway");
    let quota = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(SHARED_QUOTA))
            .with_fleet(fleet.clone()),
    );
    let name = format!("a quota of {SHARED_QUOTA} requests a minute shared through {url}");
    phase(&name, MockConfig::default(), 1_000, Route::Quota(quota)).await?;
    let fleet = fleet.snapshot();
    println!(
        "fleet: {} replicas, {} decisions in Redis, {} on the local share",
        fleet.replicas, fleet.fleet_decisions, fleet.local_decisions
    );
    Ok(())
}

async fn phase(
    name: &str,
    config: MockConfig,
    requests: usize,
    route: Route,
) -> Result<(), Box<dyn std::error::Error>> {
    let gateway = Running::start(config, route).await?;
    let callers = callers();
    let url = gateway.url.clone();
    let (answers, elapsed) = burst(requests, move || {
        let callers = callers.clone();
        let url = url.clone();
        async move {
            match callers.post(&url).body(BODY).send().await {
                Ok(response) if response.status().is_success() => Answer::Ok,
                Ok(_) => Answer::Failed,
                Err(error) if throttled(&error) => Answer::Dropped,
                Err(_) => Answer::Error,
            }
        }
    })
    .await?;
    let (mut ok, mut failed, mut dropped, mut errors) = (0_usize, 0_usize, 0_usize, 0_usize);
    for answer in answers {
        match answer {
            Answer::Ok => ok += 1,
            Answer::Failed => failed += 1,
            Answer::Dropped => dropped += 1,
            Answer::Error => errors += 1,
        }
    }
    let received = gateway.received.clone();
    let refused = gateway.refused.clone();
    let upstream_budget = gateway.budget.clone();
    let upstream_throttle = gateway.throttle.clone();
    let (stats, backup_stats) = gateway.stop().await;

    let first_tries = stats.by_attempt_header.get(&0).copied().unwrap_or(0);
    let budget = upstream_budget.snapshot();
    let probability = upstream_throttle.map_or(0.0, |throttle| throttle.snapshot().probability);
    println!("== {name}");
    println!(
        "{requests} requests at {:.0}/s through the gateway, done in {elapsed:.2?}",
        1.0 / INTERVAL.as_secs_f64()
    );
    println!(
        "callers got {ok} ok, {failed} failed responses, {dropped} dropped by their own throttle, \
         {errors} other errors; the gateway received {} attempts",
        received.load(Ordering::Relaxed)
    );
    let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    println!(
        "the gateway answered {} upstream calls itself: {} throttled, {} over the quota, {} past \
         the deadline, {} failed",
        count(&refused.throttled)
            + count(&refused.rate_limited)
            + count(&refused.deadline)
            + count(&refused.failed),
        count(&refused.throttled),
        count(&refused.rate_limited),
        count(&refused.deadline),
        count(&refused.failed)
    );
    println!(
        "attempts to the provider {} ({} retries by the gateway), statuses {:?}",
        stats.attempts,
        stats.attempts.saturating_sub(first_tries),
        stats.by_status
    );
    println!(
        "gateway budget: {} retries granted, {} refused; gateway throttle: drop probability {probability:.2}",
        budget.withdrawals, budget.rejected
    );
    println!(
        "success rate {:.1}%, amplification {:.2}x (upstream attempts per request)",
        100.0 * ok as f64 / requests.max(1) as f64,
        stats.attempts as f64 / requests.max(1) as f64
    );
    if let Some(backup) = backup_stats {
        println!(
            "the backup provider got {} attempts (statuses {:?}); answers by provider: {:?}",
            backup.attempts,
            backup.by_status,
            refused.answered_by()
        );
    }
    Ok(())
}

/// Callers stream their answers (`"stream": true`) through the gateway from a provider whose
/// streams fail after their `200`: an error frame before any content (the gateway's upstream
/// `ClientLayer` retries it, so its callers only see clean streams) or a cut mid-stream (never
/// restarted: the gateway relays the content it got, then fails its own answer, and the
/// callers' bodies end with `StreamInterrupted`).
async fn streams() -> Result<(), Box<dyn std::error::Error>> {
    const REQUESTS: usize = 400;
    let provider = MockConfig {
        error_rate: 0.06,
        faults: vec![(Fault::ErrorBeforeContent, 1), (Fault::CutMidStream, 1)],
        ..MockConfig::default()
    };
    let error_rate = provider.error_rate;
    let gateway = Running::start(provider, Route::Direct).await?;
    let callers = callers();
    let url = gateway.url.clone();
    let (answers, elapsed) = burst(REQUESTS, move || stream(callers.clone(), url.clone())).await?;
    let budget = gateway.budget.snapshot();
    let (stats, _) = gateway.stop().await;

    let (mut clean, mut interrupted, mut failed, mut dropped, mut errors) = (0, 0, 0, 0, 0);
    let (mut delivered, mut delivered_cut) = (0, 0);
    let (mut first_bytes, mut ends) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            StreamAnswer::Read {
                content,
                first_bytes: first,
                end,
                ended,
            } => {
                delivered += content;
                first_bytes.push(first);
                ends.push(end);
                match ended {
                    Ended::Clean => clean += 1,
                    Ended::Interrupted => {
                        interrupted += 1;
                        delivered_cut += content;
                    }
                    Ended::Otherwise => errors += 1,
                }
            }
            StreamAnswer::Failed => failed += 1,
            StreamAnswer::Dropped => dropped += 1,
            StreamAnswer::Error => errors += 1,
        }
    }
    // The two stream faults share the error rate equally.
    let each = 100.0 * error_rate / 2.0;
    println!("== streams: {each:.0}% errors before content, {each:.0}% cut mid-stream");
    println!(
        "{REQUESTS} streamed requests at {:.0}/s through the gateway, done in {elapsed:.2?}",
        1.0 / INTERVAL.as_secs_f64()
    );
    println!(
        "callers got {clean} clean streams, {interrupted} interrupted after content \
         (StreamInterrupted), {failed} failed responses, {dropped} dropped, {errors} other errors"
    );
    println!(
        "the provider began {} streams in {} attempts: {} retried before content ({} error \
         frames), {} cut mid-stream; gateway budget: {} retries granted, {} refused",
        stats.streams,
        stats.attempts,
        stats.attempts.saturating_sub(REQUESTS as u64),
        stats.stream_errors,
        stats.streams_cut,
        budget.withdrawals,
        budget.rejected
    );
    println!(
        "content chunks: {} sent by the provider, {delivered} delivered to callers ({delivered_cut} \
         in interrupted streams); medians: first bytes after {:.0?}, the end after {:.0?}",
        stats.content_chunks,
        median(&mut first_bytes),
        median(&mut ends)
    );
    Ok(())
}

/// What a caller got when it asked for a stream.
enum StreamAnswer {
    /// A `2xx` whose body it read: the content events in it, when its first bytes and its end
    /// came (from the request's start), and how it ended.
    Read {
        content: usize,
        first_bytes: Duration,
        end: Duration,
        ended: Ended,
    },
    Failed,
    Dropped,
    Error,
}

/// How a streamed body ended.
enum Ended {
    /// With `data: [DONE]`.
    Clean,
    /// With `StreamInterrupted`, from the caller's own stream guard.
    Interrupted,
    /// With another error, or without `data: [DONE]`.
    Otherwise,
}

/// Asks for a streamed answer at `url` and reads it to its end (or its error).
async fn stream(callers: ClientWithMiddleware, url: String) -> StreamAnswer {
    let started = Instant::now();
    let mut response = match callers.post(&url).body(STREAM_BODY).send().await {
        Ok(response) if response.status().is_success() => response,
        Ok(_) => return StreamAnswer::Failed,
        Err(error) if throttled(&error) => return StreamAnswer::Dropped,
        Err(_) => return StreamAnswer::Error,
    };
    let mut text = Vec::new();
    let mut first_bytes = None;
    let error = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                first_bytes.get_or_insert_with(|| started.elapsed());
                text.extend_from_slice(&chunk);
            }
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    let end = started.elapsed();
    let read = Transcript::parse(&String::from_utf8_lossy(&text));
    let ended = match error {
        None if read.done => Ended::Clean,
        Some(error)
            if stormguard::classify::chain(&error)
                .any(|link| link.downcast_ref::<StreamInterrupted>().is_some()) =>
        {
            Ended::Interrupted
        }
        _ => Ended::Otherwise,
    };
    StreamAnswer::Read {
        content: read.content.len(),
        first_bytes: first_bytes.unwrap_or(end),
        end,
        ended,
    }
}

/// The middle value of `values` (zero if there are none).
fn median(values: &mut [Duration]) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Callers with retries of their own, which honour the gateway's `x-should-retry: false`.
fn callers() -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(
            ClientLayer::default().with_backoff(FullJitter::new(
                Duration::from_millis(10),
                Duration::from_millis(200),
            )),
        ))
        .build()
}

/// Runs `requests` calls of `call`, one every [`INTERVAL`] whatever happens to the earlier ones
/// (an open loop, like users): their answers, and how long the burst took.
async fn burst<T, F, Fut>(
    requests: usize,
    call: F,
) -> Result<(Vec<T>, Duration), tokio::task::JoinError>
where
    T: Send + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let started = Instant::now();
    let mut burst = tokio::task::JoinSet::new();
    for n in 0..requests {
        let at = started + INTERVAL.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        let call = call();
        burst.spawn(async move {
            tokio::time::sleep_until(at).await;
            call.await
        });
    }
    let mut answers = Vec::with_capacity(requests);
    while let Some(answer) = burst.join_next().await {
        answers.push(answer?);
    }
    Ok((answers, started.elapsed()))
}

/// A gateway serving on loopback in front of its mock provider (and, behind a failover, its
/// backup).
struct Running {
    /// The gateway's chat completions URL.
    url: String,
    backend: MockHandle,
    backup: Option<MockHandle>,
    received: Arc<AtomicU64>,
    refused: Arc<Refused>,
    /// The upstream client's retry budget and throttle.
    budget: RetryBudget,
    throttle: Option<AdaptiveThrottle>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Starts a mock provider with `config` and a gateway reaching it by `route`.
    async fn start(config: MockConfig, route: Route) -> Result<Self, Box<dyn std::error::Error>> {
        let backend = mock::spawn(config).await?;

        // The gateway: ServerLayer on its routes, ClientLayer on its upstream client. Delays are
        // scaled down from the defaults (500 ms .. 8 s) so that the example ends in seconds.
        let mut client_layer = ClientLayer::default()
            .with_backoff(FullJitter::new(
                Duration::from_millis(10),
                Duration::from_millis(200),
            ))
            .with_timeout(Duration::from_secs(5));
        if let Route::Quota(quota) = &route {
            client_layer = client_layer.with_rate_limit(quota.clone());
        }
        let budget = client_layer.budget().clone();
        let throttle = client_layer.throttle().cloned();
        let hyper = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let mut backup = None;
        let upstream = match route {
            Route::Direct | Route::Quota(_) => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .layer(client_layer)
                    .service(hyper)
                    .map_response(|response| response.map(Body::new)),
            ),
            Route::Failover(config) => {
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
                backup = Some(server);
                BoxCloneSyncService::new(
                    ServiceBuilder::new()
                        .layer(failover)
                        .service(hyper)
                        .map_response(|response| response.map(Body::new)),
                )
            }
        };
        let received = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(Refused::default());
        let app = Router::new()
            .route(CHAT_COMPLETIONS, post(forward))
            .layer(stormguard::ServerLayer::default())
            .with_state(Gateway {
                upstream,
                backend: backend.addr,
                received: received.clone(),
                refused: refused.clone(),
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}{CHAT_COMPLETIONS}", listener.local_addr()?);
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
        Ok(Self {
            url,
            backend,
            backup,
            received,
            refused,
            budget,
            throttle,
            stop,
            task,
        })
    }

    /// Stops the gateway and its providers: what the provider and the backup saw.
    async fn stop(self) -> (StatsSnapshot, Option<StatsSnapshot>) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
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

/// What a caller got.
enum Answer {
    Ok,
    Failed,
    Dropped,
    Error,
}

/// Sends the request on to the backend through the protected upstream client. The deadline the
/// `ServerLayer` read from the caller travels in the request's extensions, so the upstream
/// attempts share it. An upstream call that ends without a response returns its
/// `stormguard::Error`, which answers the caller (throttled: 503, deadline: 504, failed: 502,
/// each with `x-should-retry: false`).
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
