//! `AdaptiveThrottleLayer` around real tower services, on a paused clock.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use stormguard_adaptive_throttle::{
    AdaptiveThrottle, AdaptiveThrottleLayer, ThrottleConfig, Throttled,
};
use stormguard_classify::{
    BoxError, Classify, ERROR_BODY_LIMIT, LlmClassifier, MakeClassify, Outcome, Reason,
};
use stormguard_test_kit::ScriptedBody;
use tokio_test::{assert_pending, assert_ready, assert_ready_err, assert_ready_ok};
use tower::{Layer, Service, ServiceExt, service_fn};

mod support;
use support::answer;

const TICK: Duration = Duration::from_millis(1);

/// A backend that answers every request with `status` and counts the requests it saw.
fn backend(
    status: StatusCode,
    seen: Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    answering(status, "backend body", seen)
}

/// A backend that answers every request with `status` and `body` (labelled
/// `application/json`), and counts the requests it saw.
fn answering(
    status: StatusCode,
    body: &'static str,
    seen: Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    service_fn(move |_request: Request<String>| {
        seen.fetch_add(1, Ordering::Relaxed);
        async move {
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    })
}

/// The whole body of a response, as the caller reads it.
async fn read_body<B>(body: B) -> Bytes
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    body.collect().await.unwrap().to_bytes()
}

/// What a second of 1,000 requests per second through a service looked like.
#[derive(Debug, Default)]
struct Tally {
    responses: u32,
    throttled: u32,
    other_errors: u32,
}

async fn offer<S>(service: &mut S, requests: u32) -> Tally
where
    S: Service<Request<String>, Error = BoxError>,
{
    let mut tally = Tally::default();
    for _ in 0..requests {
        match service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
        {
            Ok(_) => tally.responses += 1,
            Err(error) if error.is::<Throttled>() => tally.throttled += 1,
            Err(_) => tally.other_errors += 1,
        }
        tokio::time::advance(TICK).await;
    }
    tally
}

/// Against a backend answering 503 to everything, local drops never reach it and, after the
/// first 2 s, under 10% of the offered requests do. Every drop is a `Throttled` error.
#[tokio::test(start_paused = true)]
async fn a_dead_backend_is_spared() {
    let seen = Arc::new(AtomicU32::new(0));
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(1));
    let mut service = AdaptiveThrottleLayer::new(throttle.clone())
        .layer(backend(StatusCode::SERVICE_UNAVAILABLE, seen.clone()));

    let first = offer(&mut service, 2_000).await;
    let later = offer(&mut service, 3_000).await;
    println!("first 2 s: {first:?}, next 3 s: {later:?}");
    for tally in [&first, &later] {
        assert_eq!(tally.other_errors, 0);
    }
    assert_eq!(
        seen.load(Ordering::Relaxed),
        first.responses + later.responses
    );
    assert!(later.responses < 300, "{later:?}");
    assert!(later.throttled > 2_700, "{later:?}");
    let snapshot = throttle.snapshot();
    assert_eq!(snapshot.accepts, 0);
    assert!((1_900..=2_000).contains(&snapshot.requests), "{snapshot:?}");
}

/// Accepted is the classifier's verdict, not success: a 400 is the caller's mistake, the backend
/// did the work, and nothing is dropped; a 429 rate limit is a rejection.
#[tokio::test(start_paused = true)]
async fn accepted_comes_from_the_classifier() {
    for (status, drops) in [
        (StatusCode::OK, false),
        (StatusCode::BAD_REQUEST, false),
        (StatusCode::NOT_FOUND, false),
        (StatusCode::TOO_MANY_REQUESTS, true),
        (StatusCode::INTERNAL_SERVER_ERROR, true),
    ] {
        let seen = Arc::new(AtomicU32::new(0));
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(2));
        let mut service = AdaptiveThrottleLayer::new(throttle.clone()).layer(backend(status, seen));
        let tally = offer(&mut service, 3_000).await;
        assert_eq!(tally.throttled > 0, drops, "{status}: {tally:?}");
        let accepted = LlmClassifier::default()
            .classify_http(
                &Response::builder()
                    .status(status)
                    .body(())
                    .unwrap()
                    .into_parts()
                    .0,
                &[],
            )
            .is_accepted();
        assert_eq!(accepted, !drops, "{status}");
    }
}

