//! The concurrency limit inside the engine (`ClientLayer::with_concurrency`), on tokio's paused
//! clock: a place held until the answer's body ends (a stream's last byte), the limit told what
//! the provider said (a 429, an in-band overloaded event, a timeout), a full limit waited for
//! within its bound and then refused, retries passing it like first attempts.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stormguard_classify::Reason;
use stormguard_concurrency::{ConcurrencyConfig, ConcurrencyFull, ConcurrencyLimit};
use stormguard_jitter::Constant;
use stormguard_test_kit::{ScriptedBody, post};
use support::{CHAT_URI, instant, reply, retries_only, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const CONTENT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const MESSAGES_URI: &str = "http://llm.test/v1/messages";
const ANTHROPIC_CONTENT: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
const ANTHROPIC_OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

fn limit_of(initial: u32) -> ConcurrencyLimit {
    let config = ConcurrencyConfig::default()
        .with_initial(initial)
        .with_bounds(1, 100);
    ConcurrencyLimit::new(config)
}

/// A backend whose every answer is an event stream: `first`, then `rest` after `length`.
fn streaming(
    first: &'static str,
    length: Duration,
    rest: &'static str,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<ScriptedBody>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(move |_request: Request<Full<Bytes>>| async move {
        let body = ScriptedBody::new().data(first).delay(length).data(rest);
        let response = Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap();
        Ok(response)
    })
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_five_seconds_holds_its_place_five_seconds() {
    let limit = limit_of(4);
    let client = retries_only()
        .with_concurrency(limit.clone())
        .layer(streaming(CONTENT, Duration::from_secs(5), DONE));
    let start = Instant::now();
    let response = client
        .oneshot(post(CHAT_URI, "{\"stream\":true}"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(limit.snapshot().in_flight, 1, "held after the head");
    let reading = tokio::spawn(response.into_body().collect());
    tokio::time::sleep(Duration::from_millis(4_900)).await;
    assert_eq!(limit.snapshot().in_flight, 1, "held while the stream runs");
    reading.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let snapshot = limit.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.shrunk), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_whole_answer_holds_its_place_until_its_body_is_read() {
    let limit = limit_of(4);
    let (_log, backend) = instant(|_, _| Ok(reply(200, &[], "{\"choices\":[]}")));
    let client = retries_only()
        .with_concurrency(limit.clone())
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(limit.snapshot().in_flight, 1);
    response.into_body().collect().await.unwrap();
    assert_eq!(limit.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_event_after_content_shrinks_the_limit() {
    let limit = limit_of(20);
    let client = retries_only()
        .with_concurrency(limit.clone())
        .layer(streaming(
            ANTHROPIC_CONTENT,
            Duration::from_secs(1),
            ANTHROPIC_OVERLOADED,
        ));
    let response = client
        .oneshot(post(MESSAGES_URI, "{\"stream\":true}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await;
    let snapshot = limit.snapshot();
    assert_eq!(
        (snapshot.limit, snapshot.in_flight, snapshot.shrunk),
        (18, 0, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_429_shrinks_the_limit_and_the_retry_passes_it_again() {
    let limit = limit_of(20);
    let (log, backend) = instant(|index, _| Ok(status(if index == 0 { 429 } else { 200 })));
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(100)))
        .with_concurrency(limit.clone())
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.len(), 2);
    drop(response);
    let snapshot = limit.snapshot();
    assert_eq!(
        (snapshot.limit, snapshot.in_flight, snapshot.shrunk),
        (18, 0, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_in_flight_at_the_deadline_counts_as_a_timeout() {
    let limit = limit_of(20);
    let backend = tower::service_fn(|_request: Request<Full<Bytes>>| async {
        Ok::<_, std::convert::Infallible>(
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(ScriptedBody::hanging())
                .unwrap(),
        )
    });
    let client = retries_only()
        .with_timeout(Duration::from_secs(3))
        .with_concurrency(limit.clone())
        .layer(backend);
    let error = client
        .oneshot(post(CHAT_URI, "{\"stream\":true}"))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    let snapshot = limit.snapshot();
    assert_eq!(
        (snapshot.limit, snapshot.in_flight, snapshot.shrunk),
        (18, 0, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_limit_is_waited_for_then_refused_without_a_retry() {
    let limit = limit_of(1);
    let client = retries_only()
        .with_concurrency(limit.clone())
        .layer(streaming(CONTENT, Duration::from_secs(60), DONE));
    let held = client
        .clone()
        .oneshot(post(CHAT_URI, "{\"stream\":true}"))
        .await
        .unwrap();
    let start = Instant::now();
    let error = client
        .clone()
        .oneshot(post(CHAT_URI, "{\"stream\":true}"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), ConcurrencyConfig::DEFAULT_MAX_WAIT);
    assert_eq!(error.reason(), Reason::BulkheadFull, "{error}");
    assert_eq!(error.attempts(), 0);
    assert_eq!(
        error.downcast_source::<ConcurrencyFull>().unwrap().limit(),
        1
    );
    // A place that frees within the wait is taken: the next request goes when the first body
    // is dropped, 1 s into its wait.
    let waiting = tokio::spawn(client.oneshot(post(CHAT_URI, "{\"stream\":true}")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(held);
    let start = Instant::now();
    let response = waiting.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(response.status(), 200);
    assert_eq!(limit.snapshot().in_flight, 1);
}
