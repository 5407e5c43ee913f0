//! Runs the fault-injecting mock LLM server, sends it a burst of plain requests (one attempt each,
//! no protection), prints what it served and exits.
//!
//! ```text
//! cargo run -p stormguard-examples --bin mock_llm               # burst, summary, exit
//! cargo run -p stormguard-examples --bin mock_llm -- --serve 30 # then stay up 30 s for curl
//! ```
//!
//! With `"stream": true` in the request's JSON the mock streams its answer (`text/event-stream`,
//! one chunk per token); `curl -N` prints the chunks as they come. The same server answers
//! Anthropic's `POST /v1/messages` in Anthropic's format.

use std::time::Duration;

use stormguard_examples::mock::{self, MockConfig};

const CONCURRENCY: usize = 16;
const PER_WORKER: usize = 12;
const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_for = serve_seconds()?;
    let config = MockConfig {
        error_rate: 0.2,
        ..MockConfig::default()
    };
    println!(
        "mock LLM: {:.0}% errors, {:?} + {:?}/token, capacity {}",
        config.error_rate * 100.0,
        config.base_latency,
        config.latency_per_token,
        config.capacity
    );
    let server = mock::spawn(config).await?;
    println!("listening on {}", server.url());

    let client = reqwest::Client::new();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let client = client.clone();
        let url = server.url();
        workers.spawn(async move {
            for _ in 0..PER_WORKER {
                // A failed request is the point of the mock: its status is counted server-side.
                let _ = client.post(&url).body(BODY).send().await;
            }
        });
    }
    while workers.join_next().await.is_some() {}

    if serve_for > Duration::ZERO {
        println!(
            "serving for {serve_for:?}: curl -d '{BODY}' {}",
            server.url()
        );
        tokio::time::sleep(serve_for).await;
    }

    let stats = server.stats.snapshot();
    server.shutdown().await;
    println!(
        "served {} requests (peak {} at once)",
        stats.attempts, stats.peak_in_flight
    );
    for (status, count) in &stats.by_status {
        println!("  {status}: {count}");
    }
    Ok(())
}

/// `--serve SECS`: how long to stay up after the burst (default 0).
fn serve_seconds() -> Result<Duration, Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut serve = Duration::ZERO;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve" => {
                let secs: u64 = args.next().ok_or("--serve needs seconds")?.parse()?;
                serve = Duration::from_secs(secs.min(3_600));
            }
            other => return Err(format!("unknown argument {other:?} (try --serve SECS)").into()),
        }
    }
    Ok(serve)
}
