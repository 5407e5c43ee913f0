//! A two-hop chain on loopback: client -> gateway (axum with `ServerLayer`, calling upstream
//! through a `ClientLayer`-wrapped hyper-util client) -> upstream. The deadline travels and
//! shrinks; retries happen at one layer only.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use http::StatusCode;
use stormguard::budget::RetryBudget;
use stormguard::classify::headers::{X_REQUEST_TIMEOUT_MS, X_SHOULD_RETRY};
use stormguard::deadline::Deadline;
use stormguard::{ClientService, ServerLayer, error_response};
use stormguard_tests::{
    HyperClient, Reply, ScriptedBackend, Server, chat_post, fast_client_layer, guarded_hyper,
    hyper_client, timeout_ms,
};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";

#[derive(Clone)]
struct Gateway {
    upstream: String,
    client: ClientService<HyperClient>,
    /// `x-request-timeout-ms` of every request the gateway received.
    received: Arc<Mutex<Vec<Option<u64>>>>,
}

async fn forward(State(gateway): State<Gateway>, request: Request) -> Response {
    let received = request
        .headers()
        .get(X_REQUEST_TIMEOUT_MS)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    gateway.received.lock().unwrap().push(received);

    let mut outgoing = chat_post(&gateway.upstream);
    // Inherit the caller's deadline (stored by ServerLayer): the upstream call gets what is left
    // of it, not the client layer's own 600 s.
    if let Some(deadline) = Deadline::of(&request) {
        deadline.apply_to(&mut outgoing);
    }
    match gateway.client.oneshot(outgoing).await {
        Ok(response) => response.map(Body::new),
        Err(error) => error_response(&error, false),
    }
}

/// A gateway in front of `upstream`; returns it with the log of deadlines it received.
async fn gateway(upstream: &ScriptedBackend) -> (Server, Arc<Mutex<Vec<Option<u64>>>>) {
    let received = Arc::default();
    let state = Gateway {
        upstream: upstream.url(PATH),
        client: guarded_hyper(RetryBudget::default()),
        received: Arc::clone(&received),
    };
    let router = Router::new()
        .route(PATH, post(forward))
        .with_state(state)
        .layer(ServerLayer::default());
    (Server::spawn(router).await, received)
}

#[tokio::test]
async fn the_deadline_travels_both_hops_and_only_shrinks() {
    let upstream = ScriptedBackend::spawn([Reply::status(200)]).await;
    let (gateway, received) = gateway(&upstream).await;
    let client = fast_client_layer(RetryBudget::default())
        .with_timeout(Duration::from_secs(2))
        .layer(hyper_client());

    let response = client.oneshot(chat_post(&gateway.url(PATH))).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let inbound = received.lock().unwrap()[0].unwrap();
    let outbound = timeout_ms(&upstream.seen()[0]).unwrap();
    eprintln!("gateway deadline: {inbound} ms in, {outbound} ms out");
    // 2000 ms minus the client's 50 ms margin (and a little transit).
    assert!((1500..=1950).contains(&inbound), "gateway got {inbound} ms");
    // What was left of it minus the gateway's own margin: not the gateway client's 600 s.
    assert!(
        outbound <= inbound - 50,
        "{inbound} ms in, {outbound} ms out"
    );
    assert!(outbound >= 1000, "{inbound} ms in, {outbound} ms out");
}

#[tokio::test]
async fn an_outage_behind_the_gateway_is_retried_at_one_layer_only() {
    let upstream = ScriptedBackend::spawn([Reply::status(503)]).await;
    let (gateway, received) = gateway(&upstream).await;
    let client = fast_client_layer(RetryBudget::default()).layer(hyper_client());

    let response = client.oneshot(chat_post(&gateway.url(PATH))).await.unwrap();

    // The gateway spent its 3 attempts and marked its answer; the client above honoured the mark
    // instead of multiplying: 3 upstream attempts, not 3 x 3 = 9.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(received.lock().unwrap().len(), 1);
    assert_eq!(upstream.hits(), 3);
}

#[tokio::test]
async fn a_slow_upstream_is_cut_off_at_the_callers_deadline() {
    let upstream = ScriptedBackend::spawn([Reply::status(200).delay(Duration::from_secs(5))]).await;
    let (gateway, _received) = gateway(&upstream).await;
    let mut request = chat_post(&gateway.url(PATH));
    request
        .headers_mut()
        .insert(X_REQUEST_TIMEOUT_MS, "200".parse().unwrap());

    let response = hyper_client().request(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "no retry once the deadline is gone");
    assert!(timeout_ms(&seen[0]).unwrap() <= 150);
}
