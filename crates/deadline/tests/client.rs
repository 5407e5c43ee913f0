//! Client side: setting, enforcing and propagating deadlines, on a paused clock.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header::CONTENT_TYPE};
use stormguard_classify::headers::{GRPC_TIMEOUT, X_REQUEST_TIMEOUT_MS};
use stormguard_classify::{Outcome, Reason, outcome_of};
use stormguard_deadline::propagate;
use stormguard_deadline::{Deadline, DeadlineExceeded, DeadlineLayer};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};

/// A backend that takes `work` to answer and reports the deadline headers it was sent.
fn backend(
    work: Duration,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |request: Request<()>| async move {
        tokio::time::sleep(work).await;
        Ok(Response::new(told(request.headers())))
    })
}

/// The propagation headers, as `"<x-request-timeout-ms>|<grpc-timeout>"`.
fn told(headers: &http::HeaderMap) -> String {
    let get = |name| {
        headers
            .get(name)
            .map(|v: &HeaderValue| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    format!("{}|{}", get(X_REQUEST_TIMEOUT_MS), get(GRPC_TIMEOUT))
}

/// Waits for `client` to be ready, then sends it `request`.
async fn send<S, B>(client: &mut S, request: Request<B>) -> Result<S::Response, S::Error>
where
    S: Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    client.ready().await.unwrap().call(request).await
}

/// Sends `request`, asserts it fails with `DeadlineExceeded`, and returns how long that took.
async fn expires_after<S, B>(client: &mut S, request: Request<B>) -> Duration
where
    S: Service<Request<B>, Response: std::fmt::Debug, Error = BoxError>,
{
    let start = Instant::now();
    let error = send(client, request).await.unwrap_err();
    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert_eq!(
        outcome_of(error.as_ref()),
        Some(Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false))
    );
    start.elapsed()
}

/// A request with `body` whose caller set a deadline `after` from now.
fn due_in<B>(after: Duration, body: B) -> Request<B> {
    let mut request = Request::new(body);
    Deadline::after(after).apply_to(&mut request);
    request
}

