//! Cancellation: a caller may drop the response future of the client pipeline at any point (a
//! timeout above it, a closed connection, `select!`). Wherever it is dropped (buffering the request
//! body, waiting for an attempt, reading an error body, backing off) nothing leaks: every clone of
//! the backend, its in-flight futures and bodies are released, no task is left running, and the
//! shared budget and throttle hold exactly the events that happened before the drop (a retry
//! withdrawn but not yet sent is given back).
//!
//! The scenario, polled step by step with `tokio_test::task::spawn` on a paused clock: a POST
//! whose body arrives in two chunks; attempt 1 answers 503 with an error body in two chunks; a
//! 100 ms backoff; attempt 2 answers 200. Each `Pending` on the way is a point to drop at.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use stormguard::ClientLayer;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::jitter::Constant;
use stormguard::retry::ReplayBody;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_classify::body::PartialBody;
use stormguard_test_kit::ScriptedBody;
use tower::{Layer, Service, ServiceExt, service_fn};

/// Held by the backend, every future it returns and every body it hands out or is handed: its
/// strong count says how many of them are still alive.
#[derive(Debug)]
struct Marker;

/// The kit's scripted body holding a marker, replayable by the engine (`ReplayBody` is the
/// engine's trait, so the body that carries it is this crate's).
#[derive(Debug)]
enum Gated {
    Script(ScriptedBody),
    Partial(Box<PartialBody<Gated>>),
}

impl Gated {
    /// `body`, holding `marker` while it lives.
    fn new(body: ScriptedBody, marker: &Arc<Marker>) -> Self {
        Self::Script(body.holding(marker))
    }

    /// A body that has ended.
    fn ended() -> Self {
        Self::Script(ScriptedBody::new())
    }
}

impl Body for Gated {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Self::Script(body) => Pin::new(body).poll_frame(cx),
            Self::Partial(partial) => Pin::new(partial.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Script(body) => body.is_end_stream(),
            Self::Partial(partial) => partial.is_end_stream(),
        }
    }
}

impl ReplayBody for Gated {
    fn from_bytes(bytes: Bytes) -> Self {
        Self::Script(ScriptedBody::from(bytes))
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        Self::Partial(Box::new(partial))
    }
}

/// Pending once (waking the task at once), then ready: one drop point inside an attempt.
#[derive(Default)]
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The backend: attempt 1 answers 503 with a two-chunk JSON error body, later attempts 200.
/// Every attempt is pending once before answering.
fn backend(
    marker: Arc<Marker>,
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<Gated>, Response = Response<Gated>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(move |_request: Request<Gated>| {
        let marker = marker.clone();
        let attempt = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            YieldOnce::default().await;
            let response = if attempt == 0 {
                let body = Gated::new(
                    ScriptedBody::new()
                        .data(r#"{"error":{"type":"overloaded_error","#)
                        .yield_once()
                        .data(r#""message":"Overloaded"}}"#),
                    &marker,
                );
                Response::builder().status(503).body(body).unwrap()
            } else {
                Response::new(Gated::new(ScriptedBody::new().data("ok"), &marker))
            };
            Ok(response)
        }
    })
}

/// K = 2 over a 60 s window (longer than any test here, so that counts do not age out), with the
/// default minimum rate.
fn window_of_a_minute() -> ThrottleConfig {
    ThrottleConfig::default()
        .with_k(2.0)
        .with_window(Duration::from_secs(60))
}

/// The counts the shared state and the backend hold after the drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    calls: usize,
    throttle_requests: u64,
    throttle_accepts: u64,
    withdrawals: u64,
    deposits: u64,
}

