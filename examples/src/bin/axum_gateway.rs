//! An LLM gateway in axum: `stormguard::ServerLayer` on its routes, `stormguard::ClientLayer`
//! (with a circuit breaker) on its upstream hyper client to the mock LLM server, and `/metrics`
//! and `/healthz` of its own ([`stormguard_examples::gateway`]). Fires a bounded burst of
//! requests through it, first at a flaky provider, then at one in a total outage, prints what the
//! backend paid for each and exits.
//!
//! The callers retry too (reqwest with `StormguardMiddleware`): two layers retry, and yet the
//! backend sees about 1.1x the offered load, not 3 x 3 = 9x, because the gateway retries within
//! its budget and marks what it gives up on with `x-should-retry: false`, which the callers
//! honour.
//!
//! The gateway's handler returns `Result<_, stormguard::Error>`: when its upstream call ends
//! without a response (throttled locally, refused by the open breaker, deadline exceeded, given
//! up on), `?` answers for it with 503, 504 or 502 and `x-should-retry: false`.
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway
//! ```
//!
//! Each phase prints the gateway's address first. Besides its LLM routes it serves
//! `GET /metrics` (the engine's metrics in Prometheus' text format, labelled with the phase's
//! provider name) and `GET /healthz` (the retry budget's, throttle's and breaker's snapshots as
//! JSON, `"status": "degraded"` while the provider is refused locally). With `--serve SECS`, each
//! phase's requests go on for SECS seconds (200 a second) instead of its usual count, long enough
//! to `curl` both while the fault lasts:
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway -- --serve 30
//! curl -s 127.0.0.1:PORT/metrics | grep stormguard
//! curl -s 127.0.0.1:PORT/healthz
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
//! an error frame before any content, which the gateway retries, or a cut mid-stream, never
//! restarted but continued: the gateway asks the provider for the rest (the text received as an
//! assistant prefill) and splices it in. The callers read whole answers, every word once:
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway -- --stream
//! ```
//!
//! With `--stream --listen ADDR` it fires nothing itself: it serves callers in other processes at
//! ADDR, on OpenAI's `/v1/chat/completions` and Anthropic's `/v1/messages`, from the same kind of
//! provider failing more of its streams (one in ten cut), until it is stopped.
//! The official Python SDKs, for one, point their `base_url` at it:
//!
//! ```text
//! cargo run -p stormguard-examples --bin axum_gateway -- --stream --listen 127.0.0.1:8080
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
//!
//! `--serve SECS` goes with any of them but `--listen`.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::ClientLayer;
use stormguard::jitter::FullJitter;
use stormguard::rate_limit::{Fleet, RateLimit, RateLimitConfig};
use stormguard::reqwest::StormguardMiddleware;
use stormguard::stream::StreamInterrupted;
use stormguard_examples::gateway::{HEALTHZ, Health, METRICS, Refused, Route, Running};
use stormguard_examples::mock::{
    self, CHAT_COMPLETIONS, Fault, MESSAGES, MockConfig, StatsSnapshot, Transcript,
};
use stormguard_examples::throttled;
use tokio::time::Instant;

/// Requests arrive at this pace whatever happens to the earlier ones (an open loop, like users):
/// 200 per second.
const INTERVAL: Duration = Duration::from_millis(5);
const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;
/// The same request, asking for a streamed answer of [`STREAM_TOKENS`].
const STREAM_BODY: &str = r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16,"stream":true}"#;
/// The `max_tokens` of [`STREAM_BODY`]: the mock streams that many words.
const STREAM_TOKENS: u32 = 16;

/// The `--stream` provider of a burst: 3% of its streams fail with an error event before
/// content, 3% are cut mid-stream.
const BURST_STREAM_FAULTS: (u32, u32) = (3, 3);
/// The `--stream` provider when the gateway serves callers in other processes (`--listen`): 5%
/// and 10%, so that a few dozen requests sent one after the other see several cuts (at 3%, one
/// run of 48 in four would see none), and yet the retries and continuations they need (about
/// one request in six) stay within the default retry budget (10% of successes plus 10 in any
/// 10 s).
const SERVED_STREAM_FAULTS: (u32, u32) = (5, 10);

/// The quota the gateways started with `--redis` share: 1,200 requests a minute.
const SHARED_QUOTA: u32 = 1_200;

/// The longest `--serve`: an hour.
const MAX_SERVE: Duration = Duration::from_secs(3_600);

const USAGE: &str = "usage: axum_gateway [--failover | --stream [--listen ADDR] | --redis URL] \
                     [--serve SECS]";

