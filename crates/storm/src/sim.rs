//! Runs one pipeline through one scenario on virtual time.
//!
//! A current-thread tokio runtime with a paused clock: the clock jumps to the next timer
//! whenever every task is waiting, so a 60 s scenario takes as long as its CPU work. Nothing
//! reads the wall clock and every random draw is seeded, so a seed gives the same numbers on
//! every run.
//!
//! Arrivals are a Poisson process drawn per millisecond (tokio's timers have millisecond
//! resolution), at the scenario's rate or, in bursts, at the rate of the moment
//! ([`ArrivalProcess`]); each logical request is a task that calls the pipeline once and records
//! when and how it ended. Requests are a small chat completion, or, where the scenario gives
//! sizes, a chat completion of its prompt and `max_tokens` ([`llm_body`]). Requests that arrive within the scenario's duration are measured. Arrivals go on
//! after it, unmeasured, until every measured request has its answer: the last measured requests
//! meet the same load as the others instead of an idle provider. (A request a black hole holds
//! until the caller's patience runs out keeps them going that long.)
//!
//! Where the scenario has a second provider, both are simulated, each with its own model, and
//! the failover pipelines reach them through a [`Router`]; every other pipeline sends to the
//! primary alone.
//!
//! Where the provider streams (the `streams` scenario), each caller reads its answer's body to
//! the end, the only way to know what it was shown ([`Transcript`]): a request succeeds when its
//! stream is whole (`[DONE]`, then the end of the body, no error). The `naive` row's caller then
//! restarts a stream that failed (an error event, a body error), before or after content, from
//! the start: it sends the request again through its pipeline after [`NaivePolicy::INTERVAL`], at
//! most [`Pipeline::stream_restarts`] times. The tokens the new stream repeats are shown twice.
//! No other caller restarts anything.
//!
//! [`simulate_with_metrics`] also collects the metrics stormguard's engine emits
//! ([`dashboard`](crate::output::dashboard)) for the pipelines made of its layers: each measured request's
//! task is polled with the run's [`Collector`] as the thread's recorder, and a window of the
//! dashboard closes every [`WINDOW`] of the scenario's duration.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use stormguard::GiveUpCause;
use stormguard::breaker::{CircuitBreaker, State};
use stormguard::classify::LocalAnswer;
use stormguard::stream::StreamInterrupted;
use tokio::task::LocalSet;
use tokio::time::Instant;
use tower::timeout::Timeout;
use tower::{BoxError, Service, ServiceExt};
use tower_resilience::adaptive::ConcurrencyAlgorithm;

use crate::backend::{Backend, BackendStats, FINE_BUCKET, REQUEST_ID, TOKENS};
use crate::event_stream::{Ending, Transcript};
use crate::metrics::{
    Answer, Recorder, Series, StreamTally, Summary, capacity_figures, fleet_figures, summarize,
};
use crate::naive_hedge::NaiveHedge;
use crate::output::dashboard::{Collector, Dashboard, Recorded, WINDOW};
use crate::pipeline::{
    self, NaiveFailoverPolicy, NaivePolicy, Pipeline, Ranking, SimRequest, TowerPolicy,
};
use crate::router::Router;
use crate::scenario::{Arrivals, CALLER_PATIENCE, Fault, Scenario, TokenSizes};

/// The body every logical request sends where the scenario gives no sizes: a small chat
/// completion.
const REQUEST_BODY: &[u8] =
    br#"{"model":"storm-1","max_tokens":256,"messages":[{"role":"user","content":"Summarise the incident."}]}"#;

/// Bytes of prompt text per token: what `stormguard_deadline::TokenEstimate` (the rate limit's
/// weight of a request) reads a prompt at (its `BYTES_PER_TOKEN`).
pub(crate) const BYTES_PER_TOKEN: usize = 4;

/// The chat completion of `prompt` prompt tokens that allows `max_tokens` output tokens, as a
/// client weighs it (`TokenEstimate`: every string of `messages` at [`BYTES_PER_TOKEN`] bytes a
/// token, the role's 4 bytes included, and `max_tokens`): the content is `x`s, 4 bytes a token
/// less the role's 4. One allocation and a fill; the rate limit parses it once per request.
pub(crate) fn llm_body(prompt: u32, max_tokens: u32) -> Bytes {
    const ROLE: &str = "user";
    let content = (prompt as usize * BYTES_PER_TOKEN).saturating_sub(ROLE.len());
    let head = format!(
        r#"{{"model":"storm-1","max_tokens":{max_tokens},"messages":[{{"role":"{ROLE}","content":""#
    );
    const TAIL: &[u8] = br#""}]}"#;
    let mut body = Vec::with_capacity(head.len() + content + TAIL.len());
    body.extend_from_slice(head.as_bytes());
    body.resize(head.len() + content, b'x');
    body.extend_from_slice(TAIL);
    Bytes::from(body)
}

