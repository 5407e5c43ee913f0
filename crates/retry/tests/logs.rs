//! The engine's log events. Alone in its test binary: a thread-local subscriber shares tracing's
//! callsite cache with every other test thread of the same binary.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_jitter::Constant;
use stormguard_test_kit::post;
use support::{CHAT_URI, Log, retries_only, scripted, status};
use tower::{Layer, ServiceExt};

/// Collects what a `fmt` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn retries_and_give_ups_are_logged_apart() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::DEBUG)
        .without_time()
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(250)))
        .layer(backend);
    client.oneshot(post(CHAT_URI, "{}")).await.unwrap();

    // Two retries at WARN, then the failure after retrying, once, at ERROR.
    let lines = captured.lines();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (line, attempt) in lines[..2].iter().zip(1..) {
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("retrying request"), "{line}");
        assert!(line.contains(&format!("retry_attempt={attempt}")), "{line}");
        assert!(line.contains("delay_ms=250"), "{line}");
        assert!(line.contains("reason=\"unavailable\""), "{line}");
    }
    assert!(lines[2].contains("ERROR"), "{}", lines[2]);
    assert!(
        lines[2].contains("request failed after retrying"),
        "{}",
        lines[2]
    );
    assert!(
        lines[2].contains("cause=\"attempts_exhausted\""),
        "{}",
        lines[2]
    );

    // Given up on without a retry (the budget is spent): at DEBUG only.
    let budget = stormguard_budget::RetryBudget::new(
        stormguard_budget::BudgetConfig::default().with_min_per_sec(0),
    );
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only().with_budget(budget).layer(backend);
    client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    let lines = captured.lines();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[3].contains("DEBUG"), "{}", lines[3]);
    assert!(
        lines[3].contains("cause=\"budget_exhausted\""),
        "{}",
        lines[3]
    );
}

/// A log that shows no spans (as the gateway's does by default, to save formatting two spans
/// a request) still reads whole: a retry's and a give-up's lines name their backend themselves.
#[tokio::test(start_paused = true)]
async fn retry_lines_name_their_backend_without_spans() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;

    let captured = Captured::default();
    let no_spans = tracing_subscriber::filter::filter_fn(|meta| {
        !meta.is_span() && *meta.level() <= tracing::Level::INFO
    });
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(captured.clone())
        .without_time()
        .with_filter(no_spans);
    let subscriber = tracing_subscriber::registry().with(logs);
    let _guard = tracing::subscriber::set_default(subscriber);

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only()
        .with_name("primary")
        .with_backoff(Constant::new(Duration::from_millis(250)))
        .layer(backend);
    client.oneshot(post(CHAT_URI, "{}")).await.unwrap();

    let lines = captured.lines();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for line in &lines {
        assert!(line.contains("backend=\"primary\""), "{line}");
        assert!(!line.contains("stormguard.attempt"), "{line}");
    }
    assert!(lines[0].contains("retry_attempt=1"), "{}", lines[0]);
    assert!(lines[2].contains("attempts=3"), "{}", lines[2]);
}

/// An outage at 12,000 requests a second for 30 s, on the paused clock: every request fails
/// with a 503. Logged at INFO and above (what operators keep), the lines per second stay
/// bounded by the retry budget and the summaries, whatever the load.
#[tokio::test(start_paused = true)]
async fn an_outage_at_12000_requests_a_second_logs_a_bounded_number_of_lines() {
    const RATE: u64 = 12_000;
    const SECONDS: u64 = 30;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::INFO)
        .without_time()
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    // The default budget: 10 s window, 1 retry a second for free, 10% of successes (none here).
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(1)))
        .layer(backend);
    let tick = Duration::from_millis(100);
    for _ in 0..SECONDS * 10 {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..RATE / 10 {
            calls.spawn(client.clone().oneshot(post(CHAT_URI, "{}")));
        }
        while let Some(call) = calls.join_next().await {
            assert_eq!(call.unwrap().unwrap().status(), 503);
        }
        tokio::time::advance(tick).await;
    }
    let lines = captured.lines();
    let per_second = lines.len() as f64 / SECONDS as f64;
    // About 1 retry a second (the budget's floor) with its failure, and one summary every 10 s:
    // a handful a second, against 12,000 requests a second given up on.
    assert!(
        per_second <= 5.0,
        "{per_second} lines/s: {:#?}",
        &lines[..lines.len().min(20)]
    );
    let summaries = lines
        .iter()
        .filter(|line| line.contains("given up on or refused"))
        .count();
    assert!((2..=3).contains(&summaries), "{summaries}");
    let summary = lines
        .iter()
        .find(|line| line.contains("given up on or refused"))
        .unwrap();
    assert!(
        summary.contains("WARN") && summary.contains("gave_up_budget_exhausted="),
        "{summary}"
    );
    eprintln!(
        "{} requests, {} lines ({per_second:.2} a second); before: 2 WARN lines per request given up on",
        RATE * SECONDS,
        lines.len()
    );
}
