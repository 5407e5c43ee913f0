//! The circuit breaker inside the engine (`ClientLayer::with_breaker` and `with_fallback`),
//! against backends the tests control, on tokio's paused clock.

#![allow(clippy::unwrap_used)]

mod support;

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Uri};
use http_body_util::Full;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_breaker::{
    BreakerConfig, BreakerOpen, BulkheadFull, CircuitBreaker, Fallback, OpenCause, Rejected, State,
};
use stormguard_budget::RetryBudget;
use stormguard_classify::Permit;
use stormguard_classify::headers::X_SHOULD_RETRY;
use stormguard_classify::{BoxError, LocalAnswer, Outcome, Reason};
use stormguard_jitter::Constant;
use stormguard_retry::ClientLayer;
use stormguard_test_kit::post;
use support::{CHAT_URI, Chunked, Reply, body_bytes, get, instant, reply, status};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}"#;

/// What the tests' fallback answers with.
const DEGRADED: &str = r#"{"choices":[],"degraded":true}"#;

/// Long enough to stand for "never" in a test.
const A_YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// The default breaker settings, with the open waits' jitter replayed on every run.
fn seeded() -> BreakerConfig {
    BreakerConfig::default().with_seed(7)
}

/// A breaker that calls a silence of more than 1 s a stall once it has seen 10 answers in its
/// 10 s window (one answer missed is enough: these tests hold a single attempt in flight, where
/// by default 20 must be).
fn quick_to_stall() -> CircuitBreaker {
    CircuitBreaker::new(seeded().with_stall_detection(Duration::from_secs(1), 1.0))
}

/// Opens `breaker` by recording as many health failures as it needs calls.
fn open(breaker: &CircuitBreaker) {
    let failure = Outcome::retryable(Reason::Unavailable).with_accepted(false);
    for _ in 0..breaker.config().min_calls() {
        breaker
            .try_acquire()
            .unwrap()
            .record(&failure, &HeaderMap::new());
    }
    assert_eq!(breaker.state(), State::Open);
}

/// A backend that answers 200 after `latency`, except that an answer due while it is dark never
/// comes (the provider drops every packet). It records when each call arrived.
#[derive(Clone)]
struct Provider {
    latency: Duration,
    dark: Arc<Mutex<Option<Range<Instant>>>>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Provider {
    fn new(latency: Duration) -> Self {
        Self {
            latency,
            dark: Arc::default(),
            arrivals: Arc::default(),
        }
    }

    /// Answers due within `hole` never come.
    fn go_dark(&self, hole: Range<Instant>) {
        *self.dark.lock().unwrap() = Some(hole);
    }

    fn calls(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }

    /// Calls that arrived within `span`.
    fn calls_during(&self, span: Range<Instant>) -> usize {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals.iter().filter(|at| span.contains(at)).count()
    }

    fn service<B: Send + 'static>(
        &self,
    ) -> impl Service<Request<B>, Response = Reply, Error = BoxError, Future: Send> + Clone + Send + use<B>
    {
        let provider = self.clone();
        tower::service_fn(move |_request: Request<B>| {
            let provider = provider.clone();
            async move {
                let now = Instant::now();
                provider.arrivals.lock().unwrap().push(now);
                let due = now + provider.latency;
                let dark = provider.dark.lock().unwrap().clone();
                if dark.is_some_and(|hole| hole.contains(&due)) {
                    std::future::pending::<()>().await;
                }
                if !provider.latency.is_zero() {
                    tokio::time::sleep_until(due).await;
                }
                Ok(status(200))
            }
        })
    }
}

/// What a fallback was asked to answer: the request's head, and why it was not let through.
#[derive(Clone, Debug)]
struct Asked {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    rejected: Rejected,
}

