//! The axum gateway's `/metrics` (Prometheus) and `/healthz` (JSON) tell what its upstream
//! `ClientLayer` did, in numbers that match what the callers sent and what the provider saw.
//!
//! The gateway runs in-process on 127.0.0.1 (ephemeral ports) in front of a mock provider. The
//! Prometheus recorder is global to this test binary: each test names its provider
//! (`gen_ai.provider.name`) and reads only its own series, so the tests can run side by side.

#![allow(clippy::unwrap_used)]

use serde_json::Value;
use stormguard::budget::{DEFAULT_MIN_PER_SEC, DEFAULT_TTL};
use stormguard_examples::gateway::prometheus::{CONTENT_TYPE, sum};
use stormguard_examples::gateway::{HEALTHZ, METRICS, Route, Running};
use stormguard_examples::mock::{Fault, MockConfig, StatsSnapshot};

const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4}"#;

/// Retries the budget grants with no success deposited: its floor over its window.
const BUDGET_FLOOR: u64 = DEFAULT_MIN_PER_SEC as u64 * DEFAULT_TTL.as_secs();

/// Posts `BODY` to the gateway with a plain client (no retries of its own): the status.
async fn chat(client: &reqwest::Client, gateway: &Running) -> u16 {
    let response = client.post(&gateway.url).body(BODY).send().await.unwrap();
    response.status().as_u16()
}

/// `GET /metrics`: the text, after checking its content type.
async fn metrics(client: &reqwest::Client, gateway: &Running) -> String {
    let response = client
        .get(format!("http://{}{METRICS}", gateway.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], CONTENT_TYPE);
    response.text().await.unwrap()
}

