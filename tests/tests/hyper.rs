//! `ClientLayer` around a real hyper-util client, against a scripted axum backend on loopback.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::Duration;

use http::StatusCode;
use stormguard::budget::RetryBudget;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::deadline::LlmDeadline;
use stormguard::retry::GaveUp;
use stormguard::throttle::AdaptiveThrottle;
use stormguard::throttle::Throttled;
use stormguard::{ClientLayer, error_response};
use stormguard_tests::{
    DeadUpstream, INSUFFICIENT_QUOTA, RATE_LIMITED, Reply, ScriptedBackend, amplification,
    body_text, chat_post, fast_backoff, guarded_hyper, hyper_client,
};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";

#[tokio::test]
async fn two_503s_then_200_succeeds_with_attempt_headers_and_one_idempotency_key() {
    let backend =
        ScriptedBackend::spawn([Reply::status(503), Reply::status(503), Reply::status(200)]).await;
    let budget = RetryBudget::default();
    let client = guarded_hyper(budget.clone());

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

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
        let response = client
            .clone()
            .oneshot(chat_post(&backend.url(PATH)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let get = http::Request::get(backend.url("/v1/models"))
        .body(http_body_util::Full::default())
        .unwrap();
    assert_eq!(client.oneshot(get).await.unwrap().status(), StatusCode::OK);

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
    let client = guarded_hyper(RetryBudget::default());

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

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
    let client = guarded_hyper(RetryBudget::default());

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
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

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    // The 1..5 ms backoff would have come back much sooner; the ms header beats `retry-after: 30`.
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
    let client = guarded_hyper(RetryBudget::default());

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

    // 120 s is above the default 60 s maximum: give up now, tell the caller not to retry.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn the_deadline_is_sent_and_shrinks_on_each_retry() {
    // Each failure takes 5 ms, so each retry has measurably less time left.
    let slow_503 = Reply::status(503).delay(Duration::from_millis(5));
    let backend = ScriptedBackend::spawn([slow_503.clone(), slow_503, Reply::status(200)]).await;
    let client = ClientLayer::default()
        .backoff(fast_backoff())
        .timeout(Duration::from_secs(2))
        .layer(hyper_client());

    let response = client.oneshot(chat_post(&backend.url(PATH))).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let sent: Vec<u64> = backend
        .seen()
        .iter()
        .map(|s| s.timeout_ms().unwrap())
        .collect();
    // 2000 ms minus the 50 ms margin, then re-stamped before each retry.
    assert!((1500..=1950).contains(&sent[0]), "{sent:?}");
    assert!(sent[1] < sent[0] && sent[2] < sent[1], "{sent:?}");
}

#[tokio::test]
async fn an_llm_deadline_grows_with_max_tokens_on_the_wire() {
    let backend = ScriptedBackend::spawn([Reply::status(200)]).await;
    let client = ClientLayer::default()
        .backoff(fast_backoff())
        .llm_deadline(LlmDeadline::default())
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

    let sent: Vec<u64> = backend
        .seen()
        .iter()
        .map(|s| s.timeout_ms().unwrap())
        .collect();
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
    let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.1);
    let backend = ScriptedBackend::spawn([Reply::status(503)]).await;
    // Throttle off: the budget alone has to hold the line.
    let client = ClientLayer::default()
        .budget(budget.clone())
        .backoff(fast_backoff())
        .throttle(AdaptiveThrottle::default().with_max_probability(0.0))
        .layer(hyper_client());

    for _ in 0..REQUESTS {
        let response = client
            .clone()
            .oneshot(chat_post(&backend.url(PATH)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    }

    let attempts = backend.hits();
    eprintln!(
        "hyper-util outage: {REQUESTS} requests -> {attempts} backend attempts, amplification {:.2}x (naive 3 attempts: 3.00x)",
        amplification(attempts, REQUESTS)
    );
    assert!(attempts >= REQUESTS);
    assert!(
        attempts <= REQUESTS + floor,
        "{attempts} attempts for {REQUESTS} requests"
    );
    let snapshot = budget.snapshot();
    assert_eq!(snapshot.withdrawals, 10);
    assert!(snapshot.rejected >= 80, "{snapshot:?}");
}

#[tokio::test]
async fn a_dead_upstream_gets_retries_within_the_budget_then_throttled_locally() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let upstream = DeadUpstream::spawn().await;

    // Budget alone (throttle off): every request fails with GaveUp, at most `floor` retries.
    let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.1);
    let client = ClientLayer::default()
        .budget(budget.clone())
        .backoff(fast_backoff())
        .throttle(AdaptiveThrottle::default().with_max_probability(0.0))
        .layer(hyper_client());
    for _ in 0..REQUESTS {
        let error = client
            .clone()
            .oneshot(chat_post(&upstream.url(PATH)))
            .await
            .unwrap_err();
        assert!(error.is::<GaveUp>(), "{error}");
        let gateway_answer: http::Response<()> = error_response(&error, false);
        assert_eq!(gateway_answer.status(), StatusCode::BAD_GATEWAY);
    }
    let connections = upstream.connections();
    eprintln!(
        "hyper-util dead upstream, budget only: {REQUESTS} requests -> {connections} connections, amplification {:.2}x",
        amplification(connections, REQUESTS)
    );
    assert!((REQUESTS..=REQUESTS + floor).contains(&connections));
    assert_eq!(budget.snapshot().withdrawals, 10);

    // With the default adaptive throttle as well, most requests never leave the client.
    let upstream = DeadUpstream::spawn().await;
    let throttle = AdaptiveThrottle::default();
    let client = ClientLayer::default()
        .budget(RetryBudget::new(Duration::from_secs(10), 1, 0.1))
        .backoff(fast_backoff())
        .throttle(throttle.clone())
        .layer(hyper_client());
    let mut throttled = 0;
    for _ in 0..REQUESTS {
        let error = client
            .clone()
            .oneshot(chat_post(&upstream.url(PATH)))
            .await
            .unwrap_err();
        if error.is::<Throttled>() {
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
