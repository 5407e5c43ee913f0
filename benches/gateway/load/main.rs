//! `gateway-load`: the load generator of the gateway benchmark (`benches/gateway/run.sh`), on
//! 127.0.0.1 only.
//!
//! ```text
//! gateway-load port                                   a free port on 127.0.0.1
//! gateway-load wait PORT SINCE PID                    waits until PORT answers HTTP; prints the
//!                                                     ms since SINCE (bash's $EPOCHREALTIME);
//!                                                     fails at once if PID has ended
//! gateway-load measure PORT NAME [key=value...]       measures one subject; appends its row to
//!                                                     $BENCH_RESULTS and prints it
//! gateway-load table FILE                             the markdown table of a results file
//! ```
//!
//! `measure`'s keys: `pid=` (the subject's process, for its memory), `key=` (sent as
//! `Authorization: Bearer`), and figures copied into the row as they are (`start_ms=`,
//! `size_bytes=`, `reference=1`, `floor=1`). The durations and rates come from the environment:
//! `BENCH_SECONDS` (5, each measured run), `BENCH_WARMUP_SECONDS` (2), `BENCH_CONNECTIONS` (64),
//! `BENCH_RATES` (`200,1000,5000`), `BENCH_STREAM_RATE` (50 streams a second). A fixed rate above
//! the subject's saturation is not offered (its latency would only measure the queue), and its
//! cells stay empty; streams are offered at a tenth of the saturation when that is below
//! `BENCH_STREAM_RATE`, and the table says so.

mod client;
mod memory;
mod runs;
mod table;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use client::{Target, Timing};
use table::Row;

type Error = Box<dyn std::error::Error>;

/// The request every subject gets: a short chat completion, as the OpenAI SDKs send it.
const REQUEST: &str = r#"{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}"#;
/// The same, streamed.
const STREAM_REQUEST: &str = r#"{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"stream":true}"#;
/// The path every subject serves chat completions on.
const PATH: &str = "/v1/chat/completions";
/// The longest a subject may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(180);

const USAGE: &str = "usage: gateway-load port | wait PORT SINCE PID | measure PORT NAME [key=value...] | table FILE";

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["port"] => {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
            println!("{}", listener.local_addr()?.port());
            Ok(())
        }
        ["wait", port, since, pid] => {
            runtime()?.block_on(wait(loopback(port)?, since, pid.parse()?))
        }
        ["measure", port, name, fields @ ..] => {
            let row = runtime()?.block_on(measure(loopback(port)?, name, fields))?;
            let line = row.line();
            if let Ok(path) = std::env::var("BENCH_RESULTS") {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                writeln!(file, "{line}")?;
            }
            println!("{line}");
            Ok(())
        }
        ["table", path] => {
            let rows: Vec<Row> = std::fs::read_to_string(path)?
                .lines()
                .filter_map(Row::parse)
                .collect();
            print!("{}", table::markdown(&rows, &Settings::from_env()?.rates));
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn loopback(port: &str) -> Result<SocketAddr, Error> {
    Ok(SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        port.parse::<u16>()?,
    )))
}

/// The durations and rates of a measurement.
struct Settings {
    seconds: Duration,
    warmup: Duration,
    connections: usize,
    rates: Vec<u64>,
    stream_rate: u64,
}

impl Settings {
    fn from_env() -> Result<Self, Error> {
        fn var(name: &str, default: &str) -> String {
            std::env::var(name).unwrap_or_else(|_| default.to_owned())
        }
        let seconds = |name, default| -> Result<Duration, Error> {
            Ok(Duration::try_from_secs_f64(var(name, default).parse()?)?)
        };
        let rates = var("BENCH_RATES", "200,1000,5000")
            .split(',')
            .map(|rate| rate.trim().parse::<u64>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            seconds: seconds("BENCH_SECONDS", "5")?,
            warmup: seconds("BENCH_WARMUP_SECONDS", "2")?,
            connections: var("BENCH_CONNECTIONS", "64").parse::<usize>()?.max(1),
            rates,
            stream_rate: var("BENCH_STREAM_RATE", "50").parse()?,
        })
    }
}

