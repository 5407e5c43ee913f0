//! A simulated LLM provider with a fixed number of slots and a queue, driven by an open-loop
//! load through a [`ConcurrencyLayer`], on tokio's paused clock: the harness of the declarative
//! cases in `simulated.rs`, in the manner of Vector's adaptive concurrency tests (scenarios run on
//! virtual time, asserting ranges of the limit and of the attempts in flight).

#![allow(clippy::unwrap_used, dead_code)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use stormguard_concurrency::{ConcurrencyLayer, ConcurrencyLimit};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service, ServiceExt, service_fn};

/// What the provider is at a moment of the run: from `at` on (seconds), `slots` generations at
/// once, each taking `latency` times its request's length factor.
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    pub at: f64,
    pub slots: u32,
    pub latency: Duration,
}

/// One case: the provider's phases, its queue, the offered load and how long it runs.
#[derive(Clone, Debug)]
pub struct Case {
    pub phases: Vec<Phase>,
    /// Requests waiting for a slot at most; one more is answered 429.
    pub queue: u32,
    /// Requests offered per second, evenly spaced (an open loop: they come whatever happens).
    pub rate: f64,
    /// Seconds the load runs for.
    pub seconds: f64,
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Run {
    /// Every 50 ms: (seconds since the start, limit, attempts in flight by the limit's count,
    /// generations the provider runs).
    pub samples: Vec<(f64, u32, u32, u32)>,
    pub offered: u64,
    pub completed: u64,
    pub rejected: u64,
    pub refused: u64,
    pub shrunk: u64,
    pub grown: u64,
}

impl Run {
    fn between(&self, from: f64, to: f64) -> impl Iterator<Item = &(f64, u32, u32, u32)> {
        self.samples
            .iter()
            .filter(move |(at, ..)| *at >= from && *at < to)
    }

    /// The time-weighted mean of the limit between two moments (seconds).
    pub fn mean_limit(&self, from: f64, to: f64) -> f64 {
        mean(self.between(from, to).map(|s| s.1))
    }

    /// The time-weighted mean of the attempts in flight between two moments.
    pub fn mean_in_flight(&self, from: f64, to: f64) -> f64 {
        mean(self.between(from, to).map(|s| s.2))
    }

    /// The lowest and highest limit between two moments.
    pub fn limit_range(&self, from: f64, to: f64) -> (u32, u32) {
        let limits: Vec<u32> = self.between(from, to).map(|s| s.1).collect();
        (
            limits.iter().copied().min().unwrap_or(0),
            limits.iter().copied().max().unwrap_or(0),
        )
    }

    /// The first moment after `from` from which the limit stays within `low..=high` until `to`.
    pub fn settled_at(&self, from: f64, to: f64, low: u32, high: u32) -> Option<f64> {
        let mut settled = None;
        for (at, limit, ..) in self.between(from, to) {
            if (low..=high).contains(limit) {
                settled.get_or_insert(*at);
            } else {
                settled = None;
            }
        }
        settled
    }
}

fn mean(values: impl Iterator<Item = u32>) -> f64 {
    let (sum, count) = values.fold((0.0, 0.0), |(sum, count), v| {
        (sum + f64::from(v), count + 1.0)
    });
    if count == 0.0 { 0.0 } else { sum / count }
}

/// The provider's slots and queue.
struct Provider {
    state: Mutex<Slots>,
    freed: Notify,
    queue: u32,
}

struct Slots {
    slots: u32,
    busy: u32,
    queued: u32,
    latency: Duration,
}

/// A generation's hold on one of the provider's slots, given back when dropped.
struct Generation(Arc<Provider>);

impl Drop for Generation {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().busy -= 1;
        self.0.freed.notify_one();
    }
}

impl Provider {
    /// Takes a slot, queueing for one if the queue has room; `None`: answered 429.
    async fn admit(self: &Arc<Self>) -> Option<(Generation, Duration)> {
        {
            let mut state = self.state.lock().unwrap();
            if state.busy < state.slots {
                state.busy += 1;
                return Some((Generation(self.clone()), state.latency));
            }
            if state.queued >= self.queue {
                return None;
            }
            state.queued += 1;
        }
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.state.lock().unwrap();
                if state.busy < state.slots {
                    state.busy += 1;
                    state.queued -= 1;
                    return Some((Generation(self.clone()), state.latency));
                }
            }
            freed.await;
        }
    }

    fn busy(&self) -> u32 {
        self.state.lock().unwrap().busy
    }
}