/// An error from the inner service is classified too (a refused connection is a rejection), and
/// handed back unchanged.
#[tokio::test(start_paused = true)]
async fn errors_are_classified_and_passed_through() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(3));
    let refused = service_fn(|_request: Request<String>| async {
        Err::<Response<Full<Bytes>>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let mut service = AdaptiveThrottleLayer::new(throttle.clone()).layer(refused);
    let mut refused_errors = 0;
    let mut throttled = 0;
    for _ in 0..3_000 {
        let error = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap_err();
        if error.is::<Throttled>() {
            throttled += 1;
        } else {
            let io = error.downcast_ref::<std::io::Error>().unwrap();
            assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
            refused_errors += 1;
        }
        tokio::time::advance(TICK).await;
    }
    assert!(throttled > 2_000, "{throttled}");
    assert!(refused_errors < 1_000, "{refused_errors}");
    assert_eq!(throttle.snapshot().accepts, 0);
}

/// A classifier that remembers the longest body it was shown.
#[derive(Clone, Default)]
struct BodyWatcher {
    longest_body: Arc<AtomicU64>,
    responses: Arc<AtomicU64>,
}

impl Classify for BodyWatcher {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        self.longest_body
            .fetch_max(body.len() as u64, Ordering::Relaxed);
        self.responses.fetch_add(1, Ordering::Relaxed);
        LlmClassifier::default().classify_http(parts, body)
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        LlmClassifier::default().classify_error(error)
    }
}

/// A success is classified from its head alone (an empty body), its body untouched; a failure
/// from its head and the start of its body (at most `ERROR_BODY_LIMIT` bytes). Either way the
/// caller reads the whole body, every byte as the backend sent it.
#[tokio::test(start_paused = true)]
async fn error_bodies_are_read_to_classify_and_handed_on_whole() {
    let long_error: &'static str = "x".repeat(100 * 1024).leak();
    for (status, body, read) in [
        (StatusCode::OK, "generated", 0),
        (StatusCode::BAD_GATEWAY, "backend body", 12),
        (StatusCode::BAD_GATEWAY, long_error, ERROR_BODY_LIMIT as u64),
    ] {
        let watcher = BodyWatcher::default();
        let seen = Arc::new(AtomicU32::new(0));
        let mut service = AdaptiveThrottleLayer::new(AdaptiveThrottle::default())
            .with_classifier(watcher.clone())
            .layer(answering(status, body, seen));
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        assert_eq!(response.body().was_read(), read > 0, "{status}");
        assert_eq!(read_body(response.into_body()).await, body.as_bytes());
        assert_eq!(watcher.responses.load(Ordering::Relaxed), 1);
        assert_eq!(
            watcher.longest_body.load(Ordering::Relaxed),
            read,
            "{status}"
        );
    }
}

/// OpenAI's answer when the account's quota is spent ("Error codes" page of the OpenAI API
/// reference): a 429, like a rate limit, but final.
const OPENAI_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

/// OpenAI's rate limit: a 429 that a later request may pass.
const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;

/// The layer judges a response by its error body, as the retry engine does: a 429 whose body says
/// `insufficient_quota` is an accept (the backend answered: the quota is spent, and throttling
/// would only hide that answer behind local drops), a 429 rate limit is a rejection. The caller
/// reads the body the backend sent.
#[tokio::test(start_paused = true)]
async fn a_quota_429_is_an_accept_and_a_rate_limit_429_is_not() {
    for (body, accepted) in [(OPENAI_QUOTA, true), (OPENAI_RATE_LIMIT, false)] {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(10));
        let seen = Arc::new(AtomicU32::new(0));
        let mut service = AdaptiveThrottleLayer::new(throttle.clone()).layer(answering(
            StatusCode::TOO_MANY_REQUESTS,
            body,
            seen.clone(),
        ));

        // One call: one request, accepted or not.
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(read_body(response.into_body()).await, body.as_bytes());
        let snapshot = throttle.snapshot();
        assert_eq!(
            (snapshot.requests, snapshot.accepts),
            (1, u64::from(accepted)),
            "{body}"
        );

        // Three seconds at 1,000 requests per second: quota answers are never throttled, rate
        // limits are.
        let tally = offer(&mut service, 3_000).await;
        assert_eq!(tally.other_errors, 0);
        if accepted {
            assert_eq!((tally.responses, tally.throttled), (3_000, 0));
            let snapshot = throttle.snapshot();
            assert_eq!(snapshot.requests, snapshot.accepts);
            assert_eq!(snapshot.probability, 0.0);
        } else {
            assert!(tally.throttled > 2_000, "{tally:?}");
            assert_eq!(throttle.snapshot().accepts, 0);
        }
        assert_eq!(seen.load(Ordering::Relaxed), 1 + tally.responses);
    }
}

