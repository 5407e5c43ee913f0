//! The gRPC service config's backoff through the engine, on tokio's paused clock: every delay
//! between attempts is `min(initialBackoff × backoffMultiplier^(n-1), maxBackoff) × U(0.8, 1.2)`,
//! exactly, over many calls.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use stormguard_retry::grpc::{ServiceConfig, ServiceConfigLayer};
use support::{Log, scripted};
use tower::{Layer, Service, ServiceExt};

/// Every attempt answered UNAVAILABLE, trailers-only, at once.
fn unavailable() -> Result<Response<Full<Bytes>>, stormguard_classify::BoxError> {
    Ok(Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .body(Full::new(Bytes::new()))?)
}

#[tokio::test(start_paused = true)]
async fn every_delay_is_its_ceiling_within_twenty_percent() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.5s",
            "backoffMultiplier": 3, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let layer = ServiceConfigLayer::new(config).with_client(
        &stormguard_retry::ClientLayer::default()
            .without_throttle()
            .without_clocks()
            .with_budget(stormguard_budget::RetryBudget::new(
                stormguard_budget::BudgetConfig::default().with_min_per_sec(1000),
            )),
    );
    let log = Log::default();
    let mut client = layer.layer(scripted(&log, Duration::ZERO, |_, _| unavailable()));
    let (mut lowest, mut highest) = ([f64::MAX; 4], [0f64; 4]);
    for call in 0..50 {
        let request = Request::post("http://backend.invalid/echo.Echo/Say")
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
            .unwrap();
        let response = client.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
        let seen = log.all();
        let attempts = &seen[call * 5..call * 5 + 5];
        for n in 0..4 {
            let gap = (attempts[n + 1].at - attempts[n].at).as_secs_f64() * 1000.0;
            lowest[n] = lowest[n].min(gap);
            highest[n] = highest[n].max(gap);
        }
    }
    assert_eq!(log.len(), 250, "5 attempts a call");
    // Ceilings 100, 300, 500 (900 capped), 500 ms; paused time is exact to the millisecond.
    for (n, ceiling) in [100.0, 300.0, 500.0, 500.0].into_iter().enumerate() {
        assert!(
            lowest[n] >= ceiling * 0.8 - 1.0,
            "retry {}: {}",
            n + 1,
            lowest[n]
        );
        assert!(
            highest[n] <= ceiling * 1.2 + 1.0,
            "retry {}: {}",
            n + 1,
            highest[n]
        );
        // The jitter spreads: over 50 calls the delays cover most of the ±20%.
        assert!(
            highest[n] - lowest[n] >= ceiling * 0.2,
            "retry {}: {lowest:?} {highest:?}",
            n + 1
        );
    }
}

/// Retry tokens at half or fewer hold hedges back as they do retries (gRFC A6); a bucket the
/// client already has is the one the service config's layer uses.
#[tokio::test(start_paused = true)]
async fn spent_retry_tokens_send_no_hedge() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.1s"}}],
            "retryThrottling": {"maxTokens": 100, "tokenRatio": 1}}"#,
    )
    .unwrap();
    for (spent, attempts) in [(false, 2), (true, 1)] {
        let tokens = stormguard_budget::RetryTokens::new(2, 0.1);
        if spent {
            tokens.failed();
        }
        let client = stormguard_retry::ClientLayer::default()
            .without_clocks()
            .with_retry_tokens(tokens.clone());
        let layer = ServiceConfigLayer::new(config.clone()).with_client(&client);
        assert_eq!(layer.retry_tokens().unwrap().max_tokens(), 2);
        let log = Log::default();
        let ok = |_, _: &support::Seen| {
            Ok(Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .body(Full::new(Bytes::new()))?)
        };
        let mut service = layer.layer(scripted(&log, Duration::from_millis(300), ok));
        let request = Request::post("http://backend.invalid/echo.Echo/Say")
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
            .unwrap();
        let started = tokio::time::Instant::now();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "0");
        assert_eq!(log.len(), attempts, "spent: {spent}");
        // The first attempt answers at 300 ms either way (a hedge sent at 100 ms would answer
        // at 400 ms and is cancelled).
        assert_eq!(started.elapsed().as_millis(), 300, "spent: {spent}");
    }
}