#[tokio::test(start_paused = true)]
async fn slow_backend_fails_with_deadline_exceeded_exactly_at_the_deadline() {
    let mut client =
        DeadlineLayer::new(Duration::from_secs(1)).layer(backend(Duration::from_secs(10)));
    assert_eq!(
        expires_after(&mut client, Request::new(())).await,
        Duration::from_secs(1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_response_before_the_deadline_passes_through() {
    let mut client =
        DeadlineLayer::new(Duration::from_secs(1)).layer(backend(Duration::from_millis(999)));
    let response = send(&mut client, Request::new(())).await.unwrap();
    assert_eq!(response.into_body(), "950|");
}

#[tokio::test(start_paused = true)]
async fn a_response_ready_at_the_instant_of_the_deadline_is_delivered() {
    let mut client =
        DeadlineLayer::new(Duration::from_secs(1)).layer(backend(Duration::from_secs(1)));
    let response = send(&mut client, Request::new(())).await;
    assert!(response.is_ok());
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_boxed() {
    let failing = service_fn(|_: Request<()>| async {
        Err::<Response<()>, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ))
    });
    let mut client = DeadlineLayer::new(Duration::from_secs(1)).layer(failing);
    let error = send(&mut client, Request::new(())).await.unwrap_err();
    let io = error.downcast_ref::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[tokio::test(start_paused = true)]
async fn the_tighter_deadline_wins_either_way() {
    let mut client =
        DeadlineLayer::new(Duration::from_secs(2)).layer(backend(Duration::from_secs(10)));

    // The request arrives with 300 ms left: the layer's 2 s does not extend it.
    let request = due_in(Duration::from_millis(300), ());
    assert_eq!(
        expires_after(&mut client, request).await,
        Duration::from_millis(300)
    );

    // The request arrives with 5 s left: the layer's 2 s is tighter.
    let request = due_in(Duration::from_secs(5), ());
    assert_eq!(
        expires_after(&mut client, request).await,
        Duration::from_secs(2)
    );
}

#[tokio::test(start_paused = true)]
async fn an_already_expired_request_is_never_sent() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = service_fn(move |_: Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(())) }
    });
    let mut client = DeadlineLayer::new(Duration::from_secs(30)).layer(inner);
    let request = due_in(Duration::from_millis(100), ());
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(expires_after(&mut client, request).await, Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn remaining_time_minus_the_margin_is_propagated() {
    let two_seconds = Duration::from_secs(2);
    let call = |layer: DeadlineLayer, request: Request<()>| async move {
        let mut client = layer.layer(backend(Duration::ZERO));
        send(&mut client, request).await.unwrap().into_body()
    };

    // HTTP: x-request-timeout-ms, 50 ms margin by default.
    assert_eq!(
        call(DeadlineLayer::new(two_seconds), Request::new(())).await,
        "1950|"
    );
    assert_eq!(
        DeadlineLayer::new(two_seconds).margin(),
        propagate::DEFAULT_MARGIN
    );
    assert!(DeadlineLayer::new(two_seconds).propagation());
    let margin = DeadlineLayer::new(two_seconds).with_margin(Duration::from_millis(200));
    assert_eq!(margin.margin(), Duration::from_millis(200));
    assert_eq!(call(margin, Request::new(())).await, "1800|");

    // gRPC: grpc-timeout only.
    let grpc = || {
        let mut request = Request::new(());
        request.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        request
    };
    assert_eq!(
        call(DeadlineLayer::new(two_seconds), grpc()).await,
        "|1950000u"
    );

    // Propagation off.
    let off = DeadlineLayer::new(two_seconds).without_propagation();
    assert!(!off.propagation());
    assert_eq!(call(off, Request::new(())).await, "|");

    // A caller-set header is replaced by the (tighter) truth.
    let mut request = Request::new(());
    request
        .headers_mut()
        .insert(X_REQUEST_TIMEOUT_MS, HeaderValue::from_static("999999"));
    assert_eq!(
        call(DeadlineLayer::new(two_seconds), request).await,
        "1950|"
    );
}

#[tokio::test(start_paused = true)]
async fn stamping_before_each_attempt_sends_what_is_left() {
    // An inner layer that, like the retry engine, waits 700 ms and then stamps the next attempt
    // with its own margin.
    let retrying = service_fn(|mut request: Request<()>| async move {
        let first = told(request.headers());
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(propagate::stamp(&mut request, propagate::DEFAULT_MARGIN));
        Ok::<_, Infallible>(Response::new(format!(
            "{first} then {}",
            told(request.headers())
        )))
    });
    let mut client = DeadlineLayer::new(Duration::from_secs(2)).layer(retrying);
    let response = send(&mut client, Request::new(())).await.unwrap();
    assert_eq!(response.into_body(), "1950| then 1250|");

    // By hand: each stamp writes the time left then, minus the margin it is given.
    let mut request = due_in(Duration::from_secs(2), ());
    assert!(propagate::stamp(&mut request, Duration::from_millis(100)));
    assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "1900");
    tokio::time::advance(Duration::from_millis(400)).await;
    assert!(propagate::stamp(&mut request, Duration::from_millis(100)));
    assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "1500");
    // Past the deadline, zero is left.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(propagate::stamp(&mut request, Duration::from_millis(100)));
    assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "0");
    // No deadline, no stamp.
    let mut plain = Request::new(());
    assert!(!propagate::stamp(&mut plain, Duration::ZERO));
    assert!(plain.headers().is_empty());
}

#[tokio::test(start_paused = true)]
async fn respond_mode_answers_504_or_grpc_deadline_exceeded() {
    let mut client = DeadlineLayer::new(Duration::from_secs(1))
        .respond_with_504()
        .layer(backend(Duration::from_secs(10)));
    let start = Instant::now();
    let result: Result<Response<String>, Infallible> = send(&mut client, Request::new(())).await;
    let response = result.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.body(), "");
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    let mut request = Request::new(());
    request
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(response.headers()["grpc-message"], "deadline exceeded");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
}

#[tokio::test(start_paused = true)]
async fn a_function_of_the_request_picks_the_timeout() {
    let layer = DeadlineLayer::from_fn(|parts: &http::request::Parts| match parts.uri.path() {
        "/v1/embeddings" => Some(Duration::from_secs(5)),
        "/health" => None,
        _ => Some(Duration::from_secs(120)),
    });
    let mut client = layer.layer(backend(Duration::ZERO));
    let mut told_for = async |path: &str| {
        let request = Request::get(path).body(()).unwrap();
        send(&mut client, request).await.unwrap().into_body()
    };
    assert_eq!(told_for("/v1/embeddings").await, "4950|");
    assert_eq!(told_for("/v1/chat/completions").await, "119950|");
    assert_eq!(told_for("/health").await, "|");
}
