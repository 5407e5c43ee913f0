//! The simulator's document (`storm --scenario all --markdown docs/STORM.md`): each scenario's
//! explanation ([`Doc`](crate::scenarios::Doc), in its file under [`crate::scenarios`]) around the
//! table, the chart and the engine's metrics its run gave, so that no figure in it is written by
//! hand. The same seed gives the same file: nothing in it depends on the machine (no wall time).

use std::path::{Component, Path, PathBuf};

use crate::metrics::Summary;
use crate::output::dashboard::Dashboard;
use crate::output::report;
use crate::scenario::Scenario;
use crate::scenarios;

/// The line before the headline table, for the README to hold between it and [`HEADLINE_END`].
pub const HEADLINE_START: &str = "<!-- storm:headline -->";

/// The line after the headline table.
pub const HEADLINE_END: &str = "<!-- /storm:headline -->";

/// What the document says before the scenarios: the command, the pipelines, the columns.
const INTRODUCTION: &str = r#"`cargo run --release -p stormguard-storm` replays the field's incident against the real layers on
virtual time: 60 s at 12,000 requests per second against a provider with 40,000 GPU slots
(log-normal service time, 800 ms median), a queue, and work that cannot be cancelled once a client
gives up on it. Errors step from 0.01% to 5% and the median latency from 800 ms to 2,500 ms between
10 s and 40 s. The pipelines meet the same arrivals (same seed):

- `none`: no retries;
- `naive`: 3 retries, 1 s apart; in `streams` its caller also restarts a stream that fails (an
  error event, a cut), from the start, 3 times at most, 1 s apart;
- `naive+failover`: two providers; every failure goes to the other provider at once, with 3 retries
  on each (4 s per attempt, as `naive`). A default row of `failover` and `silent`, the scenarios
  with two providers, which the failover rows need;
- `naive-hedge`: every request sent twice at once, as a client that "races two requests" does; the
  first attempt to produce content (for a stream, its first content event) answers, the other is
  dropped. No delay, no budget. A default row of `tail`;
- `tower`: tower's `retry` with `ExponentialBackoff` and `TpsBudget` (10 s, 10/s, 20%);
- `tower-hedge`: tower's `hedge` (`tower::hedge::Hedge`, tower's `hedge` feature, which adds
  `hdrhistogram` and `byteorder` to the simulator alone) with the settings the AWS S3 Transfer
  Manager for Rust gives it: a second attempt once the first has waited the 95th percentile of the
  latencies recorded in the previous 2 s, none before 20 are recorded. It times the response
  future, which for a stream ends with its head: it learns the heads' latency, hedges a slow head,
  and takes the first head as the answer, however late its first token. A default row of `tail`;
- `stormguard`: `ClientLayer::default().without_continuation()`: the engine with its stream
  guard alone. Continuation acts on event streams cut after content and nothing else, so where
  nothing streams (and in `silent`, whose streams are slow to start but never cut: its figures
  are the same either way) this is `ClientLayer::default()` in all it does; it is off in every
  scenario so that the row means one configuration;
- `stormguard+continuation`: `ClientLayer::default()` as it ships, continuation on: a stream cut
  after content is continued from the text received. A default row of `streams`;
- `stormguard+hedge`: `ClientLayer::default().without_continuation()` (the `stormguard` row)
  `.with_hedging(Hedging::default())`: an attempt that has produced no content (for a stream, no
  first content event) after the backend's 95th percentile of the time to it, learned by the
  per-attempt clocks (before 20 are learned, their cold limit), gets one hedge: a second attempt drawn from
  the retry budget like a retry (a spent budget sends none) and counted against `max_attempts`,
  through the throttle; the first to produce content answers, the other is cancelled. A default
  row of `tail`;
