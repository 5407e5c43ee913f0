//! `storm`: replay retry storms against the real layers and print what each pipeline did.
//!
//! ```text
//! storm [--scenario seed|outage|quota|blackhole|burst|failover|streams] [--qps N]
//!       [--duration SECS] [--capacity SLOTS] [--seed N]
//!       [--pipelines none,naive,naive+failover,tower,stormguard,stormguard+breaker,
//!                    stormguard+rate-limit,stormguard+adaptive,stormguard+failover]
//!       [--attempt-timeout SECS] [--out DIR] [--json]
//! ```
//!
//! Without `--pipelines`, a scenario runs its default rows ([`Pipeline::defaults`]). The failover
//! rows (`naive+failover`, `stormguard+failover`) need the scenario with two providers
//! (`failover`). In `streams`, every caller reads its streamed answer to the end, and `naive`'s
//! restarts a stream that failed ([`Pipeline::stream_restarts`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use stormguard_storm::pipeline::Pipeline;
use stormguard_storm::scenario::{Scenario, ScenarioKind};
use stormguard_storm::{chart, report};

const USAGE: &str = "usage: storm [--scenario seed|outage|quota|blackhole|burst|failover|streams] \
[--qps N] [--duration SECS] [--capacity SLOTS] [--seed N] \
[--pipelines none,naive,naive+failover,tower,stormguard,stormguard+breaker,stormguard+rate-limit,\
stormguard+adaptive,stormguard+failover] [--attempt-timeout SECS] [--out DIR] [--json]";

struct Args {
    scenario: Scenario,
    pipelines: Vec<Pipeline>,
    out: PathBuf,
    json: bool,
}

fn seconds(value: f64) -> Result<Duration, lexopt::Error> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            lexopt::Error::from(format!(
                "expected a positive number of seconds, got {value}"
            ))
        })
}

fn parse_args() -> Result<Args, lexopt::Error> {
    use lexopt::prelude::*;

    let mut kind = ScenarioKind::Seed;
    let (mut qps, mut duration, mut capacity, mut seed, mut attempt_timeout) =
        (None, None, None, None, None);
    let mut pipelines = None;
    let mut out = PathBuf::from("storm-out");
    let mut json = false;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("scenario") => kind = parser.value()?.parse()?,
            Long("qps") => qps = Some(parser.value()?.parse::<f64>()?),
            Long("duration") => duration = Some(seconds(parser.value()?.parse()?)?),
            Long("capacity") => capacity = Some(parser.value()?.parse::<u32>()?),
            Long("seed") => seed = Some(parser.value()?.parse::<u64>()?),
            Long("attempt-timeout") => attempt_timeout = Some(seconds(parser.value()?.parse()?)?),
            Long("pipelines") => {
                pipelines = Some(
                    Pipeline::parse_list(&parser.value()?.string()?).map_err(|e| e.to_string())?,
                );
            }
            Long("out") => out = parser.value()?.into(),
            Long("json") => json = true,
            Short('h') | Long("help") => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    let mut scenario = Scenario::builtin(kind);
    if let Some(qps) = qps {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(format!("--qps must be positive, got {qps}").into());
        }
        scenario = scenario.with_qps(qps);
    }
    if let Some(capacity) = capacity {
        scenario = scenario.with_capacity(capacity);
    }
    if let Some(duration) = duration {
        scenario = scenario.with_duration(duration);
    }
    if let Some(seed) = seed {
        scenario = scenario.with_seed(seed);
    }
    if let Some(timeout) = attempt_timeout {
        scenario = scenario.with_attempt_timeout(timeout);
    }
    let pipelines = pipelines.unwrap_or_else(|| Pipeline::defaults(kind).to_vec());
    if pipelines.is_empty() {
        return Err("--pipelines names no pipeline".into());
    }
    if let Some(row) = pipelines.iter().find(|row| row.fails_over())
        && scenario.secondary().is_none()
    {
        return Err(format!(
            "--pipelines {row} needs two providers: --scenario failover, not {kind}"
        )
        .into());
    }
    Ok(Args {
        scenario,
        pipelines,
        out,
        json,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("storm: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let total = args.scenario.duration.as_secs() * args.pipelines.len() as u64;
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} simulated seconds")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("simulating {}", args.scenario.kind));
    let ticker = bar.clone();
    let runs = match stormguard_storm::run(&args.scenario, &args.pipelines, move || ticker.inc(1)) {
        Ok(runs) => runs,
        Err(error) => {
            bar.abandon();
            eprintln!("storm: {error}");
            return ExitCode::FAILURE;
        }
    };
    bar.finish_and_clear();

    let lines: Vec<(&str, &stormguard_storm::metrics::Series)> = runs
        .iter()
        .map(|run| (run.summary.name, &run.series))
        .collect();
    let svg = chart::render(&args.scenario, &lines);
    let path = args.out.join(format!("{}.svg", args.scenario.kind));
    let written = std::fs::create_dir_all(&args.out).and_then(|()| std::fs::write(&path, svg));

    let summaries: Vec<_> = runs.into_iter().map(|run| run.summary).collect();
    let text = if args.json {
        match serde_json::to_string_pretty(&summaries) {
            Ok(json) => json + "\n",
            Err(error) => {
                eprintln!("storm: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        let chart = match &written {
            Ok(()) => format!("chart: {}", path.display()),
            Err(error) => format!("chart: could not write {}: {error}", path.display()),
        };
        format!(
            "{}\n\n{}\n{}\n\n{chart}\nwall time: {:.1} s\n",
            args.scenario.describe(),
            report::table(&args.scenario, &summaries),
            report::legend(&args.scenario),
            started.elapsed().as_secs_f64()
        )
    };
    // A closed pipe (`storm | head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if written.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
