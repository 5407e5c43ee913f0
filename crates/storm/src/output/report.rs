//! The printed table.

use std::fmt::Write as _;

use crate::metrics::Summary;
use crate::output::dashboard::{Dashboard, Value};
use crate::pipeline::Pipeline;
use crate::scenario::Scenario;
use crate::scenarios;

/// The columns a scenario with two providers adds, after the others: the secondary's load, and
/// how much of the traffic the primary got during its fault and after it.
const FAILOVER_HEADER: [&str; 5] = [
    "secondary",
    "secondary peak load",
    "secondary overloaded",
    "primary in fault",
    "back",
];

/// The columns a scenario whose provider streams adds, after the others: what became of the
/// streams that failed before content, and what the callers saw of those that failed after it.
const STREAMS_HEADER: [&str; 8] = [
    "pre-content errors",
    "retried",
    "given up",
    "budget refused",
    "out of attempts",
    "interrupted",
    "duplicated tokens",
    "lost tokens",
];

/// The columns a scenario whose provider's capacity steps adds, after the others: the attempts
/// open and the goodput against the slots in each phase, how fast the attempts open came back
/// to the slots after each step, and how low the row's concurrency limit went.
const CAPACITY_HEADER: [&str; 5] = [
    "in-flight / slots",
    "goodput / slots",
    "429s / offered",
    "settled after steps",
    "lowest limit",
];

/// The columns a scenario whose provider goes silent adds, after the others: the same run's
/// healthy latency, the p99 against it, and what the provider did.
const SILENT_HEADER: [&str; 4] = [
    "healthy p99",
    "p99 / healthy",
    "silent attempts",
    "slow first tokens",
];

/// The columns a scenario whose streams start with a slow tail adds, after the others: the time
/// to first token of the requests that succeeded, the attempts against the `stormguard` row's,
/// the hedges, and the load during the fault.
const TAIL_HEADER: [&str; 10] = [
    "first token p50",
    "first token p99",
    "first token p99.9",
    "attempts / stormguard",
    "hedges",
    "hedges / request",
    "fault ampl",
    "fault attempts",
    "fault hedges",
    "slow first tokens",
];

/// The columns a scenario with deployments adds after each deployment's share of the load (its
/// `<name> share` column): the 429s against the `round-robin` row's, and the median latency
/// against the best split's.
const BALANCE_HEADER: [&str; 2] = ["429s / round-robin", "p50 / best split"];

/// The columns a scenario whose fault kills a deployment adds, after the others: when the first
/// and the last replica saw it die, the attempts that reached it after the first had (and before
/// the last had), and those against the `stormguard+balance` row's.
const FLEET_HEADER: [&str; 6] = [
    "dying",
    "first saw it die",
    "last saw it die",
    "attempts after",
    "before the last",
    "after / stormguard+balance",
];

/// The columns every table has, in order.
const HEADER: [&str; 20] = [
    "pipeline",
    "offered",
    "attempts",
    "ampl",
    "peak ampl",
    "peak load",
    "peak in-flight",
    "success",
    "success outside",
    "fallback",
    "p50 ms",
    "p99 ms",
    "fallback p99",
    "overloaded",
    "recovery",
    "cut",
    "fault load",
    "429s",
    "retries",
    "early retries",
];

/// One row per pipeline of a run of `scenario`, aligned columns, with a header line (and, in a
/// scenario with two providers, the columns of [`FailoverFigures`](crate::metrics::FailoverFigures);
/// in one whose streams fail, those of [`StreamFigures`](crate::metrics::StreamFigures); in one
/// whose provider goes silent, those of [`SilentFigures`](crate::metrics::SilentFigures); in one
/// whose streams start with a slow tail, those of [`TailFigures`](crate::metrics::TailFigures)
/// and the attempts against the `stormguard` row's).
pub fn table(scenario: &Scenario, summaries: &[Summary]) -> String {
    let two_providers = scenario.secondary().is_some();
    let streams = scenario.streams_fail();
    let silent = scenario.goes_silent();
    let tail = scenario.has_slow_starts();
    let capacity = scenario.steps_capacity();
    let baseline = summaries
        .iter()
        .find(|s| s.name == Pipeline::Stormguard.as_str())
        .map(|s| s.backend_attempts);
    let shares: Vec<String> = scenario
        .deployments
        .iter()
        .map(|d| format!("{} share", d.name))
        .collect();
    let mut header = HEADER.to_vec();
    if !shares.is_empty() {
        header.extend(shares.iter().map(String::as_str));
        header.extend(BALANCE_HEADER);
    }
    if scenario.dying.is_some() {
        header.extend(FLEET_HEADER);
    }
    if two_providers {
        header.extend(FAILOVER_HEADER);
    }
    if streams {
        header.extend(STREAMS_HEADER);
    }
    if silent {
        header.extend(SILENT_HEADER);
    }
    if tail {
        header.extend(TAIL_HEADER);
    }
    if capacity {
        header.extend(CAPACITY_HEADER);
    }
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|s| {
            let mut row = Vec::from(cells(scenario, s));
            if two_providers {
                row.extend(failover_cells(s));
            }
            if streams {
                row.extend(streams_cells(s));
            }
            if silent {
                row.extend(silent_cells(s));
            }
            if tail {
                row.extend(tail_cells(s, baseline));
            }
            if capacity {
                row.extend(capacity_cells(s));
            }
            if !shares.is_empty() {
                row.extend(balance_cells(s, summaries, shares.len()));
            }
            if scenario.dying.is_some() {
                row.extend(fleet_cells(s, summaries));
            }
            row
        })
        .collect();
    aligned(&header, &rows, 1)
}

