//! The soak: the axum gateway on 127.0.0.1, its provider (the mock, on loopback) failing in every
//! way `stormguard::chaos` knows at once, under 1,000 requests a second of callers, whole and
//! streamed answers on both routes, for `STORMGUARD_SOAK_SECS` seconds (60 by default; 600 by
//! hand: see docs/ROBUSTNESS.md, "Soak"). Real time and real sockets: memory and connections are
//! the point.
//!
//! It must end with no panic anywhere in the process; every call ended within its deadline; every
//! guard's count back to rest once the retry budget's window has passed (the breaker's attempts
//! in flight and probes, the rate limit's slots, the budget's withdrawals, the throttle's window,
//! the chaos layer's and the provider's calls in flight); resident memory at the end of the load
//! within 10% of what it was after the warm-up; and no word of any streamed answer shown twice,
//! out of order or lost. It prints its figures whether it passes or not.

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
use stormguard_examples::mock::{MockConfig, StatsSnapshot};
use tokio::time::Instant;

/// The allocator: mimalloc gives the pages a burst took back once they are free. glibc's keeps
/// them (an arena shrinks only from its top), so under glibc the resident size follows the
/// largest burst of calls the machine's scheduler happened to cause, not what the process holds,
/// and a memory check would measure the machine rather than the gateway.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Requests a second.
const RATE: u32 = 1_000;
/// The soak's length without `STORMGUARD_SOAK_SECS`.
const DEFAULT_SECS: u64 = 60;
/// Every request's deadline.
const DEADLINE: Duration = Duration::from_secs(4);
/// How late after its deadline a call may end, as its caller measures it: the gateway's timers
/// fire on time, but on a busy 2-core machine the caller's own task waits its turn to read the
/// last bytes.
const SLACK: Duration = Duration::from_millis(500);
/// Resident memory at the end of the load may exceed what it was after the warm-up by this share.
const RSS_GROWTH: f64 = 0.10;
/// How far apart resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The resident size "after the warm-up" is the lowest of the samples of this long after it, and
/// "at the end" the lowest of the last samples of this long: what the process holds between
/// bursts. A burst of calls (a few hundred at once for a moment, when the machine is busy) takes
/// memory that comes back within seconds of its end; a leak stays, and lifts the lowest sample
/// too.
const MEMORY_WINDOW: Duration = Duration::from_secs(15);

/// Every fault the chaos layer knows, at once, each at a rate a provider in a bad hour shows
/// (about 10% of calls fail, 5.5% of streams break), seeded so that runs can be compared.
///
/// A 429's hint holds the gateway's shared quota for every request until it has passed (what a
/// provider asks of an account), so the hinted 429s ask for 50 ms: at 10 a second, hints of
/// 500 ms would hold the quota shut most of the time and the soak would measure a queue.
fn every_fault() -> ChaosLayer {
    let answer = FaultKind::Answer;
    let hinted = ErrorAnswer::RateLimited {
        retry_after: Some(Duration::from_millis(50)),
    };
    let faults = [
        (answer(hinted), 0.01),
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

/// This process's resident memory in KiB (`VmRSS`), on Linux.
fn resident_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The CPU time this process has used (user and system), on Linux: `/proc/self/stat`'s fields
/// 14 and 15, in clock ticks of 1/100 s.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command's name, which is in parentheses and may hold spaces.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    let (user, system) = (ticks()?, ticks()?);
    Some(Duration::from_millis((user + system) * 10))
}

/// The resident memory every [`SAMPLE_EVERY`] from the end of the warm-up to the end of the
/// load.
async fn sample_memory(warm_up: Duration, load: Duration) -> Vec<(Duration, Option<u64>)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut at = warm_up;
    while at <= load {
        tokio::time::sleep_until(started + at).await;
        samples.push((at, resident_kib()));
        at += SAMPLE_EVERY;
    }
    samples
}

/// The lowest resident size sampled within `window` of the first sample (`last`: of the last
/// one), in KiB; `None` where there are none.
fn lowest_kib(memory: &[(Duration, Option<u64>)], window: Duration, last: bool) -> Option<u64> {
    let (first, end) = (memory.first()?.0, memory.last()?.0);
    memory
        .iter()
        .filter(|(at, _)| {
            if last {
                *at + window > end
            } else {
                *at < first + window
            }
        })
        .filter_map(|(_, kib)| *kib)
        .min()
}

