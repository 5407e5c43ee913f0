//! What stormguard's protections cost per request, side by side with tower's `retry` and
//! tower-resilience, in one run:
//!
//! * `success`: the inner service answers 200 at once; one thread;
//! * `threads`: the same, from one and from two threads that share one budget and one throttle
//!   (and tower's and tower-resilience's shared state), for the scaling ratio;
//! * `failure`: every request is answered 503 and then 200 on its retry, with zero-length
//!   backoffs, so that the retry machinery runs but nothing sleeps.
//!
//! `cargo bench -p stormguard-benches` runs everything and ends with a table of the ratios against
//! the targets of docs/PERFORMANCE.md, read back from criterion's estimates.
//!
//! For profilers, `STORMGUARD_BENCH_PROFILE=success/stormguard_client` (any `group/variant` of the
//! one-thread groups) skips criterion and sends `STORMGUARD_BENCH_REQUESTS` requests (default
//! 100 000) through that variant on each of `STORMGUARD_BENCH_THREADS` threads (default 1), e.g.
//! under `valgrind --tool=callgrind` or `perf`.

use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Ready, poll_fn, ready};
use std::hint::black_box;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, LazyLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::Full;
use stormguard::budget::RetryBudget;
use stormguard::deadline::{Deadline, propagate};
use stormguard::jitter::Constant;
use stormguard::retry::{ensure_idempotency_key, stamp_attempt};
use stormguard::throttle::AdaptiveThrottle;
use stormguard::{ClientLayer, DEFAULT_CLIENT_TIMEOUT};
use tokio::runtime::Runtime;
use tower::retry::Policy;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_resilience::circuitbreaker::CircuitBreakerLayer;
use tower_resilience::retry::{RetryBudgetBuilder, RetryLayer as ResilienceRetryLayer};

type Req = Request<Full<Bytes>>;
type Res = Response<Full<Bytes>>;

/// A small chat-completion request, as an LLM client sends it.
const CHAT_REQUEST: &[u8] = br#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"Say hello in one word."}]}"#;

/// A small chat-completion answer.
const CHAT_RESPONSE: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}"#;

/// The JSON error body of an overloaded provider.
const OVERLOADED: &[u8] =
    br#"{"error":{"message":"The server is overloaded.","type":"server_error","code":null}}"#;

/// Requests per profiling run unless `STORMGUARD_BENCH_REQUESTS` says otherwise.
const PROFILE_REQUESTS: u64 = 100_000;

/// Parsed once, as a client keeps its endpoint: every request gets a cheap clone.
static ENDPOINT: LazyLock<Uri> =
    LazyLock::new(|| Uri::from_static("http://llm.invalid/v1/chat/completions"));