/// The arrivals of a scenario, drawn one millisecond at a time: a Poisson process at the
/// scenario's `qps`, or at the rate of the moment for bursts (the same draws on a clock that runs
/// at `rate / qps`, the time-rescaling of a Poisson process).
pub(crate) struct ArrivalProcess {
    rng: SmallRng,
    qps: f64,
    arrivals: Arrivals,
    /// When the next request arrives, on the process's clock (seconds).
    next: f64,
    /// The process's clock at the end of the last millisecond drawn (bursts only).
    clock: f64,
}

impl ArrivalProcess {
    /// The arrivals of `scenario`, from time zero.
    pub fn new(scenario: &Scenario) -> ArrivalProcess {
        let mut rng = SmallRng::seed_from_u64(scenario.seed);
        let qps = scenario.qps.max(f64::MIN_POSITIVE);
        let next = Self::gap(&mut rng, qps);
        ArrivalProcess {
            rng,
            qps,
            arrivals: scenario.arrivals,
            next,
            clock: 0.0,
        }
    }

    fn gap(rng: &mut SmallRng, qps: f64) -> f64 {
        -(1.0 - rng.random::<f64>()).ln() / qps
    }

    /// How many requests arrive in millisecond `ms`; call it for 0, 1, 2, ... in turn.
    pub(crate) fn tick(&mut self, ms: u64) -> u32 {
        let tick_end = match &self.arrivals {
            Arrivals::Poisson => (ms + 1) as f64 / 1_000.0,
            Arrivals::Bursts(bursts) => {
                let rate = bursts.rate_at(Duration::from_millis(ms));
                self.clock += rate / self.qps / 1_000.0;
                self.clock
            }
        };
        let mut count = 0;
        while self.next < tick_end {
            count += 1;
            self.next += Self::gap(&mut self.rng, self.qps);
        }
        count
    }
}

/// Draws each request's prompt and `max_tokens`, uniformly, in the order of the requests' ids.
struct SizeDraws {
    sizes: TokenSizes,
    rng: SmallRng,
}

impl SizeDraws {
    fn new(sizes: TokenSizes, seed: u64) -> SizeDraws {
        SizeDraws {
            sizes,
            rng: SmallRng::seed_from_u64(seed ^ 0x5123_70c3_e45e_0001),
        }
    }

    /// The next request's (prompt, `max_tokens`).
    fn draw(&mut self) -> (u32, u32) {
        let (prompt, output) = (self.sizes.prompt, self.sizes.max_tokens);
        (
            self.rng.random_range(prompt.0..=prompt.1.max(prompt.0)),
            self.rng.random_range(output.0..=output.1.max(output.0)),
        )
    }
}

/// The outcome of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The figures of the report.
    pub summary: Summary,
    /// Per-second series for the chart, and per-100 ms ones for a closer look.
    pub series: Series,
    /// The circuit breaker's state at the start of each [`FINE_BUCKET`] (100 ms) of the scenario's
    /// duration (the primary's, for a failover); empty for a pipeline without a breaker.
    pub breaker: Vec<State>,
    /// The concurrency limit at the start of each [`FINE_BUCKET`] (100 ms) of the scenario's
    /// duration; empty for a pipeline without one.
    pub limits: Vec<u32>,
    /// The metrics stormguard's engine emitted for the measured requests
    /// ([`simulate_with_metrics`], pipelines made of stormguard's layers); `None` otherwise.
    pub metrics: Option<Dashboard>,
}

/// Run `pipeline` through `scenario`; `on_second` is called after each second of virtual time.
///
/// A failover pipeline needs a scenario with a second provider ([`Scenario::secondary`]); every
/// other pipeline sends to the primary alone.
pub fn simulate(
    scenario: &Scenario,
    pipeline: Pipeline,
    on_second: impl Fn() + 'static,
) -> Result<Run, BoxError> {
    drive(scenario, pipeline, None, on_second)
}

/// [`simulate`], and collect the metrics stormguard's engine emits for the measured requests
/// into [`Run::metrics`], if the pipeline is made of stormguard's layers
/// ([`Pipeline::uses_stormguard`]). The run's figures are those [`simulate`] gives.
pub(crate) fn simulate_with_metrics(
    scenario: &Scenario,
    pipeline: Pipeline,
    on_second: impl Fn() + 'static,
) -> Result<Run, BoxError> {
    let collector = pipeline
        .uses_stormguard()
        .then(|| Rc::new(Collector::new()));
    drive(scenario, pipeline, collector, on_second)
}