/// Drops the response future at its `stop`-th pending point (or lets it finish when there are
/// fewer), then checks that nothing is left behind. Returns the counts and where it stopped.
async fn drop_at(stop: usize) -> (Counts, Option<&'static str>) {
    let marker = Arc::new(Marker);
    let calls = Arc::new(AtomicUsize::new(0));
    let budget = RetryBudget::new(BudgetConfig::default());
    // A 60 s window and the default minimum rate: the throttle counts but never drops here.
    let throttle = AdaptiveThrottle::new(window_of_a_minute());
    let layer = ClientLayer::default()
        .with_budget(budget.clone())
        .with_throttle(throttle.clone())
        .with_backoff(Constant::new(Duration::from_millis(100)));
    let mut client = layer.layer(backend(marker.clone(), calls.clone()));
    let baseline = Arc::strong_count(&marker);

    let body = Gated::new(
        ScriptedBody::new()
            .data(r#"{"model":"m","#)
            .yield_once()
            .data(r#""max_tokens":5}"#),
        &marker,
    );
    let request = Request::post("http://llm.test/v1/messages")
        .body(body)
        .unwrap();
    client.ready().await.unwrap();
    let mut task = tokio_test::task::spawn(client.call(request));
    let mut pending = 0;
    let stopped = loop {
        match task.poll() {
            Poll::Ready(result) => {
                let response = result.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                drop((response, task));
                break None;
            }
            Poll::Pending if pending == stop => {
                let at = STAGES[stop];
                drop(task);
                break Some(at);
            }
            Poll::Pending => {
                pending += 1;
                tokio::time::advance(Duration::from_millis(150)).await;
            }
        }
    };

    assert_eq!(
        Arc::strong_count(&marker),
        baseline,
        "a backend future or body outlived the drop at {stopped:?}"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0,
        "a task was left behind at {stopped:?}"
    );
    drop(client);
    assert_eq!(Arc::strong_count(&marker), 1);

    let throttled = throttle.snapshot();
    let spent = budget.snapshot();
    let counts = Counts {
        calls: calls.load(Ordering::SeqCst),
        throttle_requests: throttled.requests,
        throttle_accepts: throttled.accepts,
        withdrawals: spent.withdrawals,
        deposits: spent.deposits,
    };
    (counts, stopped)
}

/// The pending points of the scenario, in order.
const STAGES: [&str; 5] = [
    "buffering the request body",
    "waiting for attempt 1",
    "reading the 503 error body",
    "backing off",
    "waiting for attempt 2",
];

const fn counts(
    calls: usize,
    throttle_requests: u64,
    throttle_accepts: u64,
    withdrawals: u64,
    deposits: u64,
) -> Counts {
    Counts {
        calls,
        throttle_requests,
        throttle_accepts,
        withdrawals,
        deposits,
    }
}

/// What each drop point leaves in the shared state:
/// - buffering the body: nothing was sent, nothing counted;
/// - during attempt 1: the attempt counts as a request the backend did not accept (a call dropped
///   unfinished is recorded as not accepted: a hanging backend must not look healthy);
/// - reading the error body: the 503 head was recorded (not accepted), the response is not yet
///   classified, so no retry was withdrawn;
/// - backing off: the retry was withdrawn when it was scheduled and is given back: it was never
///   sent;
/// - during attempt 2: two requests, neither accepted (the second was dropped), one withdrawal;
/// - not dropped: the 200 is accepted and deposits into the budget.
#[tokio::test(start_paused = true)]
async fn dropping_at_every_pending_point_leaks_nothing_and_counts_exactly() {
    let expected = [
        counts(0, 0, 0, 0, 0),
        counts(1, 1, 0, 0, 0),
        counts(1, 1, 0, 0, 0),
        counts(1, 1, 0, 0, 0),
        counts(2, 2, 0, 1, 0),
    ];
    for (stop, expected) in expected.iter().enumerate() {
        let (counts, stopped) = drop_at(stop).await;
        assert_eq!(
            stopped,
            Some(STAGES[stop]),
            "fewer pending points than stages"
        );
        assert_eq!(counts, *expected, "dropped {}", STAGES[stop]);
    }
    // Run to completion: exactly the pending points above, then the success.
    let (counts, stopped) = drop_at(STAGES.len()).await;
    assert_eq!(stopped, None, "more pending points than stages");
    assert_eq!(counts, self::counts(2, 2, 1, 1, 1));
}

/// A caller's own timeout around the pipeline is just another drop: a backend that never answers
/// is abandoned at the caller's deadline, its future released, and the attempt counted once as
/// not accepted; nothing is retried behind the caller's back.
#[tokio::test(start_paused = true)]
async fn a_caller_timeout_releases_a_hanging_attempt() {
    let marker = Arc::new(Marker);
    let calls = Arc::new(AtomicUsize::new(0));
    let budget = RetryBudget::new(BudgetConfig::default());
    let throttle = AdaptiveThrottle::new(window_of_a_minute());
    let hanging = {
        let (marker, calls) = (marker.clone(), calls.clone());
        service_fn(move |_request: Request<Gated>| {
            let marker = marker.clone();
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                std::future::pending::<()>().await;
                drop(marker);
                Ok::<_, Infallible>(Response::new(Gated::ended()))
            }
        })
    };
    let client = ClientLayer::default()
        .with_budget(budget.clone())
        .with_throttle(throttle.clone())
        .layer(hanging);
    let request = Request::get("http://llm.test/v1/models")
        .body(Gated::ended())
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), client.oneshot(request)).await;
    assert!(outcome.is_err(), "the caller's timeout fires first");
    assert_eq!(
        Arc::strong_count(&marker),
        1,
        "the service and its call were released"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let throttled = throttle.snapshot();
    assert_eq!((throttled.requests, throttled.accepts), (1, 0));
    let spent = budget.snapshot();
    assert_eq!((spent.withdrawals, spent.deposits), (0, 0));
    // Later, nothing else happens: no retry was left scheduled.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