/// Counts every answer as accepted.
#[derive(Clone, Copy)]
struct Lenient;

impl Classify for Lenient {
    fn classify_http(&self, _parts: &http::response::Parts, _body: &[u8]) -> Outcome {
        Outcome::success()
    }

    fn classify_error(&self, _error: &(dyn std::error::Error + 'static)) -> Outcome {
        Outcome::success()
    }
}

/// Lenient for `/batch` (where 503 means "queued, come back later"), the LLM classifier elsewhere.
#[derive(Clone, Copy)]
struct ByPath;

#[derive(Clone)]
enum Picked {
    Lenient(Lenient),
    Llm(LlmClassifier),
}

impl Classify for Picked {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        match self {
            Self::Lenient(c) => c.classify_http(parts, body),
            Self::Llm(c) => c.classify_http(parts, body),
        }
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        match self {
            Self::Lenient(c) => c.classify_error(error),
            Self::Llm(c) => c.classify_error(error),
        }
    }
}

impl MakeClassify for ByPath {
    type Classifier = Picked;

    fn make_classifier<B>(&self, request: &Request<B>) -> Picked {
        if request.uri().path() == "/batch" {
            Picked::Lenient(Lenient)
        } else {
            Picked::Llm(LlmClassifier::default())
        }
    }
}

/// The classifier can be picked per request: the same 503s are accepts on `/batch` and
/// rejections elsewhere.
#[tokio::test(start_paused = true)]
async fn the_classifier_can_be_picked_per_request() {
    for (path, accepted) in [("/batch", true), ("/v1/chat/completions", false)] {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(6));
        let seen = Arc::new(AtomicU32::new(0));
        let mut service = AdaptiveThrottleLayer::new(throttle.clone())
            .with_classifier(ByPath)
            .layer(backend(StatusCode::SERVICE_UNAVAILABLE, seen));
        for _ in 0..100 {
            let request = Request::builder().uri(path).body(String::new()).unwrap();
            let _ = service.ready().await.unwrap().call(request).await;
            tokio::time::advance(TICK).await;
        }
        let snapshot = throttle.snapshot();
        assert_eq!(
            snapshot.accepts == snapshot.requests,
            accepted,
            "{path}: {snapshot:?}"
        );
    }
}

/// A drop resolves on its first poll, without calling the inner service.
#[tokio::test(start_paused = true)]
async fn a_drop_never_reaches_the_backend() {
    let throttle = AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_max_probability(1.0)
            .with_seed(4),
    );
    // 100,000 failures in the window: P_drop = 100000 / 100001.
    for _ in 0..100_000 {
        if let Ok(permit) = throttle.try_acquire() {
            answer(permit, false);
        }
    }
    let seen = Arc::new(AtomicU32::new(0));
    let mut service =
        AdaptiveThrottleLayer::new(throttle.clone()).layer(backend(StatusCode::OK, seen.clone()));
    for _ in 0..100 {
        assert_ready_ok!(tokio_test::task::spawn(poll_fn(|cx| service.poll_ready(cx))).poll());
        let mut call = tokio_test::task::spawn(service.call(Request::new(String::new())));
        let error = assert_ready_err!(call.poll());
        assert!(error.is::<Throttled>(), "{error}");
        assert_eq!(
            error.to_string(),
            "request throttled locally: backend is rejecting"
        );
        // Any classifier tells what it is without knowing the type: final, never sent.
        let outcome = LlmClassifier::default().classify_error(&*error);
        assert_eq!(outcome.reason(), Reason::Throttled);
        assert!(outcome.is_fatal() && !outcome.is_accepted());
    }
    assert_eq!(seen.load(Ordering::Relaxed), 0);
    assert!(throttle.snapshot().requests >= 100_100);
}