/// Run `pipeline` through `scenario`, its measured requests recorded by `collector` if there is
/// one.
fn drive(
    scenario: &Scenario,
    pipeline: Pipeline,
    collector: Option<Rc<Collector>>,
    on_second: impl Fn() + 'static,
) -> Result<Run, BoxError> {
    check(scenario, pipeline)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let local = LocalSet::new();
    let recorder = Rc::new(RefCell::new(Recorder::healthy_until(scenario.fault.start)));
    let on_second: Rc<dyn Fn()> = Rc::new(on_second);
    let states = Rc::new(RefCell::new(Vec::new()));
    let opened = Rc::new(RefCell::new(Vec::new()));
    let limits = Rc::new(RefCell::new(Vec::new()));
    let providers = local.block_on(&runtime, async {
        let epoch = Instant::now();
        let providers = providers(scenario, epoch);
        let driver = Driver {
            scenario: scenario.clone(),
            restarts: pipeline.stream_restarts(),
            epoch,
            recorder: recorder.clone(),
            collector: collector.clone(),
            on_second,
            backends: providers.clone(),
        };
        let watched = start(pipeline, scenario, &providers, driver)?;
        if let Some(breaker) = watched.breaker {
            let watch = watch(breaker, epoch, scenario.duration, states.clone());
            tokio::task::spawn_local(watch);
        }
        if let Some(limit) = watched.limit {
            let watch = watch_limit(limit, epoch, scenario.duration, limits.clone());
            tokio::task::spawn_local(watch);
        }
        if !watched.dying.is_empty() {
            let fault = scenario.fault;
            let watch = watch_opening(watched.dying, epoch, fault, opened.clone());
            tokio::task::spawn_local(watch);
        }
        Ok::<_, BoxError>(providers)
    })?;
    // Every pipeline answers within its deadline or attempt timeouts, unless a black hole holds
    // an attempt with no timeout; this bound guarantees that a run ends. Requests still
    // unanswered by then count as failures.
    let limit = scenario.duration.saturating_add(CALLER_PATIENCE);
    let _ = runtime.block_on(async { tokio::time::timeout(limit, local).await });
    let stats: Vec<BackendStats> = providers
        .iter()
        .map(|provider| provider.model().stats().clone())
        .collect();
    let (mut summary, series) = summarize(pipeline.as_str(), scenario, recorder.take(), &stats);
    summary.fleet = fleet_figures(scenario, &stats, &opened.take());
    let limits = limits.take();
    summary.capacity = capacity_figures(scenario, &series, &limits);
    Ok(Run {
        summary,
        series,
        breaker: states.take(),
        limits,
        metrics: collector.map(|collector| collector.dashboard()),
    })
}

/// Whether `pipeline` can run through `scenario`: the failover rows need two providers, the
/// balance rows deployments.
fn check(scenario: &Scenario, pipeline: Pipeline) -> Result<(), BoxError> {
    if pipeline.fails_over() && scenario.secondary().is_none() {
        return Err(format!(
            "pipeline {pipeline} needs a scenario with two providers (failover, silent), not {}",
            scenario.name
        )
        .into());
    }
    if pipeline.balances() && scenario.deployments.is_empty() {
        return Err(format!(
            "pipeline {pipeline} needs a scenario with deployments (balance, balance-fleet), not {}",
            scenario.name
        )
        .into());
    }
    Ok(())
}

/// The providers of `scenario` whose time zero is `epoch`: its deployments, where it has some;
/// else the primary, and the secondary where there is one.
fn providers(scenario: &Scenario, epoch: Instant) -> Vec<Backend> {
    if !scenario.deployments.is_empty() {
        return (0..scenario.deployments.len())
            .filter_map(|index| scenario.deployment(index))
            .map(|deployment| Backend::new(&deployment, epoch))
            .collect();
    }
    std::iter::once(Backend::new(scenario, epoch))
        .chain(
            scenario
                .secondary()
                .map(|second| Backend::new(&second, epoch)),
        )
        .collect()
}

/// The router to several `providers` of `scenario` (see [`providers`]): to its deployments, or
/// to the primary and the secondary; `None` with one provider.
fn router(scenario: &Scenario, providers: &[Backend]) -> Option<Router> {
    if !scenario.deployments.is_empty() {
        let names = scenario.deployments.iter().map(|d| d.name);
        return Some(Router::deployments(
            names.zip(providers.iter().cloned()).collect(),
        ));
    }
    match providers {
        [primary, secondary] => Some(Router::new(primary.clone(), secondary.clone())),
        _ => None,
    }
}

/// Note the breaker's state at the start of every [`FINE_BUCKET`] until `duration`.
async fn watch(
    breaker: CircuitBreaker,
    epoch: Instant,
    duration: Duration,
    states: Rc<RefCell<Vec<State>>>,
) {
    let mut at = Duration::ZERO;
    while at < duration {
        tokio::time::sleep_until(epoch + at).await;
        states.borrow_mut().push(breaker.state());
        at += FINE_BUCKET;
    }
}

/// A row's concurrency limit as it is now, whoever's it is.
type LimitProbe = Box<dyn Fn() -> u32>;

/// Note the concurrency limit at the start of every [`FINE_BUCKET`] until `duration`.
async fn watch_limit(
    limit: LimitProbe,
    epoch: Instant,
    duration: Duration,
    limits: Rc<RefCell<Vec<u32>>>,
) {
    let mut at = Duration::ZERO;
    while at < duration {
        tokio::time::sleep_until(epoch + at).await;
        limits.borrow_mut().push(limit());
        at += FINE_BUCKET;
    }
}

