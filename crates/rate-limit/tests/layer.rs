//! `RateLimitLayer` around a tower service the tests control, on tokio's paused clock: calls
//! paced, refusals as errors answered 429, answers teaching the limit, and the response future
//! dropped at each await: while waiting for its slot (given back) and while the call is in
//! flight (spent).

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use stormguard_classify::{BoxError, error_response};
use stormguard_deadline::Deadline;
use stormguard_rate_limit::{
    RateLimit, RateLimitCause, RateLimitConfig, RateLimitLayer, RateLimited,
};
use tokio::time::Instant;
use tokio_test::task::spawn;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Layer, Service, ServiceExt};

const MS: Duration = Duration::from_millis(1);

/// A backend that records when each call reached it and answers the status (and headers) the
/// request's path names: `/200`, `/429?retry-after=2`, `/limit?60` (200 stating 60 requests a
/// minute); `/hang` never answers.
#[derive(Clone, Default)]
struct Backend {
    calls: Arc<Mutex<Vec<Instant>>>,
}

impl Backend {
    fn service(
        &self,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + use<> {
        let calls = Arc::clone(&self.calls);
        tower::service_fn(move |request: Request<()>| {
            calls.lock().unwrap().push(Instant::now());
            let uri = request.uri().clone();
            async move {
                let mut response = Response::builder();
                match (uri.path(), uri.query()) {
                    ("/hang", _) => std::future::pending::<()>().await,
                    ("/429", Some(query)) => {
                        let after = query.trim_start_matches("retry-after=");
                        response = response.status(429).header("retry-after", after);
                    }
                    ("/limit", Some(limit)) => {
                        response = response.header("x-ratelimit-limit-requests", limit);
                    }
                    _ => {}
                }
                Ok(response.body(()).unwrap())
            }
        })
    }

    fn calls(&self) -> Vec<Duration> {
        let calls = self.calls.lock().unwrap();
        let Some(first) = calls.first() else {
            return Vec::new();
        };
        calls.iter().map(|at| *at - *first).collect()
    }
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

fn per_minute(requests: u32) -> RateLimit {
    RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(requests)))
}

/// The refusal behind an error of the layer.
fn limited(error: &BoxError) -> &RateLimited {
    error.downcast_ref::<RateLimited>().unwrap()
}

/// 120 a minute: three calls in one instant reach the backend at 0, 0 and 500 ms.
#[tokio::test(start_paused = true)]
async fn calls_are_paced() {
    let backend = Backend::default();
    let service = RateLimitLayer::new(per_minute(120)).layer(backend.service());
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(service.clone().oneshot(get("/200"))))
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(backend.calls(), [0, 0, 500].map(|ms| ms * MS));
}

/// A call whose slot is more than 2 s away fails at once, unsent, with a `RateLimited` that a
/// gateway answers with 429, `Retry-After` and `x-should-retry: false`.
#[tokio::test(start_paused = true)]
async fn a_refusal_fails_at_once_and_is_answered_429() {
    let backend = Backend::default();
    let mut service = RateLimitLayer::new(per_minute(60)).layer(backend.service());
    // Slots now, at 1 s and at 2 s.
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(spawn(service.ready().await.unwrap().call(get("/200"))));
    }
    let before = Instant::now();
    let error = service.clone().oneshot(get("/200")).await.unwrap_err();
    assert_eq!(Instant::now(), before, "refused without waiting");
    assert_eq!(limited(&error).cause(), RateLimitCause::Wait);
    assert_eq!(limited(&error).retry_after(), Duration::from_secs(3));
    let response: Response<()> = error_response(&*error, false);
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(response.headers()["x-should-retry"], "false");
    for call in &mut waiting {
        call.await.unwrap();
    }
    assert_eq!(backend.calls(), [0, 1_000, 2_000].map(|ms| ms * MS));
}

/// The request's deadline bounds its wait: with the next slot 1 s away, a request due in
/// 500 ms is refused.
#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait() {
    let backend = Backend::default();
    let service = RateLimitLayer::new(per_minute(60)).layer(backend.service());
    service.clone().oneshot(get("/200")).await.unwrap();
    let mut request = get("/200");
    Deadline::after(500 * MS).apply_to_extensions(request.extensions_mut());
    let error = service.clone().oneshot(request).await.unwrap_err();
    assert_eq!(limited(&error).retry_after(), Duration::from_secs(1));
    assert_eq!(backend.calls().len(), 1);
}