fn chat_request() -> Req {
    let mut request = Request::new(Full::new(Bytes::from_static(CHAT_REQUEST)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = ENDPOINT.clone();
    request.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    request
}

fn answer(status: StatusCode, body: &'static [u8]) -> Res {
    let mut response = Response::new(Full::new(Bytes::from_static(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The backend of the success path: 200 at once.
fn healthy(_request: Req) -> Ready<Result<Res, Infallible>> {
    ready(Ok(answer(StatusCode::OK, CHAT_RESPONSE)))
}

/// The backend of the failure path: 503, 200, 503, 200 ... so that every request through a
/// retrying layer fails once and succeeds on its first retry.
#[derive(Clone, Default)]
struct Flaky {
    calls: Arc<AtomicU64>,
}

impl Service<Req> for Flaky {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Req) -> Self::Future {
        let response = if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            answer(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED)
        } else {
            answer(StatusCode::OK, CHAT_RESPONSE)
        };
        ready(Ok(response))
    }
}

/// Which path a set of variants is built for. The failure path gets budgets that never refuse
/// (every request retries once, far above any sane ratio) and zero-length backoffs, so that it
/// measures the machinery of a retry and not a budget's refusal or a sleep.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Success,
    Failure,
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

/// Something that benchmarks (or profiles) one variant.
trait Visit {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug;
}

/// Every variant over `inner`, for `path`. The failure path leaves out the bare service (it does
/// not retry) and the circuit breaker (a 50% failure rate is what it exists to trip on).
fn each_variant<I, V>(inner: I, path: Path, visit: &mut V)
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
        // The same tower retry, made to write what DESIGN.md asks the retry engine to put on
        // every request (an `Idempotency-Key` on a POST, `x-retry-attempt`), with stormguard's
        // own header functions: the cost of the contract alone, without any of the engine.
        let retry = tower::retry::RetryLayer::new(TpsPolicy::new(path));
        visit.variant(
            "tower_retry_contract",
            retry.layer(inner.clone()).map_request(|mut request: Req| {
                ensure_idempotency_key(request.headers_mut());
                stamp_attempt(request.headers_mut(), 0, false);
                request
            }),
        );
        // And what the client stack adds to that: a deadline in the extensions and its
        // `x-request-timeout-ms`.
        let retry = tower::retry::RetryLayer::new(TpsPolicy::new(path));
        visit.variant(
            "tower_client_contract",
            retry.layer(inner.clone()).map_request(|mut request: Req| {
                Deadline::after(DEFAULT_CLIENT_TIMEOUT).apply_to(&mut request);
                propagate::stamp(&mut request, propagate::DEFAULT_MARGIN);
                ensure_idempotency_key(request.headers_mut());
                stamp_attempt(request.headers_mut(), 0, false);
                request
            }),
        );
    }

    // Each variant gets budgets of its own.
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
    let generous = || RetryBudget::new(Duration::from_secs(10), u32::MAX, 1000.0);

    let resilience = ResilienceRetryLayer::<Req, Res, Infallible>::builder()
        .max_attempts(3)
        .fixed_backoff(Duration::ZERO)
        .retry_on_response(is_server_error)
        .budget(token_bucket())
        .build();
    visit.variant("resilience_retry", resilience.layer(inner.clone()));

    if path == Path::Success {
        let (breaker, _handle) = CircuitBreakerLayer::builder()
            .failure_classifier(|result: &Result<Res, Infallible>| {
                result.as_ref().is_ok_and(is_server_error)
            })
            .build_with_handle()
            .expect("valid breaker");
        let retry = ResilienceRetryLayer::builder()
            .max_attempts(3)
            .fixed_backoff(Duration::ZERO)
            .retry_on_response(is_server_error)
            .budget(token_bucket())
            .build();
        visit.variant(
            "resilience_retry_breaker",
            retry.layer(breaker.layer(inner.clone())),
        );
    }

    match path {
        Path::Success => {
            visit.variant(
                "stormguard_retry",
                stormguard::retry::RetryLayer::new().layer(inner.clone()),
            );
            visit.variant("stormguard_client", ClientLayer::default().layer(inner));
        }
        Path::Failure => {
            let backoff = Constant::new(Duration::ZERO);
            let retry = stormguard::retry::RetryLayer::new()
                .budget(generous())
                .backoff(backoff.clone());
            visit.variant("stormguard_retry", retry.layer(inner.clone()));
            // Every request is rejected once: with the default K = 2 the throttle's drop
            // probability sits exactly at its threshold and random-walks (a drop counts as a
            // request without an accept), so the failure path gets K = 3, as it gets budgets that
            // never refuse.
            let client = ClientLayer::default()
                .budget(generous())
                .throttle(AdaptiveThrottle::new(3.0, AdaptiveThrottle::DEFAULT_WINDOW))
                .backoff(backoff);
            visit.variant("stormguard_client", client.layer(inner));
        }
    }
}

/// Requests that had to wait on the runtime (see [`send`]); expected to stay zero.
static WAITED: AtomicU64 = AtomicU64::new(0);

/// Requests sent by [`in_parallel`] that did not end in a 200 (an error, or a failure the retry
/// gave up on); reported by the profiling mode.
static NOT_OK: AtomicU64 = AtomicU64::new(0);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// Sends one request as a caller does (`poll_ready`, then `call`), inside the runtime's context
/// (the caller holds `runtime.enter()`: the deadline layer's timer needs it), polling with a no-op
/// waker. Every variant completes on its first poll here, so no variant pays for a scheduler; a
/// future that does wait is handed to `block_on` and counted in [`WAITED`].
fn send<S, B>(runtime: &Runtime, service: &mut S, request: Req) -> Result<Response<B>, S::Error>
where
    S: Service<Req, Response = Response<B>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match service.poll_ready(&mut cx) {
        Poll::Ready(ready) => ready?,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(poll_fn(|cx| service.poll_ready(cx)))?;
        }
    }
    let mut future = pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(future)
        }
    }
}

