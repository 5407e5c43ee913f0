//! `ShedRetriesLayer` in front of a real axum server: shedding starts where the budget says and
//! stops when traffic recovers.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard_budget::{BudgetConfig, RetryBudget, ShedRetriesLayer};
use stormguard_classify::headers::X_RETRY_ATTEMPT;

struct Server {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// Calls that reached a handler.
    handled: Arc<AtomicU32>,
}

impl Server {
    /// Serves `/ok` (200) and `/unavailable` (503 from the handler itself) behind the layer.
    async fn start(budget: RetryBudget) -> Self {
        let handled = Arc::new(AtomicU32::new(0));
        let (ok, unavailable) = (handled.clone(), handled.clone());
        let app = Router::new()
            .route(
                "/ok",
                get(move || async move {
                    ok.fetch_add(1, Ordering::Relaxed);
                    "ok"
                }),
            )
            .route(
                "/unavailable",
                get(move || async move {
                    unavailable.fetch_add(1, Ordering::Relaxed);
                    (StatusCode::SERVICE_UNAVAILABLE, "try later")
                }),
            )
            .layer(ShedRetriesLayer::new(budget));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base: format!("http://{address}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
            handled,
        }
    }

    async fn get(&self, path: &str, retry_attempt: Option<u32>) -> Response<Bytes> {
        let mut request = Request::get(format!("{}{path}", self.base));
        if let Some(previous) = retry_attempt {
            request = request.header(X_RETRY_ATTEMPT, previous);
        }
        let response = self
            .client
            .request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
    }

    fn handled(&self) -> u32 {
        self.handled.load(Ordering::Relaxed)
    }
}

#[tokio::test]
async fn sheds_retries_beyond_ten_percent_of_successes() {
    // Real clock, but a 10 s window is far longer than this test: nothing expires.
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let server = Server::start(budget.clone()).await;

    for _ in 0..100 {
        let response = server.get("/ok", None).await;
        assert_eq!(response.status(), 200);
    }
    assert_eq!(budget.snapshot().balance, 10);

    // Ten retries of a failing call reach the handler (and fail again: no deposit).
    for attempt in 0..10 {
        let response = server.get("/unavailable", Some(1 + attempt % 2)).await;
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers().get("x-should-retry"), None);
        assert_eq!(response.body(), "try later");
    }
    assert_eq!(server.handled(), 110);

    // The 11th is shed: the handler never sees it, and the client is told not to retry.
    let shed = server.get("/unavailable", Some(1)).await;
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["x-should-retry"], "false");
    assert_eq!(shed.body(), "");
    assert_eq!(server.handled(), 110);
    // A retry of a call that would succeed is shed just the same.
    assert_eq!(server.get("/ok", Some(2)).await.status(), 503);
    assert_eq!(server.handled(), 110);

    // First attempts still pass while retries are shed.
    for _ in 0..30 {
        assert_eq!(server.get("/ok", None).await.status(), 200);
    }
    assert_eq!(server.handled(), 140);

    // 130 successes now: 13 retries in all, 10 spent. Three more pass, the fourth is shed.
    for _ in 0..3 {
        let response = server.get("/unavailable", Some(1)).await;
        assert_eq!(response.body(), "try later");
    }
    let shed = server.get("/unavailable", Some(1)).await;
    assert_eq!(shed.headers()["x-should-retry"], "false");
    assert_eq!(server.handled(), 143);

    let snapshot = budget.snapshot();
    assert_eq!(
        (snapshot.deposits, snapshot.withdrawals, snapshot.rejected),
        (130, 13, 3)
    );
}
