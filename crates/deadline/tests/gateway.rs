//! Deadline propagation through a gateway: two real axum hops on loopback, real time.
//!
//! The client calls hop A (a gateway with `ServerDeadlineLayer`, 30 s default), whose handler calls
//! hop B through a `DeadlineLayer`-wrapped hyper client (120 s fixed timeout). B reports the
//! `x-request-timeout-ms` it received. An incoming 2 s deadline must reach B as ~2 s, not as a fresh
//! 30 s or 120 s.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard_classify::headers::X_REQUEST_TIMEOUT_MS;
use stormguard_deadline::client::ClientDeadline;
use stormguard_deadline::{Deadline, DeadlineLayer, ServerDeadlineLayer};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Clone)]
struct Gateway {
    upstream: String,
    client: ClientDeadline<HttpClient>,
    handled: Arc<AtomicUsize>,
}

async fn spawn(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// Hop B: reports the timeout it was told.
async fn report(headers: HeaderMap) -> String {
    headers
        .get(X_REQUEST_TIMEOUT_MS)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_else(|| "none".to_owned())
}

/// Hop A: forwards to B under the incoming deadline.
async fn forward(
    State(gateway): State<Gateway>,
    Extension(deadline): Extension<Deadline>,
) -> Result<String, StatusCode> {
    gateway.handled.fetch_add(1, Ordering::SeqCst);
    let mut request = Request::get(format!("{}/report", gateway.upstream))
        .body(Full::new(Bytes::new()))
        .unwrap();
    deadline.apply_to(&mut request);
    let response = gateway
        .client
        .oneshot(request)
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

struct Setup {
    gateway: String,
    handled: Arc<AtomicUsize>,
    client: HttpClient,
}

async fn setup() -> Setup {
    let upstream = spawn(Router::new().route("/report", get(report))).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let handled = Arc::new(AtomicUsize::new(0));
    let gateway = Gateway {
        upstream,
        client: DeadlineLayer::new(Duration::from_secs(120)).layer(client.clone()),
        handled: handled.clone(),
    };
    let app = Router::new()
        .route("/forward", get(forward))
        .with_state(gateway)
        .layer(ServerDeadlineLayer::new().with_default(Duration::from_secs(30)));
    Setup {
        gateway: spawn(app).await,
        handled,
        client,
    }
}

async fn call(setup: &Setup, timeout_ms: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get(format!("{}/forward", setup.gateway));
    if let Some(timeout) = timeout_ms {
        request = request.header(X_REQUEST_TIMEOUT_MS, timeout);
    }
    let response = setup
        .client
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn an_incoming_two_second_deadline_reaches_the_upstream_as_two_seconds() {
    let setup = setup().await;

    let (status, told) = call(&setup, Some("2000")).await;
    assert_eq!(status, StatusCode::OK);
    let told: u64 = told.parse().unwrap();
    println!("hop B was told x-request-timeout-ms: {told} (incoming 2000)");
    assert!((1800..=2000).contains(&told), "B was told {told} ms");

    let (status, told) = call(&setup, None).await;
    assert_eq!(status, StatusCode::OK);
    let told: u64 = told.parse().unwrap();
    println!("hop B was told x-request-timeout-ms: {told} (no incoming header, 30 s default)");
    assert!((29_000..=30_000).contains(&told), "B was told {told} ms");
    assert_eq!(setup.handled.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_expired_incoming_deadline_never_reaches_the_handler() {
    let setup = setup().await;
    let (status, body) = call(&setup, Some("0")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "");
    assert_eq!(setup.handled.load(Ordering::SeqCst), 0);
}
