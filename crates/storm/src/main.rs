//! `storm`: replay retry storms against the real layers and print what each pipeline did.
//!
//! ```text
//! storm [--scenario seed|outage|quota|blackhole|burst|failover|streams|silent|tail|balance|
//!                   balance-fleet|all]
//!       [--qps N] [--duration SECS] [--capacity SLOTS] [--seed N]
//!       [--pipelines none,naive,naive+failover,naive-hedge,tower,tower-hedge,stormguard,
//!                    stormguard+continuation,stormguard+hedge,stormguard+breaker,
//!                    stormguard+rate-limit,stormguard+adaptive,
//!                    stormguard+failover-no-clocks,stormguard+failover,round-robin,
//!                    ordered-failover,stormguard+balance,stormguard+balance+cooldowns]
//!       [--attempt-timeout SECS] [--out DIR] [--json] [--metrics] [--markdown FILE] [--help]
//! ```
//!
//! Without `--pipelines`, a scenario runs its default rows (its file's `pipelines`). The failover
//! rows (`naive+failover`, `stormguard+failover-no-clocks`, `stormguard+failover`) need a scenario
//! with two providers (`failover`, `silent`). In `streams`, every caller reads its streamed answer
//! to the end, and `naive`'s restarts a stream that failed ([`Pipeline::stream_restarts`]);
//! `stormguard` is the stream guard alone (continuation off, in every scenario), and
//! `stormguard+continuation` continues a stream cut after content. In `tail`, the hedging rows
//! race a second attempt against a slow first token: `naive-hedge` always, `tower-hedge` after
//! the 95th percentile of the response heads' latency, `stormguard+hedge` after the 95th
//! percentile of the backend's time to first content. The balance rows (`round-robin`,
//! `ordered-failover`, `stormguard+balance`, `stormguard+balance+cooldowns`) need a scenario with
//! deployments (`balance`, `balance-fleet`), which sends to them alone.
//! `--scenario all` runs every scenario with its default rows and ends with [`report::overview`].
//! `--metrics` adds, after each scenario's table, the metrics stormguard's engine emitted in each
//! of its rows made of stormguard's layers ([`report::dashboards`]; in the JSON, each such run's
//! `metrics`). `--markdown FILE` also writes the simulator's document ([`markdown::document`]).
//! `--help` says what each option, scenario and pipeline is.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use stormguard_storm::metrics::Summary;
use stormguard_storm::output::dashboard::Dashboard;
use stormguard_storm::output::{chart, markdown, report};
use stormguard_storm::pipeline::Pipeline;
use stormguard_storm::scenario::Scenario;
use stormguard_storm::scenarios;
use stormguard_storm::scenarios::Builtin;

/// The usage line: every scenario and pipeline by name.
fn usage() -> String {
    let scenarios: Vec<&str> = scenarios::ALL.iter().map(|kind| kind.name).collect();
    let pipelines: Vec<&str> = Pipeline::ALL.iter().map(|p| p.as_str()).collect();
    format!(
        "usage: storm [--scenario {}|{ALL}] [--qps N] [--duration SECS] [--capacity SLOTS] \
         [--seed N] [--pipelines {}] [--attempt-timeout SECS] [--out DIR] [--json] [--metrics] \
         [--help]",
        scenarios.join("|"),
        pipelines.join(",")
    )
}

/// The value of `--scenario` that runs every built-in scenario.
const ALL: &str = "all";

/// What each option does, printed by `--help` between the usage line and the scenarios.
const OPTIONS_HELP: &str = "\
Replays retry storms against the real client layers (tower's and stormguard's) on virtual time,
and prints, per client pipeline, what it did to the provider and what its callers got.