/// How often [`watch_opening`] looks at the breakers: every millisecond, tokio's timer's
/// resolution.
const OPENING_CHECK: Duration = Duration::from_millis(1);

/// Note when each of `breakers` first opened in `fault` (its time from the run's start, `None`
/// while it has not), looking every millisecond until all have or the fault ends.
async fn watch_opening(
    breakers: Vec<CircuitBreaker>,
    epoch: Instant,
    fault: Fault,
    opened: Rc<RefCell<Vec<Option<Duration>>>>,
) {
    // Counted from just before the fault, so that an opening at its first instant is seen.
    tokio::time::sleep_until(epoch + fault.start.saturating_sub(OPENING_CHECK)).await;
    let before: Vec<u64> = breakers.iter().map(|b| b.snapshot().opened).collect();
    *opened.borrow_mut() = vec![None; breakers.len()];
    let mut at = fault.start;
    while at < fault.end {
        tokio::time::sleep_until(epoch + at).await;
        let mut seen = opened.borrow_mut();
        for ((breaker, was), when) in breakers.iter().zip(&before).zip(seen.iter_mut()) {
            if when.is_none() && breaker.snapshot().opened > *was {
                *when = Some(at);
            }
        }
        if seen.iter().all(Option::is_some) {
            return;
        }
        at += OPENING_CHECK;
    }
}

/// What a pipeline's builder hands back to watch: the circuit breaker whose state the run notes
/// ([`Run::breaker`]), and the breakers each replica has for the deployment the fault strikes.
#[derive(Default)]
struct Watched {
    breaker: Option<CircuitBreaker>,
    dying: Vec<CircuitBreaker>,
    /// The pipeline's concurrency limit, whose value the run notes ([`Run::limits`]).
    limit: Option<LimitProbe>,
}

/// Build the pipeline around the providers (a failover: around the router to them) and start
/// the arrivals; returns what there is to watch: the pipeline's circuit breaker (a failover's
/// primary's), if it has one; a balance row's breakers of the dying deployment.
fn start(
    pipeline: Pipeline,
    scenario: &Scenario,
    providers: &[Backend],
    driver: Driver,
) -> Result<Watched, BoxError> {
    let backend = providers[0].clone();
    let attempt = |backend: Backend| Timeout::new(backend, scenario.attempt_timeout);
    let router = || {
        router(scenario, providers)
            .ok_or_else(|| BoxError::from(format!("{pipeline} needs several providers")))
    };
    let breaker = |breaker| Watched {
        breaker: Some(breaker),
        ..Watched::default()
    };
    match pipeline {
        Pipeline::None => driver.spawn(attempt(backend)),
        Pipeline::Naive => driver.spawn(tower::retry::Retry::new(
            NaivePolicy::default(),
            attempt(backend),
        )),
        Pipeline::NaiveFailover => driver.spawn(tower::retry::Retry::new(
            NaiveFailoverPolicy::default(),
            Timeout::new(router()?, scenario.attempt_timeout),
        )),
        Pipeline::StormguardFailover => {
            let (client, primary) = pipeline::stormguard_failover(router()?, scenario);
            driver.spawn(client);
            return Ok(breaker(primary));
        }
        Pipeline::StormguardFailoverNoClocks => {
            let (client, primary) =
                pipeline::stormguard_failover_without_clocks(router()?, scenario);
            driver.spawn(client);
            return Ok(breaker(primary));
        }
        Pipeline::NaiveHedge => driver.spawn(NaiveHedge::new(attempt(backend))),
        Pipeline::Tower => {
            let policy = TowerPolicy::new(scenario.seed ^ 0x7043_7e12)?;
            driver.spawn(tower::retry::Retry::new(policy, attempt(backend)));
        }
        Pipeline::TowerHedge => driver.spawn(pipeline::tower_hedge(attempt(backend))),
        Pipeline::StormguardHedge => driver.spawn(pipeline::stormguard_hedge(backend, scenario)),
        Pipeline::Stormguard => driver.spawn(pipeline::stormguard(backend, scenario)),
        Pipeline::StormguardContinuation => {
            driver.spawn(pipeline::stormguard_continuation(backend, scenario));
        }
        Pipeline::StormguardRateLimit => {
            driver.spawn(pipeline::stormguard_rate_limit(backend, scenario));
        }
        Pipeline::StormguardAdaptive => {
            driver.spawn(pipeline::stormguard_adaptive(backend, scenario));
        }
        Pipeline::StormguardBreaker => {
            let (client, own) = pipeline::stormguard_breaker(backend, scenario);
            driver.spawn(client);
            return Ok(breaker(own));
        }
        Pipeline::StormguardBulkhead
        | Pipeline::ResilienceAdaptive
        | Pipeline::StormguardConcurrency => {
            return start_limited(pipeline, scenario, backend, driver);
        }
        Pipeline::RoundRobin
        | Pipeline::OrderedFailover
        | Pipeline::StormguardBalance
        | Pipeline::StormguardBalanceCooldowns => {
            return Ok(start_balance(
                pipeline,
                scenario,
                providers,
                router()?,
                driver,
            ));
        }
    }
    Ok(Watched::default())
}