/// A fallback that answers 200 with [`DEGRADED`], says in `x-fallback` whether the attempt was
/// cut in flight, refused before it was sent, or kept out by the bulkhead, and records what it
/// was asked.
fn fallback() -> (Fallback, Arc<Mutex<Vec<Asked>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let fallback = Fallback::new(move |head, rejected| {
        log.lock().unwrap().push(Asked {
            method: head.method.clone(),
            uri: head.uri.clone(),
            headers: head.headers.clone(),
            rejected: rejected.clone(),
        });
        let why = match rejected {
            Rejected::Open(open) if open.was_sent() => "cut",
            Rejected::Open(_) => "refused",
            Rejected::Full(_) => "bulkhead",
        };
        Response::builder()
            .header("x-fallback", why)
            .body(Bytes::from_static(DEGRADED.as_bytes()))
            .unwrap()
    });
    (fallback, asked)
}

/// `x-fallback` of a response the fallback wrote; `None` for the backend's own.
fn fallback_kind<B>(response: &Response<B>) -> Option<&str> {
    response.extensions().get::<LocalAnswer>()?;
    Some(response.headers()["x-fallback"].to_str().unwrap())
}

/// The refusal behind an engine error, which must be a [`BreakerOpen`].
fn breaker_open(error: stormguard_retry::Error) -> BreakerOpen {
    *error
        .into_source()
        .unwrap()
        .downcast::<BreakerOpen>()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_is_not_sent_retried_throttled_or_charged_to_the_budget() {
    let breaker = CircuitBreaker::new(seeded());
    open(&breaker);
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let budget = RetryBudget::default();
    let before = budget.snapshot();
    let layer = ClientLayer::default()
        .with_budget(budget.clone())
        .with_breaker(breaker.clone());
    let throttle = layer.throttle().unwrap().clone();
    let client = layer.layer(backend);

    let start = Instant::now();
    for _ in 0..5 {
        let error = client
            .clone()
            .oneshot(post(CHAT_URI, CHAT))
            .await
            .unwrap_err();
        assert_eq!(error.reason(), Reason::BreakerOpen, "{error}");
        assert_eq!(error.attempts(), 0);
        assert_eq!(error.gave_up(), None);
    }

    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(log.len(), 0);
    assert_eq!(budget.snapshot(), before);
    // Refusals are no calls to the breaker, and the throttle never saw them.
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.in_flight), (20, 0));
    assert_eq!(throttle.snapshot().requests, 0);
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_breaker_refuses_gives_its_withdrawal_back() {
    for with_fallback in [false, true] {
        // One failure in one call opens this breaker: the 503 opens it, and its retry is refused.
        let breaker = CircuitBreaker::new(seeded().with_min_calls(1));
        let (log, backend) = instant(|_, _| Ok(status(503)));
        let budget = RetryBudget::default();
        let before = budget.snapshot();
        let (fallback, asked) = fallback();
        let mut layer = ClientLayer::default()
            .without_throttle()
            .with_budget(budget.clone())
            .with_backoff(Constant::new(Duration::from_millis(100)))
            .with_breaker(breaker.clone());
        if with_fallback {
            layer = layer.with_fallback(fallback);
        }

        let result = layer.layer(backend).oneshot(post(CHAT_URI, CHAT)).await;

        if with_fallback {
            let response = result.unwrap();
            assert_eq!(fallback_kind(&response), Some("refused"));
            let asked = asked.lock().unwrap();
            assert_eq!(asked.len(), 1);
            assert_eq!(asked[0].method, Method::POST);
        } else {
            let error = result.unwrap_err();
            assert_eq!(error.reason(), Reason::BreakerOpen, "{error}");
            assert_eq!(error.attempts(), 1);
            assert_eq!(error.gave_up(), None);
        }
        assert_eq!(log.len(), 1, "fallback: {with_fallback}");
        let after = budget.snapshot();
        assert_eq!(after.withdrawals, 0, "fallback: {with_fallback}");
        assert_eq!(after.balance, before.balance, "fallback: {with_fallback}");
        assert_eq!(breaker.snapshot().cause, Some(OpenCause::Failures));
    }
}