/// What the command line asks for.
enum Mode {
    /// The flaky provider, then the total outage.
    Phases,
    Failover,
    Stream,
    /// `--stream --listen ADDR`: serve callers at `ADDR` until stopped.
    ServeStreams(SocketAddr),
    Redis(String),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mode, serve) = parse_args(std::env::args().skip(1))?;
    // Each phase sends its usual number of requests, or as many as `--serve` lasts.
    let requests = |usual: usize| match serve {
        Some(serve) => usize::try_from(serve.as_millis() / INTERVAL.as_millis()).unwrap_or(usual),
        None => usual,
    };
    match mode {
        Mode::Redis(url) => shared_quota(&url, requests(1_000)).await,
        Mode::Failover => failover(requests(400)).await,
        Mode::Stream => streams(requests(400)).await,
        Mode::ServeStreams(listen) => serve_streams(listen).await,
        Mode::Phases => {
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
            let name = "flaky provider (10% errors)";
            phase(name, "mock-flaky", flaky, requests(400), Route::Direct).await?;
            let outage = MockConfig::outage(Fault::Unavailable);
            let name = "total outage (100% 503)";
            phase(name, "mock-outage", outage, requests(400), Route::Direct).await
        }
    }
}

/// The mode and the `--serve` duration, if any. `--listen` goes with `--stream` only, and not
/// with `--serve`: a gateway serving others sends no requests of its own.
fn parse_args(
    mut args: impl Iterator<Item = String>,
) -> Result<(Mode, Option<Duration>), Box<dyn std::error::Error>> {
    let (mut mode, mut serve, mut listen) = (None, None, None);
    while let Some(arg) = args.next() {
        let chosen = match arg.as_str() {
            "--failover" => Mode::Failover,
            "--stream" => Mode::Stream,
            "--redis" => Mode::Redis(args.next().ok_or(USAGE)?),
            "--serve" => {
                let secs: u64 = args.next().ok_or(USAGE)?.parse()?;
                serve = Some(Duration::from_secs(secs).min(MAX_SERVE));
                continue;
            }
            "--listen" => {
                listen = Some(args.next().ok_or(USAGE)?.parse::<SocketAddr>()?);
                continue;
            }
            _ => return Err(USAGE.into()),
        };
        if mode.replace(chosen).is_some() {
            return Err(USAGE.into());
        }
    }
    let mode = match (mode.unwrap_or(Mode::Phases), listen) {
        (mode, None) => mode,
        (Mode::Stream, Some(listen)) if serve.is_none() => Mode::ServeStreams(listen),
        _ => return Err(USAGE.into()),
    };
    Ok((mode, serve))
}

/// The OpenAI-style provider is down; the backup takes its traffic, asked for its own model.
async fn failover(requests: usize) -> Result<(), Box<dyn std::error::Error>> {
    let name = "failover: the primary in a total outage, a backup with another model";
    let route = Route::Failover(MockConfig::healthy());
    let outage = MockConfig::outage(Fault::Unavailable);
    phase(name, "openai", outage, requests, route).await
}

/// A healthy provider whose quota the gateways share through the Redis at `url`: 1,000
/// requests in 5 s, five times the quota's pace.
async fn shared_quota(url: &str, requests: usize) -> Result<(), Box<dyn std::error::Error>> {
    let fleet = Fleet::new(url)?.with_prefix("stormguard:example:axum_gateway");
    let quota = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(SHARED_QUOTA))
            .with_fleet(fleet.clone()),
    );
    let name = format!("a quota of {SHARED_QUOTA} requests a minute shared through {url}");
    let route = Route::Quota(quota, Some(fleet.clone()));
    phase(&name, "mock-quota", MockConfig::default(), requests, route).await?;
    let fleet = fleet.snapshot();
    println!(
        "fleet: {} replicas, {} decisions in Redis, {} on the local share",
        fleet.replicas, fleet.fleet_decisions, fleet.local_decisions
    );
    Ok(())
}

/// Starts a gateway in front of a provider named `provider`, started with `config`, and says
/// where it listens.
async fn start(
    name: &str,
    provider: &str,
    config: MockConfig,
    route: Route,
) -> Result<Running, Box<dyn std::error::Error>> {
    let gateway = Running::start(provider, config, route).await?;
    println!(
        "-- {name}: the gateway listens on {} ({METRICS}, {HEALTHZ})",
        gateway.addr
    );
    Ok(gateway)
}