/// [`start`] for the rows with a concurrency limit (the fixed one, tower-resilience's, the
/// adaptive one), whose limit is watched.
fn start_limited(
    pipeline: Pipeline,
    scenario: &Scenario,
    backend: Backend,
    driver: Driver,
) -> Result<Watched, BoxError> {
    let probe: LimitProbe = match pipeline {
        Pipeline::ResilienceAdaptive => {
            let (client, aimd) = pipeline::resilience_adaptive(backend, scenario)?;
            driver.spawn(client);
            Box::new(move || u32::try_from(aimd.limit()).unwrap_or(u32::MAX))
        }
        _ => {
            let (client, own) = match pipeline {
                Pipeline::StormguardBulkhead => pipeline::stormguard_bulkhead(backend, scenario),
                _ => pipeline::stormguard_concurrency(backend, scenario),
            };
            driver.spawn(client);
            Box::new(move || own.snapshot().limit)
        }
    };
    Ok(Watched {
        limit: Some(probe),
        ..Watched::default()
    })
}

/// [`start`] for the balance rows: the round robin over the deployments, or the gateway of
/// failovers over them (whose replicas' breakers of the dying deployment are watched, the first
/// replica's state noted).
fn start_balance(
    pipeline: Pipeline,
    scenario: &Scenario,
    providers: &[Backend],
    router: Router,
    driver: Driver,
) -> Watched {
    let (ranking, cooldowns) = match pipeline {
        Pipeline::RoundRobin => {
            driver.spawn(pipeline::round_robin(providers, scenario));
            return Watched::default();
        }
        Pipeline::OrderedFailover => (Ranking::InOrder, false),
        Pipeline::StormguardBalanceCooldowns => (Ranking::Balanced, true),
        _ => (Ranking::Balanced, false),
    };
    let gateway = pipeline::gateway(router, scenario, ranking, cooldowns);
    driver.spawn(gateway.replicas);
    Watched {
        breaker: gateway.dying.first().cloned(),
        dying: gateway.dying,
        limit: None,
    }
}

struct Driver {
    scenario: Scenario,
    /// How many times a caller restarts a stream that failed.
    restarts: u32,
    epoch: Instant,
    recorder: Rc<RefCell<Recorder>>,
    /// Where the measured requests' engine metrics go, when they are collected.
    collector: Option<Rc<Collector>>,
    on_second: Rc<dyn Fn()>,
    /// The providers (the primary first), told which requests are measured.
    backends: Vec<Backend>,
}

impl Driver {
    fn spawn<S, RB>(self, service: S)
    where
        S: Service<SimRequest, Response = Response<RB>> + Clone + 'static,
        S::Future: 'static,
        RB: Body<Data = Bytes> + 'static,
        RB::Error: Into<BoxError>,
    {
        tokio::task::spawn_local(self.arrivals(service));
    }

    async fn arrivals<S, RB>(self, service: S)
    where
        S: Service<SimRequest, Response = Response<RB>> + Clone + 'static,
        S::Future: 'static,
        RB: Body<Data = Bytes> + 'static,
        RB::Error: Into<BoxError>,
    {
        let mut arrivals = ArrivalProcess::new(&self.scenario);
        let mut sizes = self
            .scenario
            .sizes
            .map(|sizes| SizeDraws::new(sizes, self.scenario.seed));
        let millis = u64::try_from(self.scenario.duration.as_millis()).unwrap_or(u64::MAX);
        let outstanding = Rc::new(Cell::new(0_u64));
        let window = u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX);
        let mut id: u64 = 0;
        for ms in 0.. {
            let measured = ms < millis;
            if !measured && outstanding.get() == 0 {
                break;
            }
            if ms > millis.saturating_add(CALLER_PATIENCE.as_millis() as u64) {
                break;
            }
            if ms == millis {
                for backend in &self.backends {
                    backend.model().count_ids_below(id);
                }
            }
            let at = Duration::from_millis(ms);
            tokio::time::sleep_until(self.epoch + at).await;
            for _ in 0..arrivals.tick(ms) {
                let record = measured.then(|| {
                    self.recorder.borrow_mut().arrive(at);
                    outstanding.set(outstanding.get() + 1);
                    Record {
                        arrival: at,
                        epoch: self.epoch,
                        recorder: self.recorder.clone(),
                        outstanding: outstanding.clone(),
                    }
                });
                let size = sizes.as_mut().map(SizeDraws::draw);
                let request = request(id, size, self.scenario.asks_for_stream);
                let collector = self.collector.as_ref().filter(|_| measured);
                let deadline = self.scenario.deadline;
                if self.scenario.stream.is_some() {
                    let restarts = self.restarts;
                    let caller =
                        call_streaming(service.clone(), request, restarts, deadline, record);
                    spawn_recorded(caller, collector);
                } else {
                    spawn_recorded(call(service.clone(), request, deadline, record), collector);
                }
                id += 1;
            }
            if measured && (ms + 1) % 1_000 == 0 {
                (self.on_second)();
            }
            if let Some(collector) = &self.collector
                && (ms + 1) % window == 0
                && ms + 1 < millis
            {
                collector.close_window();
            }
        }
    }
}