#[tokio::test(start_paused = true)]
async fn the_fallback_answers_locally_from_the_request_head() {
    let breaker = CircuitBreaker::new(seeded());
    open(&breaker);
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let (fallback, asked) = fallback();
    let client = ClientLayer::default()
        .with_breaker(breaker)
        .with_fallback(fallback)
        .layer(backend);
    let mut request = post(CHAT_URI, CHAT);
    request
        .headers_mut()
        .insert("x-tenant", http::HeaderValue::from_static("acme"));

    let response = client.oneshot(request).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(fallback_kind(&response), Some("refused"));
    let answer = response.extensions().get::<LocalAnswer>().unwrap();
    assert_eq!(answer.outcome().reason(), Reason::BreakerOpen);
    assert!(answer.outcome().is_fatal());
    assert!(!answer.outcome().is_accepted());
    assert!(response.body().is_local());
    assert_eq!(body_bytes(response).await, DEGRADED.as_bytes());
    assert_eq!(log.len(), 0);

    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].method, Method::POST);
    assert_eq!(asked[0].uri, "http://llm.test/v1/chat/completions");
    assert_eq!(asked[0].headers["x-tenant"], "acme");
    assert_eq!(asked[0].headers["content-type"], "application/json");
    let Rejected::Open(open) = &asked[0].rejected else {
        panic!("refused by the open breaker: {:?}", asked[0].rejected);
    };
    assert!(!open.was_sent());
    // The default open wait of 1 s, stretched by at most 25%.
    let after = open.retry_after();
    assert!(
        (Duration::from_secs(1)..=Duration::from_millis(1250)).contains(&after),
        "{after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_fallback_a_refusal_is_a_typed_error_answered_with_503_and_retry_after() {
    // An open wait of 1.5 s, stretched by at most 25%: between 1.5 and 1.875 s.
    let breaker = CircuitBreaker::new(
        seeded().with_open_wait(Duration::from_millis(1500), Duration::from_secs(30)),
    );
    open(&breaker);
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = ClientLayer::default().with_breaker(breaker).layer(backend);

    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(log.len(), 0);
    assert_eq!(error.reason(), Reason::BreakerOpen);
    assert_eq!(error.attempts(), 0);
    assert!(error.outcome().is_fatal());
    assert!(!error.outcome().is_accepted());
    let response = error.to_response::<()>(false);
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let open = breaker_open(error);
    assert!(!open.was_sent());
    assert_eq!(open.cause(), OpenCause::Failures);
    let after = open.retry_after();
    assert!(
        (Duration::from_millis(1500)..=Duration::from_millis(1875)).contains(&after),
        "{after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_recorded_and_only_what_the_backend_failed_counts_against_it() {
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    let bad = r#"{"error":{"message":"Invalid 'messages'","type":"invalid_request_error"}}"#;
    // Request by request: 200; 503 then 200; a 429 rate limit then 200; a fatal 400; 529 then 200.
    let (log, backend) = instant(move |n, _| {
        Ok(match n {
            1 => status(503),
            3 => reply(429, &[], limited),
            5 => reply(400, &[], bad),
            6 => status(529),
            _ => status(200),
        })
    });
    let breaker = CircuitBreaker::new(seeded());
    let client = ClientLayer::default()
        .without_throttle()
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .with_breaker(breaker.clone())
        .layer(backend);

    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            client
                .clone()
                .oneshot(post(CHAT_URI, CHAT))
                .await
                .unwrap()
                .status(),
        );
    }

    assert_eq!(statuses, [200, 200, 200, 400, 200]);
    assert_eq!(log.len(), 8);
    let snapshot = breaker.snapshot();
    // Eight attempts, all answered; the 503 and the 529 are the backend's failures, the 429 (a
    // rate limit) and the 400 (the caller's mistake) are not.
    assert_eq!(
        (snapshot.calls, snapshot.answers, snapshot.failures),
        (8, 8, 2)
    );
    assert_eq!(snapshot.in_flight, 0);
    assert_eq!(snapshot.state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn twenty_503s_open_the_breaker_and_the_next_requests_never_reach_the_backend() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let breaker = CircuitBreaker::new(seeded());
    // One attempt per request, and no throttle (it would drop some of the 503s' followers): one
    // request, one call to the breaker.
    let client = ClientLayer::default()
        .without_throttle()
        .with_max_attempts(1)
        .with_breaker(breaker.clone())
        .layer(backend);

    for _ in 0..19 {
        let response = client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(
        breaker.state(),
        State::Closed,
        "19 calls are too few to judge"
    );
    let response = client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 503, "the 20th is answered, then judged");
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!((snapshot.calls, snapshot.failures), (20, 20));
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Failures))
    );

    for _ in 0..10 {
        let error = client
            .clone()
            .oneshot(post(CHAT_URI, CHAT))
            .await
            .unwrap_err();
        assert_eq!(error.reason(), Reason::BreakerOpen, "{error}");
    }
    assert_eq!(log.len(), 20);
}

