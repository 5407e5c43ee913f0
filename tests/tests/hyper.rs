//! `ClientLayer` around a real hyper-util client, against a scripted axum backend on loopback.

#![allow(clippy::unwrap_used)]

use std::fmt::Debug;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use stormguard::budget::RetryBudget;
use stormguard::classify::Reason;
use stormguard::deadline::LlmDeadline;
use stormguard::throttle::AdaptiveThrottle;
use stormguard::{ClientLayer, error_response};
use stormguard_tests::{
    DeadUpstream, INSUFFICIENT_QUOTA, RATE_LIMITED, Reply, ScriptedBackend, amplification,
    assert_dead_upstream_within_floor, assert_final, assert_one_key_per_post_and_none_for_get,
    assert_outage_within_floor, assert_retried_after_the_ms_hint,
    assert_three_attempts_with_one_idempotency_key, body_text, chat_post, fast_backoff,
    guarded_hyper, hyper_client, outage_budget, sent_timeouts_ms, unthrottled_client_layer,
};
use tower::{Layer, Service, ServiceExt};

const PATH: &str = "/v1/chat/completions";

/// Sends a [`chat_post`] to `url` through a clone of `client`.
async fn post<S>(client: &S, url: &str) -> Result<S::Response, S::Error>
where
    S: Service<http::Request<Full<Bytes>>> + Clone,
{
    client.clone().oneshot(chat_post(url)).await
}

/// Sends a [`chat_post`] to `backend` through `client`, and expects an answer.
async fn post_ok<S>(client: &S, backend: &ScriptedBackend) -> S::Response
where
    S: Service<http::Request<Full<Bytes>>> + Clone,
    S::Error: Debug,
{
    post(client, &backend.url(PATH)).await.unwrap()
}

/// Sends a [`chat_post`] to `upstream` through `client`, and expects an error.
async fn post_err<S>(client: &S, upstream: &DeadUpstream) -> S::Error
where
    S: Service<http::Request<Full<Bytes>>> + Clone,
    S::Response: Debug,
{
    post(client, &upstream.url(PATH)).await.unwrap_err()
}

#[tokio::test]
async fn two_503s_then_200_succeeds_with_attempt_headers_and_one_idempotency_key() {
    let backend =
        ScriptedBackend::spawn([Reply::status(503), Reply::status(503), Reply::status(200)]).await;
    let budget = RetryBudget::default();
    let client = guarded_hyper(budget.clone());

    let response = post_ok(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::OK);
    let seen = backend.seen();
    assert_three_attempts_with_one_idempotency_key(&seen);
    // The body was replayed byte for byte.
    assert!(
        seen.iter()
            .all(|s| s.body == seen[0].body && !s.body.is_empty())
    );
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
    let client = guarded_hyper(RetryBudget::default());

    for _ in 0..2 {
        assert_eq!(post_ok(&client, &backend).await.status(), StatusCode::OK);
    }
    let get = http::Request::get(backend.url("/v1/models"))
        .body(http_body_util::Full::default())
        .unwrap();
    assert_eq!(client.oneshot(get).await.unwrap().status(), StatusCode::OK);

    assert_one_key_per_post_and_none_for_get(&backend.seen());
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let backend = ScriptedBackend::spawn([Reply::status(400), Reply::status(200)]).await;
    let client = guarded_hyper(RetryBudget::default());

    let response = post_ok(&client, &backend).await;

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
    let client = guarded_hyper(RetryBudget::default());

    let response = post_ok(&client, &backend).await;

    assert_final(
        response.status(),
        response.headers(),
        StatusCode::TOO_MANY_REQUESTS,
    );
    assert_eq!(body_text(response).await, INSUFFICIENT_QUOTA);
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
    let client = guarded_hyper(RetryBudget::default());

    let response = post_ok(&client, &backend).await;

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
    let client = guarded_hyper(RetryBudget::default());

    let response = post_ok(&client, &backend).await;

    // 120 s is above the default 60 s maximum: give up now, tell the caller not to retry.
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
    let client = ClientLayer::default()
        .with_backoff(fast_backoff())
        .with_timeout(Duration::from_secs(2))
        .layer(hyper_client());

    let response = post_ok(&client, &backend).await;

    assert_eq!(response.status(), StatusCode::OK);
    let sent = sent_timeouts_ms(&backend);
    // 2000 ms minus the 50 ms margin, then re-stamped before each retry.
    assert!((1500..=1950).contains(&sent[0]), "{sent:?}");
    assert!(sent[1] < sent[0] && sent[2] < sent[1], "{sent:?}");
}

