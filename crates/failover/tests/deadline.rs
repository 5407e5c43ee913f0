//! A request its deadline cuts, on a paused clock: with a degraded answer set, the caller gets
//! that answer at the deadline, marked as degraded and saying why; without one, the deadline
//! error. Cut while an attempt is in flight on the primary, in flight on the backup it failed
//! over to, and while the next backend was not yet ready to take the request.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stormguard_breaker::{BreakerConfig, CircuitBreaker};
use stormguard_budget::RetryBudget;
use stormguard_classify::Reason;
use stormguard_classify::headers::{X_STORMGUARD_BACKEND, X_STORMGUARD_DEGRADED};
use stormguard_failover::{Adapter, Answered, Backend, Degraded, DegradedAnswer, Failover};
use stormguard_jitter::Constant;
use stormguard_retry::ClientLayer;
use tokio::time::{Instant, Sleep};
use tower::{Layer, ServiceExt};

const MS: Duration = Duration::from_millis(1);
const DEADLINE: Duration = Duration::from_secs(2);

/// How a provider answers: `Some((status, delay))`, or `None`: it never does.
type Script = Option<(u16, Duration)>;

/// The providers behind `primary.test` and `backup.test` as one service, counting the requests
/// each one got. Its `poll_ready` is pending until `ready_at` (a connection pool or a
/// concurrency limit with no slot free).
struct Providers {
    primary: Script,
    backup: Script,
    hits: Arc<Mutex<HashMap<String, u32>>>,
    ready_at: Option<Instant>,
    wait: Option<Pin<Box<Sleep>>>,
}

impl Providers {
    fn new(primary: Script, backup: Script) -> Self {
        Self {
            primary,
            backup,
            hits: Arc::default(),
            ready_at: None,
            wait: None,
        }
    }

    fn ready_at(mut self, at: Instant) -> Self {
        self.ready_at = Some(at);
        self
    }

    /// Requests received: (primary, backup).
    fn hits(&self) -> (u32, u32) {
        let hits = self.hits.lock().unwrap();
        let of = |host: &str| hits.get(host).copied().unwrap_or(0);
        (of("primary.test"), of("backup.test"))
    }
}

/// A clone shares the scripts and counts, and waits for readiness on its own timer.
impl Clone for Providers {
    fn clone(&self) -> Self {
        Self {
            hits: Arc::clone(&self.hits),
            wait: None,
            ..*self
        }
    }
}

impl tower::Service<Request<Full<Bytes>>> for Providers {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        let Some(at) = self.ready_at else {
            return Poll::Ready(Ok(()));
        };
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        wait.as_mut().poll(cx).map(Ok)
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let host = request.uri().host().unwrap_or_default().to_owned();
        let script = if host == "backup.test" {
            self.backup
        } else {
            self.primary
        };
        *self.hits.lock().unwrap().entry(host).or_default() += 1;
        Box::pin(async move {
            let Some((status, delay)) = script else {
                return std::future::pending().await;
            };
            tokio::time::sleep(delay).await;
            let response = Response::builder()
                .status(status)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            Ok(response)
        })
    }
}

