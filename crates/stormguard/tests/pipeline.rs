//! The facade's pipelines end to end, on tokio's paused clock with scripted backends.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::classify::Reason;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::deadline::Deadline;
use stormguard::jitter::FullJitter;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard::{ClientLayer, ServerLayer};
use stormguard_test_kit::{Log, Replies, Reply, ScriptedBackend, post};
use tower::{Layer, ServiceExt, service_fn};

/// Where the requests of these tests go.
const URI: &str = "http://backend.test/v1/chat/completions";
/// A small chat request.
const BODY: &str = r#"{"max_tokens":50}"#;

/// A backend answering `statuses` in order (the last one repeats), noting its calls in `log`.
fn scripted(statuses: &[u16], log: &Log) -> ScriptedBackend<Replies> {
    let replies = statuses.iter().map(|&code| Reply::status(code).body("{}"));
    ScriptedBackend::replies(replies).logging_to(log)
}

#[tokio::test(start_paused = true)]
async fn default_client_retries_transient_failures_within_its_budget() {
    let log = Log::default();
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(2));
    let layer = ClientLayer::default()
        .with_budget(budget.clone())
        .with_backoff(
            FullJitter::new(Duration::from_millis(10), Duration::from_millis(100)).with_seed(7),
        );
    let client = layer.layer(scripted(&[503, 503, 200], &log));

    let response = client.oneshot(post(URI, BODY)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(log.len(), 3);
    let snapshot = budget.snapshot();
    assert_eq!(snapshot.withdrawals, 2);
    assert_eq!(snapshot.deposits, 1);
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_layer_share_one_budget() {
    let log = Log::default();
    // Floor of 1 retry/s over 10 s, no successes: 10 retries for everyone together.
    let layer = ClientLayer::default()
        .with_budget(RetryBudget::new(BudgetConfig::default()))
        .with_throttle(AdaptiveThrottle::new(
            ThrottleConfig::default().with_min_rate(f64::MAX),
        ))
        .with_backoff(
            FullJitter::new(Duration::from_millis(1), Duration::from_millis(1)).with_seed(1),
        );
    let first = layer.clone().layer(scripted(&[503], &log));
    let second = layer.layer(scripted(&[503], &log));

    for i in 0..20 {
        let client = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let response = client.oneshot(post(URI, BODY)).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    }
    // 20 requests + the 10 retries of the shared floor.
    assert_eq!(log.len(), 30);
}

#[tokio::test(start_paused = true)]
async fn deadline_spans_all_attempts() {
    let calls = Arc::new(AtomicU32::new(0));
    let slow_calls = calls.clone();
    let backend = service_fn(move |_request: Request<Full<Bytes>>| {
        slow_calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Infallible>(response)
        }
    });
    let client = ClientLayer::default()
        .with_timeout(Duration::from_secs(10))
        .with_backoff(
            FullJitter::new(Duration::from_millis(10), Duration::from_millis(10)).with_seed(3),
        )
        .layer(backend);

    let start = tokio::time::Instant::now();
    let response = client.oneshot(post(URI, BODY)).await.unwrap();
    // Two 4 s attempts fit in 10 s; a third could not finish in the 2 s left, so it is not sent.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_hung_backend_gets_deadline_exceeded_at_the_deadline() {
    let backend = service_fn(|_request: Request<Full<Bytes>>| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let client = ClientLayer::default()
        .with_timeout(Duration::from_secs(5))
        .layer(backend);
    let start = tokio::time::Instant::now();
    let error = client.oneshot(post(URI, BODY)).await.unwrap_err();
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn the_throttle_drops_locally_once_the_backend_rejects_everything() {
    let log = Log::default();
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(11));
    let client = ClientLayer::default()
        .with_max_attempts(1)
        .with_throttle(throttle.clone())
        .layer(scripted(&[503], &log));

    let mut throttled = 0;
    for _ in 0..1000 {
        tokio::time::advance(Duration::from_millis(1)).await;
        match client.clone().oneshot(post(URI, BODY)).await {
            Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
            Err(error) => {
                assert_eq!(error.reason(), Reason::Throttled, "{error}");
                throttled += 1;
            }
        }
    }
    let sent = log.len();
    assert_eq!(sent + throttled, 1000);
    // After one second of total rejection most attempts never leave the client.
    assert!(
        sent < 500,
        "{sent} of 1000 reached a backend that rejects everything"
    );
}

#[tokio::test(start_paused = true)]
async fn server_layer_sheds_expired_requests_and_retries_beyond_budget() {
    let handled = Arc::new(AtomicU32::new(0));
    let counter = handled.clone();
    let handler = service_fn(move |request: Request<Full<Bytes>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        // The handler sees the caller's deadline, capped by the layer.
        let remaining = Deadline::of(&request).map(|d| d.remaining());
        async move {
            assert!(remaining.unwrap() <= Duration::from_secs(2));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let server = ServerLayer::default()
        .with_budget(RetryBudget::new(
            BudgetConfig::default().with_min_per_sec(0),
        ))
        .layer(handler);

    let expired = Request::post("/")
        .header("x-request-timeout-ms", "0")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = server.clone().oneshot(expired).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(handled.load(Ordering::SeqCst), 0);

    // 20 successful first attempts earn 2 retries.
    for _ in 0..20 {
        let request = Request::post("/")
            .header("x-request-timeout-ms", "2000")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(
            server.clone().oneshot(request).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let retry = Request::post("/")
            .header("x-request-timeout-ms", "2000")
            .header("x-retry-attempt", "1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = server.clone().oneshot(retry).await.unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
        }
        let _ = response.into_body().collect().await.unwrap();
    }
    assert_eq!(statuses, [200, 200, 503]);
    assert_eq!(handled.load(Ordering::SeqCst), 22);
}