#[tokio::test]
async fn an_llm_deadline_grows_with_max_tokens_on_the_wire() {
    let backend = ScriptedBackend::spawn([Reply::status(200)]).await;
    let client = ClientLayer::default()
        .with_backoff(fast_backoff())
        .with_llm_deadline(LlmDeadline::default())
        .layer(hyper_client());

    for max_tokens in [50, 4000] {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens}}}"#
        );
        let request = http::Request::post(backend.url(PATH))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let response = client.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    let sent = sent_timeouts_ms(&backend);
    // Base 10 s + 28 ms per output token: ~11.4 s for 50 tokens, ~122 s for 4000.
    assert!((10_000..12_000).contains(&sent[0]), "{sent:?}");
    assert!((110_000..125_000).contains(&sent[1]), "{sent:?}");
    // The body the estimate read was still sent whole.
    assert!(backend.seen()[1].body.ends_with(b"\"max_tokens\":4000}"));
}

#[tokio::test]
async fn total_outage_is_amplified_no_more_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    // 10 s window, 1 retry/s floor = 10 free retries, 10% of successes (there are none).
    let floor = 10;
    let budget = outage_budget();
    let backend = ScriptedBackend::spawn([Reply::status(503)]).await;
    // Throttle off: the budget alone has to hold the line.
    let client = unthrottled_client_layer(budget.clone()).layer(hyper_client());

    for _ in 0..REQUESTS {
        let response = post_ok(&client, &backend).await;
        assert_final(
            response.status(),
            response.headers(),
            StatusCode::SERVICE_UNAVAILABLE,
        );
    }

    assert_outage_within_floor("hyper-util", REQUESTS, backend.hits(), floor);
    let snapshot = budget.snapshot();
    assert_eq!(snapshot.withdrawals, 10);
    assert!(snapshot.rejected >= 80, "{snapshot:?}");
}

#[tokio::test]
async fn a_dead_upstream_gets_retries_within_the_budget_then_throttled_locally() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let upstream = DeadUpstream::spawn().await;

    // Budget alone (throttle off): every request is given up on, at most `floor` retries.
    let budget = outage_budget();
    let client = unthrottled_client_layer(budget.clone()).layer(hyper_client());
    for _ in 0..REQUESTS {
        let error = post_err(&client, &upstream).await;
        assert!(error.gave_up().is_some(), "{error}");
        let gateway_answer: http::Response<()> = error_response(&error, false);
        assert_eq!(gateway_answer.status(), StatusCode::BAD_GATEWAY);
    }
    assert_dead_upstream_within_floor("hyper-util", REQUESTS, upstream.connections(), floor);
    assert_eq!(budget.snapshot().withdrawals, 10);

    // With the default adaptive throttle as well, most requests never leave the client.
    let upstream = DeadUpstream::spawn().await;
    let throttle = AdaptiveThrottle::default();
    let client = ClientLayer::default()
        .with_budget(outage_budget())
        .with_backoff(fast_backoff())
        .with_throttle(throttle.clone())
        .layer(hyper_client());
    let mut throttled = 0;
    for _ in 0..REQUESTS {
        let error = post_err(&client, &upstream).await;
        if error.reason() == Reason::Throttled {
            throttled += 1;
            let gateway_answer: http::Response<()> = error_response(&error, false);
            assert_eq!(gateway_answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    let connections = upstream.connections();
    eprintln!(
        "hyper-util dead upstream, budget + throttle: {REQUESTS} requests -> {connections} connections ({throttled} dropped locally), amplification {:.2}x",
        amplification(connections, REQUESTS)
    );
    assert!(throttled >= REQUESTS / 2, "{throttled} dropped locally");
    // Every request not dropped locally reached the upstream at least once.
    assert!(connections >= REQUESTS - throttled);
    assert!(connections < REQUESTS / 2, "{connections} connections");
}