/// A provider that answers every request (the chaos layer fails them), quickly, with numbered
/// words, keeping nothing per request.
fn provider() -> MockConfig {
    MockConfig {
        error_rate: 0.0,
        capacity: 100_000,
        numbered: true,
        keep_idempotency_keys: false,
        ..MockConfig::default()
    }
}

/// What the soak saw, for its figures and its checks.
struct Figures {
    secs: u64,
    sent: u64,
    ran: Duration,
    cpu: Option<Duration>,
    tally: Tally,
    received: u64,
    chaos: ChaosSnapshot,
    provider: StatsSnapshot,
    at_rest: Value,
    end: Value,
    memory: Vec<(Duration, Option<u64>)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_holds_under_every_fault_at_1000_requests_a_second() {
    let panics = count_panics();
    let secs = std::env::var("STORMGUARD_SOAK_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let load = Load {
        rate: RATE,
        duration: Duration::from_secs(secs),
        deadline: DEADLINE,
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
    let gateway = Running::start_with(loopback, "soak", provider(), route, chaos.clone())
        .await
        .unwrap();
    let at_rest = gateway.health.to_json();

    let cpu_before = cpu_time();
    let started = Instant::now();
    let warm_up = (load.duration / 4).min(Duration::from_secs(60));
    let memory = tokio::spawn(sample_memory(warm_up, load.duration));
    let mut tally = Tally::default();
    let base = format!("http://{}", gateway.addr);
    let sent = load
        .run(&base, |call| tally.count(&call, DEADLINE, SLACK))
        .await;
    let ran = started.elapsed();
    let cpu = cpu_time().zip(cpu_before).map(|(now, then)| now - then);
    let memory = memory.await.unwrap();

    // Every guard's window passes: what is left was never given back.
    tokio::time::sleep(DEFAULT_TTL + Duration::from_secs(1)).await;
    let figures = Figures {
        secs,
        sent,
        ran,
        cpu,
        tally,
        received: gateway.received.load(Ordering::Relaxed),
        chaos: chaos.snapshot(),
        provider: gateway.provider_stats(),
        at_rest,
        end: gateway.health.to_json(),
        memory,
    };
    gateway.stop().await;
    figures.print();

    assert_eq!(panics.load(Ordering::SeqCst), 0, "panics");
    figures.assert_every_call_ended_in_time();
    figures.assert_at_rest();
    figures.assert_memory_flat();
}

impl Figures {
    /// Every call sent, ended and counted, none hung or late, every fault injected, no word of a
    /// stream shown twice or lost.
    fn assert_every_call_ended_in_time(&self) {
        let tally = &self.tally;
        assert_eq!(tally.calls, self.sent, "every call ends and is counted");
        assert!(
            self.sent as f64 >= 0.95 * f64::from(RATE) * self.secs as f64,
            "{} calls in {} s",
            self.sent,
            self.secs
        );
        assert_eq!(tally.of(Seen::Hung), 0, "{tally}");
        assert_eq!(tally.late, 0, "calls past their deadline: {tally}");
        assert_eq!(
            (tally.repeated, tally.missing, tally.foreign),
            (0, 0, 0),
            "{tally}"
        );
        assert!(tally.of(Seen::Streamed) > 0 && tally.of(Seen::Answered) > 0);
        for fault in &self.chaos.faults {
            assert!(fault.injected > 0, "{} never injected", fault.kind);
        }
    }

    /// Every count back where it was before the load: what the gateway's guards hold, the chaos
    /// layer's calls in flight, the provider's.
    fn assert_at_rest(&self) {
        let budget = &self.end["budget"];
        assert_eq!(budget["withdrawals"], 0, "budget: {budget}");
        assert_eq!(budget["deposits"], 0, "budget: {budget}");
        let provider = &self.end["providers"][0];
        let breaker = &provider["breaker"];
        assert_eq!(breaker["in_flight"], 0, "breaker: {breaker}");
        assert_eq!(breaker["probes"], 0, "breaker: {breaker}");
        assert_eq!(provider["throttle"]["requests"], 0, "{provider}");
        let limit = &provider["rate_limit"];
        let full = &self.at_rest["providers"][0]["rate_limit"];
        for slots in ["requests_available", "tokens_available"] {
            assert_eq!(limit[slots], full[slots], "{slots}: {limit}");
        }
        assert_eq!(self.chaos.in_flight, 0, "the chaos layer's calls in flight");
        assert_eq!(self.provider.in_flight, 0, "the provider's requests");
    }

    /// Resident memory at the end of the load within [`RSS_GROWTH`] of what it was after the
    /// warm-up ([`MEMORY_WINDOW`] says how each is read). Linux only: elsewhere there is no
    /// `/proc/self/status` and nothing is checked.
    fn assert_memory_flat(&self) {
        let (Some(warm), Some(end)) = self.memory_flat() else {
            return;
        };
        let limit = warm as f64 * (1.0 + RSS_GROWTH);
        assert!(
            end as f64 <= limit,
            "resident memory grew from {warm} KiB to {end} KiB (limit {limit:.0} KiB)"
        );
    }

    /// The resident size after the warm-up and at the end of the load, in KiB.
    fn memory_flat(&self) -> (Option<u64>, Option<u64>) {
        (
            lowest_kib(&self.memory, MEMORY_WINDOW, false),
            lowest_kib(&self.memory, MEMORY_WINDOW, true),
        )
    }

    /// Prints what the soak did and where every count ended.
    fn print(&self) {
        let cpu = self
            .cpu
            .map_or("-".to_owned(), |cpu| format!("{:.1}", cpu.as_secs_f64()));
        println!(
            "== soak: {} s at {RATE} requests/s, deadline {DEADLINE:?}",
            self.secs
        );
        println!(
            "{} calls sent, the last one ended after {:.1?}; {cpu} s of CPU",
            self.sent, self.ran
        );
        println!("callers saw {}", self.tally);
        let chaos = &self.chaos;
        println!(
            "the gateway received {} requests and made {} calls to the provider; chaos injected \
             {} faults:",
            self.received,
            chaos.calls,
            chaos.injected()
        );
        for fault in &chaos.faults {
            println!(
                "  {:>7}  {} (rate {})",
                fault.injected, fault.kind, fault.rate
            );
        }
        println!("{}", self.end_state());
        let mib = |kib: Option<u64>| {
            kib.map_or("-".to_owned(), |kib| {
                format!("{:.1} MiB", kib as f64 / 1024.0)
            })
        };
        let (warm, end) = self.memory_flat();
        println!(
            "resident memory: {} after the warm-up, {} at the end (the lowest of {MEMORY_WINDOW:?} each); \
             every 5 s: {}",
            mib(warm),
            mib(end),
            self.memory_samples()
        );
    }

    /// Every count at the end, after the budget's window.
    fn end_state(&self) -> String {
        let (end, budget) = (&self.end["providers"][0], &self.end["budget"]);
        let (breaker, limit) = (&end["breaker"], &end["rate_limit"]);
        let full = &self.at_rest["providers"][0]["rate_limit"];
        format!(
            "at the end, after {DEFAULT_TTL:?}: budget withdrawals {}, deposits {}, balance {}; \
             breaker {} (opened {} times), in flight {}, probes {}; throttle requests {}; rate \
             limit requests {}/{}, tokens {}/{}; chaos in flight {}; provider in flight {} (at \
             most {} at once)",
            budget["withdrawals"],
            budget["deposits"],
            budget["balance"],
            breaker["state"],
            breaker["opened"],
            breaker["in_flight"],
            breaker["probes"],
            end["throttle"]["requests"],
            limit["requests_available"],
            full["requests_available"],
            limit["tokens_available"],
            full["tokens_available"],
            self.chaos.in_flight,
            self.provider.in_flight,
            self.provider.peak_in_flight,
        )
    }

    /// `15s 70.1 MiB, 20s 71.0 MiB, ...`: from the warm-up on, every fifth second.
    fn memory_samples(&self) -> String {
        let samples: Vec<String> = self
            .memory
            .iter()
            .filter(|(at, _)| at.as_secs() % 5 == 0)
            .map(|(at, kib)| match kib {
                Some(kib) => format!("{}s {:.1} MiB", at.as_secs(), *kib as f64 / 1024.0),
                None => format!("{}s -", at.as_secs()),
            })
            .collect();
        samples.join(", ")
    }
}
