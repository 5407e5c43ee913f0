//! Server side: reading, capping, shedding and enforcing the caller's deadline, on a paused clock.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header::CONTENT_TYPE};
use stormguard_classify::headers::{
    GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_TIMEOUT_MS,
};
use stormguard_deadline::{Deadline, ServerDeadlineLayer};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};

/// A handler that works for `work`, counts its runs, and answers with the milliseconds its
/// deadline left it when it started.
fn handler(
    work: Duration,
    runs: Arc<AtomicUsize>,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(move |request: Request<()>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            let left = Deadline::of(&request).map(|d| d.remaining().as_millis());
            tokio::time::sleep(work).await;
            Ok(Response::new(format!("{left:?}")))
        }
    })
}

fn request(headers: &[(&http::HeaderName, &'static str)]) -> Request<()> {
    let mut request = Request::new(());
    for (name, value) in headers {
        request
            .headers_mut()
            .append(*name, HeaderValue::from_static(value));
    }
    request
}

async fn serve(layer: ServerDeadlineLayer, request: Request<()>) -> (Response<String>, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(handler(Duration::ZERO, runs.clone()));
    let response = service.oneshot(request).await.unwrap();
    (response, runs.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn the_handler_inherits_the_callers_deadline() {
    let layer = ServerDeadlineLayer::new();
    let (response, _) = serve(layer, request(&[(&X_REQUEST_TIMEOUT_MS, "2000")])).await;
    assert_eq!(response.body(), "Some(2000)");
    let (response, _) = serve(layer, request(&[(&GRPC_TIMEOUT, "1500m")])).await;
    assert_eq!(response.body(), "Some(1500)");
    let (response, _) = serve(layer, request(&[(&X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "750")])).await;
    assert_eq!(response.body(), "Some(750)");
}

#[tokio::test(start_paused = true)]
async fn no_header_gets_the_default_and_long_asks_are_capped() {
    let (response, _) = serve(ServerDeadlineLayer::new(), request(&[])).await;
    assert_eq!(response.body(), "Some(300000)");
    let custom = ServerDeadlineLayer::new().with_default(Duration::from_secs(30));
    let (response, _) = serve(custom, request(&[])).await;
    assert_eq!(response.body(), "Some(30000)");

    // A day is cut to the 600 s maximum, or to a configured one.
    let (response, _) = serve(
        ServerDeadlineLayer::new(),
        request(&[(&X_REQUEST_TIMEOUT_MS, "86400000")]),
    )
    .await;
    assert_eq!(response.body(), "Some(600000)");
    let (response, _) = serve(
        ServerDeadlineLayer::new(),
        request(&[(&GRPC_TIMEOUT, "99999999H")]),
    )
    .await;
    assert_eq!(response.body(), "Some(600000)");
    let strict = ServerDeadlineLayer::new().with_max(Duration::from_secs(20));
    let (response, _) = serve(strict, request(&[(&X_REQUEST_TIMEOUT_MS, "45000")])).await;
    assert_eq!(response.body(), "Some(20000)");
    // The default is capped as well.
    let odd = ServerDeadlineLayer::new().with_default(Duration::from_secs(900));
    let (response, _) = serve(odd, request(&[])).await;
    assert_eq!(response.body(), "Some(600000)");
}

#[tokio::test(start_paused = true)]
async fn hostile_headers_fall_back_to_the_default() {
    let layer = ServerDeadlineLayer::new().with_default(Duration::from_secs(30));
    let ten_kb = "9".repeat(10 * 1024);
    let cases = [
        (&GRPC_TIMEOUT, "99999999999S"),
        (&GRPC_TIMEOUT, "-1m"),
        (&GRPC_TIMEOUT, "10X"),
        (&X_REQUEST_TIMEOUT_MS, ""),
        (&X_REQUEST_TIMEOUT_MS, "-5"),
        (&X_REQUEST_TIMEOUT_MS, ten_kb.as_str()),
        (&X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "1.5e3"),
    ];
    for (name, value) in cases {
        let mut hostile = Request::new(());
        hostile
            .headers_mut()
            .insert(name, HeaderValue::from_str(value).unwrap());
        let (response, runs) = serve(layer, hostile).await;
        assert_eq!(response.status(), StatusCode::OK, "{name}: {value}");
        assert_eq!(response.body(), "Some(30000)", "{name}: {value}");
        assert_eq!(runs, 1);
    }
    // Non-UTF-8 bytes are valid in a header value and ignored as a timeout.
    let mut binary = Request::new(());
    binary.headers_mut().insert(
        X_REQUEST_TIMEOUT_MS,
        HeaderValue::from_bytes(b"\xff\xfe12").unwrap(),
    );
    let (response, _) = serve(layer, binary).await;
    assert_eq!(response.body(), "Some(30000)");
}

#[tokio::test(start_paused = true)]
async fn expired_requests_are_shed_without_running_the_handler() {
    let layer = ServerDeadlineLayer::new();
    let (response, runs) = serve(layer, request(&[(&X_REQUEST_TIMEOUT_MS, "0")])).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.body(), "");
    // The caller's time is spent: nobody above should retry.
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(runs, 0);

    let grpc = request(&[(&GRPC_TIMEOUT, "0n"), (&CONTENT_TYPE, "application/grpc")]);
    let (response, runs) = serve(layer, grpc).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    assert_eq!(runs, 0);

    // An outer layer's deadline that has already passed counts too.
    let mut late = request(&[(&X_REQUEST_TIMEOUT_MS, "5000")]);
    Deadline::after(Duration::from_millis(10)).apply_to(&mut late);
    tokio::time::advance(Duration::from_millis(10)).await;
    let (response, runs) = serve(layer, late).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(runs, 0);
}

#[tokio::test(start_paused = true)]
async fn requests_below_the_minimum_remaining_are_shed() {
    let layer = ServerDeadlineLayer::new().with_min_remaining(Duration::from_millis(20));
    let (response, runs) = serve(layer, request(&[(&X_REQUEST_TIMEOUT_MS, "19")])).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(runs, 0);
    let (response, runs) = serve(layer, request(&[(&X_REQUEST_TIMEOUT_MS, "20")])).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(runs, 1);
}

#[tokio::test(start_paused = true)]
async fn an_overrunning_handler_is_cut_off_at_the_deadline() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = ServerDeadlineLayer::new().layer(handler(Duration::from_secs(5), runs.clone()));

    let start = Instant::now();
    let response = service
        .clone()
        .oneshot(request(&[(&X_REQUEST_TIMEOUT_MS, "1000")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    let start = Instant::now();
    let grpc = request(&[
        (&GRPC_TIMEOUT, "250m"),
        (&CONTENT_TYPE, "application/grpc+proto"),
    ]);
    let response = service.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(start.elapsed(), Duration::from_millis(250));

    // Within its deadline the handler answers normally.
    let response = service
        .oneshot(request(&[(&X_REQUEST_TIMEOUT_MS, "5001")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "Some(5001)");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_tighter_deadline_from_an_outer_layer_is_kept() {
    let mut tight = request(&[(&X_REQUEST_TIMEOUT_MS, "5000")]);
    Deadline::after(Duration::from_millis(800)).apply_to(&mut tight);
    let (response, _) = serve(ServerDeadlineLayer::new(), tight).await;
    assert_eq!(response.body(), "Some(800)");
}

#[tokio::test(start_paused = true)]
async fn works_as_an_axum_router_layer() {
    use axum::body::Body;
    use axum::routing::get;
    use axum::{Extension, Router};

    async fn left(Extension(deadline): Extension<Deadline>) -> String {
        deadline.remaining().as_millis().to_string()
    }
    async fn slow() -> &'static str {
        tokio::time::sleep(Duration::from_secs(60)).await;
        "too late"
    }
    let app = Router::new()
        .route("/left", get(left))
        .route("/slow", get(slow))
        .layer(ServerDeadlineLayer::new());

    let call = |path: &str, timeout: &'static str| {
        Request::get(path)
            .header(X_REQUEST_TIMEOUT_MS, timeout)
            .body(Body::empty())
            .unwrap()
    };
    let response = app.clone().oneshot(call("/left", "1234")).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(body, "1234");

    let start = Instant::now();
    let response = app.clone().oneshot(call("/slow", "2000")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(start.elapsed(), Duration::from_secs(2));

    let response = app.oneshot(call("/slow", "0")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn the_client_layer_works_as_an_axum_router_layer() {
    use axum::body::Body;
    use axum::routing::post;
    use axum::{Extension, Router};
    use stormguard_deadline::DeadlineLayer;

    async fn chat(Extension(deadline): Extension<Deadline>, body: String) -> String {
        format!("{} {}", deadline.remaining().as_millis(), body.len())
    }
    async fn slow() -> &'static str {
        tokio::time::sleep(Duration::from_secs(60)).await;
        "too late"
    }
    let app = Router::new()
        .route("/v1/messages", post(chat))
        .route("/slow", post(slow))
        .layer(DeadlineLayer::new(Duration::from_secs(38)).respond_with_504());

    let body = r#"{"max_tokens": 1000, "messages": [{"role": "user", "content": "12345678"}]}"#;
    let request = |path: &str| {
        Request::post(path)
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let response = app.clone().oneshot(request("/v1/messages")).await.unwrap();
    let answer = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    // The handler sees the layer's deadline; the body arrives whole.
    assert_eq!(answer, format!("38000 {}", body.len()));

    let start = Instant::now();
    let response = app.oneshot(request("/slow")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(start.elapsed(), Duration::from_secs(38));
}