/// Runs a burst of chat requests through a gateway in front of `provider` and prints what the
/// callers got, what the gateway answered itself and what the provider (and the backup) saw.
async fn phase(
    name: &str,
    provider: &str,
    config: MockConfig,
    requests: usize,
    route: Route,
) -> Result<(), Box<dyn std::error::Error>> {
    let gateway = start(name, provider, config, route).await?;
    let callers = callers();
    let url = gateway.url.clone();
    let (answers, elapsed) = burst(requests, move || chat(callers.clone(), url.clone())).await?;
    let Answers {
        ok,
        failed,
        dropped,
        errors,
    } = Answers::count(answers);
    let received = gateway.received.clone();
    let refused = gateway.refused.clone();
    let health = gateway.health.clone();
    let status = health.status();
    let (stats, backup_stats) = gateway.stop().await;

    println!("== {name}");
    println!(
        "{requests} requests at {:.0}/s through the gateway, done in {elapsed:.2?}",
        1.0 / INTERVAL.as_secs_f64()
    );
    println!(
        "callers got {ok} ok, {failed} failed responses, {dropped} dropped by their own throttle, \
         {errors} other errors; the gateway received {} attempts",
        received.load(std::sync::atomic::Ordering::Relaxed)
    );
    print_upstream(&refused, &stats, &health, status);
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

/// Prints what happened upstream of the gateway: the calls it answered itself, the attempts
/// that reached the provider, its budget and throttle, and `status`, its `/healthz` at the end
/// of the burst.
fn print_upstream(refused: &Refused, stats: &StatsSnapshot, health: &Health, status: &str) {
    let first_tries = stats.by_attempt_header.get(&0).copied().unwrap_or(0);
    let budget = health.budget().snapshot();
    let probability = health
        .throttle()
        .map_or(0.0, |throttle| throttle.snapshot().probability);
    println!(
        "the gateway answered {} upstream calls itself: {} throttled, {} refused by the open \
         breaker, {} over the quota, {} past the deadline, {} failed",
        refused.total(),
        refused.throttled(),
        refused.breaker_open(),
        refused.rate_limited(),
        refused.deadline(),
        refused.failed()
    );
    println!(
        "attempts to the provider {} ({} retries by the gateway), statuses {:?}",
        stats.attempts,
        stats.attempts.saturating_sub(first_tries),
        stats.by_status
    );
    println!(
        "gateway budget, its last 10 s: {} retries granted, {} refused; gateway throttle: drop \
         probability {probability:.2}; /healthz at the end of the burst: {status}",
        budget.withdrawals, budget.rejected
    );
}

/// The provider of `--stream`: of its streams, `percent.0` in a hundred fail with an error event
/// before any content, `percent.1` are cut mid-stream.
fn stream_provider(percent: (u32, u32)) -> MockConfig {
    MockConfig {
        error_rate: f64::from(percent.0 + percent.1) / 100.0,
        faults: vec![
            (Fault::ErrorBeforeContent, percent.0),
            (Fault::CutMidStream, percent.1),
        ],
        ..MockConfig::default()
    }
}

/// How `stream_provider(percent)` fails its streams, in words.
fn stream_faults(percent: (u32, u32)) -> String {
    format!(
        "{}% errors before content, {}% cut mid-stream",
        percent.0, percent.1
    )
}

/// Callers stream their answers (`"stream": true`) through the gateway from a provider whose
/// streams fail after their `200`: an error frame before any content (the gateway's upstream
/// `ClientLayer` retries it) or a cut mid-stream (never restarted: the gateway's `ClientLayer`
/// asks the provider for the rest, the text received as an assistant prefill, and splices the
/// answer in). Either way the callers read whole answers, every word once; a stream the gateway
/// cannot complete (its retry budget spent) ends with the in-band error event, and the
/// callers' bodies with `StreamInterrupted`.
async fn streams(requests: usize) -> Result<(), Box<dyn std::error::Error>> {
    let provider = stream_provider(BURST_STREAM_FAULTS);
    let name = "streams";
    let gateway = start(name, "mock-streams", provider, Route::Direct).await?;
    let callers = callers();
    let url = gateway.url.clone();
    let (answers, elapsed) = burst(requests, move || stream(callers.clone(), url.clone())).await?;
    let budget = gateway.health.budget().snapshot();
    let (stats, _) = gateway.stop().await;
    let mut tally = StreamTally::count(answers);

    println!("== streams: {}", stream_faults(BURST_STREAM_FAULTS));
    println!(
        "{requests} streamed requests at {:.0}/s through the gateway, done in {elapsed:.2?}",
        1.0 / INTERVAL.as_secs_f64()
    );
    println!(
        "callers got {} clean streams ({} of them the whole answer, every word once), {} \
         interrupted after content (StreamInterrupted), {} failed responses, {} dropped, {} other \
         errors",
        tally.clean, tally.whole, tally.interrupted, tally.failed, tally.dropped, tally.errors
    );
    println!(
        "the provider began {} streams in {} attempts: {} error frames before content (retried), \
         {} cut mid-stream, {} continuation attempts (with a prefill); gateway budget, its last \
         10 s: {} retries granted, {} refused",
        stats.streams,
        stats.attempts,
        stats.stream_errors,
        stats.streams_cut,
        stats.prefilled,
        budget.withdrawals,
        budget.rejected
    );
    println!(
        "content chunks: {} sent by the provider, {} delivered to callers ({} in interrupted \
         streams); medians: first bytes after {:.0?}, the end after {:.0?}",
        stats.content_chunks,
        tally.delivered,
        tally.delivered_cut,
        median(&mut tally.first_bytes),
        median(&mut tally.ends)
    );
    Ok(())
}

/// Serves callers in other processes (a Python SDK, for one) at `listen` until
/// the process is stopped, with no burst of its own: the `--stream` provider, its streams failed
/// at [`SERVED_STREAM_FAULTS`].
async fn serve_streams(listen: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let provider = stream_provider(SERVED_STREAM_FAULTS);
    let name = format!("streams ({})", stream_faults(SERVED_STREAM_FAULTS));
    let gateway = Running::start_on(listen, "mock-streams", provider, Route::Direct).await?;
    println!(
        "-- {name}: the gateway listens on http://{} (POST {CHAT_COMPLETIONS}, POST {MESSAGES}; \
         GET {METRICS}, {HEALTHZ}) until it is stopped",
        gateway.addr
    );
    std::future::pending::<()>().await;
    gateway.stop().await;
    Ok(())
}

/// What the callers of a `--stream` burst got, counted.
#[derive(Default)]
struct StreamTally {
    clean: usize,
    /// Clean streams whose text is the provider's whole answer, every word once, in order.
    whole: usize,
    interrupted: usize,
    failed: usize,
    dropped: usize,
    errors: usize,
    /// Content events delivered, and those of them in interrupted streams.
    delivered: usize,
    delivered_cut: usize,
    first_bytes: Vec<Duration>,
    ends: Vec<Duration>,
}

impl StreamTally {
    fn count(answers: Vec<StreamAnswer>) -> Self {
        let mut tally = Self::default();
        for answer in answers {
            match answer {
                StreamAnswer::Read {
                    content,
                    whole,
                    first_bytes,
                    end,
                    ended,
                } => {
                    tally.delivered += content;
                    tally.first_bytes.push(first_bytes);
                    tally.ends.push(end);
                    match ended {
                        Ended::Clean => {
                            tally.clean += 1;
                            tally.whole += usize::from(whole);
                        }
                        Ended::Interrupted => {
                            tally.interrupted += 1;
                            tally.delivered_cut += content;
                        }
                        Ended::Otherwise => tally.errors += 1,
                    }
                }
                StreamAnswer::Failed => tally.failed += 1,
                StreamAnswer::Dropped => tally.dropped += 1,
                StreamAnswer::Error => tally.errors += 1,
            }
        }
        tally
    }
}

/// What a caller got when it asked for a stream.
enum StreamAnswer {
    /// A `2xx` whose body it read: the content events in it, whether its text is the whole
    /// answer, when its first bytes and its end came (from the request's start), and how it
    /// ended.
    Read {
        content: usize,
        whole: bool,
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

/// Posts a chat request at `url`: what the caller got.
async fn chat(callers: ClientWithMiddleware, url: String) -> Answer {
    match callers.post(&url).body(BODY).send().await {
        Ok(response) if response.status().is_success() => Answer::Ok,
        Ok(_) => Answer::Failed,
        Err(error) if throttled(&error) => Answer::Dropped,
        Err(_) => Answer::Error,
    }
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
        whole: read.text() == mock::streamed_text(STREAM_TOKENS),
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

/// Callers with retries of their own, which honour the gateway's `x-should-retry: false`. They
/// run in the gateway's process, so their engine's metrics are in its `/metrics` too, under the
/// name of what they call: `gen_ai_provider_name="gateway"`.
fn callers() -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(
            ClientLayer::default()
                .with_name("gateway")
                .with_backoff(FullJitter::new(
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

/// What a caller got.
enum Answer {
    Ok,
    Failed,
    Dropped,
    Error,
}

/// How many callers of a phase got each [`Answer`].
#[derive(Default)]
struct Answers {
    ok: usize,
    failed: usize,
    dropped: usize,
    errors: usize,
}

impl Answers {
    /// Counts `answers` by kind.
    fn count(answers: Vec<Answer>) -> Self {
        let mut count = Self::default();
        for answer in answers {
            match answer {
                Answer::Ok => count.ok += 1,
                Answer::Failed => count.failed += 1,
                Answer::Dropped => count.dropped += 1,
                Answer::Error => count.errors += 1,
            }
        }
        count
    }
}
