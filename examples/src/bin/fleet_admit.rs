//! One replica of a fleet sharing a rate limit through Redis: takes every slot the limit gives
//! for a while and prints, as one JSON line, what it admitted and how long its decisions took.
//! Start several at once with the same `--key` and `--start-at`, and together they admit the
//! quota once, not once each.
//!
//! ```text
//! cargo run -p stormguard-examples --bin fleet_admit -- --redis redis://127.0.0.1:6379/ \
//!     --key demo --per-minute 6000 --seconds 5
//! ```
//!
//! Options: `--redis URL` (required), `--key NAME` (default `demo`), `--per-minute N` (default
//! 6000), `--seconds S` (default 5), `--tasks N` (default 4), `--replicas N` (the local share
//! while Redis is away; default: as Redis counts them), `--timeout-ms N` (the longest wait for
//! Redis per decision; default 5), `--start-at MS` (a Unix time in
//! milliseconds to start at, so that replicas start together).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stormguard::rate_limit::Fleet;
use stormguard_examples::fleet;
use tokio::time::Instant;

struct Options {
    redis: String,
    key: String,
    per_minute: u32,
    seconds: f64,
    tasks: usize,
    replicas: Option<u32>,
    timeout: Option<Duration>,
    start_at: Option<u64>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        redis: String::new(),
        key: "demo".into(),
        per_minute: 6_000,
        seconds: 5.0,
        tasks: 4,
        replicas: None,
        timeout: None,
        start_at: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |what: &str| format!("{flag}: {what} expected, got {value:?}");
        match flag.as_str() {
            "--redis" => options.redis = value,
            "--key" => options.key = value,
            "--per-minute" => options.per_minute = value.parse().map_err(|_| number("a count"))?,
            "--seconds" => options.seconds = value.parse().map_err(|_| number("seconds"))?,
            "--tasks" => options.tasks = value.parse().map_err(|_| number("a count"))?,
            "--replicas" => options.replicas = Some(value.parse().map_err(|_| number("a count"))?),
            "--timeout-ms" => {
                let ms = value.parse().map_err(|_| number("milliseconds"))?;
                options.timeout = Some(Duration::from_millis(ms));
            }
            "--start-at" => options.start_at = Some(value.parse().map_err(|_| number("a time"))?),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if options.redis.is_empty() {
        return Err("--redis URL is required".into());
    }
    if !(options.seconds.is_finite() && options.seconds > 0.0) {
        return Err("--seconds must be positive".into());
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let mut fleet = Fleet::new(&options.redis)?
        .with_prefix(&format!("stormguard:example:{}", options.key))
        .with_replicas(options.replicas);
    if let Some(timeout) = options.timeout {
        fleet = fleet.with_timeout(timeout);
    }
    let limit = fleet::limit(fleet.clone(), options.per_minute);
    if let Some(start_at) = options.start_at {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let start_at = Duration::from_millis(start_at);
        tokio::time::sleep(start_at.saturating_sub(now)).await;
    }
    let window = Duration::from_secs_f64(options.seconds);
    let run = fleet::admit(&limit, options.tasks, Instant::now() + window).await;
    let micros = |q| run.quantile(q).unwrap_or_default().as_micros();
    println!(
        "{{\"admitted\":{},\"refused\":{},\"decisions\":{},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},{}}}",
        run.admitted,
        run.refused,
        run.decisions.len(),
        micros(0.5),
        micros(0.99),
        run.longest().as_micros(),
        fleet::describe(fleet.snapshot())
    );
    Ok(())
}