/// Before measuring: one request must come back 200, having made `calls` backend calls.
fn check<S, B>(name: &str, runtime: &Runtime, service: &mut S, calls: Option<&AtomicU64>)
where
    S: Service<Req, Response = Response<B>>,
    S::Error: fmt::Debug,
{
    let before = calls.map(|calls| calls.load(Ordering::Relaxed));
    let response = send(runtime, service, chat_request());
    let status = response.as_ref().map(Response::status);
    assert!(matches!(status, Ok(StatusCode::OK)), "{name}: {:?}", status);
    if let (Some(calls), Some(before)) = (calls, before) {
        let made = calls.load(Ordering::Relaxed) - before;
        assert_eq!(made, 2, "{name}: one failure and one retry per request");
    }
}

/// One thread, `b.iter`: the per-request cost.
struct OneThread<'a, 'c> {
    label: &'static str,
    group: &'a mut BenchmarkGroup<'c, WallTime>,
    runtime: &'a Runtime,
    calls: Option<Arc<AtomicU64>>,
}

impl Visit for OneThread<'_, '_> {
    fn variant<S, B>(&mut self, name: &'static str, mut service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        let runtime = self.runtime;
        check(name, runtime, &mut service, self.calls.as_deref());
        WAITED.store(0, Ordering::Relaxed);
        self.group.bench_function(name, |b| {
            b.iter(|| black_box(send(runtime, &mut service, chat_request())))
        });
        let waited = WAITED.swap(0, Ordering::Relaxed);
        if waited > 0 {
            println!(
                "{}/{name}: {waited} requests waited on the runtime",
                self.label
            );
        }
    }
}

/// One and two threads, each with its own runtime and its own clone of the service (so of its
/// shared state), timed from a common start to the last thread's end.
struct Threads<'a, 'c> {
    group: &'a mut BenchmarkGroup<'c, WallTime>,
}

impl Visit for Threads<'_, '_> {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        for threads in [1_usize, 2] {
            self.group.throughput(Throughput::Elements(threads as u64));
            self.group.bench_with_input(
                BenchmarkId::new(name, threads),
                &threads,
                |b, &threads| b.iter_custom(|iters| in_parallel(&service, threads, iters)),
            );
        }
    }
}

/// `threads` threads send `iters` requests each through clones of `service`; returns the time from
/// the first start to the last end. Spawning threads and building runtimes is not timed.
fn in_parallel<S, B>(service: &S, threads: usize, iters: u64) -> Duration
where
    S: Service<Req, Response = Response<B>> + Clone + Send,
{
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let mut service = service.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    let runtime = runtime();
                    let _context = runtime.enter();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let response = black_box(send(&runtime, &mut service, chat_request()));
                        if !response.is_ok_and(|response| response.status() == StatusCode::OK) {
                            NOT_OK.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|span| span.0).min();
    let end = spans.iter().map(|span| span.1).max();
    match (start, end) {
        (Some(start), Some(end)) => end - start,
        _ => Duration::ZERO,
    }
}

fn success(c: &mut Criterion) {
    let runtime = runtime();
    let _context = runtime.enter();
    let mut group = c.benchmark_group("success");
    group.throughput(Throughput::Elements(1));
    let mut visit = OneThread {
        label: "success",
        group: &mut group,
        runtime: &runtime,
        calls: None,
    };
    each_variant(service_fn(healthy), Path::Success, &mut visit);
    group.finish();
}

fn threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("threads");
    each_variant(
        service_fn(healthy),
        Path::Success,
        &mut Threads { group: &mut group },
    );
    group.finish();
}

/// Pairs of back-to-back runs (one thread, then two) per variant for the scaling ratio.
const SCALING_PAIRS: usize = 15;

/// About how long the one-thread run of a pair lasts.
const SCALING_RUN: Duration = Duration::from_millis(30);