#[tokio::test(start_paused = true)]
async fn the_servers_retry_after_sets_how_long_the_breaker_stays_open() {
    let (log, backend) = instant(|_, _| Ok(reply(503, &[("retry-after", "5")], "")));
    let breaker = CircuitBreaker::new(seeded().with_min_calls(1));
    let client = ClientLayer::default()
        .with_max_attempts(1)
        .with_breaker(breaker.clone())
        .layer(backend);

    let response = client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 503);
    // Not the default 1 s: the 5 s the server asked for, stretched by at most 25%.
    let error = client
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    let after = breaker_open(error).retry_after();
    assert!(
        (Duration::from_secs(5)..=Duration::from_millis(6250)).contains(&after),
        "{after:?}"
    );
    tokio::time::advance(after - Duration::from_millis(1)).await;
    let error = client
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), Reason::BreakerOpen);
    assert_eq!(log.len(), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    // The wait is over: a probe goes.
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(log.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_in_flight_at_the_deadline_is_a_health_failure_and_frees_its_place() {
    let provider = Provider::new(Duration::from_secs(3600));
    let breaker = CircuitBreaker::new(seeded());
    let client = ClientLayer::default()
        .with_timeout(Duration::from_secs(5))
        .with_breaker(breaker.clone())
        .layer(provider.service());

    let start = Instant::now();
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert_eq!(provider.calls(), 1);
    let snapshot = breaker.snapshot();
    // Counted as a call that failed, though not as an answer: a timeout is a silence.
    assert_eq!(
        (snapshot.calls, snapshot.failures, snapshot.answers),
        (1, 1, 0)
    );
    assert_eq!(snapshot.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_request_at_any_point_leaves_nothing_in_flight() {
    let breaker = CircuitBreaker::new(seeded());
    let layer = ClientLayer::default().with_breaker(breaker.clone());
    let in_flight = || breaker.snapshot().in_flight;

    // Reading a request body that never ends: no attempt yet.
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let request = Request::post("http://llm.test/v1/chat/completions")
        .body(Chunked::new([Bytes::from_static(b"{\"model\":")]).stalling())
        .unwrap();
    let mut future = tokio_test::task::spawn(layer.layer(backend).oneshot(request));
    assert!(future.poll().is_pending());
    assert_eq!((log.len(), in_flight()), (0, 0));
    drop(future);
    assert_eq!(in_flight(), 0);

    // An attempt in flight.
    let provider = Provider::new(Duration::from_secs(10));
    let mut future = tokio_test::task::spawn(
        layer
            .layer(provider.service())
            .oneshot(post(CHAT_URI, CHAT)),
    );
    assert!(future.poll().is_pending());
    assert_eq!((provider.calls(), in_flight()), (1, 1));
    drop(future);
    assert_eq!(in_flight(), 0);

    // A 503 whose error body stops halfway, while the engine reads it to classify it.
    let backend = tower::service_fn(|_request: Request<Full<Bytes>>| async {
        let body = Chunked::new([Bytes::from_static(b"{\"error\":")]).stalling();
        Ok::<_, BoxError>(Response::builder().status(503).body(body).unwrap())
    });
    let mut future = tokio_test::task::spawn(layer.layer(backend).oneshot(post(CHAT_URI, CHAT)));
    assert!(future.poll().is_pending());
    assert_eq!(in_flight(), 1);
    drop(future);
    assert_eq!(in_flight(), 0);

    // Waiting out the backoff before a retry: the failed attempt was recorded.
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let client = layer
        .clone()
        .with_backoff(Constant::new(Duration::from_secs(5)))
        .layer(backend);
    let mut future = tokio_test::task::spawn(client.oneshot(post(CHAT_URI, CHAT)));
    assert!(future.poll().is_pending());
    assert_eq!((log.len(), in_flight()), (1, 0));
    drop(future);

    let snapshot = breaker.snapshot();
    // Only the one attempt that came back was counted: a caller who gives up says nothing
    // about the backend.
    assert_eq!((snapshot.calls, snapshot.failures), (1, 1));
    assert_eq!(snapshot.in_flight, 0);
    // Past the backoff: the dropped retry is never sent.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(log.len(), 1);
    assert_eq!(breaker.snapshot().in_flight, 0);
}

/// How one request of a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// The backend answered, with this status.
    Backend(u16),
    /// The fallback answered for an attempt cut in flight.
    Cut,
    /// The fallback answered for a request refused before it was sent.
    Refused,
    /// The engine failed the request, for this reason.
    Failed(Reason),
}

/// One request of a run: when it was sent, when it ended, and how.
#[derive(Clone, Copy, Debug)]
struct Run {
    sent: Instant,
    ended: Instant,
    how: Ended,
}

/// Sends a chat request through `client` every 10 ms (100 per second) from now until `until`,
/// each in its own task, each recording how it ended in `runs` when it does.
fn at_100_per_second<S, B>(client: &S, until: Instant, runs: &Arc<Mutex<Vec<Run>>>) -> JoinSet<()>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = stormguard_retry::Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    let mut sent = start;
    while sent < until {
        let client = client.clone();
        let runs = Arc::clone(runs);
        tasks.spawn(async move {
            tokio::time::sleep_until(sent).await;
            let how = match client.oneshot(post(CHAT_URI, CHAT)).await {
                Ok(response) => match fallback_kind(&response) {
                    Some("cut") => Ended::Cut,
                    Some("refused") => Ended::Refused,
                    Some(other) => panic!("unexpected fallback {other}"),
                    None => Ended::Backend(response.status().as_u16()),
                },
                Err(error) => Ended::Failed(error.reason()),
            };
            let ended = Instant::now();
            runs.lock().unwrap().push(Run { sent, ended, how });
        });
        sent += Duration::from_millis(10);
    }
    tasks
}

/// The seed incident's client: the default pipeline (throttle, budget, 600 s deadline) with a
/// default breaker and the tests' fallback.
fn seed_layer() -> (CircuitBreaker, ClientLayer) {
    let breaker = CircuitBreaker::new(seeded());
    let (fallback, _asked) = fallback();
    let layer = ClientLayer::default()
        .with_breaker(breaker.clone())
        .with_fallback(fallback);
    (breaker, layer)
}

#[tokio::test(start_paused = true)]
async fn a_black_hole_is_cut_within_3_s_and_the_throttle_never_hears_of_it() {
    let start = Instant::now();
    let hole = start + Duration::from_secs(10);
    let provider = Provider::new(Duration::from_millis(100));
    provider.go_dark(hole..start + A_YEAR);
    let (breaker, layer) = seed_layer();
    let throttle = layer.throttle().unwrap().clone();
    let client = layer.layer(provider.service());

    // 10 s of healthy traffic at 100 requests per second, then 2.5 s into the black hole.
    let runs = Arc::default();
    let _tasks = at_100_per_second(&client, hole + Duration::from_millis(2500), &runs);
    tokio::time::sleep_until(hole + Duration::from_secs(3)).await;

    let runs = runs.lock().unwrap().clone();
    // Every request has ended by the 3rd second of the black hole, none at its 600 s deadline.
    assert_eq!(runs.len(), 1250);
    // Those whose answers were due before the hole got them.
    let answered: Vec<_> = runs.iter().filter(|run| run.ended <= hole).collect();
    assert_eq!(answered.len(), 990);
    assert!(answered.iter().all(|run| run.how == Ended::Backend(200)));
    // The others were cut in flight or refused, and the fallback answered both.
    let cut: Vec<_> = runs.iter().filter(|run| run.how == Ended::Cut).collect();
    let refused: Vec<_> = runs
        .iter()
        .filter(|run| run.how == Ended::Refused)
        .collect();
    assert_eq!(cut.len() + refused.len(), 260);
    assert_eq!(provider.calls(), 990 + cut.len());
    // The stall cut every attempt in flight at once, about 2 s into the silence.
    let cut_at = cut[0].ended;
    assert!(cut.iter().all(|run| run.ended == cut_at));
    let into_hole = cut_at - hole;
    println!(
        "black hole: cut {} attempts in flight {into_hole:?} into the silence, refused {} more",
        cut.len(),
        refused.len()
    );
    assert!(into_hole <= Duration::from_secs(3), "{into_hole:?}");
    assert!(into_hole >= Duration::from_secs(2), "{into_hole:?}");
    // Sent before the cut, cut; sent after, refused at once.
    assert!(cut.iter().all(|run| run.sent < cut_at));
    assert!(
        refused
            .iter()
            .all(|run| run.sent >= cut_at && run.ended == run.sent)
    );

    let snapshot = breaker.snapshot();
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Stall))
    );
    assert_eq!(snapshot.in_flight, 0);
    // The throttle learns from answers: the cut attempts were none, and it has nothing to
    // unlearn.
    let throttle = throttle.snapshot();
    assert_eq!(throttle.requests, throttle.accepts, "{throttle:?}");
    assert_eq!(throttle.probability, 0.0);
}

