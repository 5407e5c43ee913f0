//! The `storm` binary: the same seed prints the same JSON, with the documented keys.

use std::path::{Path, PathBuf};
use std::process::Command;

use stormguard_storm::pipeline::Pipeline;
use stormguard_storm::scenarios;

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("storm-cli-{name}-{}", std::process::id()))
}

fn run_json(args: &[&str], out: &PathBuf) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_storm"))
        .args(args)
        .arg("--json")
        .arg("--out")
        .arg(out)
        .output()
        .expect("storm runs");
    assert!(
        output.status.success(),
        "storm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.stderr.is_empty(), "--json is quiet on stderr");
    String::from_utf8(output.stdout).expect("utf-8 output")
}

#[test]
fn same_seed_same_json_with_the_documented_keys() {
    let out = out_dir("seed");
    let args = [
        "--scenario",
        "seed",
        "--qps",
        "200",
        "--duration",
        "10",
        "--seed",
        "7",
    ];
    let first = run_json(&args, &out);
    let second = run_json(&args, &out);
    assert_eq!(first, second, "a seed gives the same numbers");

    let value: serde_json::Value = serde_json::from_str(&first).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["none", "naive", "tower", "stormguard"]);
    for row in rows {
        for key in [
            "offered",
            "backend_attempts",
            "amplification",
            "success_rate",
            "p50_ms",
            "p99_ms",
            "overloaded_s",
            "recovery_s",
            "peak_in_flight",
            "cut_s",
            "fallbacks",
            "fallback_p99_ms",
            "success_outside",
            "429s",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        // 200 req/s for 10 s.
        let offered = row["offered"].as_u64().expect("a count");
        assert!((1_800..2_200).contains(&offered), "{offered}");
    }
    assert!(out.join("seed.svg").exists(), "the chart is written");

    let other_seed = run_json(
        &[
            "--scenario",
            "seed",
            "--qps",
            "200",
            "--duration",
            "10",
            "--seed",
            "8",
        ],
        &out,
    );
    assert_ne!(first, other_seed, "another seed, other draws");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn blackhole_compares_the_retrying_clients_and_the_breaker() {
    let out = out_dir("blackhole");
    let json = run_json(
        // Black hole from 6.7 s to 10 s: long enough for the breaker's 2 s stall detection.
        &[
            "--scenario",
            "blackhole",
            "--qps",
            "200",
            "--duration",
            "20",
        ],
        &out,
    );
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        ["naive", "tower", "stormguard", "stormguard+breaker"]
    );
    let breaker = &rows[3];
    assert!(
        breaker["fallbacks"].as_u64().expect("a count") > 0,
        "{breaker}"
    );
    assert!(rows[0]["cut_s"].is_null(), "naive retries never cut");
    assert!(out.join("blackhole.svg").exists(), "the chart is written");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn burst_compares_the_rate_limit_rows_and_counts_429s() {
    let out = out_dir("burst");
    let json = run_json(&["--scenario", "burst", "--duration", "10"], &out);
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "naive",
            "tower",
            "stormguard",
            "stormguard+rate-limit",
            "stormguard+adaptive"
        ]
    );
    let count = |row: &serde_json::Value| row["429s"].as_u64().expect("a count");
    assert!(count(&rows[0]) > 0, "{}", rows[0]);
    assert!(
        rows[0]["success_outside"].is_null(),
        "the quota lasts the whole run"
    );
    assert!(out.join("burst.svg").exists(), "the chart is written");

    // Any row on any scenario.
    let json = run_json(
        &[
            "--scenario",
            "quota",
            "--qps",
            "100",
            "--duration",
            "6",
            "--pipelines",
            "stormguard+rate-limit",
        ],
        &out,
    );
    assert!(
        json.contains(r#""name": "stormguard+rate-limit""#),
        "{json}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn failover_compares_the_failover_rows_with_the_secondarys_figures() {
    let out = out_dir("failover");
    let json = run_json(
        &["--scenario", "failover", "--qps", "200", "--duration", "20"],
        &out,
    );
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        ["naive+failover", "stormguard", "stormguard+failover"]
    );
    for row in rows {
        for key in [
            "secondary_attempts",
            "secondary_peak_load",
            "secondary_overloaded_s",
            "primary_in_fault",
            "back_s",
        ] {
            assert!(row["failover"].get(key).is_some(), "{key} missing in {row}");
        }
    }
    let secondary = |row: &serde_json::Value| row["failover"]["secondary_attempts"].as_u64();
    assert_eq!(
        secondary(&rows[1]),
        Some(0),
        "stormguard sends to the primary alone"
    );
    assert!(secondary(&rows[2]) > Some(0), "{}", rows[2]);
    assert!(out.join("failover.svg").exists(), "the chart is written");

    // One provider, no failover figures in the JSON, and no failover row.
    let one = run_json(
        &["--scenario", "outage", "--qps", "100", "--duration", "6"],
        &out,
    );
    assert!(!one.contains("failover"), "{one}");
    assert!(!one.contains("streams"), "{one}");
    assert!(!one.contains("silent"), "{one}");
    assert!(!one.contains("first_token"), "{one}");
    let refused = Command::new(env!("CARGO_BIN_EXE_storm"))
        .args(["--scenario", "outage", "--pipelines", "stormguard+failover"])
        .output()
        .expect("storm runs");
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("needs two providers"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn streams_compare_naive_with_stormguard_without_and_with_continuation_with_the_stream_figures() {
    let out = out_dir("streams");
    let json = run_json(
        &["--scenario", "streams", "--qps", "20", "--duration", "10"],
        &out,
    );
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["naive", "stormguard", "stormguard+continuation"]);
    for row in rows {
        for key in [
            "failed_before_content",
            "retried",
            "given_up",
            "budget_refused",
            "out_of_attempts",
            "cut",
            "interrupted",
            "stream_interrupted",
            "duplicated_tokens",
            "lost_tokens",
        ] {
            assert!(row["streams"].get(key).is_some(), "{key} missing in {row}");
        }
    }
    for row in &rows[1..] {
        assert_eq!(row["streams"]["duplicated_tokens"], 0, "{row}");
        assert_eq!(row["streams"]["lost_tokens"], 0, "{row}");
    }
    assert!(out.join("streams.svg").exists(), "the chart is written");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn silent_compares_the_failover_without_and_with_clocks_against_the_healthy_p99() {
    let out = out_dir("silent");
    let json = run_json(
        &["--scenario", "silent", "--qps", "20", "--duration", "10"],
        &out,
    );
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "naive+failover",
            "tower",
            "stormguard",
            "stormguard+failover-no-clocks",
            "stormguard+failover"
        ]
    );
    for row in rows {
        for key in ["healthy_p99_ms", "silent_attempts", "slow_first_tokens"] {
            assert!(row["silent"].get(key).is_some(), "{key} missing in {row}");
        }
        assert!(row["failover"].is_object(), "two providers: {row}");
    }
    assert!(out.join("silent.svg").exists(), "the chart is written");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tail_compares_the_hedges_with_the_first_token_figures() {
    let out = out_dir("tail");
    let json = run_json(
        &["--scenario", "tail", "--qps", "50", "--duration", "10"],
        &out,
    );
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let rows = value.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "naive-hedge",
            "tower-hedge",
            "stormguard",
            "stormguard+hedge"
        ]
    );
    for row in rows {
        for key in [
            "first_token_p50_ms",
            "first_token_p99_ms",
            "first_token_p999_ms",
            "hedges",
            "hedges_per_request",
            "fault_amplification",
            "fault_attempts",
            "fault_hedges",
            "slow_first_tokens",
        ] {
            assert!(row["tail"].get(key).is_some(), "{key} missing in {row}");
        }
    }
    // The naive hedge sends every request twice; stormguard without hedging never.
    assert_eq!(rows[0]["tail"]["hedges_per_request"], 1.0, "{}", rows[0]);
    assert_eq!(rows[2]["tail"]["hedges"], 0, "{}", rows[2]);
    assert!(out.join("tail.svg").exists(), "the chart is written");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_flags_are_refused_with_usage() {
    for args in [
        &["--scenario", "storm"][..],
        &["--pipelines", "none,retry"],
        &["--qps", "-5"],
        &["--bogus"],
        &["--scenario", "seed", "--pipelines", "naive+failover"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_storm"))
            .args(args)
            .output()
            .expect("storm runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("usage: storm"),
            "{args:?}"
        );
    }
}

fn storm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_storm"))
        .args(args)
        .output()
        .expect("storm runs")
}