/// `GET /healthz`, parsed.
async fn healthz(client: &reqwest::Client, gateway: &Running) -> Value {
    let response = client
        .get(format!("http://{}{HEALTHZ}", gateway.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "200 whatever the status");
    assert_eq!(response.headers()["content-type"], "application/json");
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

/// The fault test's provider: the name its series are labelled with.
const FAULTY: &str = "gateway-test-faults";
/// The label that selects the fault test's series.
const FAULTY_SERIES: (&str, &str) = ("gen_ai_provider_name", FAULTY);
/// How many requests the fault test sends, one after the other.
const FAULT_REQUESTS: u64 = 20;

/// The provider fails 5 attempts, then answers. 20 requests, one after the other, so every
/// number is known: request 1 gets 503, 529, 503 and gives up (3 attempts), request 2 gets 503,
/// 503, then 200; the other 18 succeed at once. The breaker (20 calls at 50%) does not open and
/// the throttle (under 10 requests in its window, or accepting most) drops nothing.
#[tokio::test]
async fn metrics_count_every_request_attempt_and_retry_during_a_fault() {
    let (text, health, seen) = recorded_during_a_fault().await;
    described_as_histograms(&text);
    requests_counted_by_outcome(&text, seen.attempts);
    attempts_timed_by_status(&text);
    retries_counted_by_reason(&text, &health);
    gauges_at_rest(&text);
    healthz_after_the_fault(&health);
}

/// Sends the fault test's requests through a gateway whose provider fails its first 5 attempts,
/// checking that the routes answer before any request and what the callers got: then the
/// `/metrics` text, `/healthz` and what the provider saw.
async fn recorded_during_a_fault() -> (String, Value, StatsSnapshot) {
    let config = MockConfig {
        first_faults: vec![
            Fault::Unavailable,
            Fault::Overloaded,
            Fault::Unavailable,
            Fault::Unavailable,
            Fault::Unavailable,
        ],
        ..MockConfig::healthy()
    };
    let gateway = Running::start(FAULTY, config, Route::Direct).await.unwrap();
    let client = reqwest::Client::new();

    // Before any request: the routes answer from memory, the provider sees nothing.
    let health = healthz(&client, &gateway).await;
    assert_eq!(health["status"], "ok");
    assert_eq!(health["budget"]["withdrawals"], 0);
    let _ = metrics(&client, &gateway).await;
    assert_eq!(gateway.provider_stats().attempts, 0);

    let mut statuses = Vec::new();
    for _ in 0..FAULT_REQUESTS {
        statuses.push(chat(&client, &gateway).await);
    }
    assert_eq!(statuses.iter().filter(|&&status| status == 200).count(), 19);
    assert_eq!(statuses[0], 503, "given up on after 3 attempts");

    let text = metrics(&client, &gateway).await;
    let health = healthz(&client, &gateway).await;
    let (seen, _) = gateway.stop().await;
    (text, health, seen)
}

/// Described, and histograms with the library's buckets (not summaries).
fn described_as_histograms(text: &str) {
    assert!(text.contains("# HELP stormguard_request_attempts "));
    assert!(text.contains("# TYPE stormguard_request_attempts histogram"));
    assert!(text.contains("# TYPE http_client_request_duration histogram"));
}

/// One observation per request, by outcome, and their attempts add up to `seen`, the attempts
/// that reached the provider: 3 + 3 + 18.
fn requests_counted_by_outcome(text: &str, seen: u64) {
    let attempts = "stormguard_request_attempts";
    let count = format!("{attempts}_count");
    assert_eq!(sum(text, &count, &[FAULTY_SERIES]), FAULT_REQUESTS as f64);
    assert_eq!(
        sum(text, &count, &[FAULTY_SERIES, ("outcome", "success")]),
        19.0
    );
    assert_eq!(
        sum(text, &count, &[FAULTY_SERIES, ("outcome", "failure")]),
        1.0
    );
    assert_eq!(seen, 24);
    assert_eq!(
        sum(text, &format!("{attempts}_sum"), &[FAULTY_SERIES]),
        24.0
    );
    let bucket = format!("{attempts}_bucket");
    assert_eq!(sum(text, &bucket, &[FAULTY_SERIES, ("le", "1")]), 18.0);
    assert_eq!(sum(text, &bucket, &[FAULTY_SERIES, ("le", "2")]), 18.0);
    assert_eq!(sum(text, &bucket, &[FAULTY_SERIES, ("le", "3")]), 20.0);
}

/// Every attempt timed, by the provider's status.
fn attempts_timed_by_status(text: &str) {
    let duration = "http_client_request_duration_count";
    let with_status = |status| {
        sum(
            text,
            duration,
            &[FAULTY_SERIES, ("http_response_status_code", status)],
        )
    };
    assert_eq!(sum(text, duration, &[FAULTY_SERIES]), 24.0);
    assert_eq!(with_status("200"), 19.0);
    assert_eq!(with_status("503"), 4.0);
    assert_eq!(with_status("529"), 1.0);
}

/// Four retries, by reason, each drawn from the budget `/healthz` reports; one give-up for want
/// of attempts.
fn retries_counted_by_reason(text: &str, health: &Value) {
    let for_reason = |reason| {
        sum(
            text,
            "stormguard_retries",
            &[FAULTY_SERIES, ("reason", reason)],
        )
    };
    let retries = sum(text, "stormguard_retries", &[FAULTY_SERIES]);
    assert_eq!(retries, 4.0);
    assert_eq!(for_reason("unavailable"), 3.0);
    assert_eq!(for_reason("overloaded"), 1.0);
    assert_eq!(health["budget"]["withdrawals"].as_f64(), Some(retries));
    assert!(retries <= BUDGET_FLOOR as f64);
    assert_eq!(
        sum(
            text,
            "stormguard_refusals",
            &[FAULTY_SERIES, ("cause", "attempts")]
        ),
        1.0
    );
    assert_eq!(sum(text, "stormguard_refusals", &[FAULTY_SERIES]), 1.0);
}

/// The gauges as of the last attempt: nothing dropped, the breaker closed.
fn gauges_at_rest(text: &str) {
    assert_eq!(
        sum(
            text,
            "stormguard_throttle_drop_probability",
            &[FAULTY_SERIES]
        ),
        0.0
    );
    assert!(text.contains(&format!(
        "stormguard_breaker_state{{gen_ai_provider_name=\"{FAULTY}\"}} 0"
    )));
}

/// `/healthz`: the same budget, the provider's throttle and breaker, no rate limit, no fleet.
fn healthz_after_the_fault(health: &Value) {
    assert_eq!(health["status"], "ok");
    assert_eq!(health["budget"]["rejected"], 0);
    assert_eq!(health["budget"]["deposits"], 19);
    assert_eq!(health["fleet"], Value::Null);
    let providers = health["providers"].as_array().unwrap();
    assert_eq!(providers.len(), 1);
    let mock = &providers[0];
    assert_eq!(mock["name"], FAULTY);
    assert_eq!(mock["throttle"]["requests"], 24);
    assert_eq!(mock["throttle"]["accepts"], 19);
    assert_eq!(mock["throttle"]["probability"], 0.0);
    assert_eq!(mock["breaker"]["state"], "closed");
    assert_eq!(mock["breaker"]["calls"], 24);
    assert_eq!(mock["breaker"]["failures"], 5);
    assert_eq!(mock["rate_limit"], Value::Null);
}

/// A provider in a total outage: 60 requests at once. The breaker opens, the throttle and the
/// budget refuse the rest, and `/healthz` says `degraded`; the retries that reached the dead
/// provider stay within the budget's floor.
#[tokio::test]
async fn healthz_is_degraded_and_retries_stay_within_the_budget_in_an_outage() {
    const REQUESTS: usize = 60;
    const P: &str = "gateway-test-outage";
    let gateway = Running::start(P, MockConfig::outage(Fault::Unavailable), Route::Direct)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let provider = [("gen_ai_provider_name", P)];

    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS {
        let (client, url) = (client.clone(), gateway.url.clone());
        calls.spawn(async move { client.post(url).body(BODY).send().await.unwrap().status() });
    }
    while let Some(status) = calls.join_next().await {
        assert!(status.unwrap().is_server_error());
    }

    let text = metrics(&client, &gateway).await;
    let health = healthz(&client, &gateway).await;
    let (seen, _) = gateway.stop().await;

    // Every request observed once: failed at the provider, or refused before any attempt.
    let count = "stormguard_request_attempts_count";
    assert_eq!(sum(&text, count, &provider), REQUESTS as f64);
    let failed = sum(&text, count, &[provider[0], ("outcome", "failure")]);
    let refused = sum(&text, count, &[provider[0], ("outcome", "refused")]);
    assert_eq!(failed + refused, REQUESTS as f64);
    assert_eq!(
        sum(&text, "stormguard_request_attempts_sum", &provider),
        seen.attempts as f64
    );

    // The retries counted are those the provider saw as retries, and the budget paid for them
    // (a retry the breaker or the throttle refused is counted as a refusal, below, not here).
    let retries = sum(&text, "stormguard_retries", &provider);
    let retried = seen.attempts - seen.by_attempt_header.get(&0).copied().unwrap_or(0);
    assert_eq!(retries, retried as f64);
    let withdrawals = health["budget"]["withdrawals"].as_u64().unwrap();
    assert!(
        retried <= withdrawals,
        "{retried} retries sent, {withdrawals} granted"
    );
    assert!(
        withdrawals <= BUDGET_FLOOR,
        "no success deposited: the floor only"
    );
    let local = ["budget", "breaker", "throttle"].map(|cause| {
        sum(
            &text,
            "stormguard_refusals",
            &[provider[0], ("cause", cause)],
        )
    });
    assert!(
        local.iter().sum::<f64>() > 0.0,
        "refused on this side: {local:?}"
    );

    // /healthz: degraded, the breaker not closed, the budget drawn to its floor.
    assert_eq!(health["status"], "degraded");
    let breaker = &health["providers"][0]["breaker"];
    assert_ne!(breaker["state"], "closed");
    assert!(breaker["opened"].as_u64().unwrap() >= 1);
    assert!(breaker["failures"].as_u64().unwrap() >= 20);
    assert_eq!(health["budget"]["deposits"], 0);
}

/// Behind a failover, `/healthz` lists each backend's guards: the dead primary's breaker is open
/// (three failures in a row), the backup's closed; `/metrics` labels each backend's series with
/// its name and counts the moves between them. Requests go one after the other; if they take
/// longer than the primary's open wait (1 s, on a loaded machine), a probe request tries the
/// primary again and moves too, so the primary's counts are asserted as they relate, not fixed.
#[tokio::test]
async fn healthz_lists_each_backend_of_a_failover() {
    const REQUESTS: usize = 30;
    let gateway = Running::start(
        "unused",
        MockConfig::outage(Fault::Unavailable),
        Route::Failover(MockConfig::healthy()),
    )
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for _ in 0..REQUESTS {
        assert_eq!(chat(&client, &gateway).await, 200, "the backup answers");
    }
    let text = metrics(&client, &gateway).await;
    let health = healthz(&client, &gateway).await;
    let (primary, backup) = gateway.stop().await;

    assert_eq!(health["status"], "degraded", "the primary is refused");
    let providers = health["providers"].as_array().unwrap();
    let names: Vec<_> = providers
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["openai", "backup"]);
    assert_ne!(providers[0]["breaker"]["state"], "closed");
    let cause = providers[0]["breaker"]["cause"].as_str().unwrap();
    assert!(
        ["consecutive_failures", "probe_failed"].contains(&cause),
        "{cause}"
    );
    assert_eq!(providers[1]["breaker"]["state"], "closed");
    assert_eq!(providers[1]["breaker"]["failures"], 0);

    // Every request answered by the backup at its first attempt.
    assert_eq!(backup.unwrap().attempts, REQUESTS as u64);
    let answered = [("gen_ai_provider_name", "backup"), ("outcome", "success")];
    let count = "stormguard_request_attempts_count";
    assert_eq!(sum(&text, count, &answered), REQUESTS as f64);
    assert_eq!(
        sum(&text, "stormguard_request_attempts_sum", &answered),
        REQUESTS as f64
    );
    // The first request failed 3 times at the primary, which opened its breaker; the others went
    // straight to the backup (skipping an open backend is not a move), but for probes. Each
    // request that tried the primary moved to the backup, and its attempts are the primary's.
    let tried = sum(&text, count, &[("gen_ai_provider_name", "openai")]);
    assert!(tried >= 1.0 && tried < REQUESTS as f64, "{tried}");
    let moved = sum(
        &text,
        "stormguard_failovers",
        &[("from", "openai"), ("to", "backup")],
    );
    assert_eq!(moved, tried);
    assert!(primary.attempts >= 3);
    assert_eq!(
        sum(
            &text,
            "stormguard_request_attempts_sum",
            &[("gen_ai_provider_name", "openai")]
        ),
        primary.attempts as f64
    );
    assert!(text.contains("stormguard_breaker_state{gen_ai_provider_name=\"openai\"} "));
}
