//! A game day: the axum gateway of `axum_gateway` in front of a provider that goes bad on a
//! schedule, played by `stormguard::chaos` under the gateway's upstream client, and what the
//! gateway's callers saw, 5 s at a time.
//!
//! **A staging exercise.** The chaos layer fails real calls on purpose: it belongs in staging, on
//! a game day, never in production (it is behind `stormguard`'s `chaos` feature, off by default).
//!
//! Callers are plain HTTP clients (no retries of their own) sending 200 requests a second for
//! 35 s, each with a 3 s deadline (`x-request-timeout-ms`), whole and streamed answers on OpenAI's
//! and Anthropic's routes. The provider, a healthy mock, is made to fail by the schedule:
//!
//! | from | for | what the provider does |
//! |---|---|---|
//! | 5 s | 5 s | overloaded: 20% 529 `overloaded_error`, 10% answers 800 ms late, 5% of streams fail before their first token |
//! | 10 s | 5 s | rate limited: 25% 429 with `Retry-After: 1`, 5% 429 `insufficient_quota` |
//! | 15 s | 5 s | streams break: 20% cut after 5 events, 5% stall after 5 events, 5% a malformed event |
//! | 20 s | 5 s | a black hole: 90% of calls are never answered |
//! | 25 s | | healthy again |
//!
//! ```text
//! cargo run -p stormguard-examples --bin game_day
//! ```
//!
//! Each row is a 5 s window of calls, by when they were sent: what their callers saw, then what
//! the gateway's engine did in the same 5 s (from its metrics): the retries it sent, and the
//! retries its budget refused (the failure then handed back as it came).
//!
//! What to look for (a run on a 2-core machine, in 5 s windows): before and after the faults, every
//! call answered, p99 about 40 ms. In the overload, about 96% of calls still answered: the gateway
//! retries the 529s within its retry budget (one retry for ten successes, over the last 10 s),
//! which cannot cover 20% of them (about 200 retries, 40 refused), and the late answers show in the
//! p99 (about 850 ms). In the rate limits, every 429 reaches its caller at once, with its hint: 283
//! of 1000 calls, the 45 exhausted quotas (never retried) and all 238 that asked for 1 s, though a
//! second fits the 3 s deadline: the budget refuses every one of their retries. A retry after a
//! hint draws on the budget like any other, and the overload's retries count against it until 10 s
//! after they were sent, while the deposits of the healthy first seconds leave the window. (Run
//! without the overload, the same window retries about 200 of the hinted 429s, each answered after
//! its second, and 135 429s reach their callers.) When streams break, every stream cut or broken
//! reaches its caller whole or ends with an error event, and no word is ever shown twice or lost; a
//! stall can hold its caller up to the deadline (the p99 of 3 s). In the black hole, the callers
//! wait out their 3 s deadline (504) until the gateway's breaker opens and answers at once (503);
//! it stays open into the next window, which comes back as its probes succeed, and the last 5 s are
//! clean.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use stormguard::chaos::{ChaosLayer, ErrorAnswer, Fault, FaultKind};
use stormguard::metrics::{REFUSALS, RETRIES};
use stormguard_examples::gateway::{Route, Running, prometheus};
use stormguard_examples::load::{Call, Load, Seen, Tally};
use stormguard_examples::mock::MockConfig;

/// Requests a second.
const RATE: u32 = 200;
/// How long the callers call.
const DURATION: Duration = Duration::from_secs(35);
/// Every request's deadline.
const DEADLINE: Duration = Duration::from_secs(3);
/// The width of a row of the table.
const WINDOW: Duration = Duration::from_secs(5);