#[tokio::test(start_paused = true)]
async fn after_a_black_hole_traffic_is_back_within_2_s_of_the_providers_return() {
    let start = Instant::now();
    let hole = start + Duration::from_secs(10);
    let back = hole + Duration::from_secs(5);
    let provider = Provider::new(Duration::from_millis(100));
    provider.go_dark(hole..back);
    let (breaker, layer) = seed_layer();
    let client = layer.layer(provider.service());

    let runs = Arc::default();
    let mut tasks = at_100_per_second(&client, back + Duration::from_secs(5), &runs);
    tokio::time::sleep_until(back + Duration::from_secs(6)).await;

    let runs = runs.lock().unwrap().clone();
    let cut_at = runs
        .iter()
        .find(|run| run.how == Ended::Cut)
        .map(|run| run.ended)
        .unwrap();
    // Probes went into the silence after the open wait, and never came back: each held its slot
    // for its lease only.
    let probes_lost = provider.calls_during(cut_at..back - Duration::from_millis(100));
    assert!(probes_lost >= 1, "no probe went into the black hole");
    assert_eq!(runs.len(), 2000 - probes_lost);
    let returned = runs
        .iter()
        .filter(|run| run.sent >= cut_at && run.how == Ended::Backend(200))
        .map(|run| run.ended)
        .min()
        .unwrap();
    println!(
        "black hole: {probes_lost} probes lost in it; traffic back {:?} after the provider",
        returned - back
    );
    assert!(returned - back <= Duration::from_secs(2));
    // Once back, every request reaches the provider: no throttle drop, no refusal.
    let after: Vec<_> = runs.iter().filter(|run| run.sent > returned).collect();
    assert!(after.len() >= 300);
    assert!(after.iter().all(|run| run.how == Ended::Backend(200)));
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.state, snapshot.opened), (State::Closed, 1));

    // The lost probes still wait for their deadline; dropping them frees their places.
    assert_eq!(snapshot.in_flight, u32::try_from(probes_lost).unwrap());
    tasks.shutdown().await;
    assert_eq!(breaker.snapshot().in_flight, 0);
}

