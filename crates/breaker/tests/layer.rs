//! `BreakerLayer` around a tower service the tests control, on a paused clock: refusals answered
//! by the fallback or the error, outcomes recorded from responses and errors, a stall cutting a
//! call in flight, and calls dropped at every await counting for nothing.

#![allow(clippy::unwrap_used)]

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use stormguard_breaker::{
    BreakerConfig, BreakerLayer, BreakerOpen, BulkheadFull, CircuitBreaker, Fallback, OpenCause,
    Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{BoxError, Classify, LlmClassifier, LocalAnswer, Outcome, Reason};
use stormguard_test_kit::ScriptedBody;
use tokio_test::task::spawn;
use tokio_test::{assert_pending, assert_ready, assert_ready_err, assert_ready_ok};
use tower::{Layer, Service, ServiceExt};

type BackendBody = BoxBody<Bytes, std::io::Error>;

const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

/// OpenAI's rate limit: a 429 that a later request may pass.
const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o on requests per min (RPM)","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
/// OpenAI's answer when the servers are overloaded.
const OPENAI_OVERLOADED: &str = r#"{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}"#;

/// A backend whose answer the request's path picks, counting its calls and the calls dropped
/// before they were answered.
#[derive(Clone, Default)]
struct Backend {
    calls: Arc<AtomicU32>,
    dropped: Arc<AtomicU32>,
}

/// Counts one when the future holding it is dropped.
struct DropGuard(Arc<AtomicU32>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl Backend {
    fn service(
        &self,
    ) -> impl Service<
        Request<String>,
        Response = Response<BackendBody>,
        Error = std::io::Error,
        Future: Send,
    > + Clone {
        let backend = self.clone();
        tower::service_fn(move |request: Request<String>| {
            backend.calls.fetch_add(1, Ordering::Relaxed);
            let path = request.uri().path().to_owned();
            let guard = (path == "/hang").then(|| DropGuard(backend.dropped.clone()));
            async move {
                let _guard = guard;
                answer(&path).await
            }
        })
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }

    fn dropped(&self) -> u32 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The backend's answer to `path`.
async fn answer(path: &str) -> Result<Response<BackendBody>, std::io::Error> {
    let json = |status: u16, body: &'static str| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(
                Full::new(Bytes::from_static(body.as_bytes()))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()
    };
    Ok(match path {
        "/ok" => json(200, "generated"),
        "/unavailable" => json(503, OPENAI_OVERLOADED),
        "/unavailable-for-5-s" => {
            let mut response = json(503, OPENAI_OVERLOADED);
            response
                .headers_mut()
                .insert("retry-after", http::HeaderValue::from_static("5"));
            response
        }
        "/rate-limited" => json(429, OPENAI_RATE_LIMIT),
        "/bad-request" => json(400, "{}"),
        "/refused" => return Err(std::io::ErrorKind::ConnectionRefused.into()),
        "/timeout" => return Err(std::io::ErrorKind::TimedOut.into()),
        "/hang" => return std::future::pending().await,
        "/endless-503" => {
            let mut response = Response::new(ScriptedBody::hanging().boxed());
            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            response
        }
        _ => json(404, "{}"),
    })
}

fn request(path: &str) -> Request<String> {
    Request::builder().uri(path).body(String::new()).unwrap()
}

/// One call through `service`, once it is ready.
async fn call<S>(service: &mut S, path: &str) -> Result<S::Response, BoxError>
where
    S: Service<Request<String>, Error = BoxError>,
{
    service.ready().await?.call(request(path)).await
}

/// A fallback that answers 200 with the refusal's cause, whether the attempt was sent, and the
/// request's path, and the time to come back in a header.
fn fallback() -> Fallback {
    Fallback::new(|head, rejected| {
        let (what, retry_after) = match rejected {
            Rejected::Open(open) => (
                format!("{} sent={}", open.cause().as_str(), open.was_sent()),
                open.retry_after(),
            ),
            Rejected::Full(full) => (format!("full {}", full.max_in_flight()), Duration::ZERO),
        };
        Response::builder()
            .header("x-retry-after-ms", retry_after.as_millis().to_string())
            .body(Bytes::from(format!("degraded: {what} {}", head.uri.path())))
            .unwrap()
    })
}

async fn read_body<B>(body: B) -> Bytes
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    body.collect().await.unwrap().to_bytes()
}

/// A refused request is answered by the fallback on the first poll, without calling the
/// backend: the fallback's status, headers and body, a body `is_local`, and a `LocalAnswer`
/// saying why (final, not accepted, the time left as its hint). It counts for nothing.
#[tokio::test(start_paused = true)]
async fn a_refusal_is_answered_by_the_fallback_without_calling_the_backend() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(1));
    let backend = Backend::default();
    let mut service = BreakerLayer::new(breaker.clone())
        .with_fallback(fallback())
        .layer(backend.service());

    let response = call(&mut service, "/unavailable").await.unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.extensions().get::<LocalAnswer>().is_none());
    assert!(!response.body().is_local());
    assert_eq!(read_body(response.into_body()).await, OPENAI_OVERLOADED);
    let wait = breaker.snapshot().retry_after.unwrap();

    tokio::time::advance(Duration::from_millis(100)).await;
    service.ready().await.unwrap();
    let mut refused = spawn(service.call(request("/v1/chat/completions")));
    let response = assert_ready_ok!(refused.poll());
    assert_eq!(response.status(), 200);
    let left = wait - Duration::from_millis(100);
    assert_eq!(
        response.headers()["x-retry-after-ms"],
        left.as_millis().to_string()
    );
    let answer = response.extensions().get::<LocalAnswer>().unwrap();
    assert_eq!(
        answer.outcome(),
        Outcome::fatal(Reason::BreakerOpen)
            .with_accepted(false)
            .with_retry_after(Some(left))
    );
    assert!(response.body().is_local());
    assert_eq!(
        read_body(response.into_body()).await,
        "degraded: failures sent=false /v1/chat/completions"
    );
    assert_eq!(backend.calls(), 1);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (1, 0));
}

