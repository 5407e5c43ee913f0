//! A rate limit shared by a fleet through a real Redis: three limiters in three tasks, and three
//! processes of `fleet_admit`, sharing one key admit the quota once between them (within 2%).
//!
//! Real time (the fleet's clock is the Redis server's): each run takes 4 s. The Redis is the one
//! at `REDIS_URL`, else a `redis-server` of the test's own (see `support`).

#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use stormguard::ClientLayer;
use stormguard::classify::{Outcome, Permit, Reason};
use stormguard::rate_limit::{Fleet, RateLimit, RateLimitConfig, Reservation};
use stormguard::reqwest::StormguardMiddleware;
use stormguard_examples::fleet::{self, Run};
use stormguard_examples::mock::{self, MockConfig};
use support::{Redis, off_by, unique};
use tokio::time::Instant;

/// 100 requests a second.
const PER_MINUTE: u32 = 6_000;
const WINDOW: Duration = Duration::from_secs(4);
/// Long enough for a loaded test machine: these tests are about sharing, not about Redis being
/// slow (the outage test is).
const TIMEOUT: Duration = Duration::from_millis(250);

const CHAT: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;

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

/// A replica of a fleet with a limit of `per_minute` requests or tokens (`tokens: true`, weights
/// corrected to the usage answers report), learning from the provider.
fn replica(redis: &Redis, prefix: &str, per_minute: u32, tokens: bool) -> RateLimit {
    let fleet = Fleet::new(&redis.url)
        .unwrap()
        .with_prefix(prefix)
        .with_timeout(TIMEOUT);
    let config = if tokens {
        RateLimitConfig::default()
            .with_tokens_per_minute(Some(per_minute))
            .with_usage_correction()
    } else {
        RateLimitConfig::default().with_requests_per_minute(Some(per_minute))
    };
    RateLimit::new(config.with_fleet(fleet))
}

/// How long after now a slot starts.
fn wait(reservation: &Reservation) -> Duration {
    reservation
        .start()
        .saturating_duration_since(Instant::now())
}

/// Lets what a replica writes in the background reach Redis.
async fn settle_down() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn a_slot_given_back_in_one_replica_goes_to_the_next_request_in_another() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("given-back");
    // One a second, a bucket of one.
    let (a, b) = (
        replica(&redis, &prefix, 60, false),
        replica(&redis, &prefix, 60, false),
    );
    let head = http::Request::new(()).into_parts().0;
    let first = a.acquire(&head, 0, None).await.unwrap();
    assert!(wait(&first) < Duration::from_millis(100));
    let _sent = first.send();
    let second = a.acquire(&head, 0, None).await.unwrap();
    assert!(wait(&second) > Duration::from_millis(800), "{second:?}");
    // Never sent: its slot, a second from now, goes back.
    drop(second);
    settle_down().await;
    let third = b.acquire(&head, 0, None).await.unwrap();
    let waited = wait(&third);
    assert!(
        waited < Duration::from_secs(1),
        "{waited:?}: the slot was given back"
    );
    assert!(
        waited > Duration::from_millis(500),
        "{waited:?}: the first still holds its own"
    );
}

#[tokio::test]
async fn a_retry_after_met_by_one_replica_holds_every_replica() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("retry-after");
    let (a, b) = (
        replica(&redis, &prefix, 6_000, false),
        replica(&redis, &prefix, 6_000, false),
    );
    let head = http::Request::new(()).into_parts().0;
    let permit = a.acquire(&head, 0, None).await.unwrap().send();
    let throttled = Outcome::retryable(Reason::RateLimited)
        .with_accepted(false)
        .with_retry_after(Some(Duration::from_secs(3)));
    permit.record(&throttled, &HeaderMap::new());
    settle_down().await;
    // B never met the 429, yet waits it out: 3 s is longer than the 2 s it may wait.
    let refused = b.acquire(&head, 0, None).await.unwrap_err();
    let retry_after = refused.retry_after();
    assert!(
        retry_after > Duration::from_millis(2_500) && retry_after <= Duration::from_secs(3),
        "{retry_after:?}"
    );
}

#[tokio::test]
async fn tokens_a_request_did_not_use_go_back_to_the_fleet() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("usage");
    // 100 tokens a second, a bucket of 100.
    let (a, b) = (
        replica(&redis, &prefix, 6_000, true),
        replica(&redis, &prefix, 6_000, true),
    );
    let head = http::Request::new(()).into_parts().0;
    let permit = a.acquire(&head, 100, None).await.unwrap().send();
    // It used 20 of its 100: 80 go back, and B's 80 go at once instead of in 0.8 s.
    permit.usage().unwrap().settle(20);
    settle_down().await;
    let next = b.acquire(&head, 80, None).await.unwrap();
    assert!(wait(&next) < Duration::from_millis(300), "{next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_pace_their_calls_at_the_fleets_quota() {
    let Some(redis) = Redis::find() else { return };
    let provider = mock::spawn(MockConfig::healthy()).await.unwrap();
    let prefix = unique("engine");
    // Two replicas' reqwest clients, each with the engine and a limit of 2 a second (a bucket
    // of 2) shared through Redis.
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let layer =
                ClientLayer::default().with_rate_limit(replica(&redis, &prefix, 120, false));
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(StormguardMiddleware::new(layer))
                .build()
        })
        .collect();
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for client in clients.iter().chain(&clients) {
        let (client, url) = (client.clone(), provider.url());
        calls.spawn(async move {
            let response = client.post(url).body(CHAT).send().await.unwrap();
            assert_eq!(response.status(), 200);
            started.elapsed()
        });
    }
    let mut done = Vec::new();
    while let Some(elapsed) = calls.join_next().await {
        done.push(elapsed.unwrap());
    }
    done.sort_unstable();
    let stats = provider.stats.snapshot();
    provider.shutdown().await;
    assert_eq!(stats.attempts, 4);
    // Two at once, then one every 500 ms, whichever client asked.
    assert!(done[1] < Duration::from_millis(400), "{done:?}");
    assert!(done[2] >= Duration::from_millis(450), "{done:?}");
    assert!(done[3] >= Duration::from_millis(950), "{done:?}");
    assert!(done[3] < Duration::from_millis(1_800), "{done:?}");
}