/// Sends 50 requests through `client`, one at a time, all answered: the breaker's window then
/// holds 50 answers.
async fn warm_up<S, B>(client: &S)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = stormguard_retry::Error>
        + Clone,
{
    for _ in 0..50 {
        let response = client.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_fallback_an_attempt_cut_in_flight_fails_with_breaker_open_sent() {
    let breaker = quick_to_stall();
    let provider = Provider::new(Duration::ZERO);
    let client = ClientLayer::default()
        .with_breaker(breaker.clone())
        .layer(provider.service());
    warm_up(&client).await;
    provider.go_dark(Instant::now()..Instant::now() + A_YEAR);

    let mut silent = tokio_test::task::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    assert!(silent.poll().is_pending());
    tokio::time::advance(Duration::from_millis(1500)).await;
    // The next request finds the silence a stall: it opens the breaker and is refused.
    let refused = client
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    assert!(!breaker_open(refused).was_sent());

    assert!(silent.is_woken());
    let Poll::Ready(Err(error)) = silent.poll() else {
        panic!("the attempt in flight should have been cut");
    };
    assert_eq!(error.reason(), Reason::BreakerOpen, "{error}");
    assert_eq!(error.attempts(), 1);
    let open = breaker_open(error);
    assert!(open.was_sent());
    assert_eq!(open.cause(), OpenCause::Stall);
    assert_eq!(provider.calls(), 51);
    assert_eq!(breaker.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_request_cut_in_flight_gets_the_fallback_with_its_head() {
    let breaker = quick_to_stall();
    let provider = Provider::new(Duration::ZERO);
    let (fallback, asked) = fallback();
    // Bodies over 4 bytes are sent once, as they come.
    let layer = ClientLayer::default()
        .with_max_replay_body(4)
        .with_breaker(breaker.clone())
        .with_fallback(fallback);
    warm_up(&layer.layer(provider.service())).await;
    provider.go_dark(Instant::now()..Instant::now() + A_YEAR);
    let chunks = [
        Bytes::from_static(b"0123456789"),
        Bytes::from_static(b"abcdef"),
    ];
    let upload = Request::post("http://llm.test/v1/uploads")
        .header("x-upload", "42")
        .body(Chunked::new(chunks))
        .unwrap();

    let mut streamed = tokio_test::task::spawn(layer.layer(provider.service()).oneshot(upload));
    assert!(streamed.poll().is_pending());
    tokio::time::advance(Duration::from_millis(1500)).await;
    let trigger = layer
        .layer(provider.service())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(fallback_kind(&trigger), Some("refused"));

    let Poll::Ready(Ok(response)) = streamed.poll() else {
        panic!("the streamed attempt should have been cut");
    };
    assert_eq!(fallback_kind(&response), Some("cut"));
    assert!(response.body().is_local());
    assert_eq!(provider.calls(), 51);
    let asked = asked.lock().unwrap();
    let upload = &asked[1];
    assert_eq!(upload.method, Method::POST);
    assert_eq!(upload.uri, "http://llm.test/v1/uploads");
    assert_eq!(upload.headers["x-upload"], "42");
    assert_eq!(breaker.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_whose_error_body_stalls_is_cut_too() {
    let breaker = quick_to_stall();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    // 50 answers, then a 503 whose body stops after its first bytes.
    let backend = tower::service_fn(move |_request: Request<Full<Bytes>>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let response = if n < 50 {
                Response::new(Chunked::new([]))
            } else {
                let body = Chunked::new([Bytes::from_static(b"{\"error\":")]).stalling();
                Response::builder().status(503).body(body).unwrap()
            };
            Ok::<_, BoxError>(response)
        }
    });
    let client = ClientLayer::default()
        .with_breaker(breaker.clone())
        .layer(backend);
    warm_up(&client).await;

    let mut stalled = tokio_test::task::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    assert!(stalled.poll().is_pending());
    assert_eq!(breaker.snapshot().in_flight, 1);
    tokio::time::advance(Duration::from_millis(1500)).await;
    let refused = client
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    assert_eq!(refused.reason(), Reason::BreakerOpen);

    let Poll::Ready(Err(error)) = stalled.poll() else {
        panic!("the attempt reading its error body should have been cut");
    };
    assert!(breaker_open(error).was_sent());
    assert_eq!(breaker.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn the_bulkhead_refuses_the_third_concurrent_request() {
    let breaker = CircuitBreaker::new(seeded().with_max_in_flight(Some(2)));
    let provider = Provider::new(Duration::from_secs(1));
    let layer = ClientLayer::default().with_breaker(breaker.clone());
    let client = layer.layer(provider.service());
    let (fallback, asked) = fallback();
    let with_fallback = layer.with_fallback(fallback).layer(provider.service());

    let mut first = tokio_test::task::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    let mut second = tokio_test::task::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    assert!(first.poll().is_pending());
    assert!(second.poll().is_pending());
    assert_eq!(breaker.snapshot().in_flight, 2);

    let error = client
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), Reason::BulkheadFull, "{error}");
    assert_eq!(error.attempts(), 0);
    let response = error.to_response::<()>(false);
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let full = error
        .into_source()
        .unwrap()
        .downcast::<BulkheadFull>()
        .unwrap();
    assert_eq!(full.max_in_flight(), 2);
    let answered = with_fallback
        .clone()
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap();
    assert_eq!(fallback_kind(&answered), Some("bulkhead"));
    assert!(matches!(
        asked.lock().unwrap()[0].rejected,
        Rejected::Full(_)
    ));
    assert_eq!(provider.calls(), 2);

    // The bulkhead is no breaker: once the two are done, the next request goes through.
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(second.await.unwrap().status(), 200);
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(provider.calls(), 3);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.state, snapshot.in_flight), (State::Closed, 0));
}

#[tokio::test(start_paused = true)]
async fn the_throttle_never_drops_a_probe() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(5));
    let breaker = CircuitBreaker::new(seeded());
    let client = ClientLayer::default()
        .with_throttle(throttle.clone())
        .with_breaker(breaker.clone())
        .layer(backend);
    let outage = |throttle: &AdaptiveThrottle| {
        for _ in 0..100 {
            // A rejection: a permit dropped untold counts as not accepted.
            drop(throttle.try_acquire());
        }
    };

    // Ten times: the breaker opens and the throttle is full of the outage (it drops 99% of what
    // it is offered), and yet the probe gets through, and closes the breaker.
    for round in 0..10 {
        open(&breaker);
        outage(&throttle);
        assert!(throttle.probability() >= 0.95, "{:?}", throttle.snapshot());
        tokio::time::advance(Duration::from_millis(1250)).await;
        let response = client.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200, "round {round}");
        assert_eq!(breaker.state(), State::Closed, "round {round}");
    }
    assert_eq!(log.len(), 10);

    // Other attempts are the throttle's to drop.
    outage(&throttle);
    let mut throttled = 0;
    for _ in 0..20 {
        if let Err(error) = client.clone().oneshot(get()).await {
            assert_eq!(error.reason(), Reason::Throttled);
            throttled += 1;
        }
    }
    assert!(throttled >= 15, "{throttled} of 20 throttled");
}