/// The schedule of the table in the docs above.
fn schedule() -> ChaosLayer {
    let secs = Duration::from_secs;
    let during = |kind, rate, from: u64, lasting: u64| {
        Fault::new(kind, rate)
            .with_start(secs(from))
            .with_duration(Some(secs(lasting)))
    };
    let answer = FaultKind::Answer;
    let rate_limited = ErrorAnswer::RateLimited {
        retry_after: Some(secs(1)),
    };
    [
        during(answer(ErrorAnswer::Overloaded), 0.2, 5, 5),
        during(FaultKind::Latency(Duration::from_millis(800)), 0.1, 5, 5),
        during(FaultKind::ErrorBeforeContent, 0.05, 5, 5),
        during(answer(rate_limited), 0.25, 10, 5),
        during(answer(ErrorAnswer::QuotaExhausted), 0.05, 10, 5),
        during(FaultKind::CutAfter(5), 0.2, 15, 5),
        during(FaultKind::StallAfter(5), 0.05, 15, 5),
        during(FaultKind::MalformedAfter(5), 0.05, 15, 5),
        during(FaultKind::Silence, 0.9, 20, 5),
    ]
    .into_iter()
    .fold(ChaosLayer::new().with_seed(7), ChaosLayer::with_fault)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = MockConfig {
        error_rate: 0.0,
        capacity: 10_000,
        numbered: true,
        ..MockConfig::default()
    };
    let chaos = schedule();
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let gateway =
        Running::start_with(loopback, "provider", provider, Route::Direct, chaos.clone()).await?;
    println!(
        "game day: {RATE} requests/s for {DURATION:?}, {DEADLINE:?} deadline each, through the \
         gateway at {} (GET /metrics, /healthz)",
        gateway.addr
    );
    let load = Load {
        rate: RATE,
        duration: DURATION,
        deadline: DEADLINE,
    };
    let mut windows: BTreeMap<u64, Window> = BTreeMap::new();
    let base = format!("http://{}", gateway.addr);
    let metrics = prometheus::install()?;
    let started = Instant::now();
    // The engine's counters as each window begins (read when the first call after it ends).
    let mut retries = Vec::new();
    load.run(&base, |call| {
        let window = call.sent.as_secs() / WINDOW.as_secs();
        windows.entry(window).or_default().count(&call);
        let now = started.elapsed().as_secs() / WINDOW.as_secs();
        while retries.len() as u64 <= now {
            retries.push(Retries::read(&metrics));
        }
    })
    .await;
    retries.push(Retries::read(&metrics));
    let health = gateway.health.clone();
    gateway.stop().await;

    println!(
        "\n{:>7}  what the callers saw | what the gateway retried then",
        "sent at"
    );
    for (window, seen) in &mut windows {
        let from = window * WINDOW.as_secs();
        let at = |n: u64| {
            usize::try_from(n)
                .ok()
                .and_then(|n| retries.get(n))
                .copied()
        };
        let retried = match (at(*window), at(window + 1)) {
            (Some(then), Some(next)) => next.since(then),
            _ => String::from("?"),
        };
        println!("{from:>5} s  {} | {retried}", seen.line());
    }
    println!("\nwhat the chaos layer injected:");
    for fault in chaos.snapshot().faults {
        println!("  {:>5}  {}", fault.injected, fault.kind);
    }
    let breaker = health.to_json()["providers"][0]["breaker"].clone();
    println!(
        "the gateway's breaker opened {} times",
        breaker["opened"].as_u64().unwrap_or(0)
    );
    Ok(())
}

/// What the gateway's engine did so far, from its metrics: the retries it sent, and the retries
/// its budget refused (the failure then handed back as it came).
#[derive(Clone, Copy)]
struct Retries {
    sent: u64,
    refused: u64,
}

impl Retries {
    fn read(metrics: &PrometheusHandle) -> Self {
        let text = metrics.render();
        // The exporter writes `stormguard.retries` as `stormguard_retries`.
        let total = |name: &str, labels| prometheus::sum(&text, &name.replace('.', "_"), labels);
        Self {
            sent: total(RETRIES, &[]) as u64,
            refused: total(REFUSALS, &[("cause", "budget")]) as u64,
        }
    }

    /// `12 retries, 3 refused by the budget`: what happened between `then` and these.
    fn since(self, then: Retries) -> String {
        let sent = self.sent.saturating_sub(then.sent);
        let refused = self.refused.saturating_sub(then.refused);
        format!("{sent} retries, {refused} refused by the budget")
    }
}

/// What the callers of one window saw.
#[derive(Default)]
struct Window {
    tally: Tally,
    took: Vec<Duration>,
}

impl Window {
    fn count(&mut self, call: &Call) {
        self.tally.count(call, DEADLINE, Duration::ZERO);
        self.took.push(call.took);
    }

    /// `1000 calls: 990 answered, ...; p50 20ms, p99 1.2s; words: 0 repeated, 0 missing`.
    fn line(&mut self) -> String {
        self.took.sort_unstable();
        let at = |share: f64| {
            let last = self.took.len().saturating_sub(1);
            self.took
                .get((last as f64 * share).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let seen: Vec<String> = self
            .tally
            .seen
            .iter()
            .map(|(seen, count)| format!("{count} {seen}"))
            .collect();
        let ok = self.tally.of(Seen::Answered) + self.tally.of(Seen::Streamed);
        format!(
            "{} calls, {:.0}% ok ({}); p50 {:.0?}, p99 {:.0?}; words shown twice {}, lost {}",
            self.tally.calls,
            100.0 * ok as f64 / self.tally.calls.max(1) as f64,
            seen.join(", "),
            at(0.5),
            at(0.99),
            self.tally.repeated,
            self.tally.missing
        )
    }
}
