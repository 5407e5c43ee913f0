//! The layer on its own: a slot is held until the answer's body ends, a refused attempt waits a
//! bounded time, an error answer gives its slot back with what it says. On tokio's paused clock.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use stormguard_concurrency::{
    ConcurrencyConfig, ConcurrencyFull, ConcurrencyLayer, ConcurrencyLimit,
};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service, ServiceExt, service_fn};

/// An event stream that sends its one event and ends `length` after its head.
#[derive(Debug)]
struct Generation {
    ends: Pin<Box<Sleep>>,
    done: bool,
}

impl Body for Generation {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        ready!(self.ends.as_mut().poll(cx));
        self.done = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: [DONE]\n\n",
        )))))
    }
}

/// A provider whose every answer is a stream of `length`, with `status`.
fn provider(
    status: u16,
    length: Duration,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<Generation>,
    Error = Infallible,
    Future: Send,
> + Clone {
    service_fn(move |_request: http::Request<()>| async move {
        let body = Generation {
            ends: Box::pin(tokio::time::sleep(length)),
            done: false,
        };
        let mut response = http::Response::new(body);
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        Ok::<_, Infallible>(response)
    })
}

fn limit_of(initial: u32) -> ConcurrencyLimit {
    let config = ConcurrencyConfig::default()
        .with_initial(initial)
        .with_bounds(1, 100);
    ConcurrencyLimit::new(config)
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_five_seconds_holds_its_slot_five_seconds() {
    let limit = limit_of(4);
    let mut client =
        ConcurrencyLayer::new(limit.clone()).layer(provider(200, Duration::from_secs(5)));
    let start = Instant::now();
    let response = client
        .ready()
        .await
        .unwrap()
        .call(http::Request::new(()))
        .await
        .unwrap();
    // The head is there at once; the provider still generates.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(limit.snapshot().in_flight, 1);
    let reading = tokio::spawn(response.into_body().collect());
    tokio::time::sleep(Duration::from_millis(4_900)).await;
    assert_eq!(limit.snapshot().in_flight, 1, "held while the stream runs");
    reading.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(limit.snapshot().in_flight, 0, "freed at its last byte");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_attempt_gets_the_slot_when_the_body_ends() {
    let config = ConcurrencyConfig::default()
        .with_initial(1)
        .with_bounds(1, 100)
        .with_max_wait(Duration::from_secs(10));
    let limit = ConcurrencyLimit::new(config);
    let client = ConcurrencyLayer::new(limit.clone()).layer(provider(200, Duration::from_secs(5)));
    let start = Instant::now();
    let first = client
        .clone()
        .oneshot(http::Request::new(()))
        .await
        .unwrap();
    tokio::spawn(async move { first.into_body().collect().await.unwrap() });
    let mut second = client.clone();
    second.ready().await.unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "admitted when the first body ended"
    );
    assert_eq!(limit.snapshot().in_flight, 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_limit_refuses_after_its_bounded_wait() {
    let limit = limit_of(1);
    let client = ConcurrencyLayer::new(limit.clone()).layer(provider(200, Duration::from_secs(60)));
    let held = client
        .clone()
        .oneshot(http::Request::new(()))
        .await
        .unwrap();
    let start = Instant::now();
    let refused = client
        .clone()
        .oneshot(http::Request::new(()))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), ConcurrencyConfig::DEFAULT_MAX_WAIT);
    let full = refused.downcast_ref::<ConcurrencyFull>().unwrap();
    assert_eq!(full.limit(), 1);
    assert!(full.outcome().is_fatal() && !full.outcome().is_accepted());
    drop(held);
    assert_eq!(
        limit.snapshot().in_flight,
        0,
        "a dropped body frees its slot"
    );
}

#[tokio::test(start_paused = true)]
async fn an_overload_answer_shrinks_and_frees_its_slot_at_the_head() {
    let limit = limit_of(20);
    let client = ConcurrencyLayer::new(limit.clone()).layer(provider(529, Duration::from_secs(5)));
    let response = client.oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(response.status(), 529);
    let snapshot = limit.snapshot();
    assert_eq!(
        (snapshot.limit, snapshot.in_flight, snapshot.shrunk),
        (18, 0, 1)
    );
}

/// Ten callers, each sending its next request when its last answer ends: the limit grows while
/// ten in flight use it (at least 0.9 of it: up to 12), to 13, and no further, however long they
/// run.
#[tokio::test(start_paused = true)]
async fn healthy_answers_grow_the_limit_only_as_far_as_it_is_used() {
    let limit = limit_of(10);
    let client = ConcurrencyLayer::new(limit.clone()).layer(provider(200, Duration::from_secs(1)));
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..50 {
                    let response = client
                        .clone()
                        .oneshot(http::Request::new(()))
                        .await
                        .unwrap();
                    response.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let snapshot = limit.snapshot();
    assert_eq!(
        (snapshot.limit, snapshot.grown, snapshot.shrunk),
        (13, 3, 0)
    );
}