/// A call whose slot is free now reaches the backend at its first poll, without a timer. (On
/// the real clock: a paused one would hide the millisecond a timer rounds up to.)
#[tokio::test]
async fn a_free_slot_calls_the_backend_at_the_first_poll() {
    let backend = Backend::default();
    let mut service = RateLimitLayer::new(per_minute(60)).layer(backend.service());
    let mut call = spawn(service.ready().await.unwrap().call(get("/200")));
    assert_ready_ok!(call.poll());
    assert_eq!(backend.calls().len(), 1);
}

/// Answers teach the limit: a 200 stating 60 requests a minute paces the calls after it at
/// one a second; a 429 with `retry-after: 2` holds the next call for 2 s.
#[tokio::test(start_paused = true)]
async fn answers_teach_the_limit() {
    let backend = Backend::default();
    let service = RateLimitLayer::new(RateLimit::default()).layer(backend.service());
    service.clone().oneshot(get("/limit?60")).await.unwrap();
    let response = service.clone().oneshot(get("/429?retry-after=2")).await;
    assert_eq!(response.unwrap().status(), 429);
    service.clone().oneshot(get("/200")).await.unwrap();
    // The first call went before any limit was known: it took nothing from the bucket.
    assert_eq!(backend.calls(), [0, 0, 2_000].map(|ms| ms * MS));
}

/// `with_weight` weighs each request in tokens from its head.
#[tokio::test(start_paused = true)]
async fn requests_are_weighed_by_the_weight_function() {
    let backend = Backend::default();
    let limit = RateLimit::new(RateLimitConfig::default().with_tokens_per_minute(Some(6_000)));
    let service = RateLimitLayer::new(limit)
        .with_weight(|head| {
            head.headers
                .get("x-tokens")
                .and_then(|value| value.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        })
        .layer(backend.service());
    for tokens in ["100", "50", "20"] {
        let request = Request::get("/200").header("x-tokens", tokens).body(());
        service.clone().oneshot(request.unwrap()).await.unwrap();
    }
    assert_eq!(backend.calls(), [0, 500, 700].map(|ms| ms * MS));
}

/// Dropping the response future while it waits for its slot gives the slot back: the bucket
/// is whole again when it would have been without it, and the next call waits less.
#[tokio::test(start_paused = true)]
async fn dropped_while_waiting_the_slot_is_given_back() {
    let backend = Backend::default();
    let limit = per_minute(60);
    let mut service = RateLimitLayer::new(limit.clone()).layer(backend.service());
    service.clone().oneshot(get("/200")).await.unwrap();
    let mut waiting = spawn(service.ready().await.unwrap().call(get("/200")));
    assert_pending!(waiting.poll());
    tokio::time::advance(500 * MS).await;
    assert_pending!(waiting.poll());
    drop(waiting);
    assert_eq!(backend.calls().len(), 1);
    tokio::time::advance(500 * MS).await;
    assert_eq!(limit.snapshot().requests_available, Some(1));
    let before = Instant::now();
    service.clone().oneshot(get("/200")).await.unwrap();
    assert_eq!(Instant::now(), before, "the slot at 1 s was free again");
}

/// Dropping the response future while the backend has the call keeps the slot spent: the
/// request reached the provider.
#[tokio::test(start_paused = true)]
async fn dropped_while_calling_the_slot_stays_spent() {
    let backend = Backend::default();
    let limit = per_minute(60);
    let mut service = RateLimitLayer::new(limit.clone()).layer(backend.service());
    let mut calling = spawn(service.ready().await.unwrap().call(get("/hang")));
    assert_pending!(calling.poll());
    assert_eq!(backend.calls().len(), 1);
    drop(calling);
    assert_eq!(limit.snapshot().requests_available, Some(0));
    let before = Instant::now();
    service.clone().oneshot(get("/200")).await.unwrap();
    assert_eq!(Instant::now() - before, Duration::from_secs(1));
}
