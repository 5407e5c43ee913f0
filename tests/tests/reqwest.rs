//! `StormguardMiddleware` in a real reqwest-middleware client, against a scripted axum backend on
//! loopback.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::budget::RetryBudget;
use stormguard::reqwest::StormguardMiddleware;
use stormguard_test_kit::ScriptedBody;
use stormguard_tests::{
    CHAT_REQUEST, DeadUpstream, INSUFFICIENT_QUOTA, RATE_LIMITED, Reply, ScriptedBackend,
    assert_dead_upstream_within_floor, assert_final, assert_one_key_per_post_and_none_for_get,
    assert_outage_within_floor, assert_retried_after_the_ms_hint,
    assert_three_attempts_with_one_idempotency_key, fast_client_layer, outage_budget,
    sent_timeouts_ms, unthrottled_client_layer,
};

const PATH: &str = "/v1/chat/completions";

/// The middleware with the fast test backoff and its own budget.
fn middleware(budget: RetryBudget) -> StormguardMiddleware {
    StormguardMiddleware::new(fast_client_layer(budget))
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
    assert_three_attempts_with_one_idempotency_key(&seen);
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

    assert_one_key_per_post_and_none_for_get(&backend.seen());
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let backend = ScriptedBackend::spawn([Reply::status(400), Reply::status(200)]).await;
    let client = client(middleware(RetryBudget::default()));

    let response = post(&client, &backend).await;

    assert_final(
        response.status(),
        response.headers(),
        StatusCode::BAD_REQUEST,
    );
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

    assert_final(
        response.status(),
        response.headers(),
        StatusCode::TOO_MANY_REQUESTS,
    );
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
    assert_retried_after_the_ms_hint(&backend.seen());
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

    assert_final(
        response.status(),
        response.headers(),
        StatusCode::SERVICE_UNAVAILABLE,
    );
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn the_deadline_is_sent_and_shrinks_on_each_retry() {
    // Each failure takes 5 ms, so each retry has measurably less time left.
    let slow_503 = Reply::status(503).delay(Duration::from_millis(5));
    let backend = ScriptedBackend::spawn([slow_503.clone(), slow_503, Reply::status(200)]).await;
    let layer = fast_client_layer(RetryBudget::default()).with_timeout(Duration::from_secs(2));
    let client = client(StormguardMiddleware::new(layer));

    assert_eq!(post(&client, &backend).await.status(), StatusCode::OK);

    let sent = sent_timeouts_ms(&backend);
    assert!(sent[0] <= 2000 && sent[0] >= 1500, "{sent:?}");
    assert!(sent[1] < sent[0] && sent[2] < sent[1], "{sent:?}");
}

#[tokio::test]
async fn total_outage_is_amplified_no_more_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let budget = outage_budget();
    let backend = ScriptedBackend::spawn([Reply::status(503)]).await;
    let client = client(StormguardMiddleware::new(unthrottled_client_layer(
        budget.clone(),
    )));

    for _ in 0..REQUESTS {
        let response = post(&client, &backend).await;
        assert_final(
            response.status(),
            response.headers(),
            StatusCode::SERVICE_UNAVAILABLE,
        );
    }

    assert_outage_within_floor("reqwest-middleware", REQUESTS, backend.hits(), floor);
    assert_eq!(budget.snapshot().withdrawals, 10);
}

#[tokio::test]
async fn a_dead_upstream_gets_no_more_retries_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let budget = outage_budget();
    let upstream = DeadUpstream::spawn().await;
    let client = client(StormguardMiddleware::new(unthrottled_client_layer(
        budget.clone(),
    )));

    for _ in 0..REQUESTS {
        let error = client
            .post(upstream.url(PATH))
            .body(CHAT_REQUEST)
            .send()
            .await
            .unwrap_err();
        // What the engine gave up on comes back as stormguard's error, with reqwest's own error
        // as its source.
        let error = stormguard_error(error);
        assert!(error.gave_up().is_some(), "{error}");
        let source = error
            .downcast_source::<reqwest_middleware::Error>()
            .unwrap();
        assert!(
            matches!(source, reqwest_middleware::Error::Reqwest(_)),
            "{source:?}"
        );
    }

    assert_dead_upstream_within_floor(
        "reqwest-middleware",
        REQUESTS,
        upstream.connections(),
        floor,
    );
    assert_eq!(budget.snapshot().withdrawals, 10);
}

#[tokio::test]
async fn a_failure_the_engine_cannot_retry_comes_back_unchanged() {
    let upstream = DeadUpstream::spawn().await;
    let layer = fast_client_layer(RetryBudget::default()).with_max_attempts(1);
    let client = client(StormguardMiddleware::new(layer));

    let error = client
        .post(upstream.url(PATH))
        .body(CHAT_REQUEST)
        .send()
        .await
        .unwrap_err();

    // One attempt allowed: the decision stays with the caller, who gets reqwest's own error.
    assert!(
        matches!(error, reqwest_middleware::Error::Reqwest(_)),
        "{error:?}"
    );
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn a_streamed_body_that_fits_the_replay_cap_is_replayed() {
    let backend = ScriptedBackend::spawn([Reply::status(503), Reply::status(200)]).await;
    let client = client(middleware(RetryBudget::default()));
    // A request body of unknown length, in two frames.
    let frames = ScriptedBody::chunks([&CHAT_REQUEST[..20], &CHAT_REQUEST[20..]]);

    let response = client
        .post(backend.url(PATH))
        .body(reqwest::Body::wrap(frames))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.body == CHAT_REQUEST.as_bytes()));
}

/// The `reqwest_middleware::Error::Middleware` that holds a `stormguard::Error`.
fn stormguard_error(error: reqwest_middleware::Error) -> stormguard::Error {
    match error {
        reqwest_middleware::Error::Middleware(error) => error.downcast().unwrap(),
        other => panic!("expected stormguard's error, got {other:?}"),
    }
}
