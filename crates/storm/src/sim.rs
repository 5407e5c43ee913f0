//! Runs one pipeline through one scenario on virtual time.
//!
//! A current-thread tokio runtime with a paused clock: the clock jumps to the next timer
//! whenever every task is waiting, so a 60 s scenario takes as long as its CPU work. Nothing
//! reads the wall clock and every random draw is seeded, so a seed gives the same numbers on
//! every run.
//!
//! Arrivals are a Poisson process drawn per millisecond (tokio's timers have millisecond
//! resolution); each logical request is a task that calls the pipeline once and records when and
//! how it ended. Requests that arrive within the scenario's duration are measured. Arrivals go on
//! after it, unmeasured, until every measured request has its answer: the last measured requests
//! meet the same load as the others instead of an idle provider. (A request a black hole holds
//! until the caller's patience runs out keeps them going that long.)

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use stormguard::breaker::{CircuitBreaker, FallbackAnswer, State};
use tokio::task::LocalSet;
use tokio::time::Instant;
use tower::timeout::Timeout;
use tower::{BoxError, Service, ServiceExt};

use crate::backend::{Backend, FINE_BUCKET, REQUEST_ID};
use crate::metrics::{Answer, Recorder, Series, Summary, summarize};
use crate::pipeline::{self, NaivePolicy, Pipeline, SimRequest, TowerPolicy};
use crate::scenario::{CALLER_PATIENCE, Scenario};

/// The body every logical request sends: a small chat completion.
const REQUEST_BODY: &[u8] =
    br#"{"model":"storm-1","max_tokens":256,"messages":[{"role":"user","content":"Summarise the incident."}]}"#;

/// The outcome of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The figures of the report.
    pub summary: Summary,
    /// Per-second series for the chart, and per-100 ms ones for a closer look.
    pub series: Series,
    /// The circuit breaker's state at the start of each [`FINE_BUCKET`] (100 ms) of the scenario's
    /// duration; empty for a pipeline without a breaker.
    pub breaker: Vec<State>,
}

/// Run `pipeline` through `scenario`; `on_second` is called after each second of virtual time.
pub fn simulate(
    scenario: &Scenario,
    pipeline: Pipeline,
    on_second: impl Fn() + 'static,
) -> Result<Run, BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let local = LocalSet::new();
    let recorder = Rc::new(RefCell::new(Recorder::default()));
    let on_second: Rc<dyn Fn()> = Rc::new(on_second);
    let states = Rc::new(RefCell::new(Vec::new()));
    let backend = local.block_on(&runtime, async {
        let epoch = Instant::now();
        let backend = Backend::new(scenario, epoch);
        let driver = Driver {
            scenario: scenario.clone(),
            epoch,
            recorder: recorder.clone(),
            on_second,
            backend: backend.clone(),
        };
        if let Some(breaker) = start(pipeline, scenario, backend.clone(), driver)? {
            let watch = watch(breaker, epoch, scenario.duration, states.clone());
            tokio::task::spawn_local(watch);
        }
        Ok::<_, BoxError>(backend)
    })?;
    // Every pipeline answers within its deadline or attempt timeouts, unless a black hole holds
    // an attempt with no timeout; this bound guarantees that a run ends. Requests still
    // unanswered by then count as failures.
    let limit = scenario.duration.saturating_add(CALLER_PATIENCE);
    let _ = runtime.block_on(async { tokio::time::timeout(limit, local).await });
    let stats = backend.model().stats().clone();
    let recorder = recorder.take();
    let (summary, series) = summarize(pipeline.as_str(), scenario, recorder, &stats);
    Ok(Run {
        summary,
        series,
        breaker: states.take(),
    })
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

/// Build the pipeline around the backend and start the arrivals; returns the pipeline's circuit
/// breaker, if it has one.
fn start(
    pipeline: Pipeline,
    scenario: &Scenario,
    backend: Backend,
    driver: Driver,
) -> Result<Option<CircuitBreaker>, BoxError> {
    let attempt = |backend: Backend| Timeout::new(backend, scenario.attempt_timeout);
    match pipeline {
        Pipeline::None => driver.spawn(attempt(backend)),
        Pipeline::Naive => driver.spawn(tower::retry::Retry::new(
            NaivePolicy::default(),
            attempt(backend),
        )),
        Pipeline::Tower => {
            let policy = TowerPolicy::new(scenario.seed ^ 0x7043_7e12)?;
            driver.spawn(tower::retry::Retry::new(policy, attempt(backend)));
        }
        Pipeline::Stormguard => driver.spawn(pipeline::stormguard(backend, scenario)),
        Pipeline::StormguardBreaker => {
            let (client, breaker) = pipeline::stormguard_breaker(backend, scenario);
            driver.spawn(client);
            return Ok(Some(breaker));
        }
    }
    Ok(None)
}

struct Driver {
    scenario: Scenario,
    epoch: Instant,
    recorder: Rc<RefCell<Recorder>>,
    on_second: Rc<dyn Fn()>,
    backend: Backend,
}

impl Driver {
    fn spawn<S, RB>(self, service: S)
    where
        S: Service<SimRequest, Response = Response<RB>> + Clone + 'static,
        S::Future: 'static,
        RB: 'static,
    {
        tokio::task::spawn_local(self.arrivals(service));
    }

    async fn arrivals<S, RB>(self, service: S)
    where
        S: Service<SimRequest, Response = Response<RB>> + Clone + 'static,
        S::Future: 'static,
        RB: 'static,
    {
        let mut rng = SmallRng::seed_from_u64(self.scenario.seed);
        let qps = self.scenario.qps.max(f64::MIN_POSITIVE);
        let gap = |rng: &mut SmallRng| -(1.0 - rng.random::<f64>()).ln() / qps;
        let mut next = gap(&mut rng);
        let millis = u64::try_from(self.scenario.duration.as_millis()).unwrap_or(u64::MAX);
        let outstanding = Rc::new(Cell::new(0_u64));
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
                self.backend.model().count_ids_below(id);
            }
            let at = Duration::from_millis(ms);
            tokio::time::sleep_until(self.epoch + at).await;
            let tick_end = (ms + 1) as f64 / 1_000.0;
            while next < tick_end {
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
                tokio::task::spawn_local(call(service.clone(), request(id), record));
                id += 1;
                next += gap(&mut rng);
            }
            if measured && (ms + 1) % 1_000 == 0 {
                (self.on_second)();
            }
        }
    }
}

fn request(id: u64) -> SimRequest {
    let mut request = Request::new(Full::new(Bytes::from_static(REQUEST_BODY)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static("http://llm.invalid/v1/chat/completions");
    request
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    request
        .headers_mut()
        .insert(REQUEST_ID, HeaderValue::from(id));
    request
}

/// Where a measured request reports its outcome.
struct Record {
    arrival: Duration,
    epoch: Instant,
    recorder: Rc<RefCell<Recorder>>,
    outstanding: Rc<Cell<u64>>,
}

async fn call<S, RB>(service: S, request: SimRequest, record: Option<Record>)
where
    S: Service<SimRequest, Response = Response<RB>>,
{
    let result = service.oneshot(request).await;
    let answer = match &result {
        Ok(response) if response.extensions().get::<FallbackAnswer>().is_some() => Answer::Fallback,
        Ok(response) if response.status().is_success() => Answer::Success,
        _ => Answer::Failure,
    };
    drop(result);
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