/// A call dropped before the backend answers (a deadline ran out) counts as a request that was
/// not accepted: a backend that hangs must not look healthy.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_before_it_answers_counts_as_not_accepted() {
    let throttle = AdaptiveThrottle::default();
    let hanging = service_fn(|_request: Request<String>| {
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    });
    let mut service = AdaptiveThrottleLayer::new(throttle.clone()).layer(hanging);
    let mut call = tokio_test::task::spawn(service.call(Request::new(String::new())));
    assert_pending!(call.poll());
    assert_eq!(
        throttle.snapshot().requests,
        0,
        "in flight: not counted yet"
    );
    drop(call);
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 0));
}

/// A call dropped while its error body is being read (the backend sent a 503 head, then nothing)
/// counts once, as a request that was not accepted.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_error_body_is_read_counts_as_not_accepted() {
    let throttle = AdaptiveThrottle::default();
    let seen = Arc::new(AtomicU32::new(0));
    let stalled = service_fn({
        let seen = seen.clone();
        move |_request: Request<String>| {
            seen.fetch_add(1, Ordering::Relaxed);
            async {
                let mut response = Response::new(ScriptedBody::hanging());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, Infallible>(response)
            }
        }
    });
    let mut service = AdaptiveThrottleLayer::new(throttle.clone()).layer(stalled);
    let mut call = tokio_test::task::spawn(service.call(Request::new(String::new())));
    assert_pending!(call.poll());
    assert_pending!(call.poll());
    assert_eq!(seen.load(Ordering::Relaxed), 1, "the backend answered");
    assert_eq!(throttle.snapshot().requests, 0, "not classified yet");
    drop(call);
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 0));
}

/// Answers that take 5 s (a long generation) do not look like rejections: a client sending 100
/// requests per second for 30 s, with up to 500 in flight, never drops one.
#[tokio::test(start_paused = true)]
async fn slow_answers_do_not_look_like_rejections() {
    let throttle = AdaptiveThrottle::default();
    let slow = service_fn(|_request: Request<String>| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"generated"))))
    });
    let service = AdaptiveThrottleLayer::new(throttle.clone()).layer(slow);
    let mut calls = Vec::new();
    for _ in 0..3_000 {
        calls.push(tokio::spawn(
            service.clone().oneshot(Request::new(String::new())),
        ));
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let mut throttled = 0;
    for call in calls {
        if call.await.unwrap().is_err() {
            throttled += 1;
        }
    }
    assert_eq!(throttled, 0);
    let snapshot = throttle.snapshot();
    assert_eq!(snapshot.requests, snapshot.accepts);
}

/// An inner service whose readiness the test controls: 0 pending, 1 ready, 2 failed.
#[derive(Clone)]
struct Gate(Arc<AtomicU32>);

impl Service<Request<String>> for Gate {
    type Response = Response<Full<Bytes>>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<Full<Bytes>>, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.0.load(Ordering::Relaxed) {
            0 => Poll::Pending,
            1 => Poll::Ready(Ok(())),
            _ => Poll::Ready(Err(std::io::Error::other("gate broken"))),
        }
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::default())))
    }
}

/// `poll_ready` reports exactly what the inner service reports.
#[tokio::test(start_paused = true)]
async fn poll_ready_passes_through() {
    let state = Arc::new(AtomicU32::new(0));
    let mut service = AdaptiveThrottleLayer::default().layer(Gate(state.clone()));
    assert_pending!(tokio_test::task::spawn(poll_fn(|cx| service.poll_ready(cx))).poll());
    state.store(1, Ordering::Relaxed);
    assert_ready!(tokio_test::task::spawn(poll_fn(|cx| service.poll_ready(cx))).poll()).unwrap();
    state.store(2, Ordering::Relaxed);
    let error =
        assert_ready_err!(tokio_test::task::spawn(poll_fn(|cx| service.poll_ready(cx))).poll());
    assert_eq!(error.to_string(), "gate broken");
    assert_eq!(service.get_ref().0.load(Ordering::Relaxed), 2);
}