/// A generation's streamed body: it ends `length` after its head, and holds the provider's slot
/// until then.
pub struct Stream {
    ends: Pin<Box<Sleep>>,
    generation: Option<Generation>,
}

impl Body for Stream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.generation.is_none() {
            return Poll::Ready(None);
        }
        std::task::ready!(self.ends.as_mut().poll(cx));
        self.generation = None;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: [DONE]\n\n",
        )))))
    }
}

/// The length factors of successive requests: varied, 0.5x to 1.5x of the phase's latency.
const LENGTHS: [f64; 8] = [1.0, 0.5, 1.5, 0.75, 1.25, 0.6, 1.4, 1.0];

/// Runs `case` through a layer over `limit`, on the paused clock.
pub async fn run(case: &Case, limit: ConcurrencyLimit) -> Run {
    let first = case.phases[0];
    let provider = Arc::new(Provider {
        state: Mutex::new(Slots {
            slots: first.slots,
            busy: 0,
            queued: 0,
            latency: first.latency,
        }),
        freed: Notify::new(),
        queue: case.queue,
    });
    let served = provider.clone();
    let counter = Arc::new(Mutex::new(0usize));
    let inner = service_fn(move |_request: http::Request<()>| {
        let provider = served.clone();
        let counter = counter.clone();
        async move {
            let Some((generation, latency)) = provider.admit().await else {
                let mut response = http::Response::new(Stream {
                    ends: Box::pin(tokio::time::sleep(Duration::ZERO)),
                    generation: None,
                });
                *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                return Ok::<_, Infallible>(response);
            };
            let index = {
                let mut counter = counter.lock().unwrap();
                *counter += 1;
                *counter
            };
            let length = latency.mul_f64(LENGTHS[index % LENGTHS.len()]);
            let mut response = http::Response::new(Stream {
                ends: Box::pin(tokio::time::sleep(length)),
                generation: Some(generation),
            });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            Ok(response)
        }
    });
    let client = ConcurrencyLayer::new(limit.clone()).layer(inner);
    let run = Arc::new(Mutex::new(Run::default()));
    let start = Instant::now();

    // The provider's phases.
    for phase in case.phases.iter().skip(1).copied() {
        let provider = provider.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(phase.at)).await;
            let mut state = provider.state.lock().unwrap();
            state.slots = phase.slots;
            state.latency = phase.latency;
            drop(state);
            provider.freed.notify_waiters();
        });
    }
    // The sampler.
    let sampler = {
        let (run, limit, provider) = (run.clone(), limit.clone(), provider.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                let snapshot = limit.snapshot();
                let at = start.elapsed().as_secs_f64();
                let sample = (at, snapshot.limit, snapshot.in_flight, provider.busy());
                run.lock().unwrap().samples.push(sample);
            }
        })
    };
    // The load.
    let gap = Duration::from_secs_f64(1.0 / case.rate);
    let requests = (case.seconds * case.rate) as u64;
    let mut tasks = Vec::new();
    for n in 0..requests {
        tokio::time::sleep_until(start + gap * n as u32).await;
        let mut client = client.clone();
        let run = run.clone();
        run.lock().unwrap().offered += 1;
        tasks.push(tokio::spawn(async move {
            let answer = client
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(()))
                .await;
            let run_now = |field: fn(&mut Run) -> &mut u64| *field(&mut run.lock().unwrap()) += 1;
            match answer {
                Err(_) => run_now(|r| &mut r.refused),
                Ok(response) if response.status() == http::StatusCode::TOO_MANY_REQUESTS => {
                    run_now(|r| &mut r.rejected)
                }
                Ok(response) => {
                    response.into_body().collect().await.unwrap();
                    run_now(|r| &mut r.completed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    sampler.abort();
    let snapshot = limit.snapshot();
    let mut run = std::mem::take(&mut *run.lock().unwrap());
    run.shrunk = snapshot.shrunk;
    run.grown = snapshot.grown;
    run
}