/// Waits until `addr` answers; prints the milliseconds since `since` (seconds since the epoch).
async fn wait(addr: SocketAddr, since: &str, pid: u32) -> Result<(), Error> {
    let since: f64 = since.replace(',', ".").parse()?;
    let give_up = tokio::time::Instant::now() + START_TIMEOUT;
    while !client::answers(addr).await {
        if !memory::alive(pid) {
            return Err(format!("process {pid} ended before {addr} answered").into());
        }
        if tokio::time::Instant::now() > give_up {
            return Err(format!("nothing answered on {addr} within {START_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    println!("{:.1}", (now - since) * 1000.0);
    Ok(())
}

/// Measures the subject on `addr`: idle memory, saturation, latency at each fixed rate, time to
/// the first token of streams, peak memory.
async fn measure(addr: SocketAddr, name: &str, fields: &[&str]) -> Result<Row, Error> {
    let settings = Settings::from_env()?;
    let mut row = Row {
        name: name.to_owned(),
        ..Row::default()
    };
    let mut key = None;
    let mut pid = None;
    for field in fields {
        match field.split_once('=') {
            Some(("key", value)) => key = Some(value.to_owned()),
            Some(("pid", value)) => pid = Some(value.parse::<u32>()?),
            Some((name, value)) => {
                row.fields.insert(name.to_owned(), value.parse()?);
            }
            None => return Err(format!("{field}: expected key=value").into()),
        }
    }
    let target = Target {
        addr,
        path: PATH.to_owned(),
        key,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let peak = pid.map(|pid| {
        row.fields
            .insert("rss_idle_kib".into(), memory::resident_kib(pid) as f64);
        tokio::spawn(memory::peak_kib(pid, Duration::from_millis(100), stopped))
    });
    let failed = load(&target, &settings, &mut row).await;
    row.fields.insert("failed".into(), failed as f64);
    let _ = stop.send(true);
    if let Some(peak) = peak {
        row.fields.insert("rss_peak_kib".into(), peak.await? as f64);
    }
    Ok(row)
}

/// The runs of [`measure`], their figures put in `row`; the requests that failed.
async fn load(target: &Target, settings: &Settings, row: &mut Row) -> u64 {
    let request = Bytes::from_static(REQUEST.as_bytes());
    let connections = settings.connections;
    eprintln!("{}: warm-up {:?}", row.name, settings.warmup);
    runs::closed(target, request.clone(), connections, settings.warmup).await;
    let (saturation, mut failed) =
        runs::closed(target, request.clone(), connections, settings.seconds).await;
    eprintln!("{}: saturation {saturation:.0} requests/s", row.name);
    row.fields.insert("sat".into(), saturation);
    let offered = |rate: u64| (rate as f64) <= saturation;
    for &rate in settings.rates.iter().filter(|rate| offered(**rate)) {
        let mut seen = runs::open(
            target,
            request.clone(),
            rate as f64,
            connections,
            settings.seconds,
        )
        .await;
        failed += seen.failed;
        record(
            row,
            &format!("p50@{rate}"),
            &format!("p99@{rate}"),
            &mut seen.timings,
            |t| t.total,
        );
        eprintln!("{}: {rate}/s done", row.name);
    }
    // A subject slow enough to queue streams gets a tenth of its saturation: a stream holds a
    // connection for its whole length, and a first token measured in a queue would say nothing
    // of the subject (LiteLLM's took seconds at half its saturation).
    let stream_rate = (settings.stream_rate as f64).min(saturation / 10.0).floor();
    if stream_rate >= 1.0 {
        let streams = Bytes::from_static(STREAM_REQUEST.as_bytes());
        let mut seen =
            runs::open(target, streams, stream_rate, connections, settings.seconds).await;
        failed += seen.failed;
        row.fields.insert("stream_rate".into(), stream_rate);
        record(row, "ttft50", "ttft99", &mut seen.timings, |t| t.first_byte);
    }
    failed
}

/// Puts the p50 and p99 of `timings` (by `which` time), in microseconds, into `row`.
fn record(
    row: &mut Row,
    p50: &str,
    p99: &str,
    timings: &mut [Timing],
    which: fn(&Timing) -> Duration,
) {
    let mut values: Vec<Duration> = timings.iter().map(which).collect();
    for (key, p) in [(p50, 0.5), (p99, 0.99)] {
        if let Some(value) = runs::quantile(&mut values, p) {
            row.fields.insert(key.to_owned(), value.as_secs_f64() * 1e6);
        }
    }
}