/// The cells of a scenario with `deployments` deployments for one row: each one's share of the
/// load (with the best split's), then [`BALANCE_HEADER`]'s, the 429s against those of the
/// `round-robin` row among `summaries` (`-` without one); `-` for a row without the figures.
fn balance_cells(summary: &Summary, summaries: &[Summary], deployments: usize) -> Vec<String> {
    let Some(f) = &summary.balance else {
        return vec!["-".to_owned(); deployments + BALANCE_HEADER.len()];
    };
    let mut cells: Vec<String> = f
        .deployments
        .iter()
        .map(|d| format!("{:.1}% ({:.0}%)", d.share * 100.0, d.best_share * 100.0))
        .collect();
    let round_robin = summaries
        .iter()
        .find(|s| s.name == Pipeline::RoundRobin.as_str())
        .map(|s| s.too_many_requests)
        .filter(|n| *n > 0);
    cells.push(round_robin.map_or_else(
        || "-".to_owned(),
        |n| {
            format!(
                "{:.2}%",
                summary.too_many_requests as f64 / n as f64 * 100.0
            )
        },
    ));
    cells.push(format!(
        "{:.2}x of {} ms",
        f.p50_over_best, f.best_split_p50_ms
    ));
    cells
}

/// The cells of [`FLEET_HEADER`] for one row, its attempts after the first replica saw the
/// deployment die against those of the `stormguard+balance` row among `summaries` (`-` without
/// one); `-` for a row without the figures.
fn fleet_cells(summary: &Summary, summaries: &[Summary]) -> [String; 6] {
    let Some(f) = &summary.fleet else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    let at = |at: Option<f64>| at.map_or_else(|| "never".to_owned(), |s| format!("{s:.3} s"));
    let seen: Vec<f64> = f.saw_it_die_s.iter().flatten().copied().collect();
    let first = seen.iter().copied().reduce(f64::min);
    let last = (seen.len() == f.saw_it_die_s.len())
        .then(|| seen.iter().copied().reduce(f64::max))
        .flatten();
    let independent = summaries
        .iter()
        .find(|s| s.name == Pipeline::StormguardBalance.as_str())
        .and_then(|s| s.fleet.as_ref()?.after_first_saw)
        .filter(|n| *n > 0);
    let count = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    [
        f.dying.to_owned(),
        at(first),
        at(last),
        count(f.after_first_saw),
        count(f.before_all_saw),
        f.after_first_saw.zip(independent).map_or_else(
            || "-".to_owned(),
            |(after, independent)| format!("{:.3}", after as f64 / independent as f64),
        ),
    ]
}

/// The cells of [`HEADER`] for one row of `scenario`'s table.
fn cells(scenario: &Scenario, s: &Summary) -> [String; 20] {
    // A fault that leaves the provider serving has nothing to cut; one that lasts the whole run
    // has no end to recover from.
    let uncut = if scenario.fault.kind.is_dead() {
        "never"
    } else {
        "-"
    };
    let unrecovered = if scenario.fault.end >= scenario.duration {
        "-"
    } else {
        "never"
    };
    [
        s.name.to_owned(),
        s.offered.to_string(),
        s.backend_attempts.to_string(),
        format!("{:.2}x", s.amplification),
        format!("{:.2}x", s.peak_amplification),
        format!("{:.2}x", s.peak_load),
        s.peak_in_flight.to_string(),
        format!("{:.2}%", s.success_rate * 100.0),
        s.success_outside
            .map_or_else(|| "-".to_owned(), |share| format!("{:.2}%", share * 100.0)),
        s.fallbacks.to_string(),
        s.p50_ms.to_string(),
        s.p99_ms.to_string(),
        s.fallback_p99_ms
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms")),
        format!("{} s", s.overloaded_s),
        s.recovery_s
            .map_or_else(|| unrecovered.to_owned(), |r| format!("{r:.0} s")),
        s.cut_s
            .map_or_else(|| uncut.to_owned(), |c| format!("{c:.1} s")),
        format!("{:.2}x", s.fault_load),
        s.too_many_requests.to_string(),
        s.retries.to_string(),
        s.early_retries.to_string(),
    ]
}

