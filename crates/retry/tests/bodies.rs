//! Request bodies of unknown length, streamed error bodies and tower's readiness contract.

#![allow(clippy::unwrap_used)]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stormguard_classify::BoxError;
use stormguard_classify::headers::X_SHOULD_RETRY;
use stormguard_jitter::Constant;
use stormguard_test_kit::post;
use support::{CHAT_URI, Chunked, Log, Recording, retries_only, scripted, status};
use tower::{Layer, Service, ServiceExt};

fn chunks(count: usize, size: usize) -> Vec<Bytes> {
    (0..count)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; size]))
        .collect()
}

fn streaming_post(chunks: Vec<Bytes>) -> Request<Chunked> {
    Request::post("http://llm.test/v1/uploads")
        .body(Chunked::new(chunks))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn unknown_length_body_that_ends_within_the_cap_is_replayed() {
    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |n, _| {
        Ok(if n < 2 { status(503) } else { status(200) })
    });
    let client = retries_only().with_max_replay_body(64).layer(backend);

    let response = client.oneshot(streaming_post(chunks(3, 10))).await.unwrap();

    assert_eq!(response.status(), 200);
    let expected: Bytes = chunks(3, 10).concat().into();
    let seen = log.all();
    assert_eq!(seen.len(), 3);
    for attempt in &seen {
        assert_eq!(attempt.body, expected);
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_length_body_past_the_cap_is_sent_once_whole() {
    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only().with_max_replay_body(16).layer(backend);

    // 30 bytes: the engine reads 20 (two chunks, past the cap of 16), then passes the rest on.
    let response = client.oneshot(streaming_post(chunks(3, 10))).await.unwrap();

    assert_eq!(response.status(), 503);
    assert!(!response.headers().contains_key(X_SHOULD_RETRY));
    let seen = log.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, Bytes::from(chunks(3, 10).concat()));
    assert_eq!(seen[0].header("idempotency-key"), None);
}

#[tokio::test(start_paused = true)]
async fn streamed_error_body_is_read_up_to_the_limit_and_the_rest_streams_on() {
    // 100 KiB in 16 KiB chunks: the engine reads four (64 KiB) and leaves the rest unread.
    let body_chunks = chunks(7, 16 * 1024);
    let total: Bytes = body_chunks.concat()[..100 * 1024].to_vec().into();
    let served = total.clone();
    let backend = tower::service_fn(move |_request: Request<Full<Bytes>>| {
        let served = served.clone();
        async move {
            let pieces = served.chunks(16 * 1024).map(Bytes::copy_from_slice);
            Ok::<_, BoxError>(
                Response::builder()
                    .status(529)
                    .body(Chunked::new(pieces.collect::<Vec<_>>()))?,
            )
        }
    });
    let classifier = Recording::default();
    let client = retries_only()
        .with_classifier(classifier.clone())
        .with_max_attempts(1)
        .layer(backend);

    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();

    assert_eq!(*classifier.bodies.lock().unwrap(), [64 * 1024]);
    assert!(response.body().was_read());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, total);
}

/// A service that insists on tower's contract: `call` only after `poll_ready` returned ready,
/// once per readiness. Readiness takes one extra poll, and clones start not ready.
struct Strict<S> {
    inner: S,
    polled_once: bool,
    ready: bool,
    violations: Arc<Mutex<u32>>,
}

impl<S: Clone> Clone for Strict<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            polled_once: false,
            ready: false,
            violations: Arc::clone(&self.violations),
        }
    }
}

impl<S, R> Service<R> for Strict<S>
where
    S: Service<R, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if !self.polled_once {
            self.polled_once = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = true;
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        if !self.ready {
            *self.violations.lock().unwrap() += 1;
        }
        self.ready = false;
        Box::pin(self.inner.call(request))
    }
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_sent_on_a_ready_service() {
    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |n, _| {
        Ok(if n < 2 { status(503) } else { status(200) })
    });
    let violations = Arc::new(Mutex::new(0));
    let strict = Strict {
        inner: backend,
        polled_once: false,
        ready: false,
        violations: Arc::clone(&violations),
    };
    let mut client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .layer(strict);

    for _ in 0..3 {
        let response = client
            .ready()
            .await
            .unwrap()
            .call(post(CHAT_URI, "{}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    // The first request took three attempts, the next two one each.
    assert_eq!(log.len(), 5);
    assert_eq!(*violations.lock().unwrap(), 0);
}
