//! A reqwest-middleware client with `StormguardMiddleware` against the mock LLM server: first a
//! flaky provider (20% rate limits, 503s and 529s), then a total outage. Prints what each phase
//! cost the backend and exits.
//!
//! ```text
//! cargo run -p stormguard-examples --bin reqwest_client
//! ```

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use stormguard::ClientLayer;
use stormguard::jitter::FullJitter;
use stormguard::reqwest::StormguardMiddleware;
use stormguard_examples::mock::{self, Fault, MockConfig};
use stormguard_examples::throttled;
use tokio::time::Instant;

const CONCURRENCY: usize = 16;
const PER_WORKER: usize = 12;
const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flaky = MockConfig {
        error_rate: 0.2,
        faults: vec![
            (
                Fault::RateLimited {
                    retry_after: Duration::from_millis(50),
                },
                2,
            ),
            (Fault::Unavailable, 1),
            (Fault::Overloaded, 1),
        ],
        ..MockConfig::default()
    };
    phase("flaky provider (20% errors)", flaky).await?;
    phase(
        "total outage (100% 503)",
        MockConfig::outage(Fault::Unavailable),
    )
    .await?;
    Ok(())
}

async fn phase(name: &str, config: MockConfig) -> Result<(), Box<dyn std::error::Error>> {
    let server = mock::spawn(config).await?;
    // Delays scaled down from the defaults (500 ms .. 8 s) so that the example ends in seconds.
    let layer = ClientLayer::default()
        .with_backoff(FullJitter::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
        ))
        .with_timeout(Duration::from_secs(5));
    let budget = layer.budget().clone();
    let throttle = layer.throttle().cloned();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(layer))
        .build();

    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let client = client.clone();
        let url = server.url();
        workers.spawn(async move {
            let mut tally = Tally::default();
            for _ in 0..PER_WORKER {
                match client.post(&url).body(BODY).send().await {
                    Ok(response) if response.status().is_success() => tally.ok += 1,
                    Ok(_) => tally.failed += 1,
                    Err(error) if throttled(&error) => tally.throttled += 1,
                    Err(_) => tally.errors += 1,
                }
            }
            tally
        });
    }
    let mut total = Tally::default();
    while let Some(tally) = workers.join_next().await {
        let tally = tally?;
        total.ok += tally.ok;
        total.failed += tally.failed;
        total.throttled += tally.throttled;
        total.errors += tally.errors;
    }
    let elapsed = started.elapsed();
    let stats = server.stats.snapshot();
    server.shutdown().await;

    let requests = total.ok + total.failed + total.throttled + total.errors;
    println!("== {name}");
    println!(
        "requests {requests}: {} ok, {} failed responses, {} throttled locally, {} other errors (deadline, transport) in {elapsed:.2?}",
        total.ok, total.failed, total.throttled, total.errors
    );
    println!(
        "success rate {:.1}%, upstream attempts {}, amplification {:.2}x",
        100.0 * total.ok as f64 / requests.max(1) as f64,
        stats.attempts,
        stats.attempts as f64 / requests.max(1) as f64
    );
    println!("upstream statuses {:?}", stats.by_status);
    println!("x-retry-attempt seen {:?}", stats.by_attempt_header);
    let budget = budget.snapshot();
    let probability = throttle.map_or(0.0, |throttle| throttle.snapshot().probability);
    println!(
        "budget, its last 10 s: {} retries granted, {} refused; throttle: drop probability \
         {probability:.2}",
        budget.withdrawals, budget.rejected
    );
    Ok(())
}

#[derive(Default)]
struct Tally {
    ok: usize,
    failed: usize,
    throttled: usize,
    errors: usize,
}
