//! A rate limit shared by a fleet through a real Redis: three limiters in three tasks, and three
//! processes of `fleet_admit`, sharing one key admit the quota once between them (within 2%).
//!
//! Real time (the fleet's clock is the Redis server's): each run takes 4 s. The Redis is the one
//! at `REDIS_URL`, else a `redis-server` of the test's own (see `support`).

#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stormguard::rate_limit::Fleet;
use stormguard_examples::fleet::{self, Run};
use support::{Redis, off_by, unique};
use tokio::time::Instant;

/// 100 requests a second.
const PER_MINUTE: u32 = 6_000;
const WINDOW: Duration = Duration::from_secs(4);
/// Long enough for a loaded test machine: these tests are about sharing, not about Redis being
/// slow (the outage test is).
const TIMEOUT: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_limiters_in_three_tasks_share_one_quota() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("tasks");
    let until = Instant::now() + WINDOW;
    let mut replicas = tokio::task::JoinSet::new();
    let mut fleets = Vec::new();
    for _ in 0..3 {
        let fleet = Fleet::new(&redis.url)
            .unwrap()
            .with_prefix(&prefix)
            .with_timeout(TIMEOUT);
        fleets.push(fleet.clone());
        let limit = fleet::limit(fleet, PER_MINUTE);
        replicas.spawn(async move { fleet::admit(&limit, 1, until).await });
    }
    let mut runs = Vec::new();
    while let Some(run) = replicas.join_next().await {
        runs.push(run.unwrap());
    }

    let allowance = fleet::allowance(PER_MINUTE, WINDOW);
    let admitted: u64 = runs.iter().map(|run| run.admitted).sum();
    // Alone, each would have admitted the whole allowance: together, once.
    assert!(
        off_by(admitted, allowance) <= 0.02,
        "admitted {admitted}, allowance {allowance}"
    );
    for run in &runs {
        // First come, first served: each gets about a third.
        assert!(run.admitted as f64 > allowance / 4.0, "{run:?}");
    }
    for fleet in &fleets {
        let snapshot = fleet.snapshot();
        assert!(snapshot.connected, "{snapshot:?}");
        assert_eq!(snapshot.local_decisions, 0, "{snapshot:?}");
        assert_eq!(snapshot.replicas, 3, "{snapshot:?}");
    }
    report("3 tasks", &runs);
}

#[test]
fn three_processes_share_one_quota() {
    let Some(redis) = Redis::find() else { return };
    let key = unique("processes");
    // Started together once all three are up.
    let start_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(2);
    let replicas: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_fleet_admit"))
                .args(["--redis", &redis.url, "--key", &key])
                .args(["--per-minute", &PER_MINUTE.to_string()])
                .args(["--seconds", &WINDOW.as_secs_f64().to_string()])
                .args(["--timeout-ms", &TIMEOUT.as_millis().to_string()])
                .args(["--start-at", &start_at.as_millis().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut admitted = 0;
    let mut lines = Vec::new();
    for replica in replicas {
        let output = replica.wait_with_output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let line = String::from_utf8(output.stdout).unwrap();
        let report: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        admitted += report["admitted"].as_u64().unwrap();
        assert_eq!(report["local_decisions"], 0, "{line}");
        assert_eq!(report["replicas"], 3, "{line}");
        lines.push(line);
    }
    let allowance = fleet::allowance(PER_MINUTE, WINDOW);
    assert!(
        off_by(admitted, allowance) <= 0.02,
        "admitted {admitted}, allowance {allowance}: {lines:#?}"
    );
    eprintln!("3 processes: admitted {admitted} of {allowance}: {lines:#?}");
}

fn report(what: &str, runs: &[Run]) {
    let mut all = Run::default();
    for run in runs {
        all.merge(run.clone());
    }
    eprintln!(
        "{what}: admitted {} of {}, decisions p50 {:?}, p99 {:?}",
        all.admitted,
        fleet::allowance(PER_MINUTE, WINDOW),
        all.quantile(0.5),
        all.quantile(0.99)
    );
}
