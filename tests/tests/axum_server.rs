//! `ServerLayer` on a real axum server on loopback: expired deadlines and retry storms are shed
//! before the handler runs.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use stormguard::ServerLayer;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard_tests::{Server, chat_post, fast_client_layer, hyper_client};
use tower::{Layer, ServiceBuilder, ServiceExt};

const PATH: &str = "/v1/chat/completions";

/// Counts of requests that reached the server (before `ServerLayer`) and the handler (after it).
#[derive(Clone, Default)]
struct Counts {
    arrived: Arc<AtomicUsize>,
    handled: Arc<AtomicUsize>,
}

impl Counts {
    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    fn handled(&self) -> usize {
        self.handled.load(Ordering::SeqCst)
    }
}

/// An axum app behind `layer` whose handler answers `status` after `delay`.
async fn app(layer: ServerLayer, status: StatusCode, delay: Duration) -> (Server, Counts) {
    let counts = Counts::default();
    let handled = Arc::clone(&counts.handled);
    let arrived = Arc::clone(&counts.arrived);
    let router = Router::new()
        .route(
            PATH,
            post(move || async move {
                handled.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                status
            }),
        )
        .layer(layer)
        .layer(
            ServiceBuilder::new().map_request(move |request: axum::extract::Request| {
                arrived.fetch_add(1, Ordering::SeqCst);
                request
            }),
        );
    (Server::spawn(router).await, counts)
}

#[tokio::test]
async fn an_expired_deadline_is_shed_without_running_the_handler() {
    let (server, counts) = app(ServerLayer::default(), StatusCode::OK, Duration::ZERO).await;
    let client = hyper_client();

    let mut request = chat_post(&server.url(PATH));
    request
        .headers_mut()
        .insert("x-request-timeout-ms", "0".parse().unwrap());
    let response = client.request(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!((counts.arrived(), counts.handled()), (1, 0));

    // The same request with time left runs the handler.
    let mut request = chat_post(&server.url(PATH));
    request
        .headers_mut()
        .insert("x-request-timeout-ms", "5000".parse().unwrap());
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!((counts.arrived(), counts.handled()), (2, 1));
}

#[tokio::test]
async fn a_handler_that_overruns_the_callers_deadline_is_cut_off() {
    let (server, counts) = app(
        ServerLayer::default(),
        StatusCode::OK,
        Duration::from_secs(30),
    )
    .await;
    let mut request = chat_post(&server.url(PATH));
    request
        .headers_mut()
        .insert("x-request-timeout-ms", "100".parse().unwrap());

    let response = hyper_client().request(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(counts.handled(), 1);
}

#[tokio::test]
async fn a_retry_storm_beyond_the_budget_is_shed_with_should_retry_false() {
    // 10 s window, 1 retry/s floor (10 retries), 10% of successes.
    let budget = RetryBudget::new(BudgetConfig::default());
    let layer = ServerLayer::default().with_budget(budget.clone());
    let (server, counts) = app(layer, StatusCode::OK, Duration::ZERO).await;
    let client = hyper_client();

    // 20 first attempts succeed: 20 deposits = 2 retries on top of the floor's 10.
    for _ in 0..20 {
        let response = client.request(chat_post(&server.url(PATH))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // A storm of 30 retries, marked the way stormguard and the OpenAI SDKs mark them.
    let mut passed = 0;
    let mut shed = 0;
    for i in 0..30 {
        let mut request = chat_post(&server.url(PATH));
        let (name, value) = if i % 2 == 0 {
            ("x-retry-attempt", "1")
        } else {
            ("x-stainless-retry-count", "2")
        };
        request.headers_mut().insert(name, value.parse().unwrap());
        let response = client.request(request).await.unwrap();
        match response.status() {
            StatusCode::OK => passed += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
                shed += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    // retries <= 10 + 0.1 x successes, and a retry that succeeds is a success too: 13 retries
    // pass (13 <= 10 + 0.1 x 33), the 14th would need 10 + 0.1 x 34 = 13.4 >= 14.
    assert_eq!((passed, shed), (13, 17));
    assert_eq!(
        counts.handled(),
        20 + 13,
        "shed retries never reach the handler"
    );
    assert_eq!(counts.arrived(), 50);

    // First attempts are never shed, even with the budget spent.
    let response = client.request(chat_post(&server.url(PATH))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_stormguard_client_stops_at_the_servers_shed() {
    // No floor: with no successes, the server sheds every retry.
    let layer = ServerLayer::default().with_budget(RetryBudget::new(
        BudgetConfig::default().with_min_per_sec(0),
    ));
    let (server, counts) = app(layer, StatusCode::SERVICE_UNAVAILABLE, Duration::ZERO).await;
    let client = fast_client_layer(RetryBudget::default()).layer(hyper_client());

    let response = client.oneshot(chat_post(&server.url(PATH))).await.unwrap();

    // Attempt 1 reached the handler (503); attempt 2 was shed with x-should-retry: false, which
    // the client honours instead of spending its third attempt.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!((counts.arrived(), counts.handled()), (2, 1));
}

#[tokio::test]
async fn a_server_timeout_tells_the_caller_not_to_retry() {
    // No deadline header: the server's default applies. An SDK with a longer timeout of its own
    // (the OpenAI SDKs: 600 s) retries a bare 504 twice, running the handler 3 times.
    let layer = ServerLayer::default().with_default_timeout(Duration::from_millis(100));
    let (server, counts) = app(layer, StatusCode::OK, Duration::from_secs(30)).await;

    let response = hyper_client()
        .request(chat_post(&server.url(PATH)))
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(counts.handled(), 1);
    assert_eq!(
        response.headers().get(X_SHOULD_RETRY).map(|v| v.as_bytes()),
        Some(&b"false"[..]),
        "a deadline answered by a server layer must say x-should-retry: false (DESIGN, retry engine)"
    );
}