/// Spawn a caller's task, recorded by `collector` if there is one.
fn spawn_recorded<F: Future<Output = ()> + 'static>(caller: F, collector: Option<&Rc<Collector>>) {
    match collector {
        Some(collector) => {
            tokio::task::spawn_local(Recorded::new(caller, collector.clone()));
        }
        None => {
            tokio::task::spawn_local(caller);
        }
    }
}

/// Request `id`: the small chat completion, or one of `(prompt, max_tokens)` tokens, which also
/// tells the provider its weight in [`TOKENS`]; asking for a stream (`"stream": true`) if
/// `stream`.
fn request(id: u64, size: Option<(u32, u32)>, stream: bool) -> SimRequest {
    let body = match size {
        Some((prompt, max_tokens)) => llm_body(prompt, max_tokens),
        None => Bytes::from_static(REQUEST_BODY),
    };
    let body = if stream {
        asking_for_stream(&body)
    } else {
        body
    };
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static("http://llm.invalid/v1/chat/completions");
    request
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    request
        .headers_mut()
        .insert(REQUEST_ID, HeaderValue::from(id));
    if let Some((prompt, max_tokens)) = size {
        let tokens = u64::from(prompt) + u64::from(max_tokens);
        request
            .headers_mut()
            .insert(TOKENS, HeaderValue::from(tokens));
    }
    request
}

/// The JSON object `body` with `"stream":true` first among its fields, as a client that asks for
/// an event stream sends it.
fn asking_for_stream(body: &[u8]) -> Bytes {
    let fields = body.strip_prefix(b"{").unwrap_or(body);
    Bytes::from([&b"{\"stream\":true,"[..], fields].concat())
}

/// Where a measured request reports its outcome.
struct Record {
    arrival: Duration,
    epoch: Instant,
    recorder: Rc<RefCell<Recorder>>,
    outstanding: Rc<Cell<u64>>,
}

/// Call `service` and wait for its answer (within the caller's `deadline`, if any).
async fn call<S, RB>(
    service: S,
    request: SimRequest,
    deadline: Option<Duration>,
    record: Option<Record>,
) where
    S: Service<SimRequest, Response = Response<RB>>,
{
    let answer = within(deadline, async {
        match &service.oneshot(request).await {
            Ok(response) if is_local_answer(response) => Answer::Fallback,
            Ok(response) if response.status().is_success() => Answer::Success,
            _ => Answer::Failure,
        }
    });
    let answer = answer.await.unwrap_or(Answer::Failure);
    if let Some(record) = record {
        let completion = Instant::now().saturating_duration_since(record.epoch);
        record
            .recorder
            .borrow_mut()
            .complete(record.arrival, completion, answer);
        record
            .outstanding
            .set(record.outstanding.get().saturating_sub(1));
    }
}

/// `future`'s output, or `None` if the caller's `deadline` (from now) passes first; `None` for
/// no deadline: wait for it.
async fn within<F: Future>(deadline: Option<Duration>, future: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

/// Call `service` for a streamed answer and read it to the end (within the caller's
/// `deadline`, if any), restarting a stream that failed up to `restarts` times (see
/// [`read_streams`]).
async fn call_streaming<S, RB>(
    service: S,
    request: SimRequest,
    restarts: u32,
    deadline: Option<Duration>,
    record: Option<Record>,
) where
    S: Service<SimRequest, Response = Response<RB>> + Clone,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut transcript = Transcript::default();
    let mut tally = StreamTally::default();
    let mut first_content = None;
    let reading = read_streams(
        service,
        &request,
        restarts,
        (&mut transcript, &mut first_content),
        &mut tally,
    );
    let answer = within(deadline, reading).await.unwrap_or(Answer::Failure);
    tally.duplicated_tokens = transcript.duplicated_tokens();
    tally.lost_tokens = transcript.lost_tokens();
    if let Some(record) = record {
        let completion = Instant::now().saturating_duration_since(record.epoch);
        let mut recorder = record.recorder.borrow_mut();
        recorder.complete(record.arrival, completion, answer);
        recorder.stream(completion, &tally);
        if let (Answer::Success, Some(at)) = (answer, first_content) {
            recorder.first_token(record.arrival, at.saturating_duration_since(record.epoch));
        }
        record
            .outstanding
            .set(record.outstanding.get().saturating_sub(1));
    }
}