/// Without a fallback a refusal is the boxed `BreakerOpen`, which says when to come back and
/// which any classifier reads as final, without knowing the type.
#[tokio::test(start_paused = true)]
async fn without_a_fallback_a_refusal_is_the_boxed_breaker_open() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(2));
    let backend = Backend::default();
    let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
    call(&mut service, "/refused").await.unwrap_err();
    let wait = breaker.snapshot().retry_after.unwrap();

    let error = call(&mut service, "/ok").await.unwrap_err();
    assert!(error.is::<BreakerOpen>(), "{error}");
    let open = error.downcast_ref::<BreakerOpen>().unwrap();
    assert_eq!(open.retry_after(), wait);
    assert_eq!(open.cause(), OpenCause::Failures);
    assert!(!open.was_sent());
    let outcome = LlmClassifier::default().classify_error(&*error);
    assert_eq!(outcome.reason(), Reason::BreakerOpen);
    assert!(outcome.is_fatal() && !outcome.is_accepted());
    assert_eq!(outcome.retry_after(), Some(wait));
    assert_eq!(backend.calls(), 1);
}

/// A full bulkhead is answered like a refusal: the fallback with a `BulkheadFull` outcome, or the
/// boxed `BulkheadFull`; the backend is not called.
#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_is_answered_like_a_refusal() {
    for with_fallback in [true, false] {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_max_in_flight(Some(1)));
        let backend = Backend::default();
        let mut layer = BreakerLayer::new(breaker.clone());
        if with_fallback {
            layer = layer.with_fallback(fallback());
        }
        let mut service = layer.layer(backend.service());
        service.ready().await.unwrap();
        let mut hanging = spawn(service.call(request("/hang")));
        assert_pending!(hanging.poll());

        let outcome = match call(&mut service, "/ok").await {
            Ok(response) => {
                assert!(with_fallback);
                let outcome = response
                    .extensions()
                    .get::<LocalAnswer>()
                    .unwrap()
                    .outcome();
                assert_eq!(
                    read_body(response.into_body()).await,
                    "degraded: full 1 /ok"
                );
                outcome
            }
            Err(error) => {
                assert!(!with_fallback);
                assert!(error.is::<BulkheadFull>(), "{error}");
                LlmClassifier::default().classify_error(&*error)
            }
        };
        assert_eq!(outcome.reason(), Reason::BulkheadFull);
        assert!(outcome.is_fatal() && !outcome.is_accepted());
        assert_eq!(backend.calls(), 1);
        drop(hanging);
        assert_eq!(breaker.snapshot().in_flight, 0);
    }
}

/// Each call's outcome is recorded as the default classifier judges it: a 200, a 429 rate limit
/// and a 400 are calls but no health failures; a 503, a refused connection and a timeout are
/// health failures (the timeout is no answer). Responses reach the caller whole, errors
/// unchanged.
#[tokio::test(start_paused = true)]
async fn outcomes_are_recorded_from_responses_and_errors() {
    for (path, failure, answer) in [
        ("/ok", false, true),
        ("/rate-limited", false, true),
        ("/bad-request", false, true),
        ("/unavailable", true, true),
        ("/refused", true, true),
        ("/timeout", true, false),
    ] {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(3));
        let backend = Backend::default();
        let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
        match call(&mut service, path).await {
            Ok(response) => {
                let status = response.status();
                let body = read_body(response.into_body()).await;
                let expected = read_body(answer_body(path).await).await;
                assert_eq!(body, expected, "{path} {status}");
            }
            Err(error) => {
                let io = error.downcast_ref::<std::io::Error>().unwrap();
                assert!(path == "/refused" || path == "/timeout", "{path}: {io}");
            }
        }
        let snapshot = breaker.snapshot();
        assert_eq!(
            (
                snapshot.calls,
                snapshot.failures,
                snapshot.answers,
                snapshot.in_flight
            ),
            (1, u64::from(failure), u64::from(answer), 0),
            "{path}"
        );
    }
}