/// One line per scenario and pipeline of several runs (`storm --scenario all`): the figures that
/// say most at a glance, and each scenario's headline figure ([`headline`]).
pub fn overview(runs: &[(&Scenario, &[Summary])]) -> String {
    let header = [
        "scenario",
        "pipeline",
        "success",
        "success outside",
        "ampl",
        "peak load",
        "peak in-flight",
        "p99 ms",
        "headline",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .flat_map(|(scenario, summaries)| {
            summaries.iter().map(|s| {
                vec![
                    scenario.name.to_owned(),
                    s.name.to_owned(),
                    format!("{:.2}%", s.success_rate * 100.0),
                    s.success_outside
                        .map_or_else(|| "-".to_owned(), |share| format!("{:.2}%", share * 100.0)),
                    format!("{:.2}x", s.amplification),
                    format!("{:.2}x", s.peak_load),
                    s.peak_in_flight.to_string(),
                    s.p99_ms.to_string(),
                    headline(scenario, s),
                ]
            })
        })
        .collect();
    aligned(&header, &rows, 2)
}

/// The figure `scenario` is about, named, as its file says
/// ([`Builtin::headline`](crate::scenarios::Builtin::headline)).
pub fn headline(scenario: &Scenario, summary: &Summary) -> String {
    (scenarios::of(scenario).headline)(scenario, summary)
}

/// What the lines of [`dashboards`] show, printed above them.
pub(crate) const DASHBOARD_LEGEND: &str = "\
metrics = what stormguard's engine counted and measured (stormguard::metrics) for the requests of
the table, as a dashboard shows it: one line per series (name and labels as an exporter names
them), a counter's total, a gauge's last and highest value, a histogram's count, p50, p99 and max
(s: seconds); then per 10 s of the run (from the time heading each column; the last runs to the
end, when the last request of the table has its answer): a counter's increase, a gauge's highest
value, a histogram's count.";

/// The metrics stormguard's engine emitted in each of `rows` (a pipeline's name and its
/// [`Dashboard`]), under [`DASHBOARD_LEGEND`]: per row, one line per series with its figures and
/// its figure per window; one line saying so when there is no row.
pub fn dashboards(rows: &[(&str, &Dashboard)]) -> String {
    if rows.is_empty() {
        return "metrics: none of these pipelines is made of stormguard's layers.\n".to_owned();
    }
    let mut out = format!("{DASHBOARD_LEGEND}\n");
    for (name, metrics) in rows {
        out += "\n";
        out += &dashboard(name, metrics);
    }
    out
}

/// The metrics stormguard's engine emitted in the row `name`: a `metrics of NAME:` line, then one
/// line per series with its figures and its figure per window.
pub fn dashboard(name: &str, dashboard: &Dashboard) -> String {
    let windows = dashboard
        .series
        .iter()
        .map(|series| per_window(&series.value).len())
        .max()
        .unwrap_or(0);
    let starts: Vec<String> = (0..windows as u64)
        .map(|w| format!("{} s", w * dashboard.window_s))
        .collect();
    let mut header = vec!["series", "type", "figures"];
    header.extend(starts.iter().map(String::as_str));
    let lines: Vec<Vec<String>> = dashboard
        .series
        .iter()
        .map(|series| {
            let mut line = vec![
                series.id(),
                series.value.kind().to_owned(),
                figures(&series.value),
            ];
            line.extend(per_window(&series.value));
            line.resize(header.len(), String::new());
            line
        })
        .collect();
    let mut out = format!("metrics of {name}:\n");
    if lines.is_empty() {
        out += "(no series: the engine emitted nothing)\n";
    } else {
        out += &aligned(&header, &lines, 3);
    }
    out
}

/// A series' figures: `total 12`; `last 0.01, max 0.99`; `count 200, p50 0.694 s, p99 ...`.
fn figures(value: &Value) -> String {
    match value {
        Value::Counter { total, .. } => format!("total {total}"),
        Value::Gauge { last, max, .. } => format!("last {}, max {}", number(*last), number(*max)),
        Value::Histogram {
            unit,
            count,
            p50,
            p99,
            max,
            ..
        } => {
            let at = |value: f64| {
                if *unit == "s" {
                    format!("{value:.3} s")
                } else {
                    number(value)
                }
            };
            format!(
                "count {count}, p50 {}, p99 {}, max {}",
                at(*p50),
                at(*p99),
                at(*max)
            )
        }
    }
}

/// A series' figure per window: a counter's increase, a gauge's highest value (`-` before it was
/// set), a histogram's count.
fn per_window(value: &Value) -> Vec<String> {
    match value {
        Value::Counter { per_window, .. } | Value::Histogram { per_window, .. } => {
            per_window.iter().map(u64::to_string).collect()
        }
        Value::Gauge { per_window, .. } => per_window
            .iter()
            .map(|max| max.map_or_else(|| "-".to_owned(), number))
            .collect(),
    }
}

/// A gauge's or a count's value: whole as an integer, else with two decimals.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// `header` and `rows` in aligned columns: the first `left` columns (the names) left-aligned, the
/// others (the figures) right-aligned.
fn aligned(header: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (c, cell) in cells.iter().enumerate() {
            if c == 0 {
                let _ = write!(out, "{cell:<width$}", width = widths[c]);
            } else if c < left {
                let _ = write!(out, "  {cell:<width$}", width = widths[c]);
            } else {
                let _ = write!(out, "  {cell:>width$}", width = widths[c]);
            }
        }
        out.push('\n');
    };
    line(&mut out, header);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cells);
    }
    out
}