fn request() -> Request<Full<Bytes>> {
    Request::post("http://primary.test/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))
        .unwrap()
}

/// The primary, whose breaker opens on its first failure: one 503 sends the request on.
fn quick_to_open_primary() -> Backend {
    Backend::new("primary").with_breaker(CircuitBreaker::new(
        BreakerConfig::default().with_consecutive_failures(Some(1)),
    ))
}

fn backup() -> Backend {
    Backend::new("backup")
        .with_adapter(Adapter::new().with_origin("http://backup.test".parse().unwrap()))
}

/// A failover from `primary` to the backup under a 2 s deadline, with the "busy" answer when
/// `degraded`.
fn failover(
    primary: Backend,
    degraded: bool,
) -> Failover<stormguard_classify::LlmClassifier, Constant> {
    let layer = ClientLayer::default()
        .with_budget(RetryBudget::default())
        .with_backoff(Constant::new(10 * MS))
        .with_timeout(DEADLINE)
        .without_throttle();
    let failover = Failover::new(layer)
        .with_backend(primary)
        .with_backend(backup());
    if !degraded {
        return failover;
    }
    // The body says why, to show what the answer was made from.
    failover.with_degraded(Degraded::new(|_head, why| {
        let body = format!("busy, try again ({})", why.reason().as_str());
        Response::builder()
            .status(200)
            .body(Bytes::from(body))
            .unwrap()
    }))
}

/// The elapsed paused time is the deadline, give or take the timer's millisecond.
fn assert_at_deadline(started: Instant) {
    let elapsed = started.elapsed();
    assert!(
        elapsed >= DEADLINE && elapsed <= DEADLINE + MS,
        "answered after {elapsed:?}, the deadline is {DEADLINE:?}"
    );
}

/// The degraded answer, marked as such and not as any backend's, made for a passed deadline.
async fn assert_degraded_for_deadline<B>(response: Response<B>)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[X_STORMGUARD_DEGRADED], "true");
    assert!(response.headers().get(X_STORMGUARD_BACKEND).is_none());
    assert!(response.extensions().get::<Answered>().is_none());
    let why = response
        .extensions()
        .get::<DegradedAnswer>()
        .expect("a degraded answer is marked with DegradedAnswer")
        .outcome();
    assert_eq!(why.reason(), Reason::DeadlineExceeded);
    assert!(!why.is_accepted());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"busy, try again (deadline_exceeded)");
}

#[tokio::test(start_paused = true)]
async fn a_request_cut_in_flight_on_the_primary_gets_the_degraded_answer_at_its_deadline() {
    let providers = Providers::new(None, Some((200, 5_000 * MS)));
    let client = failover(Backend::new("primary"), true).layer(providers.clone());
    let started = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    // The primary was cut in its first attempt; no time was left for anything else.
    assert_eq!(providers.hits(), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_request_cut_in_flight_on_the_backup_gets_the_degraded_answer_at_its_deadline() {
    let providers = Providers::new(Some((503, Duration::ZERO)), Some((200, 5_000 * MS)));
    let client = failover(quick_to_open_primary(), true).layer(providers.clone());
    let started = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    // The primary's 503 opened its breaker, the backup took the request and was cut at 2 s.
    assert_eq!(providers.hits(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_backend_is_not_ready_by_its_deadline_gets_the_degraded_answer() {
    let started = Instant::now();
    let providers = Providers::new(Some((200, Duration::ZERO)), Some((200, Duration::ZERO)))
        .ready_at(started + 5 * DEADLINE);
    let client = failover(Backend::new("primary"), true).layer(providers.clone());
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    assert_eq!(providers.hits(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn without_a_degraded_answer_a_request_cut_at_its_deadline_ends_with_the_deadline_error() {
    let providers = Providers::new(None, Some((200, 5_000 * MS)));
    let client = failover(Backend::new("primary"), false).layer(providers.clone());
    let started = Instant::now();
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(error.attempts(), 1);
    assert_eq!(error.to_string(), "deadline exceeded after 1 attempt");
    assert_eq!(providers.hits(), (1, 0));

    // Cut in flight on the backup, after the failover: the same error, two attempts sent.
    let providers = Providers::new(Some((503, Duration::ZERO)), Some((200, 5_000 * MS)));
    let client = failover(quick_to_open_primary(), false).layer(providers.clone());
    let started = Instant::now();
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(providers.hits(), (1, 1));

    // No backend ready by the deadline: the same error at the deadline, nothing sent.
    let started = Instant::now();
    let providers = Providers::new(Some((200, Duration::ZERO)), Some((200, Duration::ZERO)))
        .ready_at(started + 5 * DEADLINE);
    let client = failover(Backend::new("primary"), false).layer(providers.clone());
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(error.attempts(), 0);
    assert_eq!(providers.hits(), (0, 0));
}
