//! One admission by a rate limit that never refuses (a quota far above the rate the benchmark
//! reaches): stormguard's `RateLimit::reserve` + `Reservation::send` beside governor's
//! `RateLimiter::check`, on one thread and on two threads sharing one limiter.
//!
//! stormguard's admission does more than a yes/no: it reserves a slot in two dimensions
//! (requests and tokens; the tokens are not limited here and cost a load), counts the sent rate
//! for the adaptive mode, and hands back a permit that learns from the answer. governor's is the
//! plain GCRA check of a direct (unkeyed) limiter with its default std clock.
//!
//! `cargo bench -p stormguard-benches --bench admission`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use stormguard::rate_limit::{RateLimit, RateLimitConfig};

/// A quota no benchmark reaches: every admission goes at once.
const PER_MINUTE: u32 = u32::MAX;

fn stormguard_limit() -> RateLimit {
    RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(PER_MINUTE)))
}

fn governor_limit() -> governor::DefaultDirectRateLimiter {
    let quota = Quota::per_minute(NonZeroU32::new(PER_MINUTE).unwrap_or(NonZeroU32::MIN));
    RateLimiter::direct(quota)
}

/// One stormguard admission: the slot, sent at once.
fn admit(limit: &RateLimit, head: &http::request::Parts) {
    match limit.reserve(head, 0, None) {
        Ok(reservation) => drop(black_box(reservation.send())),
        Err(limited) => panic!("a quota no benchmark reaches refused: {limited}"),
    }
}

fn one_thread(c: &mut Criterion) {
    // stormguard's limit reads tokio's clock, which needs no runtime unless paused.
    let head = http::Request::new(()).into_parts().0;
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(1));
    let limit = stormguard_limit();
    group.bench_function("stormguard", |b| b.iter(|| admit(&limit, &head)));
    let governor = governor_limit();
    group.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });
    group.finish();
}

/// `iters` admissions on each of `threads` threads sharing one limiter: the wall time of the
/// slowest thread.
fn shared(threads: usize, iters: u64, admit: Arc<dyn Fn() + Send + Sync>) -> Duration {
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (start, admit) = (Arc::clone(&start), Arc::clone(&admit));
            thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                for _ in 0..iters {
                    admit();
                }
                began.elapsed()
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|worker| worker.join().unwrap_or_default())
        .max()
        .unwrap_or_default()
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_2_threads");
    // Two admissions per iteration, one on each thread.
    group.throughput(Throughput::Elements(2));
    let limit = stormguard_limit();
    let head = Arc::new(http::Request::new(()).into_parts().0);
    let sg: Arc<dyn Fn() + Send + Sync> = Arc::new(move || admit(&limit, &head));
    group.bench_function("stormguard", |b| {
        b.iter_custom(|iters| shared(2, iters, Arc::clone(&sg)))
    });
    let governor = Arc::new(governor_limit());
    let gv: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        black_box(governor.check().is_ok());
    });
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| shared(2, iters, Arc::clone(&gv)))
    });
    group.finish();
}

criterion_group!(benches, one_thread, two_threads);
criterion_main!(benches);