/// The cells of [`FAILOVER_HEADER`] for one row (`-` for a row without the figures).
fn failover_cells(summary: &Summary) -> [String; 5] {
    let Some(f) = &summary.failover else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    [
        f.secondary_attempts.to_string(),
        format!("{:.2}x", f.secondary_peak_load),
        format!("{} s", f.secondary_overloaded_s),
        f.primary_in_fault
            .map_or_else(|| "-".to_owned(), |share| format!("{:.2}%", share * 100.0)),
        f.back_s
            .map_or_else(|| "never".to_owned(), |back| format!("{back:.1} s")),
    ]
}

/// The cells of [`SILENT_HEADER`] for one row (`-` for a row without the figures).
fn silent_cells(summary: &Summary) -> [String; 4] {
    let Some(f) = &summary.silent else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    let ratio = summary
        .p99_over_healthy()
        .map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}x"));
    [
        f.healthy_p99_ms
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms")),
        ratio,
        f.silent_attempts.to_string(),
        f.slow_first_tokens.to_string(),
    ]
}

/// The cells of [`TAIL_HEADER`] for one row (`-` for a row without the figures), its attempts
/// against `baseline`'s (the `stormguard` row's, `-` without one).
fn tail_cells(summary: &Summary, baseline: Option<u64>) -> [String; 10] {
    let Some(f) = &summary.tail else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    let ms = |ms: Option<u32>| ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
    let against = baseline.filter(|attempts| *attempts > 0).map_or_else(
        || "-".to_owned(),
        |attempts| format!("{:.3}x", summary.backend_attempts as f64 / attempts as f64),
    );
    [
        ms(f.first_token_p50_ms),
        ms(f.first_token_p99_ms),
        ms(f.first_token_p999_ms),
        against,
        f.hedges.to_string(),
        format!("{:.4}", f.hedges_per_request),
        f.fault_amplification
            .map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x")),
        f.fault_attempts.to_string(),
        f.fault_hedges.to_string(),
        f.slow_first_tokens.to_string(),
    ]
}

/// The cells of [`CAPACITY_HEADER`] for one row (`-` for a row without the figures): each
/// figure of the three phases, or of the two steps, separated by `/`.
fn capacity_cells(summary: &Summary) -> [String; 5] {
    let Some(f) = &summary.capacity else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    let ratios = |values: &[f64; 3]| {
        let cells: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
        cells.join("/")
    };
    let settled: Vec<String> = f
        .settled_s
        .iter()
        .map(|s| s.map_or_else(|| "never".to_owned(), |s| format!("{s:.1} s")))
        .collect();
    let rejected = summary.too_many_requests as f64 / summary.offered.max(1) as f64;
    [
        ratios(&f.in_flight_per_slot),
        ratios(&f.goodput_per_slot),
        format!("{:.2}%", rejected * 100.0),
        settled.join("/"),
        f.lowest_limit
            .map_or_else(|| "-".to_owned(), |limit| limit.to_string()),
    ]
}

/// The cells of [`STREAMS_HEADER`] for one row (`-` for a row without the figures).
fn streams_cells(summary: &Summary) -> [String; 8] {
    let Some(f) = &summary.streams else {
        return std::array::from_fn(|_| "-".to_owned());
    };
    [
        f.failed_before_content.to_string(),
        f.retried.to_string(),
        f.given_up.to_string(),
        f.budget_refused.to_string(),
        f.out_of_attempts.to_string(),
        f.interrupted.to_string(),
        f.duplicated_tokens.to_string(),
        f.lost_tokens.to_string(),
    ]
}

/// What the columns of `scenario`'s table mean: [`LEGEND`], and in a scenario with two providers
/// [`FAILOVER_LEGEND`] after it, in one whose streams fail [`STREAMS_LEGEND`], in one whose
/// provider goes silent [`SILENT_LEGEND`].
pub fn legend(scenario: &Scenario) -> String {
    let mut legend = LEGEND.to_owned();
    if scenario.secondary().is_some() {
        legend = format!("{legend}\n{FAILOVER_LEGEND}");
    }
    if scenario.streams_fail() {
        legend = format!("{legend}\n{STREAMS_LEGEND}");
    }
    if scenario.goes_silent() {
        legend = format!("{legend}\n{SILENT_LEGEND}");
    }
    if scenario.has_slow_starts() {
        legend = format!("{legend}\n{TAIL_LEGEND}");
    }
    if scenario.steps_capacity() {
        legend = format!("{legend}\n{CAPACITY_LEGEND}");
    }
    if !scenario.deployments.is_empty() {
        legend = format!("{legend}\n{BALANCE_LEGEND}");
    }
    if scenario.dying.is_some() {
        legend = format!("{legend}\n{FLEET_LEGEND}");
    }
    legend
}

