//! The targets of `docs/PERFORMANCE.md`, from the medians criterion just wrote and the paired
//! runs.

use std::path::PathBuf;

use crate::paired::{ROUNDS, SCALING_PAIRS, Scaling};

/// Where criterion keeps its estimates (the same lookup as criterion's, less `cargo metadata`).
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => PathBuf::from(target).join("criterion"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/criterion"),
    }
}

/// Median time per iteration of one benchmark, in nanoseconds, from the last run.
fn median(id: &str) -> Option<f64> {
    let path = criterion_home().join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(&text).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

/// The targets: stormguard's overhead within 1.5 times that of tower's retry writing the same
/// contract (callgrind instructions are what decides; wall time is reported alongside).
const TARGETS: [(&str, &str, &str); 2] = [
    ("target 1", "stormguard_client", "tower_client_contract"),
    ("target 2", "stormguard_retry", "tower_retry_contract"),
];

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The variants of the `success`, `threads` and `failure` groups, in the order reported.
const VARIANTS: [&str; 8] = [
    "bare",
    "tower_retry_tps",
    "tower_retry_contract",
    "tower_client_contract",
    "resilience_retry",
    "resilience_retry_breaker",
    "stormguard_retry",
    "stormguard_client",
];

/// The targets of docs/PERFORMANCE.md, from the medians criterion just wrote and the paired
/// scaling runs.
pub(crate) fn report(scaling: &Scaling) {
    report_one_thread();
    report_threads();
    report_scaling(scaling);
    report_failure_path();
}

/// Each variant's time per request on one thread, its overhead over `bare`, and the targets.
fn report_one_thread() {
    let bare = median("success/bare");
    println!("\n== per request, one thread (median ns; overhead = minus bare)");
    for name in VARIANTS {
        if let Some(ns) = median(&format!("success/{name}")) {
            let overhead = bare.map_or(f64::NAN, |bare| ns - bare);
            println!("{name:<26} {ns:>8.1} ns   overhead {overhead:>8.1} ns");
        }
    }
    let overhead = |name: &str| Some(median(&format!("success/{name}"))? - bare?);
    for (target, ours, floor) in TARGETS {
        if let (Some(ours_ns), Some(floor_ns)) = (overhead(ours), overhead(floor)) {
            let ratio = ours_ns / floor_ns;
            println!(
                "{target}: {ours} overhead <= 1.5 x {floor}: {ours_ns:.1} vs {floor_ns:.1} ns \
                 (x{ratio:.2}) {}",
                verdict(ratio <= 1.5)
            );
        }
    }
}

/// Each variant's requests per second with 1 and 2 threads, from criterion's threads group.
fn report_threads() {
    println!(
        "\n== criterion's threads group: requests/s with 1 and 2 threads (`bare` shares nothing: \
         its ratio is what the machine itself allows)"
    );
    let throughputs = |name: &str| {
        let one = median(&format!("threads/{name}/1"))?;
        let two = median(&format!("threads/{name}/2"))?;
        // An iteration is one request on each thread.
        Some((1e9 / one, 2e9 / two))
    };
    let ceiling = throughputs("bare").map(|(one, two)| two / one);
    for name in VARIANTS {
        if let Some((one, two)) = throughputs(name) {
            let ratio = two / one;
            println!(
                "{name:<26} {one:>10.0}/s {two:>10.0}/s  x{ratio:.3} (of bare's x{:.3})",
                ceiling.unwrap_or(f64::NAN),
            );
        }
    }
}

/// The paired scaling runs, if there were any: each variant's ratio against bare's.
fn report_scaling(scaling: &Scaling) {
    if scaling.ratios.is_empty() {
        return;
    }
    println!("\n== scaling in {SCALING_PAIRS} back-to-back pairs of runs: median [min .. max]");
    let middle = |ratios: &[f64]| ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    let ceiling = scaling
        .ratios
        .iter()
        .find(|(name, _)| *name == "bare")
        .map_or(f64::NAN, |(_, ratios)| middle(ratios));
    for (name, ratios) in &scaling.ratios {
        let mid = middle(ratios);
        println!(
            "{name:<26} x{mid:.2} [{:.2} .. {:.2}]  {:>4.0}% of bare's x{ceiling:.2}",
            ratios.first().copied().unwrap_or(f64::NAN),
            ratios.last().copied().unwrap_or(f64::NAN),
            100.0 * mid / ceiling,
        );
    }
}

/// Each variant's time per request when the first attempt fails, against tower's and
/// tower-resilience's retries.
fn report_failure_path() {
    println!("\n== failure path: 503 then 200, zero backoff (median ns per request)");
    let tower = median("failure/tower_retry_tps");
    let resilience = median("failure/resilience_retry");
    for name in VARIANTS {
        if let Some(ns) = median(&format!("failure/{name}")) {
            println!(
                "{name:<26} {ns:>10.1} ns  x{:.2} of tower_retry_tps, x{:.3} of resilience_retry",
                ns / tower.unwrap_or(f64::NAN),
                ns / resilience.unwrap_or(f64::NAN)
            );
        }
    }
}

/// The overhead ratios of the targets, and against tower and tower-resilience, round by round.
pub(crate) fn report_rounds(rounds: &[(&'static str, Vec<f64>)]) {
    let Some((_, bare)) = rounds.iter().find(|(name, _)| *name == "bare") else {
        return;
    };
    let overheads = |wanted: &str| {
        rounds
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|(_, times)| {
                times
                    .iter()
                    .zip(bare)
                    .map(|(t, b)| t - b)
                    .collect::<Vec<_>>()
            })
    };
    let middle = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        let mid = values.get(values.len() / 2).copied().unwrap_or(f64::NAN);
        let low = values.first().copied().unwrap_or(f64::NAN);
        let high = values.last().copied().unwrap_or(f64::NAN);
        (mid, low, high)
    };
    println!(
        "\n== one thread, {ROUNDS} interleaved rounds: overhead over bare, median [min .. max] ns"
    );
    for (name, _) in rounds {
        if let Some(values) = overheads(name) {
            let (mid, low, high) = middle(values);
            println!("{name:<26} {mid:>8.1} [{low:.1} .. {high:.1}]");
        }
    }
    let ratio = |top: &str, bottom: &str| {
        let (top, bottom) = (overheads(top)?, overheads(bottom)?);
        Some(middle(
            top.iter().zip(&bottom).map(|(t, b)| t / b).collect(),
        ))
    };
    let lines = [
        (
            "target 1: stormguard_client / tower_client_contract",
            "stormguard_client",
            "tower_client_contract",
        ),
        (
            "target 2: stormguard_retry / tower_retry_contract",
            "stormguard_retry",
            "tower_retry_contract",
        ),
        (
            "stormguard_client / tower_retry_tps",
            "stormguard_client",
            "tower_retry_tps",
        ),
        (
            "stormguard_retry / resilience_retry",
            "stormguard_retry",
            "resilience_retry",
        ),
        (
            "tower_client_contract / tower_retry_tps",
            "tower_client_contract",
            "tower_retry_tps",
        ),
    ];
    for (label, top, bottom) in lines {
        if let Some((mid, low, high)) = ratio(top, bottom) {
            let verdict = if label.starts_with("target") {
                verdict(mid <= 1.5)
            } else {
                ""
            };
            println!("{label:<52} x{mid:.2} [{low:.2} .. {high:.2}] {verdict}");
        }
    }
}
