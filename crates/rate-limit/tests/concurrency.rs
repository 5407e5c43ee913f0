//! Four OS threads sharing one limit, reserving at once: nothing is over-admitted, no two
//! reservations share a slot beyond what the bucket allows, and slots given back concurrently
//! are given back exactly.
//!
//! The threads enter a runtime whose clock is paused and never moves: they all reserve at the
//! same instant, so every slot is decided by the limit's state alone.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Barrier;
use std::time::Duration;

use stormguard_rate_limit::{RateLimit, RateLimitCause, RateLimitConfig, Reservation};
use support::head;
use tokio::runtime::Runtime;
use tokio::time::Instant;

const THREADS: usize = 4;

/// A runtime whose clock is paused.
fn paused() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A limit with `config`, made on `runtime`'s clock.
fn limit_on(runtime: &Runtime, config: RateLimitConfig) -> RateLimit {
    let _clock = runtime.enter();
    RateLimit::new(config)
}

/// Runs `work` on `THREADS` threads at once, each with its own clone of `limit`, on
/// `runtime`'s paused clock; returns what they returned, and the instant they all worked at.
fn hammer<T: Send>(
    runtime: &Runtime,
    limit: &RateLimit,
    work: impl Fn(&RateLimit) -> Vec<T> + Sync,
) -> (Vec<T>, Instant) {
    let handle = runtime.handle();
    let start = Barrier::new(THREADS);
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limit, start, work) = (limit.clone(), &start, &work);
                scope.spawn(move || {
                    let _clock = handle.enter();
                    start.wait();
                    work(&limit)
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap())
            .collect()
    });
    let _clock = runtime.enter();
    (results, Instant::now())
}

/// 600 a minute and waits of up to a minute, 4 threads reserving 500 slots each in one
/// instant: exactly the bucket (10) starts at once, every other slot is exactly 100 ms after the
/// one before (610 in all, none shared), and each of the other 1,390 is refused with a wait of
/// more than a minute.
#[test]
fn concurrent_reservations_get_distinct_slots_one_interval_apart() {
    let runtime = paused();
    let limit = limit_on(
        &runtime,
        RateLimitConfig::default()
            .with_requests_per_minute(Some(600))
            .with_max_wait(Duration::from_secs(60)),
    );
    let (results, now) = hammer(&runtime, &limit, |limit| {
        (0..500)
            .map(|_| {
                limit
                    .reserve(&head(), 0, None)
                    .map(|reservation| reservation.send_at())
            })
            .collect()
    });
    let mut starts = Vec::new();
    for result in results {
        match result {
            Ok(start) => starts.push(start - now),
            Err(limited) => {
                assert_eq!(limited.cause(), RateLimitCause::Wait);
                assert!(limited.retry_after() > Duration::from_secs(60), "{limited}");
            }
        }
    }
    starts.sort();
    assert_eq!(starts.len(), 610);
    assert!(starts[..10].iter().all(Duration::is_zero), "the burst");
    for (n, start) in starts[10..].iter().enumerate() {
        assert_eq!(*start, Duration::from_millis(100) * (n as u32 + 1));
    }
}

/// 6,000 tokens a minute (100 a second, a bucket of 100), 4 threads reserving requests of 1 to
/// 50 tokens in one instant, with waits of up to 30 s: over any span between two slots, the
/// tokens that start never exceed the rate times the span plus the bucket, and in all they are
/// 30 s of the rate and the bucket, less at most one request.
#[test]
fn concurrent_weighted_reservations_never_over_admit() {
    let runtime = paused();
    let limit = limit_on(
        &runtime,
        RateLimitConfig::default()
            .with_tokens_per_minute(Some(6_000))
            .with_max_wait(Duration::from_secs(30)),
    );
    let (results, now) = hammer(&runtime, &limit, |limit| {
        (0..1_000_u64)
            .filter_map(|i| {
                let tokens = 1 + i * 7 % 50;
                let reservation = limit.reserve(&head(), tokens, None).ok()?;
                Some((reservation.send_at(), tokens))
            })
            .collect()
    });
    let mut admitted: Vec<(Duration, u64)> = results
        .into_iter()
        .map(|(start, tokens)| (start - now, tokens))
        .collect();
    admitted.sort();
    let total: u64 = admitted.iter().map(|(_, tokens)| tokens).sum();
    assert!((3_100 - 50..=3_100).contains(&total), "{total}");
    for (i, (first, _)) in admitted.iter().enumerate() {
        let mut tokens = 0;
        for (start, weight) in &admitted[i..] {
            tokens += weight;
            let span = (*start - *first).as_secs_f64();
            assert!(
                tokens as f64 <= 100.0 * span + 100.0 + 1e-6,
                "{tokens} tokens in {span} s from {first:?}"
            );
        }
    }
}

/// 4 threads each reserving 100 slots at 600 a minute and dropping every other one, from the
/// middle of the queue as much as its end: the 200 kept are as if alone, so the next request
/// gets the slot 200 intervals on, less the bucket's room (19.1 s).
#[test]
fn slots_given_back_concurrently_are_given_back_exactly() {
    let runtime = paused();
    let limit = limit_on(
        &runtime,
        RateLimitConfig::default()
            .with_requests_per_minute(Some(600))
            .with_max_wait(Duration::from_secs(3_600)),
    );
    let (kept, now) = hammer(&runtime, &limit, |limit| {
        let mut kept = Vec::new();
        for i in 0..100 {
            let reservation = limit.reserve(&head(), 0, None).unwrap();
            if i % 2 == 0 {
                kept.push(reservation);
            }
        }
        kept.into_iter().map(Reservation::send).collect()
    });
    assert_eq!(kept.len(), 200);
    let _clock = runtime.enter();
    let next = limit.reserve(&head(), 0, None).unwrap();
    assert_eq!(next.start() - now, Duration::from_millis(19_100));
}

/// Reserving then sending, as the tests do, keeping only the slot.
trait SendAt {
    fn send_at(self) -> Instant;
}

impl SendAt for Reservation {
    fn send_at(self) -> Instant {
        let start = self.start();
        drop(self.send());
        start
    }
}