#[test]
fn help_says_what_every_option_scenario_and_pipeline_is() {
    for flag in ["--help", "-h"] {
        let output = storm(&[flag]);
        assert_eq!(output.status.code(), Some(0), "{flag}");
        let help = String::from_utf8(output.stdout).expect("utf-8 output");
        for option in [
            "--scenario",
            "--qps",
            "--duration",
            "--capacity",
            "--seed",
            "--pipelines",
            "--attempt-timeout",
            "--out",
            "--json",
            "--metrics",
        ] {
            assert!(
                help.contains(&format!("\n  {option}")),
                "{option} in {help}"
            );
        }
        assert!(help.contains("`all`"), "{help}");
        for kind in scenarios::ALL {
            assert!(help.contains(&format!("\n  {kind}\n")), "{kind} in {help}");
        }
        for pipeline in Pipeline::ALL {
            assert!(
                help.contains(&format!("\n  {pipeline}\n")),
                "{pipeline} in {help}"
            );
        }
    }
}

#[test]
fn all_runs_every_scenario_and_ends_with_one_line_per_default_pipeline() {
    let out = out_dir("all");
    let args = ["--scenario", "all", "--qps", "50", "--duration", "6"];
    let output = Command::new(env!("CARGO_BIN_EXE_storm"))
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("storm runs");
    assert!(
        output.status.success(),
        "storm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("utf-8 output");
    let (tables, overview) = text.split_once("\nall scenarios:\n").expect("an overview");
    let mut lines = overview.lines();
    let header = lines.next().expect("a header");
    for column in [
        "scenario",
        "pipeline",
        "success",
        "ampl",
        "peak load",
        "headline",
    ] {
        assert!(header.contains(column), "{column} in {header}");
    }
    // Each scenario's own table, as `--scenario NAME` prints it.
    assert_eq!(tables.matches("\npipeline ").count(), scenarios::ALL.len());
    let mut expected = Vec::new();
    for kind in scenarios::ALL {
        assert!(
            out.join(format!("{kind}.svg")).exists(),
            "{kind}'s chart is written"
        );
        for pipeline in kind.pipelines {
            expected.push((kind.to_string(), pipeline.to_string()));
        }
    }
    let rows: Vec<(String, String)> = lines
        .take_while(|line| !line.starts_with("wall time"))
        .map(|line| {
            let mut cells = line.split_whitespace();
            let scenario = cells.next().unwrap_or_default().to_owned();
            (scenario, cells.next().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(rows, expected);

    // One element per scenario, each holding what `--scenario NAME --json` prints.
    let json = run_json(&args, &out);
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let elements = value.as_array().expect("an array");
    let scenarios: Vec<&str> = elements
        .iter()
        .filter_map(|e| e["scenario"].as_str())
        .collect();
    let names: Vec<&str> = scenarios::ALL.iter().map(|k| k.name).collect();
    assert_eq!(scenarios, names);
    let rows: usize = elements
        .iter()
        .map(|e| e["runs"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(rows, expected.len());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_flags_point_to_help() {
    for args in [
        &["--bogus"][..],
        &["--scenario", "every"],
        &["--scenario", "all", "--pipelines", "naive"],
    ] {
        let output = storm(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("usage: storm"), "{stderr}");
        assert!(stderr.contains("--help"), "{stderr}");
    }
}

/// The figures of a series line of `storm --metrics` (`name{labels}  type  figures  windows...`):
/// the number after `figure` (`total`, `count`, `max`...).
fn figure(line: &str, figure: &str) -> f64 {
    let after = line
        .split_once(&format!(" {figure} "))
        .unwrap_or_else(|| panic!("{figure} in {line}"))
        .1;
    let number: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("{figure} in {line}"))
}

/// The lines of the series of `name` in the metrics of `pipeline` printed by `storm --metrics`.
fn series_lines<'a>(text: &'a str, pipeline: &str, name: &str) -> Vec<&'a str> {
    let block = text
        .split_once(&format!("\nmetrics of {pipeline}:\n"))
        .unwrap_or_else(|| panic!("the metrics of {pipeline} in {text}"))
        .1;
    block
        .lines()
        .take_while(|line| !line.is_empty())
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .collect()
}

/// The run of the metrics test, but for `--out`, `--json` and `--metrics`: the outage from 6.7 s
/// to 10 s; at 500 requests/s the throttle also refuses some retries.
const METRICS_RUN: [&str; 6] = ["--scenario", "outage", "--qps", "500", "--duration", "20"];

#[test]
fn metrics_show_the_engines_counts_of_each_stormguard_row_and_change_no_figure() {
    let out = out_dir("metrics");
    metrics_text_shows_the_engines_counts(&out);
    metrics_json_holds_them_in_each_stormguard_row(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// The text of [`METRICS_RUN`], charts in `out`, with `--metrics` if `metrics`.
fn metrics_text(out: &Path, metrics: bool) -> String {
    let mut args = METRICS_RUN.to_vec();
    args.push("--out");
    let out = out.to_string_lossy().into_owned();
    args.push(&out);
    if metrics {
        args.push("--metrics");
    }
    let output = storm(&args);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// `--metrics` prints each stormguard row's metrics between the legend and the chart line, and
/// changes nothing else.
fn metrics_text_shows_the_engines_counts(out: &Path) {
    let with = metrics_text(out, true);
    let without = metrics_text(out, false);

    // The same table, legend and chart line; the metrics come between the legend and the chart.
    let (tables, rest) = with
        .split_once("\nmetrics = ")
        .expect("the metrics' legend");
    let (_, chart) = rest.split_once("\nchart: ").expect("the chart line");
    let before_wall_time = |text: &str| text.split("wall time").next().unwrap_or("").to_owned();
    assert_eq!(
        before_wall_time(&format!("{tables}\nchart: {chart}")),
        before_wall_time(&without),
        "--metrics changes no figure"
    );
    for pipeline in ["stormguard", "stormguard+breaker"] {
        assert!(
            with.contains(&format!("\nmetrics of {pipeline}:\n")),
            "{with}"
        );
    }
    for pipeline in ["none", "naive", "tower"] {
        assert!(!with.contains(&format!("metrics of {pipeline}:")), "{with}");
    }

    for pipeline in ["stormguard", "stormguard+breaker"] {
        metrics_match_the_row(&with, tables, pipeline);
    }
    let breaker = series_lines(&with, "stormguard+breaker", "stormguard.breaker.state");
    assert_eq!(breaker.len(), 1, "{with}");
    assert!(
        series_lines(&with, "stormguard", "stormguard.breaker.state").is_empty(),
        "no breaker, no breaker state"
    );
}

/// The sum of `figure` over the lines of the series `name` of `pipeline` in `text` for which
/// `label` holds.
fn series_sum(
    text: &str,
    pipeline: &str,
    name: &str,
    label: &dyn Fn(&str) -> bool,
    figure_name: &str,
) -> f64 {
    series_lines(text, pipeline, name)
        .iter()
        .filter(|line| label(line))
        .map(|line| figure(line, figure_name))
        .sum()
}

/// The metrics of `pipeline` in `with` count what its row of `tables` says: its requests, the
/// retries it sent and its fallback answers, with the refusals and the throttle of an outage.
fn metrics_match_the_row(with: &str, tables: &str, pipeline: &str) {
    let row = tables
        .lines()
        .find(|line| line.split_whitespace().next() == Some(pipeline))
        .expect("the pipeline's row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    // `offered` is the second column; `retries` the last but one (`early retries` last).
    let offered: f64 = cells[1].parse().expect("offered");
    let retries: f64 = cells[cells.len() - 2].parse().expect("retries");
    // `fallback` is the tenth column.
    let fallbacks: f64 = cells[9].parse().expect("fallback");
    assert!(offered > 9_000.0, "{row}");

    // Every request of the table ended once, with its attempts recorded.
    let requests: f64 = series_lines(with, pipeline, "stormguard.request.attempts")
        .iter()
        .map(|line| figure(line, "count"))
        .sum();
    assert_eq!(requests, offered, "{pipeline}: {with}");
    let sum = |name: &str, label: &dyn Fn(&str) -> bool, figure_name: &str| -> f64 {
        series_sum(with, pipeline, name, label, figure_name)
    };
    let any = |_: &str| true;
    // In the outage, attempts are refused on this side (the throttle, or the breaker): a
    // request's first attempt (the request ends `refused`, with no attempt sent), or a retry.
    let local = |line: &str| {
        ["throttle", "breaker", "rate_limit"]
            .iter()
            .any(|cause| line.contains(&format!("cause=\"{cause}\"")))
    };
    let refused_attempts = sum("stormguard.refusals", &local, "total");
    let refused_requests = sum(
        "stormguard.request.attempts",
        &|line| line.contains(r#"outcome="refused""#),
        "count",
    );
    assert!(refused_requests > 0.0, "{pipeline}: {with}");
    assert!(refused_attempts > refused_requests, "{pipeline}: {with}");
    // The engine counts the retries it sends, as the table counts those that reach the
    // provider: a retry refused on this side (above) is in neither.
    let sent = sum("stormguard.retries", &any, "total");
    assert!(sent > 0.0, "{pipeline}: {with}");
    assert_eq!(sent, retries, "{pipeline}: {with}");
    // A request the breaker's fallback answered ends with outcome `fallback`.
    let answered_locally = sum(
        "stormguard.request.attempts",
        &|line| line.contains(r#"outcome="fallback""#),
        "count",
    );
    assert_eq!(answered_locally, fallbacks, "{pipeline}: {with}");
    if pipeline == "stormguard+breaker" {
        assert!(fallbacks > 0.0, "{row}");
    }
    // The throttle's drop probability went up in the outage, and came back down after it.
    let drop = series_lines(with, pipeline, "stormguard.throttle.drop_probability");
    assert_eq!(drop.len(), 1, "{pipeline}: {with}");
    assert!(figure(drop[0], "max") > 0.5, "{}", drop[0]);
    assert!(figure(drop[0], "last") < 0.1, "{}", drop[0]);
}

/// The JSON: each stormguard row's object has its metrics, the others have none, and the figures
/// are those printed without --metrics.
fn metrics_json_holds_them_in_each_stormguard_row(out: &PathBuf) {
    let json = |metrics: bool| -> serde_json::Value {
        let mut args = METRICS_RUN.to_vec();
        if metrics {
            args.push("--metrics");
        }
        serde_json::from_str(&run_json(&args, out)).expect("valid JSON")
    };
    let (with, without) = (json(true), json(false));
    let rows = with.as_array().expect("an array");
    for (row, plain) in rows.iter().zip(without.as_array().expect("an array")) {
        let mut figures = row.clone();
        figures
            .as_object_mut()
            .expect("an object")
            .remove("metrics");
        assert_eq!(&figures, plain, "--metrics changes no figure");
        let name = row["name"].as_str().expect("a name");
        let Ok(pipeline) = name.parse::<Pipeline>() else {
            panic!("{name}")
        };
        assert_eq!(
            row.get("metrics").is_some(),
            pipeline.uses_stormguard(),
            "{name}"
        );
        if let Some(metrics) = row.get("metrics") {
            json_metrics_match_the_row(row, metrics, name);
        }
    }
}

/// The `metrics` of the JSON row `row` of pipeline `name` count what its figures say, and each
/// series' windows add up to its figure.
fn json_metrics_match_the_row(row: &serde_json::Value, metrics: &serde_json::Value, name: &str) {
    assert_eq!(metrics["window_s"], 10);
    let series = metrics["series"].as_array().expect("series");
    let sum = |name: &str, label: (&str, &[&str]), figure: &str| -> f64 {
        series
            .iter()
            .filter(|s| s["name"] == name)
            .filter(|s| label.1.is_empty() || label.1.iter().any(|v| s["labels"][label.0] == *v))
            .filter_map(|s| s[figure].as_f64())
            .sum()
    };
    let any = ("", &[][..]);
    assert_eq!(
        sum("stormguard.request.attempts", any, "count"),
        row["offered"].as_f64().expect("offered"),
        "{name}"
    );
    assert_eq!(
        sum("stormguard.retries", any, "total"),
        row["retries"].as_f64().expect("retries"),
        "{name}"
    );
    assert_eq!(
        sum(
            "stormguard.request.attempts",
            ("outcome", &["fallback"]),
            "count"
        ),
        row["fallbacks"].as_f64().expect("fallbacks"),
        "{name}"
    );
    for s in series {
        let per_window: f64 = match s["type"].as_str() {
            Some("counter") => s["total"].as_f64().expect("total"),
            Some("histogram") => s["count"].as_f64().expect("count"),
            Some("gauge") => continue,
            other => panic!("{other:?}"),
        };
        let windows = s["per_window"].as_array().expect("per_window");
        let summed: f64 = windows.iter().filter_map(serde_json::Value::as_f64).sum();
        assert_eq!(summed, per_window, "{s}");
        assert_eq!(windows.len(), 2, "20 s: two windows of 10 s");
        assert_eq!(s["labels"]["gen_ai.provider.name"], "primary", "{s}");
    }
}

#[test]
fn markdown_writes_the_document_with_the_runs_tables_and_the_headline_block() {
    let out = out_dir("markdown");
    std::fs::create_dir_all(&out).expect("a temporary directory");
    let file = out.join("STORM.md");
    let args = ["--qps", "200", "--duration", "5", "--out"];
    let output = Command::new(env!("CARGO_BIN_EXE_storm"))
        .args(args)
        .arg(out.join("charts"))
        .arg("--markdown")
        .arg(&file)
        .output()
        .expect("storm runs");
    assert!(output.status.success(), "{output:?}");
    let document = std::fs::read_to_string(&file).expect("the document is written");
    let stdout = String::from_utf8(output.stdout).expect("utf-8 output");
    // The table the run printed, as it printed it, once in the headline block and once in the
    // scenario's section; the chart linked from where the document is.
    let table: String = stdout
        .lines()
        .skip_while(|line| !line.starts_with("pipeline"))
        .take_while(|line| !line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(table.lines().count(), 5, "{stdout}");
    let headline =
        format!("<!-- storm:headline -->\n```text\n{table}```\n<!-- /storm:headline -->\n");
    assert!(document.contains(&headline), "{document}");
    assert_eq!(document.matches(&table).count(), 2, "{document}");
    assert!(document.contains("\n## `--scenario seed`\n"), "{document}");
    assert!(document.contains("(charts/seed.svg)"), "{document}");
    assert!(!document.contains("{chart}") && !document.contains("wall time"));
    let _ = std::fs::remove_dir_all(&out);
}
