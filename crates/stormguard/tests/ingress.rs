//! A gateway paces each caller on its way in: a `RateLimit` keyed by the caller's API key, in front
//! of an axum router, answered with `error_response` through axum's `HandleErrorLayer`. A caller
//! over its quota gets 429 with `Retry-After` and `x-should-retry: false`; another caller is not
//! affected; the handler never runs for a refused request.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::routing::post;
use http::{Request, StatusCode};
use stormguard::classify::BoxError;
use stormguard::rate_limit::{RateLimit, RateLimitConfig};
use stormguard::{ServiceBuilderExt, error_response};
use tower::{ServiceBuilder, ServiceExt};

fn call(key: &str) -> Request<Body> {
    Request::post("/v1/chat/completions")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn each_caller_is_paced_on_its_own_and_told_when_to_come_back() {
    // 60 a minute per caller, a burst of 1, no wait: the second call within a second is refused.
    let per_caller = RateLimit::keyed(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_max_wait(Duration::ZERO),
        |head| head.headers.get("x-api-key").cloned(),
    );
    let handled = Arc::new(AtomicU32::new(0));
    let count = Arc::clone(&handled);
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async { "generated" }
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|error: BoxError| async move {
                    error_response::<Body>(&*error, false)
                }))
                .pace(per_caller.clone()),
        );

    let first = app.clone().oneshot(call("alice")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let refused = app.clone().oneshot(call("alice")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["x-should-retry"], "false");
    // Another caller has its own quota.
    let other = app.clone().oneshot(call("bob")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(handled.load(Ordering::SeqCst), 2);
    assert_eq!(per_caller.snapshot().keys, 2);

    // A second later, alice's slot has come back.
    tokio::time::advance(Duration::from_secs(1)).await;
    let again = app.oneshot(call("alice")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(handled.load(Ordering::SeqCst), 3);
}
