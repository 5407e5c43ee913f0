//! The mock LLM server answers like a provider, fails as configured and counts what it sees.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_examples::mock::{self, Fault, MockConfig};

const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"one two three"}],"max_tokens":12}"#;

#[tokio::test]
async fn healthy_mock_answers_a_chat_completion_and_counts_headers() {
    let server = mock::spawn(MockConfig::healthy()).await.unwrap();
    let client = reqwest::Client::new();
    for attempt in ["0", "1"] {
        let response = client
            .post(server.url())
            .header("x-retry-attempt", attempt)
            .header("idempotency-key", "key-1")
            .body(BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "mock-1");
        assert_eq!(body["usage"]["prompt_tokens"], 3);
        assert_eq!(body["usage"]["completion_tokens"], 12);
    }
    let stats = server.stats.snapshot();
    server.shutdown().await;
    assert_eq!(stats.attempts, 2);
    assert_eq!(stats.status(200), 2);
    assert_eq!(stats.by_attempt_header.get(&0), Some(&1));
    assert_eq!(stats.by_attempt_header.get(&1), Some(&1));
    assert_eq!(stats.idempotency_keys, ["key-1", "key-1"]);
    assert_eq!(stats.distinct_idempotency_keys(), 1);
}

#[tokio::test]
async fn faults_have_the_providers_statuses_bodies_and_hints() {
    let client = reqwest::Client::new();

    let limited = mock::spawn(MockConfig::outage(Fault::RateLimited {
        retry_after: Duration::from_millis(1_500),
    }))
    .await
    .unwrap();
    let response = client.post(limited.url()).body(BODY).send().await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after-ms"], "1500");
    assert_eq!(response.headers()["retry-after"], "2");
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("rate_limit_exceeded")
    );
    limited.shutdown().await;

    let quota = mock::spawn(MockConfig::outage(Fault::QuotaExhausted))
        .await
        .unwrap();
    let response = client.post(quota.url()).body(BODY).send().await.unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().get("retry-after").is_none());
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("insufficient_quota")
    );
    quota.shutdown().await;

    let overloaded = mock::spawn(MockConfig::outage(Fault::Overloaded))
        .await
        .unwrap();
    let response = client
        .post(overloaded.url())
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 529);
    assert!(response.text().await.unwrap().contains("overloaded_error"));
    overloaded.shutdown().await;
}

#[tokio::test]
async fn error_rate_fails_about_that_share_of_requests() {
    let server = mock::spawn(MockConfig {
        error_rate: 0.25,
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for _ in 0..200 {
        client.post(server.url()).body(BODY).send().await.unwrap();
    }
    let stats = server.stats.snapshot();
    server.shutdown().await;
    let failures = stats.attempts - stats.successes();
    assert_eq!(stats.attempts, 200);
    // Seeded draws: 25% of 200 is 50, give or take sampling noise.
    assert!((30..=70).contains(&failures), "{failures} failures");
    assert_eq!(
        stats.status(429) + stats.status(503) + stats.status(529),
        failures
    );
}

#[tokio::test]
async fn above_capacity_the_mock_sheds_with_503_or_529() {
    let server = mock::spawn(MockConfig {
        capacity: 2,
        base_latency: Duration::from_millis(100),
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = client.clone();
        let url = server.url();
        calls.spawn(async move { client.post(url).body(BODY).send().await.unwrap().status() });
    }
    while calls.join_next().await.is_some() {}
    let stats = server.stats.snapshot();
    server.shutdown().await;

    assert_eq!(stats.attempts, 8);
    assert!(stats.peak_in_flight > 2, "{stats:?}");
    let shed = stats.status(503) + stats.status(529);
    assert!(shed >= 1, "{stats:?}");
    assert_eq!(stats.successes() + shed, 8);
}

#[tokio::test]
async fn malformed_request_gets_400_invalid_request_error() {
    let server = mock::spawn(MockConfig::healthy()).await.unwrap();
    let response = reqwest::Client::new()
        .post(server.url())
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("invalid_request_error")
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_messages_api_answers_and_fails_in_anthropics_shapes() {
    let body = r#"{"model":"claude-mock","max_tokens":12,"messages":[{"role":"user","content":"one two three"}]}"#;
    let client = reqwest::Client::new();
    let healthy = mock::spawn(MockConfig::healthy()).await.unwrap();
    let response = client
        .post(healthy.messages_url())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let message: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(
        (message["type"].as_str(), message["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(message["content"][0]["type"], "text");
    assert_eq!(message["usage"]["input_tokens"], 3);
    assert_eq!(message["usage"]["output_tokens"], 12);
    let response = client
        .post(healthy.messages_url())
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    healthy.shutdown().await;

    // A fault's status is the same on either API; its body is the API's, its name in a header.
    let limited = mock::spawn(MockConfig::outage(Fault::RateLimited {
        retry_after: Duration::from_millis(1_500),
    }))
    .await
    .unwrap();
    let response = client
        .post(limited.messages_url())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after-ms"], "1500");
    assert_eq!(response.headers()[mock::MOCK_FAULT], "rate_limited");
    let error: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    limited.shutdown().await;
}