async fn answer_body(path: &str) -> BackendBody {
    answer(path).await.unwrap().into_body()
}

/// Through the layer, 20 503s open the breaker at the 20th (and the 21st call is refused), while
/// 100 rate-limited 429s never do; a 503 with `Retry-After: 5` opens it for 5 s (plus up to 25%).
#[tokio::test(start_paused = true)]
async fn server_failures_open_it_and_rate_limits_never_do() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(4));
    let backend = Backend::default();
    let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
    for _ in 0..100 {
        let response = call(&mut service, "/rate-limited").await.unwrap();
        assert_eq!(response.status(), 429);
    }
    assert_eq!(breaker.state(), State::Closed);

    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(4));
    let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
    for n in 1..=20 {
        assert_eq!(breaker.state(), State::Closed, "before call {n}");
        let response = call(&mut service, "/unavailable").await.unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(breaker.snapshot().cause, Some(OpenCause::Failures));
    assert!(
        call(&mut service, "/unavailable")
            .await
            .unwrap_err()
            .is::<BreakerOpen>()
    );
    assert_eq!(backend.calls(), 120);

    let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(4));
    let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
    call(&mut service, "/unavailable-for-5-s").await.unwrap();
    let wait = breaker.snapshot().retry_after.unwrap();
    assert!(
        wait >= Duration::from_secs(5) && wait < Duration::from_millis(6_250),
        "{wait:?}"
    );
}

/// Every service a layer wraps shares its breaker: 10 failures through each of two services open
/// it for both.
#[tokio::test(start_paused = true)]
async fn every_service_of_a_layer_shares_its_breaker() {
    let backend = Backend::default();
    let layer = BreakerLayer::new(CircuitBreaker::new(BreakerConfig::default().with_seed(5)));
    let mut services = [
        layer.layer(backend.service()),
        layer.layer(backend.service()),
    ];
    for service in &mut services {
        for _ in 0..10 {
            call(service, "/unavailable").await.unwrap();
        }
    }
    assert_eq!(layer.breaker().state(), State::Open);
    for service in &mut services {
        assert!(call(service, "/ok").await.unwrap_err().is::<BreakerOpen>());
    }
}

/// A stall cuts a call in flight through the layer: the task waiting on it is woken, the inner
/// call is dropped (the backend's future with it), and the caller gets the fallback's answer
/// (or, without one, the `BreakerOpen` error) saying the attempt was sent. Nothing is counted,
/// nothing is left in flight.
#[tokio::test(start_paused = true)]
async fn a_stall_cuts_a_call_in_flight() {
    for with_fallback in [true, false] {
        // One call in flight: one missed answer must be enough to count as a stall.
        let config = BreakerConfig::default().with_stall_detection(Duration::from_secs(2), 1.0);
        let breaker = CircuitBreaker::new(config.with_seed(6));
        let backend = Backend::default();
        let mut layer = BreakerLayer::new(breaker.clone());
        if with_fallback {
            layer = layer.with_fallback(fallback());
        }
        let mut service = layer.layer(backend.service());
        for _ in 0..1_000 {
            call(&mut service, "/ok").await.unwrap();
        }
        service.ready().await.unwrap();
        let mut hanging = spawn(service.call(request("/hang")));
        assert_pending!(hanging.poll());
        assert_eq!(breaker.snapshot().in_flight, 1);

        tokio::time::advance(Duration::from_millis(2_001)).await;
        // The next request's stall check opens the breaker; it is refused itself.
        let refused = call(&mut service, "/ok").await;
        assert_eq!(breaker.snapshot().cause, Some(OpenCause::Stall));
        assert!(hanging.is_woken());
        if with_fallback {
            let response = refused.unwrap();
            assert_eq!(
                read_body(response.into_body()).await,
                "degraded: stall sent=false /ok"
            );
            let response = assert_ready_ok!(hanging.poll());
            let answer = response.extensions().get::<LocalAnswer>().unwrap();
            assert_eq!(answer.outcome().reason(), Reason::BreakerOpen);
            assert!(response.body().is_local());
            assert_eq!(
                read_body(response.into_body()).await,
                "degraded: stall sent=true /hang"
            );
        } else {
            assert!(refused.unwrap_err().is::<BreakerOpen>());
            let error = assert_ready_err!(hanging.poll());
            let open = error.downcast_ref::<BreakerOpen>().unwrap();
            assert!(open.was_sent());
            assert_eq!(open.cause(), OpenCause::Stall);
        }
        assert_eq!(backend.dropped(), 1, "the inner call was dropped");
        assert_eq!(backend.calls(), 1_001);
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.calls, snapshot.in_flight), (1_000, 0));
    }
}