/// Call `service` for a streamed answer and read it to the end into `transcript`, noting when
/// its caller was shown the first content event (`first_content`, across the streams), and
/// restarting a stream that failed up to `restarts` times (after [`NaivePolicy::INTERVAL`] each
/// time); see the [module docs](self). What became of the streams goes into `tally`.
async fn read_streams<S, RB>(
    service: S,
    request: &SimRequest,
    restarts: u32,
    (transcript, first_content): (&mut Transcript, &mut Option<Instant>),
    tally: &mut StreamTally,
) -> Answer
where
    S: Service<SimRequest, Response = Response<RB>> + Clone,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    for restart in 0..=restarts {
        if restart > 0 {
            tokio::time::sleep(NaivePolicy::INTERVAL).await;
            transcript.restart();
        }
        let sent = pipeline::clone_request(request);
        let Ok(response) = service.clone().oneshot(sent).await else {
            break;
        };
        if is_local_answer(&response) {
            return Answer::Fallback;
        }
        if !response.status().is_success() {
            break;
        }
        let cause = response.extensions().get::<GiveUpCause>().copied();
        let error = read_to_end(response.into_body(), transcript, first_content).await;
        let typed = error
            .as_ref()
            .is_some_and(|error| error.downcast_ref::<StreamInterrupted>().is_some());
        match transcript.ending(error.is_some()) {
            Ending::Complete => return Answer::Success,
            Ending::Interrupted => {
                tally.interrupted += 1;
                tally.stream_interrupted += u64::from(typed);
            }
            Ending::BeforeContent if restart == restarts => {
                tally.given_up += 1;
                tally.budget_refused += u64::from(cause == Some(GiveUpCause::BudgetExhausted));
                // stormguard's attempts, or naive's restarts, ran out.
                let out = cause == Some(GiveUpCause::AttemptsExhausted) || restarts > 0;
                tally.out_of_attempts += u64::from(out);
            }
            Ending::BeforeContent => {}
        }
    }
    Answer::Failure
}

/// Read `body` to its end into `transcript`, noting when the first content event of the
/// request came in `first_content` (if it is not noted yet); the error it ended with, if any.
async fn read_to_end<RB>(
    body: RB,
    transcript: &mut Transcript,
    first_content: &mut Option<Instant>,
) -> Option<BoxError>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    transcript.read(&data);
                    if first_content.is_none() && transcript.tokens() > 0 {
                        *first_content = Some(Instant::now());
                    }
                }
            }
            Err(error) => return Some(error.into()),
        }
    }
    None
}

