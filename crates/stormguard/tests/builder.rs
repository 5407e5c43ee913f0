//! `ServiceBuilderExt`: the documented stacks, built with the extension methods, each serving
//! requests on tokio's paused clock. Every builder is bound to the layer types it must hold, so a
//! stack cannot quietly be made of `ServiceBuilder`'s own layers instead (its inherent `retry` and
//! `timeout` are tower's, and an inherent method wins over a trait method of the same name).
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::budget::{BudgetConfig, RetryBudget, ShedRetriesLayer};
use stormguard::classify::headers::{X_REQUEST_TIMEOUT_MS, X_RETRY_ATTEMPT, X_SHOULD_RETRY};
use stormguard::deadline::{Deadline, DeadlineLayer, ServerDeadlineLayer};
use stormguard::jitter::SpreadLayer;
use stormguard::throttle::{AdaptiveThrottle, AdaptiveThrottleLayer, ThrottleConfig};
use stormguard::{ClientLayer, ServerLayer, ServiceBuilderExt};
use stormguard_test_kit::{Log, Replies, Reply, ScriptedBackend, post};
use tower::layer::util::{Identity, Stack};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// A backend answering `statuses` in order (the last one repeats), noting each request in `log`.
fn scripted(statuses: &[u16], log: &Log) -> ScriptedBackend<Replies> {
    let replies = statuses.iter().map(|&code| Reply::status(code).body("{}"));
    ScriptedBackend::replies(replies).logging_to(log)
}

/// A handler answering 200, noting the time left of the deadline each request carried.
fn handler(
    deadlines: Arc<Mutex<Vec<Option<Duration>>>>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |request: Request<Full<Bytes>>| {
        let remaining = Deadline::of(&request).map(|deadline| deadline.remaining());
        deadlines.lock().unwrap().push(remaining);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
    })
}

/// Where the requests of these tests go.
const URI: &str = "http://backend.test/v1/chat/completions";
/// A small chat request.
const BODY: &str = r#"{"max_tokens":50}"#;

/// A request to a server, with the caller's deadline and, for a retry, its attempt number.
fn incoming(timeout_ms: &str, attempt: Option<&str>) -> Request<Full<Bytes>> {
    let mut request =
        Request::post("/v1/chat/completions").header(X_REQUEST_TIMEOUT_MS, timeout_ms);
    if let Some(attempt) = attempt {
        request = request.header(X_RETRY_ATTEMPT, attempt);
    }
    request.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test(start_paused = true)]
async fn spread_then_the_client_pipeline_retries_a_503() {
    let log = Log::default();
    let builder: ServiceBuilder<Stack<ClientLayer, Stack<SpreadLayer, Identity>>> =
        ServiceBuilder::new()
            .spread(Duration::from_millis(100))
            .stormguard_client(ClientLayer::default());
    let client = builder.service(scripted(&[503, 200], &log));

    let response = client.oneshot(post(URI, BODY)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let received = log.all();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].headers[X_RETRY_ATTEMPT], "0");
    assert_eq!(received[1].headers[X_RETRY_ATTEMPT], "1");
}

#[tokio::test(start_paused = true)]
async fn the_server_pipeline_hands_the_callers_deadline_to_the_handler() {
    let deadlines = Arc::default();
    let builder: ServiceBuilder<Stack<ServerLayer, Identity>> =
        ServiceBuilder::new().stormguard_server(ServerLayer::default());
    let server = builder.service(handler(Arc::clone(&deadlines)));

    let response = server.oneshot(incoming("2000", None)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*deadlines.lock().unwrap(), [Some(Duration::from_secs(2))]);
}

#[tokio::test(start_paused = true)]
async fn server_deadline_then_shed_retries_reads_the_deadline_and_sheds_a_retry() {
    let deadlines = Arc::default();
    // No floor: only successes earn retries, one tenth of a retry each.
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let builder: ServiceBuilder<Stack<ShedRetriesLayer, Stack<ServerDeadlineLayer, Identity>>> =
        ServiceBuilder::new()
            .server_deadline(ServerDeadlineLayer::default())
            .shed_retries(budget.clone());
    let server = builder.service(handler(Arc::clone(&deadlines)));

    let response = server
        .clone()
        .oneshot(incoming("2000", None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let shed = server.oneshot(incoming("2000", Some("1"))).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()[X_SHOULD_RETRY], "false");
    // The handler ran once, for the first attempt, with the caller's 2 s.
    assert_eq!(*deadlines.lock().unwrap(), [Some(Duration::from_secs(2))]);
    assert_eq!(budget.snapshot().deposits, 1);
}

#[tokio::test(start_paused = true)]
async fn deadline_then_adaptive_throttle_stamps_the_time_left_and_counts_the_attempt() {
    let log = Log::default();
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default());
    let builder: ServiceBuilder<Stack<AdaptiveThrottleLayer, Stack<DeadlineLayer, Identity>>> =
        ServiceBuilder::new()
            .deadline(Duration::from_secs(5))
            .adaptive_throttle(throttle.clone());
    let client = builder.service(scripted(&[200], &log));

    let response = client.oneshot(post(URI, BODY)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // 5 s, less the 50 ms safety margin.
    let received = log.all();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].headers[X_REQUEST_TIMEOUT_MS], "4950");
    let counted = throttle.snapshot();
    assert_eq!((counted.requests, counted.accepts), (1, 1));
}