Options:
  --scenario NAME
      The incident to replay (default seed; see Scenarios below). `all` runs every scenario in
      turn, each with its default pipelines, prints each one's table, then one overview line per
      scenario and pipeline.
  --qps N
      Offered requests per second (default: the scenario's). The provider's slots and quota scale
      with it, so the incident keeps its shape at a smaller load.
  --duration SECS
      Length of the run (default 60 s); the fault window keeps its place in proportion.
  --capacity SLOTS
      The provider's concurrent slots (default: the scenario's, scaled by --qps).
  --seed N
      Seed of the arrivals and the provider's draws (default 42): a seed always gives the same
      numbers.
  --pipelines LIST
      Comma-separated pipelines to compare (default: the scenario's, listed under Scenarios).
      Not with --scenario all.
  --attempt-timeout SECS
      Per-attempt timeout of today's clients (none, naive, naive+failover, naive-hedge, tower,
      tower-hedge; default 4 s, about the healthy provider's p99.9). stormguard has no fixed one:
      one deadline spans all attempts, and each attempt has clocks learned from its backend's
      answers.
  --out DIR
      Where the SVG charts go, one per scenario, named after it (default storm-out).
  --json
      Print the figures as JSON instead of tables: an array with one object per pipeline. With
      --scenario all, an array with one {\"scenario\": NAME, \"runs\": [...]} per scenario.
  --metrics
      After each scenario's table, what a dashboard would show of each of its stormguard rows
      (every pipeline made of stormguard's layers): the metrics its engine emitted for the
      table's requests (stormguard::metrics), one line per series: a counter's total, a gauge's
      last and highest value, a histogram's count, p50, p99 and max, and the same per 10 s. With
      --json, under \"metrics\" in each stormguard row's object. The figures do not change.
  --markdown FILE
      Also write FILE: the simulator's document, each scenario's explanation around the table,
      chart and metrics this run gave, opening with the default run's table as the README shows
      it (storm --scenario all --markdown docs/STORM.md --out docs/storm writes the committed one).
  -h, --help
      Print this help.

With --scenario all, --qps, --duration, --capacity, --seed and --attempt-timeout apply to every
scenario.";

/// The `--help` text: usage, options, every scenario with its default pipelines, every pipeline.
fn help() -> String {
    let indent = |text: &str| {
        text.lines()
            .map(|line| format!("      {line}\n"))
            .collect::<String>()
    };
    let mut help = format!("{}\n\n{OPTIONS_HELP}\n\nScenarios:\n", usage());
    for kind in scenarios::ALL {
        let defaults: Vec<&str> = kind.pipelines.iter().map(|p| p.as_str()).collect();
        help += &format!(
            "  {kind}\n{}      Default pipelines: {}.\n",
            indent(kind.help),
            defaults.join(", ")
        );
    }
    help += "\nPipelines (real tower and stormguard code, meeting the same arrivals):\n";
    for pipeline in Pipeline::ALL {
        help += &format!("  {pipeline}\n{}", indent(pipeline.help()));
    }
    help
}

struct Args {
    /// The scenarios to run, each with its pipelines, in order.
    runs: Vec<(Scenario, Vec<Pipeline>)>,
    /// `--scenario all`: the JSON names each scenario, and the text ends with the overview.
    all: bool,
    out: PathBuf,
    json: bool,
    /// `--metrics`: collect and print the engine's metrics of the stormguard rows.
    metrics: bool,
    /// `--markdown FILE`: where to write the simulator's document.
    markdown: Option<PathBuf>,
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

/// The scenario settings given on the command line; `None`: the scenario's own.
#[derive(Clone, Copy, Default)]
struct Overrides {
    qps: Option<f64>,
    duration: Option<Duration>,
    capacity: Option<u32>,
    seed: Option<u64>,
    attempt_timeout: Option<Duration>,
}

impl Overrides {
    /// The built-in scenario `kind` with these settings.
    fn scenario(&self, kind: &'static Builtin) -> Scenario {
        let mut scenario = kind.scenario();
        if let Some(qps) = self.qps {
            scenario = scenario.with_qps(qps);
        }
        if let Some(capacity) = self.capacity {
            scenario = scenario.with_capacity(capacity);
        }
        if let Some(duration) = self.duration {
            scenario = scenario.with_duration(duration);
        }
        if let Some(seed) = self.seed {
            scenario = scenario.with_seed(seed);
        }
        if let Some(timeout) = self.attempt_timeout {
            scenario = scenario.with_attempt_timeout(timeout);
        }
        scenario
    }
}

/// The command line as given, before its options are checked against each other.
struct Options {
    /// `None`: every scenario.
    kind: Option<&'static Builtin>,
    overrides: Overrides,
    pipelines: Option<Vec<Pipeline>>,
    out: PathBuf,
    json: bool,
    metrics: bool,
    markdown: Option<PathBuf>,
}

/// Read the command line; `--help` prints the help and exits.
fn read_options() -> Result<Options, lexopt::Error> {
    use lexopt::prelude::*;

    let mut options = Options {
        kind: Some(scenarios::SEED),
        overrides: Overrides::default(),
        pipelines: None,
        out: PathBuf::from("storm-out"),
        json: false,
        metrics: false,
        markdown: None,
    };
    let given = &mut options.overrides;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("scenario") => {
                let name = parser.value()?.string()?;
                options.kind = if name == ALL {
                    None
                } else {
                    Some(scenarios::named(&name).map_err(|e| format!("{e}, or {ALL}"))?)
                };
            }
            Long("qps") => given.qps = Some(parser.value()?.parse::<f64>()?),
            Long("duration") => given.duration = Some(seconds(parser.value()?.parse()?)?),
            Long("capacity") => given.capacity = Some(parser.value()?.parse::<u32>()?),
            Long("seed") => given.seed = Some(parser.value()?.parse::<u64>()?),
            Long("attempt-timeout") => {
                given.attempt_timeout = Some(seconds(parser.value()?.parse()?)?);
            }
            Long("pipelines") => {
                options.pipelines = Some(
                    Pipeline::parse_list(&parser.value()?.string()?).map_err(|e| e.to_string())?,
                );
            }
            Long("out") => options.out = parser.value()?.into(),
            Long("json") => options.json = true,
            Long("metrics") => options.metrics = true,
            Long("markdown") => options.markdown = Some(parser.value()?.into()),
            Short('h') | Long("help") => {
                print!("{}", help());
                std::process::exit(0);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(options)
}

/// The command line, its options checked against each other: the scenarios to run, each with
/// its pipelines.
fn parse_args() -> Result<Args, lexopt::Error> {
    let Options {
        kind,
        overrides,
        pipelines,
        out,
        json,
        metrics,
        markdown,
    } = read_options()?;
    if let Some(qps) = overrides.qps
        && !(qps.is_finite() && qps > 0.0)
    {
        return Err(format!("--qps must be positive, got {qps}").into());
    }
    let runs = match kind {
        Some(kind) => vec![one_scenario(kind, overrides, pipelines)?],
        None => every_scenario(overrides, pipelines.is_some())?,
    };
    Ok(Args {
        runs,
        all: kind.is_none(),
        out,
        json,
        metrics,
        markdown,
    })
}

/// `--scenario all`: every scenario with its default pipelines. `--pipelines`
/// (`with_pipelines`) needs one scenario.
fn every_scenario(
    overrides: Overrides,
    with_pipelines: bool,
) -> Result<Vec<(Scenario, Vec<Pipeline>)>, lexopt::Error> {
    if with_pipelines {
        return Err(format!(
            "--pipelines needs one scenario: --scenario {ALL} runs each one's default pipelines"
        )
        .into());
    }
    Ok(scenarios::ALL
        .into_iter()
        .map(|kind| (overrides.scenario(kind), kind.pipelines.to_vec()))
        .collect())
}

/// Scenario `kind` with `pipelines` (by default, its own), which it must be able to run: the
/// failover rows need two providers.
fn one_scenario(
    kind: &'static Builtin,
    overrides: Overrides,
    pipelines: Option<Vec<Pipeline>>,
) -> Result<(Scenario, Vec<Pipeline>), lexopt::Error> {
    let scenario = overrides.scenario(kind);
    let pipelines = pipelines.unwrap_or_else(|| kind.pipelines.to_vec());
    if pipelines.is_empty() {
        return Err("--pipelines names no pipeline".into());
    }
    if let Some(row) = pipelines.iter().find(|row| row.fails_over())
        && scenario.secondary().is_none()
    {
        return Err(format!(
            "--pipelines {row} needs two providers: --scenario failover or silent, not {kind}"
        )
        .into());
    }
    if let Some(row) = pipelines.iter().find(|row| row.balances())
        && scenario.deployments.is_empty()
    {
        return Err(format!(
            "--pipelines {row} needs deployments: --scenario balance or balance-fleet, not {kind}"
        )
        .into());
    }
    Ok((scenario, pipelines))
}

/// What one scenario's run gave: the figures, the engine's metrics of each row (with
/// `--metrics`, for the stormguard rows), and whether its chart could be written.
struct Outcome {
    summaries: Vec<Summary>,
    metrics: Vec<Option<Dashboard>>,
    /// The chart's path, or why it could not be written.
    chart: Result<PathBuf, String>,
}

/// Simulate `pipelines` through `scenario` with a progress bar (hidden under `--json`),
/// collecting the engine's metrics if `metrics`, and write its chart into `out`.
fn simulate(
    scenario: &Scenario,
    pipelines: &[Pipeline],
    out: &std::path::Path,
    json: bool,
    metrics: bool,
) -> Result<Outcome, String> {
    let total = scenario.duration.as_secs() * pipelines.len() as u64;
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} simulated seconds")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("simulating {}", scenario.name));
    let ticker = bar.clone();
    let on_second = move || ticker.inc(1);
    let runs = if metrics {
        stormguard_storm::run_with_metrics(scenario, pipelines, on_second)
    } else {
        stormguard_storm::run(scenario, pipelines, on_second)
    };
    let runs = match runs {
        Ok(runs) => runs,
        Err(error) => {
            bar.abandon();
            return Err(error.to_string());
        }
    };
    bar.finish_and_clear();

    let lines: Vec<(&str, &stormguard_storm::metrics::Series)> = runs
        .iter()
        .map(|run| (run.summary.name, &run.series))
        .collect();
    let svg = chart::render(scenario, &lines);
    let path = out.join(format!("{}.svg", scenario.name));
    let chart = match std::fs::create_dir_all(out).and_then(|()| std::fs::write(&path, svg)) {
        Ok(()) => Ok(path),
        Err(error) => Err(format!("could not write {}: {error}", path.display())),
    };
    let (summaries, metrics) = runs
        .into_iter()
        .map(|run| (run.summary, run.metrics))
        .unzip();
    Ok(Outcome {
        summaries,
        metrics,
        chart,
    })
}

/// One scenario's text: its description, table, legend, the engine's metrics (`--metrics`) and
/// chart line.
fn scenario_text(scenario: &Scenario, outcome: &Outcome, metrics: bool) -> String {
    let chart = match &outcome.chart {
        Ok(path) => format!("chart: {}", path.display()),
        Err(error) => format!("chart: {error}"),
    };
    let metrics = if metrics {
        let rows: Vec<(&str, &Dashboard)> = outcome
            .summaries
            .iter()
            .zip(&outcome.metrics)
            .filter_map(|(summary, metrics)| Some((summary.name, metrics.as_ref()?)))
            .collect();
        format!("\n{}", report::dashboards(&rows))
    } else {
        String::new()
    };
    format!(
        "{}\n\n{}\n{}\n{metrics}\n{chart}\n",
        scenario.describe(),
        report::table(scenario, &outcome.summaries),
        report::legend(scenario),
    )
}

/// One run in the JSON: its figures and, with `--metrics` in a stormguard row, its engine's
/// metrics.
#[derive(serde::Serialize)]
struct RunJson<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<&'a Dashboard>,
}

impl Outcome {
    /// The runs as the JSON has them.
    fn json(&self) -> Vec<RunJson<'_>> {
        self.summaries
            .iter()
            .zip(&self.metrics)
            .map(|(summary, metrics)| RunJson {
                summary,
                metrics: metrics.as_ref(),
            })
            .collect()
    }
}

/// One element of `--scenario all --json`: a scenario's name and its figures, as `--scenario NAME
/// --json` prints them.
#[derive(serde::Serialize)]
struct ScenarioRuns<'a> {
    scenario: &'static str,
    runs: Vec<RunJson<'a>>,
}

/// Write `text` to stdout; a closed pipe (`storm | head`) is not an error worth a panic.
fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!(
                "storm: {error}\n{}\nstorm --help says what each option does",
                usage()
            );
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let mut outcomes = Vec::with_capacity(args.runs.len());
    for (scenario, pipelines) in &args.runs {
        // The document shows the engine's metrics of the row its scenario names; collecting them
        // changes no figure.
        let metrics = args.metrics
            || (args.markdown.is_some() && scenarios::of(scenario).doc.metrics_of.is_some());
        let outcome = match simulate(scenario, pipelines, &args.out, args.json, metrics) {
            Ok(outcome) => outcome,
            Err(error) => {
                eprintln!("storm: {error}");
                return ExitCode::FAILURE;
            }
        };
        if !args.json {
            // Between scenarios, a blank line; each one prints as soon as it is done.
            let separator = if outcomes.is_empty() { "" } else { "\n" };
            let text = scenario_text(scenario, &outcome, args.metrics);
            print(&format!("{separator}{text}"));
        }
        outcomes.push(outcome);
    }

    let text = if args.json {
        match json_text(&args, &outcomes) {
            Ok(json) => json,
            Err(error) => {
                eprintln!("storm: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        closing_text(&args, &outcomes, started)
    };
    print(&text);
    if let Some(file) = &args.markdown {
        let document = markdown_document(&args, &outcomes, file);
        if let Err(error) = std::fs::write(file, document) {
            eprintln!("storm: could not write {}: {error}", file.display());
            return ExitCode::FAILURE;
        }
    }
    if outcomes.iter().all(|outcome| outcome.chart.is_ok()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The JSON of the runs: one scenario's runs, or with `--scenario all` every scenario's.
fn json_text(args: &Args, outcomes: &[Outcome]) -> serde_json::Result<String> {
    let json = if args.all {
        let runs: Vec<_> = args
            .runs
            .iter()
            .zip(outcomes)
            .map(|((scenario, _), outcome)| ScenarioRuns {
                scenario: scenario.name,
                runs: outcome.json(),
            })
            .collect();
        serde_json::to_string_pretty(&runs)
    } else {
        serde_json::to_string_pretty(&outcomes[0].json())
    };
    json.map(|json| json + "\n")
}

/// What the text output ends with: the overview of `--scenario all`, and the wall time.
fn closing_text(args: &Args, outcomes: &[Outcome], started: Instant) -> String {
    let overview = if args.all {
        let runs: Vec<(&Scenario, &[Summary])> = args
            .runs
            .iter()
            .zip(outcomes)
            .map(|((scenario, _), outcome)| (scenario, outcome.summaries.as_slice()))
            .collect();
        format!("\nall scenarios:\n{}", report::overview(&runs))
    } else {
        String::new()
    };
    format!(
        "{overview}wall time: {:.1} s\n",
        started.elapsed().as_secs_f64()
    )
}

/// The simulator's document (`--markdown`) of the runs, to be written at `file`.
fn markdown_document(args: &Args, outcomes: &[Outcome], file: &std::path::Path) -> String {
    let sections: Vec<markdown::Section<'_>> = args
        .runs
        .iter()
        .zip(outcomes)
        .map(|((scenario, _), outcome)| markdown::Section {
            scenario,
            summaries: &outcome.summaries,
            metrics: &outcome.metrics,
        })
        .collect();
    markdown::document(&sections, file, &args.out)
}