/// Whether the client answered `response` itself: the breaker's fallback, or a failover's
/// degraded answer (no success, though a 200).
fn is_local_answer<B>(response: &Response<B>) -> bool {
    let extensions = response.extensions();
    extensions.get::<LocalAnswer>().is_some()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenarios;

    /// Requests per second of `scenario`'s arrivals over its duration.
    fn per_second(scenario: &Scenario) -> Vec<u64> {
        let mut arrivals = ArrivalProcess::new(scenario);
        let millis = scenario.duration.as_millis() as u64;
        let mut seconds = vec![0; millis.div_ceil(1_000) as usize];
        for ms in 0..millis {
            seconds[(ms / 1_000) as usize] += u64::from(arrivals.tick(ms));
        }
        seconds
    }

    #[test]
    fn burst_arrivals_average_70_percent_of_the_quota_in_bursts_of_2_to_3_times_it() {
        let scenario = scenarios::BURST.scenario();
        let Arrivals::Bursts(bursts) = scenario.arrivals else {
            panic!("bursts")
        };
        let q = bursts.quota;
        let seconds = per_second(&scenario);
        let total: u64 = seconds.iter().sum();
        let average = total as f64 / 60.0 / q;
        // 6,830 expected; Poisson's spread is about 1.2%.
        assert!((0.67..0.73).contains(&average), "{average}");
        for burst in bursts.until(scenario.duration) {
            // The whole seconds of each burst: 2x for 2 s, 2.5x for 1.33 s, 3x for 1 s.
            let first = burst.start.as_secs() as usize;
            let whole = ((burst.end - burst.start).as_secs_f64().floor() as usize).max(1);
            for count in &seconds[first..first + whole] {
                let height = *count as f64 / q;
                let expected = burst.height;
                assert!(
                    (height - expected).abs() < 0.25 * expected,
                    "{burst:?}: {height}"
                );
            }
            // The second before each burst is calm: under half the quota.
            assert!((seconds[first - 1] as f64) < 0.5 * q * 1.3, "{burst:?}");
        }
        let peak = seconds.iter().copied().max().unwrap() as f64 / q;
        assert!((2.7..3.3).contains(&peak), "{peak}");
    }

    #[test]
    fn metrics_change_no_figure_and_a_failover_counts_its_moves() {
        use crate::output::dashboard::Value;
        use stormguard::metrics::{FAILOVERS, REQUEST_ATTEMPTS};

        // The primary is down from 6.7 s to 11.7 s.
        let scenario = scenarios::FAILOVER
            .scenario()
            .with_qps(100.0)
            .with_duration(Duration::from_secs(20));
        let pipeline = Pipeline::StormguardFailover;
        let plain = simulate(&scenario, pipeline, || {}).unwrap();
        let metered = simulate_with_metrics(&scenario, pipeline, || {}).unwrap();
        assert_eq!(plain.summary, metered.summary);
        assert_eq!(plain.series, metered.series);
        assert_eq!(plain.breaker, metered.breaker);
        assert_eq!(plain.metrics, None);

        let dashboard = metered.metrics.unwrap();
        let total = |name, labels| -> u64 {
            dashboard
                .find(name, labels)
                .iter()
                .map(|series| match series.value {
                    Value::Counter { total, .. } => total,
                    Value::Histogram { count, .. } => count,
                    Value::Gauge { .. } => 0,
                })
                .sum()
        };
        let moved = total(FAILOVERS, &[("from", "primary"), ("to", "secondary")]);
        assert!(moved > 0, "{dashboard:?}");
        // A request ends once on each engine it reaches: on the primary's (unless its open
        // breaker sends it straight to the secondary), and on the secondary's if it moved or
        // went there straight. A few probes into the black hole never end before the run does.
        let primary = total(REQUEST_ATTEMPTS, &[("gen_ai.provider.name", "primary")]);
        let secondary = total(REQUEST_ATTEMPTS, &[("gen_ai.provider.name", "secondary")]);
        let offered = metered.summary.offered;
        assert!(secondary >= moved, "{secondary} {moved}");
        assert!(primary + secondary <= offered + moved, "{dashboard:?}");
        assert!(
            primary + secondary >= offered + moved - offered / 100,
            "{dashboard:?}"
        );
        // Two windows of 10 s.
        assert!(dashboard.series.iter().all(|series| match &series.value {
            Value::Counter { per_window, .. } | Value::Histogram { per_window, .. } =>
                per_window.len() == 2,
            Value::Gauge { per_window, .. } => per_window.len() == 2,
        }));

        // The other rows record nothing.
        let naive = simulate_with_metrics(&scenario, Pipeline::NaiveFailover, || {}).unwrap();
        assert_eq!(naive.metrics, None);
    }

    #[test]
    fn poisson_arrivals_are_the_scenarios_rate() {
        let scenario = scenarios::SEED.scenario().with_qps(1_000.0);
        let seconds = per_second(&scenario);
        let total: u64 = seconds.iter().sum();
        assert!((59_000..61_000).contains(&total), "{total}");
        assert!(
            seconds.iter().all(|n| (880..1_120).contains(n)),
            "{seconds:?}"
        );
    }

    #[test]
    fn an_llm_body_weighs_its_prompt_and_max_tokens_as_token_estimate_reads_it() {
        for (prompt, max_tokens) in [(100, 50), (2_345, 1_000), (4_000, 2_000)] {
            let body = llm_body(prompt, max_tokens);
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["max_tokens"], max_tokens);
            // `TokenEstimate`: the bytes of every string of `messages`, 4 a token.
            let message = &json["messages"][0];
            let bytes = message["role"].as_str().unwrap().len()
                + message["content"].as_str().unwrap().len();
            assert_eq!(bytes, prompt as usize * BYTES_PER_TOKEN, "{prompt}");
        }
        let request = request(7, Some((2_345, 1_000)), false);
        assert_eq!(request.headers()[TOKENS], "3345");
        assert_eq!(request.headers()[REQUEST_ID], "7");
        assert!(
            super::request(7, None, false)
                .headers()
                .get(TOKENS)
                .is_none(),
            "a small request is not weighed"
        );
    }

    #[test]
    fn a_request_that_asks_for_a_stream_says_so_in_its_body() {
        let body = |stream: bool| -> serde_json::Value {
            let request = request(3, None, stream);
            serde_json::from_slice(&request.body().clone().into_inner().unwrap()).unwrap()
        };
        let (whole, streamed) = (body(false), body(true));
        assert_eq!(whole.get("stream"), None);
        assert_eq!(streamed["stream"], true);
        assert_eq!(streamed["max_tokens"], whole["max_tokens"]);
        assert_eq!(streamed["messages"], whole["messages"]);
    }

    #[test]
    fn sizes_are_drawn_uniformly_from_their_ranges() {
        let mut draws = SizeDraws::new(TokenSizes::LLM, 42);
        let sample: Vec<(u32, u32)> = (0..20_000).map(|_| draws.draw()).collect();
        assert!(
            sample
                .iter()
                .all(|(p, m)| (100..=4_000).contains(p) && (50..=2_000).contains(m))
        );
        let mean =
            sample.iter().map(|(p, m)| f64::from(*p + *m)).sum::<f64>() / sample.len() as f64;
        assert!((mean - TokenSizes::LLM.mean()).abs() < 30.0, "{mean}");
    }
}
