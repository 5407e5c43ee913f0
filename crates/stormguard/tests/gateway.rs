//! A gateway on axum whose handler calls upstream through `ClientLayer` and returns the
//! pipeline's `stormguard::Error` with `?`: its caller gets the answer `error_response` gives for
//! that error (throttled 503, deadline 504, upstream failure 502), marked `x-should-retry: false`.
//! The gateway is a real axum server on 127.0.0.1, called with hyper-util's client.
#![cfg(feature = "axum")]
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::classify::Reason;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::jitter::Constant;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard::{ClientLayer, GiveUpCause, error_response};
use tower::{Layer, Service, ServiceExt, service_fn};

/// What the handler saw of the upstream call's error: its reason, why the engine gave up (if it
/// did), and the status and `x-should-retry` of `error_response` for it.
#[derive(Clone, Debug, PartialEq)]
struct Failed {
    reason: Reason,
    gave_up: Option<GiveUpCause>,
    status: StatusCode,
    should_retry: Option<String>,
}

type Log = Arc<Mutex<Vec<Failed>>>;

fn upstream_request() -> Request<Full<Bytes>> {
    Request::post("http://upstream.test/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"max_tokens":50}"#)))
        .unwrap()
}

/// Serves a gateway on 127.0.0.1 whose one route calls `upstream` and returns its error with `?`;
/// each error is noted in the log first.
async fn gateway<S, RB>(upstream: S, log: Log) -> SocketAddr
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>, Error = stormguard::Error>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let relay = move || {
        let (upstream, log) = (upstream.clone(), log.clone());
        async move {
            let response = upstream
                .oneshot(upstream_request())
                .await
                .inspect_err(|error| {
                    let answer = error_response::<()>(error, false);
                    log.lock().unwrap().push(Failed {
                        reason: error.reason(),
                        gave_up: error.gave_up(),
                        status: answer.status(),
                        should_retry: header(&answer, X_SHOULD_RETRY),
                    });
                })?;
            Ok::<_, stormguard::Error>(response.status())
        }
    };
    let app = Router::new().route("/v1/chat/completions", post(relay));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

fn header<B>(response: &Response<B>, name: http::HeaderName) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|value| value.to_str().unwrap().to_owned())
}

/// Calls the gateway once; returns its status and `x-should-retry`.
async fn call(gateway: SocketAddr) -> (StatusCode, Option<String>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{gateway}/v1/chat/completions"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .unwrap()
        .unwrap();
    (response.status(), header(&response, X_SHOULD_RETRY))
}

/// An upstream that answers 200 after `delay`, counting calls.
fn upstream(
    delay: Duration,
    calls: Arc<AtomicU32>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync {
    service_fn(move |_request: Request<Full<Bytes>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    })
}

/// Asserts the gateway answered `status` with `x-should-retry: false`, as `error_response` does
/// for the one error the handler logged, whose reason was `reason`.
fn assert_answered_like_error_response(
    answer: (StatusCode, Option<String>),
    status: StatusCode,
    log: &Log,
    reason: Reason,
) -> Failed {
    assert_eq!(answer, (status, Some("false".to_owned())));
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    let failed = log[0].clone();
    assert_eq!(failed.reason, reason, "{failed:?}");
    assert_eq!((failed.status, failed.should_retry.clone()), answer);
    failed
}

#[tokio::test]
async fn a_throttled_upstream_call_answers_503() {
    // A throttle that has seen the backend reject everything: it drops every attempt.
    let throttle = AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_window(Duration::from_secs(60))
            .with_min_rate(0.0)
            .with_max_probability(1.0)
            .with_seed(5),
    );
    for _ in 0..1_000 {
        // A rejection: a permit dropped untold counts as not accepted.
        drop(throttle.try_acquire());
    }
    assert!(throttle.probability() > 0.99);
    let calls = Arc::new(AtomicU32::new(0));
    let client = ClientLayer::default()
        .with_throttle(throttle)
        .layer(upstream(Duration::ZERO, calls.clone()));
    let log = Log::default();
    let address = gateway(client, log.clone()).await;

    let answer = call(address).await;
    let failed = assert_answered_like_error_response(
        answer,
        StatusCode::SERVICE_UNAVAILABLE,
        &log,
        Reason::Throttled,
    );
    assert_eq!(failed.gave_up, None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_upstream_call_past_its_deadline_answers_504() {
    let calls = Arc::new(AtomicU32::new(0));
    let client = ClientLayer::default()
        .with_timeout(Duration::from_millis(200))
        .layer(upstream(Duration::from_secs(3600), calls.clone()));
    let log = Log::default();
    let address = gateway(client, log.clone()).await;

    let answer = call(address).await;
    let failed = assert_answered_like_error_response(
        answer,
        StatusCode::GATEWAY_TIMEOUT,
        &log,
        Reason::DeadlineExceeded,
    );
    assert_eq!(failed.gave_up, None);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_upstream_refusing_connections_answers_502_once_the_budget_is_spent() {
    // A port bound and never listened on refuses connections, and stays this test's: a port
    // closed after its bind could be taken by another test's server meanwhile.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = reserved.local_addr().unwrap();
    // Point the upstream request at the closed port.
    let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let redirect = tower::service_fn(move |mut request: Request<Full<Bytes>>| {
        let uri = format!("http://{closed}{}", request.uri().path());
        *request.uri_mut() = uri.parse().unwrap();
        hyper.request(request)
    });
    // No floor and no successes: the budget grants no retry.
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let client = ClientLayer::default()
        .with_budget(budget.clone())
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .layer(redirect);
    let log = Log::default();
    let address = gateway(client, log.clone()).await;

    let answer = call(address).await;
    let failed = assert_answered_like_error_response(
        answer,
        StatusCode::BAD_GATEWAY,
        &log,
        Reason::Transport,
    );
    assert_eq!(failed.gave_up, Some(GiveUpCause::BudgetExhausted));
    assert_eq!(budget.snapshot().rejected, 1);
}
