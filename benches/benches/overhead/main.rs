//! What stormguard's client engine costs per request, side by side with tower's `retry` and
//! tower-resilience, in one run:
//!
//! * `success`: the inner service answers 200 at once; one thread;
//! * `threads`: the same, from one and from two threads that share one budget and one throttle
//!   (and tower's and tower-resilience's shared state), for the scaling ratio;
//! * `failure`: every request is answered 503 and then 200 on its retry, with zero-length
//!   backoffs, so that the retry machinery runs but nothing sleeps.
//!
//! `cargo bench -p stormguard-benches` runs everything and ends with the ratios against the
//! targets of `docs/PERFORMANCE.md`, read back from criterion's estimates ([`report`]) and
//! measured again in interleaved rounds ([`paired`]).
//!
//! For profilers, `STORMGUARD_BENCH_PROFILE=success/stormguard_client` (any `group/variant` of the
//! one-thread groups) skips criterion and sends `STORMGUARD_BENCH_REQUESTS` requests (default
//! 100 000) through that variant on each of `STORMGUARD_BENCH_THREADS` threads (default 1), e.g.
//! under `valgrind --tool=callgrind` or `perf`, once the variant's time windows are full (see
//! [`PROFILE_SETTLE`]).

mod paired;
mod report;

use std::fmt;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use http::Response;
use stormguard_benches::drive::{NOT_OK, WAITED, check, in_parallel, runtime, send};
use stormguard_benches::requests::{Flaky, Req, chat_request, healthy};
use stormguard_benches::variants::{Path, Visit, each_variant};
use tokio::runtime::Runtime;
use tower::{Service, service_fn};

use crate::paired::{Rounds, Scaling, selected};

/// Requests per profiling run unless `STORMGUARD_BENCH_REQUESTS` says otherwise.
const PROFILE_REQUESTS: u64 = 100_000;

/// How long a profiling run waits between making the variant and its first request: 11 s.
///
/// The throttle's window (2 s), the retry budget's and the breaker's (10 s) are cut in time
/// slices, and a sum covers only the slices since the window was made. A run shorter than a window
/// (20,000 requests under callgrind take a second or two) would sum fewer slices the faster the
/// machine ran it, and the count would move with the machine's load (by up to 700 instructions
/// per request for the client). After the wait every window is full, as in a client that has run
/// for a while; waiting costs no instructions.
const PROFILE_SETTLE: Duration = Duration::from_secs(11);

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
        std::thread::sleep(PROFILE_SETTLE);
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
        report::report(&scaling);
        report::report_rounds(&rounds);
    }
}