/// The scaling ratio measured in pairs: a one-thread run and a two-thread run of the same
/// per-thread count, back to back, so that both see the same machine (on a shared machine the
/// load drifts between criterion's separate one- and two-thread benchmarks). Each pair gives
/// `2 x t(1 thread) / t(2 threads)`; the report shows their median and range.
#[derive(Default)]
struct Scaling {
    ratios: Vec<(&'static str, Vec<f64>)>,
}

impl Visit for Scaling {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        const PROBE: u64 = 2_000;
        let probe = in_parallel(&service, 1, PROBE).as_secs_f64().max(1e-9);
        let iters = (PROBE as f64 * SCALING_RUN.as_secs_f64() / probe).max(1_000.0) as u64;
        let mut ratios: Vec<f64> = (0..SCALING_PAIRS)
            .map(|_| {
                let one = in_parallel(&service, 1, iters).as_secs_f64();
                let two = in_parallel(&service, 2, iters).as_secs_f64();
                2.0 * one / two
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        self.ratios.push((name, ratios));
    }
}

/// Whether the command line's filter (if any) selects `group`.
fn selected(group: &str) -> bool {
    let mut free = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .peekable();
    free.peek().is_none() || free.any(|filter| group.contains(&filter))
}

/// Rounds of interleaved one-thread runs, for the overhead ratios of targets 1 and 2.
const ROUNDS: usize = 15;

/// About how long each variant runs in a round.
const ROUND_RUN: Duration = Duration::from_millis(20);

/// The one-thread overheads measured in rounds: every variant runs for about [`ROUND_RUN`] in each
/// round (in an order that rotates from round to round), and each round gives every ratio from its
/// own runs. Criterion measures the variants seconds apart, and this machine's speed drifts by
/// more than the differences between some of them; a ratio taken within a round sees one machine.
#[derive(Default)]
struct Rounds {
    runners: Vec<(&'static str, Runner)>,
}

/// Sends `n` requests through one variant on a thread of its own; returns the time taken.
type Runner = Box<dyn FnMut(u64) -> Duration>;

impl Visit for Rounds {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        self.runners
            .push((name, Box::new(move |n| in_parallel(&service, 1, n))));
    }
}

impl Rounds {
    /// Nanoseconds per request, per variant, per round.
    fn run(mut self) -> Vec<(&'static str, Vec<f64>)> {
        const PROBE: u64 = 2_000;
        let counts: Vec<u64> = self
            .runners
            .iter_mut()
            .map(|(_, run)| {
                let probe = run(PROBE).as_secs_f64().max(1e-9);
                (PROBE as f64 * ROUND_RUN.as_secs_f64() / probe).max(1_000.0) as u64
            })
            .collect();
        let variants = self.runners.len();
        let mut times = vec![Vec::with_capacity(ROUNDS); variants];
        for round in 0..ROUNDS {
            for k in 0..variants {
                let i = (k + round) % variants;
                let elapsed = (self.runners[i].1)(counts[i]);
                times[i].push(elapsed.as_nanos() as f64 / counts[i] as f64);
            }
        }
        self.runners
            .iter()
            .map(|(name, _)| *name)
            .zip(times)
            .collect()
    }
}

fn failure(c: &mut Criterion) {
    let runtime = runtime();
    let _context = runtime.enter();
    let mut group = c.benchmark_group("failure");
    group.throughput(Throughput::Elements(1));
    let flaky = Flaky::default();
    let mut visit = OneThread {
        label: "failure",
        group: &mut group,
        runtime: &runtime,
        calls: Some(Arc::clone(&flaky.calls)),
    };
    each_variant(flaky, Path::Failure, &mut visit);
    group.finish();
}

/// Runs one variant `requests` times, for a profiler.
struct Profile {
    name: String,
    requests: u64,
    threads: usize,
    found: bool,
}

impl Visit for Profile {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        if name != self.name {
            return;
        }
        self.found = true;
        let elapsed = in_parallel(&service, self.threads, self.requests);
        let per_second = (self.threads as u64 * self.requests) as f64 / elapsed.as_secs_f64();
        println!(
            "{} threads x {} requests in {elapsed:?}: {per_second:.0} requests/s, {} not 200, \
             {} waited",
            self.threads,
            self.requests,
            NOT_OK.load(Ordering::Relaxed),
            WAITED.load(Ordering::Relaxed)
        );
    }
}

fn profile(target: &str) {
    let requests = std::env::var("STORMGUARD_BENCH_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(PROFILE_REQUESTS);
    let threads = std::env::var("STORMGUARD_BENCH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let (group, name) = target.split_once('/').unwrap_or(("success", target));
    let mut visit = Profile {
        name: name.to_owned(),
        requests,
        threads,
        found: false,
    };
    match group {
        "success" => each_variant(service_fn(healthy), Path::Success, &mut visit),
        "failure" => each_variant(Flaky::default(), Path::Failure, &mut visit),
        _ => {}
    }
    assert!(
        visit.found,
        "no variant {target}: use success/NAME or failure/NAME"
    );
}

/// Where criterion keeps its estimates (the same lookup as criterion's, less `cargo metadata`).
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => PathBuf::from(target).join("criterion"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/criterion"),
    }
}

/// Median time per iteration of one benchmark, in nanoseconds, from the last run.
fn median(id: &str) -> Option<f64> {
    let path = criterion_home().join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(&text).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The targets of docs/PERFORMANCE.md, from the medians criterion just wrote and the paired
/// scaling runs.
fn report(scaling: &Scaling) {
    const VARIANTS: [&str; 8] = [
        "bare",
        "tower_retry_tps",
        "tower_retry_contract",
        "tower_client_contract",
        "resilience_retry",
        "resilience_retry_breaker",
        "stormguard_retry",
        "stormguard_client",
    ];
    let bare = median("success/bare");
    println!("\n== per request, one thread (median ns; overhead = minus bare)");
    for name in VARIANTS {
        if let Some(ns) = median(&format!("success/{name}")) {
            let overhead = bare.map_or(f64::NAN, |bare| ns - bare);
            println!("{name:<26} {ns:>8.1} ns   overhead {overhead:>8.1} ns");
        }
    }
    let overhead = |name: &str| Some(median(&format!("success/{name}"))? - bare?);
    if let (Some(client), Some(tower)) =
        (overhead("stormguard_client"), overhead("tower_retry_tps"))
    {
        println!(
            "target 1: stormguard_client overhead <= tower_retry_tps: {client:.1} vs {tower:.1} ns \
             (x{:.2}) {}",
            client / tower,
            verdict(client <= tower)
        );
    }
    if let (Some(ours), Some(theirs)) = (overhead("stormguard_retry"), overhead("resilience_retry"))
    {
        let ratio = theirs / ours;
        println!(
            "target 2: resilience_retry / stormguard_retry overhead >= 1.5: x{ratio:.2} {}",
            verdict(ratio >= 1.5)
        );
    }
    println!(
        "\n== criterion's threads group: requests/s with 1 and 2 threads (`bare` shares nothing: \
         its ratio is what the machine itself allows)"
    );
    let throughputs = |name: &str| {
        let one = median(&format!("threads/{name}/1"))?;
        let two = median(&format!("threads/{name}/2"))?;
        // An iteration is one request on each thread.
        Some((1e9 / one, 2e9 / two))
    };
    let ceiling = throughputs("bare").map(|(one, two)| two / one);
    for name in VARIANTS {
        if let Some((one, two)) = throughputs(name) {
            let ratio = two / one;
            println!(
                "{name:<26} {one:>10.0}/s {two:>10.0}/s  x{ratio:.3} (of bare's x{:.3}) {}",
                ceiling.unwrap_or(f64::NAN),
                verdict(ratio >= 1.6)
            );
        }
    }
    if !scaling.ratios.is_empty() {
        println!(
            "\n== scaling in {SCALING_PAIRS} back-to-back pairs of runs: median [min .. max] \
             (target >= 1.6)"
        );
        let middle = |ratios: &[f64]| ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
        let ceiling = scaling
            .ratios
            .iter()
            .find(|(name, _)| *name == "bare")
            .map_or(f64::NAN, |(_, ratios)| middle(ratios));
        for (name, ratios) in &scaling.ratios {
            let mid = middle(ratios);
            println!(
                "{name:<26} x{mid:.2} [{:.2} .. {:.2}]  {:>4.0}% of bare's x{ceiling:.2} {}",
                ratios.first().copied().unwrap_or(f64::NAN),
                ratios.last().copied().unwrap_or(f64::NAN),
                100.0 * mid / ceiling,
                verdict(mid >= 1.6)
            );
        }
    }
    println!("\n== failure path: 503 then 200, zero backoff (median ns per request)");
    let tower = median("failure/tower_retry_tps");
    let resilience = median("failure/resilience_retry");
    for name in VARIANTS {
        if let Some(ns) = median(&format!("failure/{name}")) {
            println!(
                "{name:<26} {ns:>10.1} ns  x{:.2} of tower_retry_tps, x{:.3} of resilience_retry",
                ns / tower.unwrap_or(f64::NAN),
                ns / resilience.unwrap_or(f64::NAN)
            );
        }
    }
}

/// The overhead ratios of targets 1 and 2, and against the contract rows, round by round.
fn report_rounds(rounds: &[(&'static str, Vec<f64>)]) {
    let Some((_, bare)) = rounds.iter().find(|(name, _)| *name == "bare") else {
        return;
    };
    let overheads = |wanted: &str| {
        rounds
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|(_, times)| {
                times
                    .iter()
                    .zip(bare)
                    .map(|(t, b)| t - b)
                    .collect::<Vec<_>>()
            })
    };
    let middle = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        let mid = values.get(values.len() / 2).copied().unwrap_or(f64::NAN);
        let low = values.first().copied().unwrap_or(f64::NAN);
        let high = values.last().copied().unwrap_or(f64::NAN);
        (mid, low, high)
    };
    println!(
        "\n== one thread, {ROUNDS} interleaved rounds: overhead over bare, median [min .. max] ns"
    );
    for (name, _) in rounds {
        if let Some(values) = overheads(name) {
            let (mid, low, high) = middle(values);
            println!("{name:<26} {mid:>8.1} [{low:.1} .. {high:.1}]");
        }
    }
    let ratio = |top: &str, bottom: &str| {
        let (top, bottom) = (overheads(top)?, overheads(bottom)?);
        Some(middle(
            top.iter().zip(&bottom).map(|(t, b)| t / b).collect(),
        ))
    };
    let lines = [
        (
            "target 1: stormguard_client / tower_retry_tps",
            "stormguard_client",
            "tower_retry_tps",
            "<= 1",
        ),
        (
            "target 2: resilience_retry / stormguard_retry",
            "resilience_retry",
            "stormguard_retry",
            ">= 1.5",
        ),
        (
            "stormguard_retry / tower_retry_contract",
            "stormguard_retry",
            "tower_retry_contract",
            "",
        ),
        (
            "stormguard_client / tower_client_contract",
            "stormguard_client",
            "tower_client_contract",
            "",
        ),
        (
            "resilience_retry / tower_retry_contract",
            "resilience_retry",
            "tower_retry_contract",
            "",
        ),
        (
            "tower_client_contract / tower_retry_tps",
            "tower_client_contract",
            "tower_retry_tps",
            "",
        ),
    ];
    for (label, top, bottom, target) in lines {
        if let Some((mid, low, high)) = ratio(top, bottom) {
            let verdict = match target {
                "<= 1" => verdict(mid <= 1.0),
                ">= 1.5" => verdict(mid >= 1.5),
                _ => "",
            };
            println!("{label:<48} x{mid:.2} [{low:.2} .. {high:.2}] {target} {verdict}");
        }
    }
}

fn main() {
    if let Some(target) = std::env::var_os("STORMGUARD_BENCH_PROFILE") {
        profile(&target.to_string_lossy());
        return;
    }
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    success(&mut criterion);
    threads(&mut criterion);
    failure(&mut criterion);
    criterion.final_summary();
    if std::env::args().any(|arg| arg == "--bench") {
        let mut scaling = Scaling::default();
        if selected("threads") {
            each_variant(service_fn(healthy), Path::Success, &mut scaling);
        }
        let rounds = if selected("success") {
            let mut rounds = Rounds::default();
            each_variant(service_fn(healthy), Path::Success, &mut rounds);
            rounds.run()
        } else {
            Vec::new()
        };
        report(&scaling);
        report_rounds(&rounds);
    }
}