- `stormguard+breaker`: the same with `.with_breaker(CircuitBreaker::new(BreakerConfig::default()))`
  and a `.with_fallback(...)` that answers locally with a 200 and a small JSON body saying the
  answer is degraded (counted as a fallback answer, never as a success). A default row where the
  provider dies (`outage`, `blackhole`); `--pipelines` selects it anywhere;
- `stormguard+rate-limit`: the same with `.with_rate_limit(RateLimit::new(...))` configured with the
  provider's quota (`.with_requests_per_minute(Some(..))`, `.with_tokens_per_minute(Some(..))`);
- `stormguard+adaptive`: the same with `.with_rate_limit(RateLimit::default())`, which learns the
  quota from the provider. Both are default rows of `burst`; `--pipelines` selects them anywhere
  (where the provider states no quota, the configured row has no numbers and learns too);
- `stormguard+bulkhead`: the same with `.with_concurrency(..)`, a fixed limit on the attempts in
  flight sized by hand for the healthy provider (its attempts in flight by Little's law, plus a
  quarter), held until a stream ends;
- `stormguard+concurrency`: the same with `.with_concurrency(ConcurrencyLimit::default())`, the
  adaptive limit learned from the provider's overload answers. Both are default rows of `capacity`;
- `stormguard+failover`: `Failover::new(ClientLayer::default())` with a backend `primary` and a
  backend `secondary` (`.with_adapter(Adapter::new().with_origin(..))`, the secondary's address),
  each with the default backend breaker (`Backend::default_breaker()`: open after 3 failures in a
  row, probes after 1 s doubling to 3 s); the secondary has its quota as its rate limit (90% of
  what it completes a second, a burst of 100 ms, a wait of up to 30 s); each backend has its own
  per-attempt clocks (the failover gives each one fresh clocks of the layer's). A default row of
  `failover` and `silent`;
- `stormguard+failover-no-clocks`: the same failover made from
  `ClientLayer::default().without_clocks()`: no backend has per-attempt clocks, only the deadline
  bounds an attempt. A default row of `silent`.
- `round-robin`, `ordered-failover`, `stormguard+balance`, `stormguard+balance+cooldowns`: the
  rows of the scenarios with deployments of one model (`balance`, `balance-fleet`), described
  with them below.

`none`, `naive`, `naive-hedge`, `tower` and `tower-hedge` time out each attempt after 4 s (the
healthy provider's p99.9);
stormguard has no fixed per-attempt timeout but one deadline across all attempts, and per-attempt
clocks learned from each backend's answers (a whole answer's never fires before what the request's
size needs: 17 s for the small chat completion most scenarios send; a stream's head clock is
learned, see `silent`).
Besides load, success, latency and recovery, each table shows `peak in-flight`, the most attempts
the clients hold open at once (sent and not yet answered, timed out or cut: their connections);
`success outside`, the success of the requests that arrived 4 s (the healthy provider's p99.9) or
more before the fault, or from 2 s after its end (a request that arrives later may still be waiting
for its answer when the fault begins, and that answer is among what the fault loses); `fallback`, the requests the breaker's fallback answered (`fallback p99`: their p99 latency);
`cut`, how long after a dead provider's fault starts the attempts reaching it fall below 5% of
the offered load for good (per 100 ms; `-` when the provider still serves); and `429s`, the
attempts the provider answered with 429. The binary prints this legend under each table.
`storm --help` says what each option, scenario and pipeline is; `storm --scenario all` runs every
scenario at its defaults with its default pipelines, prints each one's table and chart, and ends
with one line per scenario and pipeline (success, amplification, peak load, peak in-flight, p99 and
the scenario's headline figure)."#;

/// One scenario's run, as the document shows it.
pub struct Section<'a> {
    /// The scenario run.
    pub scenario: &'a Scenario,
    /// Its figures, one per pipeline.
    pub summaries: &'a [Summary],
    /// The engine's metrics of each pipeline (collected for the row its [`Doc`] names).
    ///
    /// [`Doc`]: crate::scenarios::Doc
    pub metrics: &'a [Option<Dashboard>],
}

/// The headline block: the default scenario's table (`storm` with no option) as a fenced block,
/// between [`HEADLINE_START`] and [`HEADLINE_END`]; `None` when `sections` do not hold it.
pub fn headline(sections: &[Section<'_>]) -> Option<String> {
    let section = sections
        .iter()
        .find(|section| section.scenario.name == scenarios::DEFAULT.name)?;
    Some(format!(
        "{HEADLINE_START}\n```text\n{}```\n{HEADLINE_END}\n",
        report::table(section.scenario, section.summaries)
    ))
}

/// The document of `sections`, written at `file`, its charts in `charts` (the `--out`
/// directory), linked relative to the file.
pub fn document(sections: &[Section<'_>], file: &Path, charts: &Path) -> String {
    let charts = relative(file.parent().unwrap_or(Path::new("")), charts);
    let mut out = String::from(
        "# The storm simulator\n\n\
         <!-- Written by `storm --scenario all --markdown docs/STORM.md --out docs/storm` from \
         each scenario's file in crates/storm/src/scenarios/; .ci/storm-docs checks it against a \
         fresh run. -->\n\n",
    );
    if let Some(headline) = headline(sections) {
        out += "The default run's table (`cargo run --release -p stormguard-storm`), as the \
                README shows it:\n\n";
        out += &headline;
        out += "\n";
    }
    out += INTRODUCTION;
    out += "\n";
    for section in sections {
        let kind = scenarios::of(section.scenario);
        let table = report::table(section.scenario, section.summaries);
        let chart = charts.join(format!("{kind}.svg"));
        let chart = chart.to_string_lossy().replace('\\', "/");
        let metrics = kind.doc.metrics_of.map_or_else(String::new, |row| {
            section
                .summaries
                .iter()
                .zip(section.metrics)
                .find(|(summary, _)| summary.name == row)
                .and_then(|(_, metrics)| metrics.as_ref())
                .map_or_else(
                    || format!("(no metrics of {row})"),
                    |dashboard| format!("```\n{}```", report::dashboard(row, dashboard)),
                )
        });
        let after = kind
            .doc
            .after
            .replace("{chart}", &chart)
            .replace("{metrics}", &metrics);
        out += &format!(
            "\n## `--scenario {kind}`\n\n{}\n\n```\n{table}```\n\n{after}\n",
            kind.doc.before
        );
    }
    out
}

/// `to` as a path from the directory `from`, when both are relative to the same directory (or
/// both absolute) and `from` climbs nowhere (`..`); `to` as it is otherwise.
fn relative(from: &Path, to: &Path) -> PathBuf {
    fn plain(path: &Path) -> Vec<Component<'_>> {
        path.components()
            .filter(|c| *c != Component::CurDir)
            .collect()
    }
    let (from_parts, to_parts) = (plain(from), plain(to));
    if from.is_absolute() != to.is_absolute() || from_parts.contains(&Component::ParentDir) {
        return to.to_path_buf();
    }
    let common = from_parts
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in common..from_parts.len() {
        path.push("..");
    }
    for part in &to_parts[common..] {
        path.push(part);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_linked_from_where_the_document_is() {
        let link = |file: &str, charts: &str| {
            relative(
                Path::new(file).parent().unwrap_or(Path::new("")),
                Path::new(charts),
            )
        };
        assert_eq!(link("docs/STORM.md", "docs/storm"), Path::new("storm"));
        assert_eq!(link("STORM.md", "storm-out"), Path::new("storm-out"));
        assert_eq!(
            link("docs/STORM.md", "storm-out"),
            Path::new("../storm-out")
        );
        assert_eq!(link("/tmp/STORM.md", "/tmp/charts"), Path::new("charts"));
        assert_eq!(link("../STORM.md", "storm-out"), Path::new("storm-out"));
    }
}
