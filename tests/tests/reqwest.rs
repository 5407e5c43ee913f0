//! `StormguardMiddleware` in a real reqwest-middleware client, against a scripted axum backend on
//! loopback.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::budget::RetryBudget;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::throttle::AdaptiveThrottle;
use stormguard_reqwest::StormguardMiddleware;
use stormguard_tests::{
    CHAT_REQUEST, DeadUpstream, INSUFFICIENT_QUOTA, RATE_LIMITED, Reply, ScriptedBackend,
    amplification, fast_backoff,
};

const PATH: &str = "/v1/chat/completions";

/// `StormguardMiddleware::default()` with the fast test backoff and its own budget.
fn middleware(budget: RetryBudget) -> StormguardMiddleware {
    StormguardMiddleware::default()
        .budget(budget)
        .backoff(fast_backoff())
}

fn client(middleware: StormguardMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

async fn post(client: &ClientWithMiddleware, backend: &ScriptedBackend) -> reqwest::Response {
    client
        .post(backend.url(PATH))
        .header("content-type", "application/json")
        .body(CHAT_REQUEST)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn two_503s_then_200_succeeds_with_attempt_headers_and_one_idempotency_key() {
    let backend =
        ScriptedBackend::spawn([Reply::status(503), Reply::status(503), Reply::status(200)]).await;
    let budget = RetryBudget::default();
    let client = client(middleware(budget.clone()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::OK);
    let seen = backend.seen();
    assert_eq!(seen.len(), 3);
    let attempts: Vec<_> = seen.iter().map(|s| s.retry_attempt()).collect();
    assert_eq!(attempts, [Some(0), Some(1), Some(2)]);
    let keys: HashSet<_> = seen.iter().map(|s| s.idempotency_key()).collect();
    assert_eq!(
        keys.len(),
        1,
        "one Idempotency-Key for all attempts: {keys:?}"
    );
    assert!(keys.iter().all(|key| key.is_some_and(|k| k.len() == 36)));
    assert!(seen.iter().all(|s| s.body == CHAT_REQUEST.as_bytes()));
    let snapshot = budget.snapshot();
    assert_eq!((snapshot.withdrawals, snapshot.deposits), (2, 1));
}

#[tokio::test]
async fn each_logical_post_gets_its_own_idempotency_key_and_get_gets_none() {
    let backend = ScriptedBackend::spawn([
        Reply::status(503),
        Reply::status(200),
        Reply::status(503),
        Reply::status(200),
        Reply::status(503),
        Reply::status(200),
    ])
    .await;
    let client = client(middleware(RetryBudget::default()));

    for _ in 0..2 {
        assert_eq!(post(&client, &backend).await.status(), StatusCode::OK);
    }
    let response = client.get(backend.url("/v1/models")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let seen = backend.seen();
    assert_eq!(seen.len(), 6);
    let keys: Vec<_> = seen.iter().map(|s| s.idempotency_key()).collect();
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[2], keys[3]);
    assert_ne!(keys[0], keys[2]);
    assert!(keys[..4].iter().all(Option::is_some));
    assert_eq!(keys[4..], [None, None], "GET is idempotent: no key");
    assert_eq!(seen[5].retry_attempt(), Some(1));
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let backend = ScriptedBackend::spawn([Reply::status(400), Reply::status(200)]).await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn insufficient_quota_429_is_not_retried_and_its_body_reaches_the_caller() {
    let backend = ScriptedBackend::spawn([
        Reply::status(429).json(INSUFFICIENT_QUOTA),
        Reply::status(200),
    ])
    .await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(response.text().await.unwrap(), INSUFFICIENT_QUOTA);
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn a_server_that_says_do_not_retry_is_not_retried() {
    let backend = ScriptedBackend::spawn([
        Reply::status(503).header("x-should-retry", "false"),
        Reply::status(200),
    ])
    .await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn rate_limit_429_waits_for_retry_after_ms() {
    let backend = ScriptedBackend::spawn([
        Reply::status(429)
            .json(RATE_LIMITED)
            .header("retry-after-ms", "50")
            .header("retry-after", "30"),
        Reply::status(200),
    ])
    .await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::OK);
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(50), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(30), "retried after {gap:?}");
}

#[tokio::test]
async fn retry_after_beyond_the_hint_cap_is_not_waited_for() {
    let backend = ScriptedBackend::spawn([
        Reply::status(503).header("retry-after", "120"),
        Reply::status(200),
    ])
    .await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn the_deadline_is_sent_and_shrinks_on_each_retry() {
    // Each failure takes 5 ms, so each retry has measurably less time left.
    let slow_503 = Reply::status(503).delay(Duration::from_millis(5));
    let backend = ScriptedBackend::spawn([slow_503.clone(), slow_503, Reply::status(200)]).await;
    let client = client(middleware(RetryBudget::default()).timeout(Duration::from_secs(2)));

    assert_eq!(post(&client, &backend).await.status(), StatusCode::OK);

    let sent: Vec<u64> = backend
        .seen()
        .iter()
        .map(|s| s.timeout_ms().unwrap())
        .collect();
    assert!(sent[0] <= 2000 && sent[0] >= 1500, "{sent:?}");
    assert!(sent[1] < sent[0] && sent[2] < sent[1], "{sent:?}");
}

#[tokio::test]
async fn total_outage_is_amplified_no_more_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.1);
    let backend = ScriptedBackend::spawn([Reply::status(503)]).await;
    let client = client(
        middleware(budget.clone()).throttle(AdaptiveThrottle::default().with_max_probability(0.0)),
    );

    for _ in 0..REQUESTS {
        let response = post(&client, &backend).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    }

    let attempts = backend.hits();
    eprintln!(
        "reqwest-middleware outage: {REQUESTS} requests -> {attempts} backend attempts, amplification {:.2}x (naive 3 attempts: 3.00x)",
        amplification(attempts, REQUESTS)
    );
    assert!(attempts >= REQUESTS);
    assert!(
        attempts <= REQUESTS + floor,
        "{attempts} attempts for {REQUESTS} requests"
    );
    assert_eq!(budget.snapshot().withdrawals, 10);
}

#[tokio::test]
async fn a_dead_upstream_gets_no_more_retries_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.1);
    let upstream = DeadUpstream::spawn().await;
    let client = client(
        middleware(budget.clone()).throttle(AdaptiveThrottle::default().with_max_probability(0.0)),
    );

    for _ in 0..REQUESTS {
        let error = client
            .post(upstream.url(PATH))
            .body(CHAT_REQUEST)
            .send()
            .await
            .unwrap_err();
        // The error comes back as reqwest's own, not wrapped.
        assert!(
            matches!(error, reqwest_middleware::Error::Reqwest(_)),
            "{error:?}"
        );
    }

    let connections = upstream.connections();
    eprintln!(
        "reqwest-middleware dead upstream, budget only: {REQUESTS} requests -> {connections} connections, amplification {:.2}x",
        amplification(connections, REQUESTS)
    );
    assert!((REQUESTS..=REQUESTS + floor).contains(&connections));
    assert_eq!(budget.snapshot().withdrawals, 10);
}