/// A stall cuts a call whose error body is being read to classify it, too (a 503 whose body
/// never ends): the stall's error, not a hang until the caller gives up.
#[tokio::test(start_paused = true)]
async fn a_stall_cuts_a_call_reading_its_error_body() {
    // One call in flight: one missed answer must be enough to count as a stall.
    let config = BreakerConfig::default().with_stall_detection(Duration::from_secs(2), 1.0);
    let breaker = CircuitBreaker::new(config.with_seed(8));
    let backend = Backend::default();
    let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
    for _ in 0..1_000 {
        call(&mut service, "/ok").await.unwrap();
    }
    service.ready().await.unwrap();
    let mut reading = spawn(service.call(request("/endless-503")));
    assert_pending!(reading.poll());
    assert_eq!(breaker.snapshot().in_flight, 1);

    tokio::time::advance(Duration::from_millis(2_001)).await;
    assert!(call(&mut service, "/ok").await.is_err());
    assert!(reading.is_woken());
    let error = assert_ready_err!(reading.poll());
    let open = error.downcast_ref::<BreakerOpen>().unwrap();
    assert!(open.was_sent());
    assert_eq!(open.cause(), OpenCause::Stall);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (1_000, 0));
}

/// A call dropped by its caller at any await (waiting for the backend, or reading a 503's error
/// body that never ends) counts for nothing, leaves nothing in flight and, half-open, frees its
/// probe slot without deciding anything.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_any_await_counts_for_nothing() {
    for half_open in [false, true] {
        for path in ["/hang", "/endless-503"] {
            let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(7));
            if half_open {
                for _ in 0..20 {
                    breaker
                        .try_acquire()
                        .unwrap()
                        .record(&UNAVAILABLE, &HeaderMap::new());
                }
                tokio::time::advance(breaker.snapshot().retry_after.unwrap()).await;
            }
            let before = breaker.snapshot();
            let backend = Backend::default();
            let mut service = BreakerLayer::new(breaker.clone()).layer(backend.service());
            service.ready().await.unwrap();
            let mut pending = spawn(service.call(request(path)));
            assert_pending!(pending.poll());
            assert_pending!(pending.poll());
            assert_eq!(backend.calls(), 1, "{path}: the backend was called");
            let snapshot = breaker.snapshot();
            assert_eq!(snapshot.in_flight, 1);
            assert_eq!(snapshot.probes, u32::from(half_open));

            drop(pending);
            let after = breaker.snapshot();
            assert_eq!((after.in_flight, after.probes), (0, 0), "{path}");
            assert_eq!(after.calls, before.calls, "{path}");
            assert_eq!(after.opened, before.opened, "{path}");
            assert_eq!(after.state, before.state, "{path}");
            assert_eq!(backend.dropped(), u32::from(path == "/hang"));
        }
    }
}

/// An inner service whose readiness the test sets: 0 pending, 1 ready, 2 failed.
#[derive(Clone)]
struct Gate(Arc<AtomicU32>);

impl Service<Request<String>> for Gate {
    type Response = Response<BackendBody>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<BackendBody>, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.0.load(Ordering::Relaxed) {
            0 => Poll::Pending,
            1 => Poll::Ready(Ok(())),
            _ => Poll::Ready(Err(std::io::Error::other("gate broken"))),
        }
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(
            Full::default().map_err(|never| match never {}).boxed(),
        )))
    }
}

/// `poll_ready` reports exactly what the inner service reports, and asks the breaker nothing.
#[tokio::test(start_paused = true)]
async fn poll_ready_passes_through() {
    let state = Arc::new(AtomicU32::new(0));
    let breaker = CircuitBreaker::default();
    let mut service = BreakerLayer::new(breaker.clone()).layer(Gate(state.clone()));
    assert_pending!(spawn(poll_fn(|cx| service.poll_ready(cx))).poll());
    state.store(1, Ordering::Relaxed);
    assert_ready!(spawn(poll_fn(|cx| service.poll_ready(cx))).poll()).unwrap();
    state.store(2, Ordering::Relaxed);
    let error = assert_ready_err!(spawn(poll_fn(|cx| service.poll_ready(cx))).poll());
    assert_eq!(error.to_string(), "gate broken");
    assert_eq!(service.get_ref().0.load(Ordering::Relaxed), 2);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (0, 0));
}
