//! The soak: the axum gateway on 127.0.0.1, its provider (the mock, on loopback) failing in every
//! way `stormguard::chaos` knows at once, under 1,000 requests a second of callers, whole and
//! streamed answers on both routes, for `STORMGUARD_SOAK_SECS` seconds (60 by default; 600 by
//! hand: see the README). Real time and real sockets: memory and connections are the point.
//!
//! It must end with no panic anywhere in the process; every call ended within its deadline; every
//! guard's count back to rest once the retry budget's window has passed (the breaker's attempts
//! in flight and probes, the rate limit's slots, the budget's withdrawals, the throttle's window,
//! the chaos layer's and the provider's calls in flight); resident memory at the end of the load
//! within 10% of what it was after the warm-up; and no word of any streamed answer shown twice,
//! out of order or lost.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use stormguard::budget::DEFAULT_TTL;
use stormguard::chaos::{ChaosLayer, ChaosSnapshot, ErrorAnswer, Fault, FaultKind};
use stormguard::rate_limit::{RateLimit, RateLimitConfig};
use stormguard_examples::gateway::{Route, Running};
use stormguard_examples::load::{Load, Seen, Tally};
use stormguard_examples::mock::MockConfig;
use tokio::time::Instant;

/// Requests a second.
const RATE: u32 = 1_000;
/// The soak's length without `STORMGUARD_SOAK_SECS`.
const DEFAULT_SECS: u64 = 60;
/// Every request's deadline.
const DEADLINE: Duration = Duration::from_secs(4);
/// How late after its deadline a call may end: the gateway's timers fire on time, but a busy
/// 2-core machine takes a while to run the tasks they wake and to write the last bytes.
const SLACK: Duration = Duration::from_millis(500);
/// Resident memory at the end of the load may exceed what it was after the warm-up by this share.
const RSS_GROWTH: f64 = 0.10;

/// Every fault the chaos layer knows, at once, each at a rate a provider in a bad hour shows
/// (in all about 10% of calls fail and 5.5% of streams break), with a seed so that runs can be
/// compared.
fn every_fault() -> ChaosLayer {
    let answer = |answer| FaultKind::Answer(answer);
    let faults = [
        (
            answer(ErrorAnswer::RateLimited {
                retry_after: Some(Duration::from_millis(500)),
            }),
            0.01,
        ),
        (answer(ErrorAnswer::RateLimited { retry_after: None }), 0.01),
        (answer(ErrorAnswer::QuotaExhausted), 0.005),
        (answer(ErrorAnswer::ContextTooLong), 0.005),
        (answer(ErrorAnswer::ServerError), 0.01),
        (answer(ErrorAnswer::Unavailable), 0.01),
        (answer(ErrorAnswer::Overloaded), 0.01),
        (FaultKind::Latency(Duration::from_millis(300)), 0.02),
        (FaultKind::Silence, 0.003),
        (FaultKind::Reset, 0.01),
        (FaultKind::ErrorBeforeContent, 0.02),
        (FaultKind::CutAfter(6), 0.02),
        (FaultKind::StallAfter(6), 0.005),
        (FaultKind::MalformedAfter(4), 0.01),
    ];
    faults
        .into_iter()
        .fold(ChaosLayer::new().with_seed(2024), |chaos, (kind, rate)| {
            chaos.with_fault(Fault::new(kind, rate))
        })
}

/// Counts every panic in the process, whatever task it is in, and reports it as usual.
fn count_panics() -> Arc<AtomicU64> {
    let panics = Arc::new(AtomicU64::new(0));
    let counted = panics.clone();
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counted.fetch_add(1, Ordering::SeqCst);
        report(info);
    }));
    panics
}

fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// This process's resident memory in KiB (`VmRSS`), on Linux.
fn resident_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The resident memory after the warm-up and at the end of the load, and every 5 s between.
async fn sample_memory(warm_up: Duration, load: Duration) -> Vec<(Duration, Option<u64>)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut at = warm_up;
    while at <= load {
        tokio::time::sleep_until(started + at).await;
        samples.push((at, resident_kib()));
        at += Duration::from_secs(5);
    }
    if samples.last().is_none_or(|(last, _)| *last < load) {
        tokio::time::sleep_until(started + load).await;
        samples.push((load, resident_kib()));
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_holds_under_every_fault_at_1000_requests_a_second() {
    let panics = count_panics();
    let secs = std::env::var("STORMGUARD_SOAK_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let rate = std::env::var("SOAK_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(RATE);
    let cpu0 = cpu_secs();
    let load = Load {
        rate,
        duration: Duration::from_secs(secs),
        deadline: DEADLINE,
    };
    // A provider that answers every request (the chaos layer fails them), quickly, with
    // numbered words, keeping nothing per request.
    let provider = MockConfig {
        error_rate: 0.0,
        capacity: 100_000,
        numbered: true,
        keep_idempotency_keys: false,
        latency_per_token: Duration::from_millis(
            std::env::var("SOAK_PACE")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(1),
        ),
        ..MockConfig::default()
    };
    // A quota the gateway paces to, well above the load: every attempt takes a slot.
    let quota = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(300_000))
            .with_tokens_per_minute(Some(6_000_000)),
    );
    let chaos = every_fault();
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let route = Route::Quota(quota, None);
    let gateway = Running::start_with(loopback, "soak", provider, route, chaos.clone())
        .await
        .unwrap();
    let at_rest = gateway.health.to_json();

    let started = Instant::now();
    let warm_up = (load.duration / 4).min(Duration::from_secs(30));
    let memory = tokio::spawn(sample_memory(warm_up, load.duration));
    let mut tally = Tally::default();
    let base = format!("http://{}", gateway.addr);
    let sent = load
        .run(&base, |call| tally.count(&call, DEADLINE, SLACK))
        .await;
    let ran = started.elapsed();
    println!("CPU {:.1} s for {} calls", cpu_secs() - cpu0, sent);
    let memory = memory.await.unwrap();

    // Every guard's window passes: what is left was never given back.
    tokio::time::sleep(DEFAULT_TTL + Duration::from_secs(1)).await;
    let health = gateway.health.to_json();
    let chaos_now = chaos.snapshot();
    let provider_now = gateway.provider_stats();
    let received = gateway.received.load(Ordering::Relaxed);
    gateway.stop().await;

    print_figures(secs, sent, ran, &tally, &chaos_now, &health, &memory);
    println!(
        "the gateway received {received} requests; the provider {} attempts ({} streams, {} in \
         flight at the end, at most {} at once)",
        provider_now.attempts,
        provider_now.streams,
        provider_now.in_flight,
        provider_now.peak_in_flight
    );

    assert_eq!(panics.load(Ordering::SeqCst), 0, "panics");
    assert_eq!(tally.calls, sent, "every call ends and is counted");
    assert!(
        sent as f64 >= 0.95 * f64::from(RATE) * secs as f64,
        "{sent} calls in {secs} s"
    );
    assert_eq!(tally.of(Seen::Hung), 0, "{tally}");
    assert_eq!(tally.late, 0, "calls past their deadline: {tally}");
    assert_eq!(
        (tally.repeated, tally.missing, tally.foreign),
        (0, 0, 0),
        "{tally}"
    );
    assert!(tally.of(Seen::Streamed) > 0 && tally.of(Seen::Answered) > 0);
    assert_at_rest(&at_rest, &health, &chaos_now, provider_now.in_flight);
    for fault in &chaos_now.faults {
        assert!(fault.injected > 0, "{} never injected", fault.kind);
    }
    assert_memory_flat(&memory);
}

/// Every count back where it was before the load: what the gateway's guards hold, the chaos
/// layer's calls in flight, the provider's.
fn assert_at_rest(before: &Value, after: &Value, chaos: &ChaosSnapshot, provider_in_flight: usize) {
    let budget = &after["budget"];
    assert_eq!(budget["withdrawals"], 0, "budget: {budget}");
    assert_eq!(budget["deposits"], 0, "budget: {budget}");
    let provider = &after["providers"][0];
    let breaker = &provider["breaker"];
    assert_eq!(breaker["in_flight"], 0, "breaker: {breaker}");
    assert_eq!(breaker["probes"], 0, "breaker: {breaker}");
    assert_eq!(provider["throttle"]["requests"], 0, "{provider}");
    let limit = &provider["rate_limit"];
    let full = &before["providers"][0]["rate_limit"];
    assert_eq!(
        limit["requests_available"], full["requests_available"],
        "{limit}"
    );
    assert_eq!(
        limit["tokens_available"], full["tokens_available"],
        "{limit}"
    );
    assert_eq!(chaos.in_flight, 0, "the chaos layer's calls in flight");
    assert_eq!(provider_in_flight, 0, "the provider's requests in flight");
}

/// Resident memory at the end of the load within [`RSS_GROWTH`] of the first sample (after the
/// warm-up). Linux only: elsewhere there is no `/proc/self/status` and nothing is checked.
fn assert_memory_flat(memory: &[(Duration, Option<u64>)]) {
    let (Some((_, Some(warm))), Some((_, Some(end)))) = (memory.first(), memory.last()) else {
        println!("resident memory: not measured here (no /proc/self/status)");
        return;
    };
    let limit = *warm as f64 * (1.0 + RSS_GROWTH);
    assert!(
        *end as f64 <= limit,
        "resident memory grew from {warm} KiB to {end} KiB (limit {limit:.0} KiB)"
    );
}

/// Prints what the soak did and where everything ended.
fn print_figures(
    secs: u64,
    sent: u64,
    ran: Duration,
    tally: &Tally,
    chaos: &ChaosSnapshot,
    health: &Value,
    memory: &[(Duration, Option<u64>)],
) {
    println!("== soak: {secs} s at {RATE} requests/s, deadline {DEADLINE:?}");
    println!("{sent} calls sent, the last one ended after {ran:.1?}");
    println!("callers saw {tally}");
    println!(
        "chaos: {} calls, {} injected, {} in flight at the end",
        chaos.calls,
        chaos.injected(),
        chaos.in_flight
    );
    for fault in &chaos.faults {
        println!(
            "  {:>6} {} (rate {})",
            fault.injected, fault.kind, fault.rate
        );
    }
    println!("at the end, after {DEFAULT_TTL:?}: {:#}", health);
    let samples: Vec<String> = memory
        .iter()
        .map(|(at, kib)| match kib {
            Some(kib) => format!("{}s {:.1} MiB", at.as_secs(), *kib as f64 / 1024.0),
            None => format!("{}s -", at.as_secs()),
        })
        .collect();
    println!(
        "resident memory (after the warm-up, every 5 s, the end of the load): {}",
        samples.join(", ")
    );
}