/// What the columns of a scenario with deployments mean, printed under [`LEGEND`].
pub(crate) const BALANCE_LEGEND: &str = "\
with deployments, the provider columns above (attempts, ampl, peak load, peak in-flight,
overloaded, 429s, retries) count them together (the peaks: the sum of each one's);
<name> share = the deployment's share of the successes of all the deployments (in brackets: its
share in the best split, the quickest filled up to its quota first, then the next);
429s / round-robin = 429s over the round-robin row's;
p50 / best split = the median latency over the best split's (from the model: the median of the
deployments' latencies mixed in the best split's shares, with no wait, no retry and no 429).";

/// What the columns of a scenario whose fault kills a deployment mean, printed under
/// [`BALANCE_LEGEND`].
pub(crate) const FLEET_LEGEND: &str = "\
with replicas and a dying deployment, cut and fault load count the dying deployment alone;
first / last saw it die = when the first and the last replica saw it die: its breaker of that
deployment opened (never: it did not);
attempts after = attempts that reached the dying deployment from the millisecond the first replica
saw it die to the end of the run; before the last = those that arrived before the last replica saw
it die;
after / stormguard+balance = attempts after over the stormguard+balance row's (its replicas'
breakers independent).";

/// What the columns of a scenario whose provider's capacity steps mean, printed under
/// [`LEGEND`].
pub(crate) const CAPACITY_LEGEND: &str = "\
with capacity steps, each figure a/b/c is one per phase (healthy; slower with the slots unchanged;
the slots cut), over the phase from 10 s after its start to its end;
in-flight / slots = the attempts open at once (the most of each 100 ms, averaged), the provider's
queue included, over its slots;
goodput / slots = successes a second over what the slots allow (slots / mean service time);
429s / offered = the provider's 429s over the requests offered;
settled after steps = after the latency step and after the slots' cut, the time until the attempts
open stayed within 0.8x to 1.25x of the slots to the end of the phase;
lowest limit = the lowest the row's concurrency limit went from the first step on.";

/// What the columns of a scenario whose streams start with a slow tail mean, printed under
/// [`LEGEND`].
pub(crate) const TAIL_LEGEND: &str = "\
with streamed answers, success = requests whose caller read a whole stream (to data: [DONE], no
error), and latency = until the stream's end;
first token p50, p99, p99.9 = time to first token of the requests that succeeded: from the
request's start to the first content event its caller was shown, across its attempts;
attempts / stormguard = attempts reaching the provider over the run / the stormguard row's;
hedges = attempts sent while another attempt of the same request was still open (hedges / request:
over offered);
fault ampl = attempts reaching the provider / offered during the whole fault, the outage (per
100 ms of arrival), fault attempts = those attempts, fault hedges = the hedges among them;
slow first tokens = attempts the provider drew in the slow tail of its first tokens.";

/// What the columns of a scenario whose provider goes silent mean, printed under [`LEGEND`].
pub(crate) const SILENT_LEGEND: &str = "\
with streamed answers, success = requests whose caller read a whole stream (to data: [DONE], no
error) within the callers' deadline, and latency = until the stream's end (a request given up at
the deadline counts its deadline);
healthy p99 = p99 latency of the requests that arrived before the fault, in the same run;
p99 / healthy = the p99 above over it;
silent attempts = attempts the primary kept without a response head for the fault's silence;
slow first tokens = the primary's streams slow to their first token (its count).";

/// What the columns of a scenario whose provider streams mean, printed under [`LEGEND`].
pub(crate) const STREAMS_LEGEND: &str = "\
with streamed answers, success = requests whose caller read a whole stream (to data: [DONE], no
error); a stream cut after content is no success;
pre-content errors = streams the provider failed with an error event before any content;
retried = those another attempt of the same request followed (a retry, or naive's restart);
given up = those whose error reached the caller, with no retry or restart after it: budget refused
= stormguard's retry budget refused the retry, out of attempts = the request had sent stormguard's
3 attempts (or naive's 3 restarts were used up);
interrupted = streams whose caller saw them fail after content (naive restarts them from the
start, stormguard ends them with StreamInterrupted; stormguard+continuation continues a cut stream
in place, and counts here only one it could not continue);
duplicated tokens = content tokens callers were shown twice (a restarted stream repeating them);
lost tokens = content tokens callers never got though they got a later one (a continuation going
on from the wrong place).";

/// What the columns of a scenario with two providers mean, printed under [`LEGEND`].
pub(crate) const FAILOVER_LEGEND: &str = "\
with two providers, the provider columns above (attempts, ampl, peak load, peak in-flight,
overloaded, cut, fault load, 429s, retries) are the primary's; success, fallback, latency and
recovery are the callers', whichever provider answered;
secondary = attempts reaching the secondary provider (secondary peak load and overloaded: as above,
of its slots);
primary in fault = attempts reaching the primary during its fault / offered during it (per 100 ms
of arrival);
back = seconds after the primary's fault ends until the attempts reaching it stay >= 95% of
offered (per 100 ms of arrival).";

/// What the columns mean, printed under the table.
pub(crate) const LEGEND: &str = "\
ampl = attempts reaching the provider / offered (peak ampl: in the worst second);
peak load = most requests in the provider at once (running + queued) / its slots;
peak in-flight = most attempts open at once, client side (sent, not yet answered, dropped or cut);
success = requests the provider answered with success (a fallback answer is none);
success outside = the same, of the requests that arrived 4 s (the healthy p99.9) or more before the
fault, or from 2 s after its end (- when the fault lasts the whole run, as the burst scenario's
quota does; so does recovery);
fallback = requests answered locally by the breaker's fallback (fallback p99: their p99 latency);
overloaded = seconds in which over 1% of attempts found every slot busy;
recovery = seconds after the fault ends until goodput stays >= 95% of offered (per second of arrival);
cut = seconds after a dead provider's fault starts until attempts stay below 5% of offered until it
ends (per 100 ms of arrival; - when the provider still serves);
fault load = attempts / offered during the fault, after its first 3 s;
429s = attempts the provider answered with 429 (Too Many Requests);
retries = attempts that repeat a request; early retries = those sent before the Retry-After they
were given.";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::metrics::{FailoverFigures, SilentFigures, StreamFigures};
    use crate::scenarios;

    #[test]
    fn table_aligns_columns_and_says_never() {
        let summary = Summary {
            name: "naive",
            offered: 720_000,
            backend_attempts: 2_500_000,
            amplification: 3.47,
            peak_amplification: 3.9,
            peak_load: 1.9,
            peak_in_flight: 9_000,
            success_rate: 0.41,
            success_outside: Some(0.5),
            fallbacks: 0,
            fallback_p99_ms: None,
            p50_ms: 4_000,
            p99_ms: 16_000,
            overloaded_s: 50,
            recovery_s: None,
            cut_s: None,
            fault_load: 3.9,
            too_many_requests: 0,
            retries: 1_780_000,
            early_retries: 0,
            successes: 295_200,
            failover: None,
            streams: None,
            silent: None,
            tail: None,
            balance: None,
            fleet: None,
            capacity: None,
        };
        let outage = scenarios::OUTAGE.scenario();
        let text = table(&outage, std::slice::from_ref(&summary));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), lines[1].len());
        assert!(
            lines[1].contains("3.47x") && lines[1].contains("never") && lines[1].contains("41.00%")
        );
        let cells = |text: &str| -> Vec<String> {
            let row = text.lines().nth(1).unwrap();
            row.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        };
        // Columns: ... recovery, cut, fault load ...
        assert_eq!(cells(&text)[14..16], ["never", "never"]);
        let seed = scenarios::SEED.scenario();
        assert_eq!(
            cells(&table(&seed, std::slice::from_ref(&summary)))[14..16],
            ["never", "-"],
            "nothing to cut while the provider serves"
        );
        let cut = Summary {
            cut_s: Some(2.1),
            fallbacks: 9_000,
            fallback_p99_ms: Some(2_003),
            ..summary
        };
        let cells = cells(&table(&outage, std::slice::from_ref(&cut)));
        assert_eq!(cells[15], "2.1 s");
        assert_eq!((cells[9].as_str(), cells[12].as_str()), ("9000", "2003 ms"));
        // The burst scenario's quota lasts the whole run: nothing outside it, no recovery from it.
        let burst = scenarios::BURST.scenario();
        let limited = Summary {
            success_outside: None,
            too_many_requests: 1_234,
            ..cut
        };
        let text = table(&burst, &[limited]);
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        let header = text.lines().next().unwrap();
        assert!(header.contains("fault load  429s  retries"), "{header}");
        assert_eq!(row[8], "-", "success outside: {row:?}");
        assert_eq!(row[row.len() - 3], "1234", "{row:?}");
        assert!(!legend(&burst).contains("secondary"));
        assert_eq!(legend(&burst), LEGEND);
    }

    /// Two rows of the failover scenario: `stormguard`, whose secondary got nothing, and
    /// `stormguard+failover`.
    fn failover_rows() -> (Summary, Summary) {
        let alone = Summary {
            name: "stormguard",
            offered: 60_000,
            backend_attempts: 45_000,
            amplification: 0.75,
            peak_amplification: 1.67,
            peak_load: 0.56,
            peak_in_flight: 1_088,
            success_rate: 0.7,
            success_outside: Some(1.0),
            fallbacks: 0,
            fallback_p99_ms: None,
            p50_ms: 612,
            p99_ms: 2_354,
            overloaded_s: 0,
            recovery_s: Some(2.0),
            cut_s: Some(1.9),
            fault_load: 0.01,
            too_many_requests: 0,
            retries: 904,
            early_retries: 0,
            successes: 42_000,
            failover: Some(FailoverFigures {
                secondary_attempts: 0,
                secondary_peak_load: 0.0,
                secondary_overloaded_s: 0,
                primary_in_fault: Some(0.1374),
                back_s: Some(1.8),
            }),
            streams: None,
            silent: None,
            tail: None,
            balance: None,
            fleet: None,
            capacity: None,
        };
        let failing_over = Summary {
            name: "stormguard+failover",
            failover: Some(FailoverFigures {
                secondary_attempts: 14_045,
                secondary_peak_load: 1.31,
                secondary_overloaded_s: 2,
                primary_in_fault: Some(0.0007),
                back_s: None,
            }),
            ..alone.clone()
        };
        (alone, failing_over)
    }

    #[test]
    fn two_providers_add_the_failover_columns_at_the_end() {
        let failover = scenarios::FAILOVER.scenario();
        let (alone, failing_over) = failover_rows();
        let text = table(&failover, &[alone.clone(), failing_over]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains(
                "early retries  secondary  secondary peak load  secondary overloaded  \
                 primary in fault"
            ) && lines[0].ends_with(" back"),
            "{}",
            lines[0]
        );
        assert!(lines.iter().all(|line| line.len() == lines[0].len()));
        let tail = |line: &str| -> Vec<String> {
            let cells: Vec<&str> = line
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            cells[cells.len() - 5..]
                .iter()
                .map(|c| (*c).to_owned())
                .collect()
        };
        assert_eq!(tail(lines[1]), ["0", "0.00x", "0 s", "13.74%", "1.8 s"]);
        assert_eq!(tail(lines[2]), ["14045", "1.31x", "2 s", "0.07%", "never"]);
        assert!(legend(&failover).starts_with(LEGEND));
        assert!(legend(&failover).ends_with(FAILOVER_LEGEND));
        assert!(!legend(&failover).contains("streamed"));
        // A one-provider scenario's table is as it always was.
        let outage = scenarios::OUTAGE.scenario();
        let one = table(&outage, &[alone]);
        assert!(
            one.lines()
                .next()
                .unwrap()
                .ends_with("retries  early retries")
        );
    }

    #[test]
    fn streams_add_their_columns_at_the_end() {
        let streams = scenarios::STREAMS.scenario();
        let figures = StreamFigures {
            failed_before_content: 554,
            retried: 552,
            given_up: 2,
            budget_refused: 0,
            out_of_attempts: 2,
            cut: 98,
            interrupted: 98,
            stream_interrupted: 98,
            duplicated_tokens: 0,
            lost_tokens: 0,
        };
        let summary = Summary {
            name: "stormguard",
            offered: 29_958,
            backend_attempts: 30_514,
            amplification: 1.02,
            peak_amplification: 1.08,
            peak_load: 0.47,
            peak_in_flight: 2_364,
            success_rate: 0.9967,
            success_outside: Some(1.0),
            fallbacks: 0,
            fallback_p99_ms: None,
            p50_ms: 4_000,
            p99_ms: 12_900,
            overloaded_s: 0,
            recovery_s: Some(0.0),
            cut_s: None,
            fault_load: 1.06,
            too_many_requests: 0,
            retries: 556,
            early_retries: 0,
            successes: 29_859,
            failover: None,
            streams: Some(figures),
            silent: None,
            tail: None,
            balance: None,
            fleet: None,
            capacity: None,
        };
        let text = table(&streams, &[summary]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with(
                "early retries  pre-content errors  retried  given up  budget refused  \
                 out of attempts  interrupted  duplicated tokens  lost tokens"
            ),
            "{}",
            lines[0]
        );
        assert_eq!(lines[0].len(), lines[1].len());
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells[cells.len() - 8..],
            ["554", "552", "2", "0", "2", "98", "0", "0"]
        );
        assert!(legend(&streams).starts_with(LEGEND));
        assert!(legend(&streams).ends_with(STREAMS_LEGEND));
    }

    /// Two rows of the tail scenario: `stormguard`, and `stormguard+hedge`.
    fn tail_rows() -> (Summary, Summary) {
        use crate::metrics::TailFigures;
        let figures = TailFigures {
            first_token_p50_ms: Some(509),
            first_token_p99_ms: Some(3_916),
            first_token_p999_ms: Some(6_169),
            hedges: 0,
            hedges_per_request: 0.0,
            fault_amplification: Some(0.1677),
            fault_attempts: 20_063,
            fault_hedges: 0,
            slow_first_tokens: 6_325,
        };
        let plain = Summary {
            name: "stormguard",
            offered: 720_009,
            backend_attempts: 616_188,
            amplification: 0.86,
            peak_amplification: 1.5,
            peak_load: 0.28,
            peak_in_flight: 11_000,
            success_rate: 0.809,
            success_outside: Some(1.0),
            fallbacks: 0,
            fallback_p99_ms: None,
            p50_ms: 745,
            p99_ms: 4_500,
            overloaded_s: 0,
            recovery_s: Some(1.0),
            cut_s: Some(1.6),
            fault_load: 0.01,
            too_many_requests: 0,
            retries: 11_618,
            early_retries: 0,
            successes: 582_000,
            failover: None,
            streams: None,
            silent: None,
            tail: Some(figures),
            balance: None,
            fleet: None,
            capacity: None,
        };
        let hedged = Summary {
            name: "stormguard+hedge",
            backend_attempts: 644_328,
            tail: Some(TailFigures {
                first_token_p99_ms: Some(1_116),
                first_token_p999_ms: Some(1_381),
                hedges: 37_440,
                hedges_per_request: 0.052,
                ..figures
            }),
            ..plain.clone()
        };
        (plain, hedged)
    }

    #[test]
    fn slow_first_tokens_add_the_first_token_percentiles_and_the_hedges_at_the_end() {
        let tail = scenarios::TAIL.scenario();
        let (plain, hedged) = tail_rows();
        let text = table(&tail, &[plain.clone(), hedged.clone()]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with(
                "first token p50  first token p99  first token p99.9  attempts / stormguard  \
                 hedges  hedges / request  fault ampl  fault attempts  fault hedges  \
                 slow first tokens"
            ),
            "{}",
            lines[0]
        );
        assert!(lines.iter().all(|line| line.len() == lines[0].len()));
        let cells = |line: &str| -> Vec<String> {
            let cells: Vec<&str> = line.split_whitespace().collect();
            cells[cells.len() - 13..]
                .iter()
                .map(|c| (*c).to_owned())
                .collect()
        };
        assert_eq!(
            cells(lines[2]),
            [
                "509", "ms", "1116", "ms", "1381", "ms", "1.046x", "37440", "0.0520", "0.17x",
                "20063", "0", "6325"
            ]
        );
        assert_eq!(cells(lines[1])[6], "1.000x");
        // Without a stormguard row, nothing to compare the attempts with.
        let alone = table(&tail, std::slice::from_ref(&hedged));
        assert_eq!(cells(alone.lines().nth(1).unwrap())[6], "-");
        assert_eq!(
            headline(&tail, &hedged),
            "first token p99 1116 ms, 0.052 hedges/request"
        );
        let legend = legend(&tail);
        assert!(legend.starts_with(LEGEND) && legend.ends_with(TAIL_LEGEND));
        assert!(!legend.contains(STREAMS_LEGEND) && !legend.contains(SILENT_LEGEND));
        // Another scenario's table has none of these columns.
        let outage = scenarios::OUTAGE.scenario();
        assert!(!table(&outage, &[plain]).contains("first token"));
    }

    #[test]
    fn a_silent_provider_adds_the_healthy_p99_and_the_ratio_to_it_and_no_stream_columns() {
        let silent = scenarios::SILENT.scenario();
        let figures = SilentFigures {
            healthy_p99_ms: Some(13_479),
            silent_attempts: 807,
            slow_first_tokens: 58,
        };
        let summary = Summary {
            name: "stormguard+failover",
            offered: 17_921,
            backend_attempts: 13_315,
            amplification: 0.74,
            peak_amplification: 1.0,
            peak_load: 0.39,
            peak_in_flight: 1_559,
            success_rate: 0.9874,
            success_outside: Some(1.0),
            fallbacks: 0,
            fallback_p99_ms: None,
            p50_ms: 4_519,
            p99_ms: 13_580,
            overloaded_s: 0,
            recovery_s: Some(0.0),
            cut_s: None,
            fault_load: 0.35,
            too_many_requests: 0,
            retries: 1,
            early_retries: 0,
            successes: 17_695,
            failover: None,
            streams: None,
            silent: Some(figures),
            tail: None,
            balance: None,
            fleet: None,
            capacity: None,
        };
        let text = table(&silent, std::slice::from_ref(&summary));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0]
                .ends_with("back  healthy p99  p99 / healthy  silent attempts  slow first tokens"),
            "{}",
            lines[0]
        );
        assert!(!lines[0].contains("duplicated tokens"), "{}", lines[0]);
        assert_eq!(lines[0].len(), lines[1].len());
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells[cells.len() - 5..],
            ["13479", "ms", "1.01x", "807", "58"]
        );
        assert_eq!(headline(&silent, &summary), "p99 / healthy 1.01x");
        let legend = legend(&silent);
        assert!(legend.starts_with(LEGEND) && legend.ends_with(SILENT_LEGEND));
        assert!(!legend.contains(STREAMS_LEGEND));
        let unknown = Summary {
            silent: None,
            ..summary
        };
        assert_eq!(headline(&silent, &unknown), "p99 / healthy -");
    }
}
