//! Hedged attempts on tokio's paused clock: a second attempt while the first waits for its
//! content, the first to produce content answering, the other cancelled; what each guard, the
//! budget and the clocks are left with, wherever the request is dropped.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_breaker::{BreakerConfig, CircuitBreaker};
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::headers::{IDEMPOTENCY_KEY, X_RETRY_ATTEMPT};
use stormguard_classify::{BoxError, Reason};
use stormguard_deadline::clocks::{AttemptClocks, ClockSettings};
use stormguard_jitter::Constant;
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use stormguard_retry::{ClientLayer, Hedging};
use stormguard_test_kit::{Log, Respond, ScriptedBackend, ScriptedBody, Seen, post};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
const STREAM: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#;

/// Where the requests of these tests go.
const CHAT_URI: &str = "http://llm.test/v1/chat/completions";

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

/// What the backend does with its n-th attempt (from 0): after `head` its head goes (`status`;
/// for a stream, its first content event `content` later, then the rest).
#[derive(Clone, Copy)]
struct Plan {
    head: Duration,
    status: u16,
    /// `Some`: an event stream whose first content comes this long after the head.
    content: Option<Duration>,
}

fn answer(head: Duration) -> Plan {
    Plan {
        head,
        status: 200,
        content: None,
    }
}

fn failing(head: Duration, status: u16) -> Plan {
    Plan {
        head,
        status,
        content: None,
    }
}

fn stream(content: Duration) -> Plan {
    Plan {
        head: Duration::ZERO,
        status: 200,
        content: Some(content),
    }
}

/// The backend's books: every attempt it received, and how many it saw cancelled (dropped
/// before its head was sent, or a stream's body dropped before its end).
#[derive(Clone, Default)]
struct Books {
    log: Log,
    cancelled: Arc<AtomicUsize>,
}

impl Books {
    fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn attempts(&self) -> Vec<Option<String>> {
        let header = |seen: &Seen| seen.header(X_RETRY_ATTEMPT.as_str()).map(str::to_owned);
        self.log.all().iter().map(header).collect()
    }
}

type Reply = Response<ScriptedBody>;

/// The answers of a backend whose n-th attempt goes as `plan(n)` says; a stream's body counts a
/// cancellation in the books when dropped before its end.
#[derive(Clone)]
struct Planned {
    plan: fn(usize) -> Plan,
    cancelled: Arc<AtomicUsize>,
}

impl Respond for Planned {
    type Body = ScriptedBody;

    fn delay(&self, n: usize) -> Duration {
        (self.plan)(n).head
    }

    fn respond(&self, n: usize, _seen: &Seen) -> Result<Reply, BoxError> {
        let plan = (self.plan)(n);
        let Some(content) = plan.content else {
            return Ok(reply(
                plan.status,
                "application/json",
                ScriptedBody::from("{}"),
            ));
        };
        let events = ScriptedBody::new()
            .data(sse(r#"{"role":"assistant","content":""}"#))
            .delay(content)
            .data(sse(&format!(r#"{{"content":"attempt {n} "}}"#)))
            .delay(10 * MS)
            .data(sse(r#"{"content":"done"}"#))
            .data("data: [DONE]\n\n")
            .watched(&self.cancelled);
        Ok(reply(plan.status, "text/event-stream", events))
    }
}

/// A backend that answers its n-th attempt as `plan(n)` says, and counts in `books` every
/// attempt dropped before its head was sent.
fn backend(books: &Books, plan: fn(usize) -> Plan) -> ScriptedBackend<Planned> {
    let cancelled = Arc::clone(&books.cancelled);
    ScriptedBackend::new(Planned {
        plan,
        cancelled: Arc::clone(&cancelled),
    })
    .logging_to(&books.log)
    .watched(&cancelled)
}

fn reply(status: u16, content_type: &str, body: ScriptedBody) -> Reply {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(body)
        .unwrap()
}

fn sse(delta: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
    ))
}

/// A budget of ten retries or hedges and nothing more (a floor of 1 a second over 10 s).
fn ten() -> RetryBudget {
    RetryBudget::new(BudgetConfig::default().with_ratio(0.0))
}

/// The engine of these tests: hedged after a fixed `delay`, a constant 100 ms backoff,
/// `budget`, a 60 s deadline.
fn hedged(
    delay: Duration,
    budget: &RetryBudget,
) -> ClientLayer<stormguard_classify::LlmClassifier, Constant> {
    ClientLayer::default()
        .with_budget(budget.clone())
        .with_backoff(Constant::new(100 * MS))
        .with_timeout(Duration::from_secs(60))
        .with_hedging(Hedging::after(delay))
}

/// The first attempt waits 10 s for its head: at 1 s the hedge goes to the same backend (attempt
/// 1, the same idempotency key) and answers 100 ms later; the first is cancelled, and each guard
/// and the budget are left as a cancelled loser leaves them.
#[tokio::test(start_paused = true)]
async fn a_slow_attempt_is_hedged_and_the_hedge_answers() {
    let books = Books::default();
    let budget = ten();
    let throttle = AdaptiveThrottle::default();
    let breaker = CircuitBreaker::default();
    let client = hedged(SECOND, &budget)
        .with_throttle(throttle.clone())
        .with_breaker(breaker.clone())
        .layer(backend(&books, |n| answer([10 * SECOND, 100 * MS][n])));

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 1100 * MS);
    assert_eq!(books.attempts(), [Some("0".into()), Some("1".into())]);
    let keys: Vec<_> = books
        .log
        .all()
        .iter()
        .map(|seen| seen.header(IDEMPOTENCY_KEY.as_str()).map(str::to_owned))
        .collect();
    assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
    assert_eq!(books.cancelled(), 1, "the first attempt was dropped");
    // The hedge was a withdrawal, spent: it was sent.
    assert_eq!(budget.snapshot().withdrawals, 1);
    // The throttle counted the winner alone; the breaker has nothing in flight.
    let counted = throttle.snapshot();
    assert_eq!((counted.requests, counted.accepts), (1, 1));
    let breaker = breaker.snapshot();
    assert_eq!(
        (breaker.in_flight, breaker.calls, breaker.failures),
        (0, 1, 0)
    );
}

/// The first attempt answers at 1.5 s, before the hedge sent at 1 s (10 s): the hedge is
/// cancelled, its withdrawal spent.
#[tokio::test(start_paused = true)]
async fn the_first_attempt_answering_first_cancels_the_hedge() {
    let books = Books::default();
    let budget = ten();
    let client =
        hedged(SECOND, &budget).layer(backend(&books, |n| answer([1500 * MS, 10 * SECOND][n])));

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 1500 * MS);
    assert_eq!(books.log.len(), 2);
    assert_eq!(books.cancelled(), 1, "the hedge was dropped");
    assert_eq!(budget.snapshot().withdrawals, 1);
}

/// An attempt that answers within the delay is never hedged, and draws nothing.
#[tokio::test(start_paused = true)]
async fn an_answer_within_the_delay_sends_no_hedge() {
    let books = Books::default();
    let budget = ten();
    let client = hedged(SECOND, &budget).layer(backend(&books, |_| answer(900 * MS)));
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(books.log.len(), 1);
    assert_eq!(budget.snapshot().withdrawals, 0);
}

/// A spent budget sends no hedge: the storm's own brake. The first attempt answers at 10 s.
#[tokio::test(start_paused = true)]
async fn a_spent_budget_sends_no_hedge() {
    let books = Books::default();
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let client = hedged(SECOND, &budget).layer(backend(&books, |_| answer(10 * SECOND)));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 10 * SECOND);
    assert_eq!(books.log.len(), 1);
    assert_eq!(budget.snapshot().rejected, 1);
}

/// The hedge fails (503 at once) while the first attempt is in flight: the first goes on alone
/// and answers at 3 s; no retry is sent for the hedge's failure.
#[tokio::test(start_paused = true)]
async fn a_failed_hedge_leaves_the_first_attempt_to_answer() {
    let books = Books::default();
    let budget = ten();
    let client = hedged(SECOND, &budget).layer(backend(&books, |n| match n {
        0 => answer(3 * SECOND),
        _ => failing(Duration::ZERO, 503),
    }));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 3 * SECOND);
    assert_eq!(books.log.len(), 2);
    assert_eq!(books.cancelled(), 0);
}

/// The first attempt fails at 1.5 s (503) while the hedge, sent at 1 s, is in flight: the hedge
/// answers at 2 s.
#[tokio::test(start_paused = true)]
async fn a_failed_first_attempt_leaves_the_hedge_to_answer() {
    let books = Books::default();
    let budget = ten();
    let client = hedged(SECOND, &budget).layer(backend(&books, |n| match n {
        0 => failing(1500 * MS, 503),
        _ => answer(SECOND),
    }));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 2 * SECOND);
    assert_eq!(books.log.len(), 2);
}

/// Both fail: the hedge at 1.2 s, the first at 1.5 s. The request is then retried as the policy
/// allows: the third attempt (of three, the hedge counted) answers after the 100 ms backoff.
#[tokio::test(start_paused = true)]
async fn when_both_fail_the_request_is_retried_within_its_attempts() {
    let books = Books::default();
    let budget = ten();
    let client = hedged(SECOND, &budget).layer(backend(&books, |n| match n {
        0 => failing(1500 * MS, 503),
        1 => failing(200 * MS, 503),
        _ => answer(100 * MS),
    }));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 1700 * MS);
    assert_eq!(
        books.attempts(),
        [Some("0".into()), Some("1".into()), Some("2".into())]
    );
    // The hedge and the retry.
    assert_eq!(budget.snapshot().withdrawals, 2);
}

/// A bulkhead of one refuses the hedge: it is not sent, its grant goes back, the first
/// attempt answers at 10 s.
#[tokio::test(start_paused = true)]
async fn a_hedge_the_breaker_refuses_is_not_sent_and_draws_nothing() {
    let books = Books::default();
    let budget = ten();
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_max_in_flight(Some(1)));
    let client = hedged(SECOND, &budget)
        .with_breaker(breaker.clone())
        .layer(backend(&books, |_| answer(10 * SECOND)));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 10 * SECOND);
    assert_eq!(books.log.len(), 1);
    assert_eq!(budget.snapshot().withdrawals, 0);
    assert_eq!(breaker.snapshot().in_flight, 0);
}

/// A stream whose head comes at once but whose first content event would take 10 s: the hedge
/// at 1 s streams its first content 50 ms later, and the caller reads the hedge's stream; the
/// first stream's body is dropped.
#[tokio::test(start_paused = true)]
async fn a_stream_slow_to_its_first_content_is_hedged_and_the_first_content_wins() {
    let books = Books::default();
    let budget = ten();
    let client =
        hedged(SECOND, &budget).layer(backend(&books, |n| stream([10 * SECOND, 50 * MS][n])));
    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, STREAM)).await.unwrap();
    assert_eq!(start.elapsed(), 1050 * MS);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("attempt 1 ") && !text.contains("attempt 0 "),
        "{text}"
    );
    assert_eq!(text.matches("[DONE]").count(), 1, "{text}");
    assert_eq!(books.cancelled(), 1);
}

/// The deadline (3 s) passes with both attempts in flight: the request ends with
/// `DeadlineExceeded`, both attempts dropped, and the breaker counts two timeouts.
#[tokio::test(start_paused = true)]
async fn the_deadline_ends_both_attempts() {
    let books = Books::default();
    let budget = ten();
    let breaker = CircuitBreaker::default();
    let client = hedged(SECOND, &budget)
        .with_timeout(3 * SECOND)
        .with_breaker(breaker.clone())
        .layer(backend(&books, |_| answer(10 * SECOND)));
    let start = Instant::now();
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();
    assert_eq!(start.elapsed(), 3 * SECOND);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(error.attempts(), 2);
    assert_eq!(books.cancelled(), 2);
    let breaker = breaker.snapshot();
    assert_eq!(
        (breaker.in_flight, breaker.calls, breaker.failures),
        (0, 2, 2)
    );
}

/// With the learned delay: twenty answers at 200 ms to 390 ms teach the backend's time to
/// first content, whose 95th percentile is 380 ms; a slow attempt is hedged then.
#[tokio::test(start_paused = true)]
async fn a_learned_delay_hedges_at_the_backends_95th_percentile() {
    let books = Books::default();
    let budget = ten();
    let clocks = AttemptClocks::default();
    let client = ClientLayer::default()
        .with_budget(budget.clone())
        .with_clocks(clocks.clone())
        .with_hedging(Hedging::default())
        .layer(backend(&books, |n| match n {
            0..20 => answer(Duration::from_millis(200 + 10 * n as u64)),
            20 => answer(10 * SECOND),
            _ => answer(100 * MS),
        }));
    for _ in 0..20 {
        client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    }
    assert_eq!(clocks.to_first_content(false, 0.95), Some(380 * MS));
    assert_eq!(budget.snapshot().withdrawals, 0, "none of them was hedged");

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 480 * MS);
    assert_eq!(books.log.len(), 22);
}

/// What a race teaches the backend's time to first content: the winner's time, and the wait
/// of the attempt that was hedged when it loses (at least that long); never a losing hedge's
/// own wait, which would teach a tail shorter than the backend's.
#[tokio::test(start_paused = true)]
async fn a_race_teaches_the_hedged_attempts_wait_and_never_the_losing_hedges() {
    let books = Books::default();
    let clocks = AttemptClocks::new(ClockSettings {
        min_samples: 1,
        ..ClockSettings::default()
    });
    let client = hedged(SECOND, &ten())
        .with_clocks(clocks.clone())
        .layer(backend(&books, |n| {
            answer([10 * SECOND, 100 * MS, 1500 * MS, 10 * SECOND][n])
        }));
    // The hedge wins at 1.1 s: its 100 ms, and the first attempt's 1.1 s waited.
    client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    // The first wins at 1.5 s: its 1.5 s, and not the hedge's 500 ms.
    client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    let at = |percentile| clocks.to_first_content(false, percentile);
    assert_eq!(at(0.0), Some(100 * MS));
    // Three figures: 100 ms, 1.1 s, 1.5 s (with the hedge's 500 ms, this would be 500 ms).
    assert_eq!(at(0.34), Some(1100 * MS));
    assert_eq!(at(1.0), Some(1500 * MS));
}

/// A service below that fails to get ready for the hedge: the hedge is not sent, and the
/// first attempt answers.
#[tokio::test(start_paused = true)]
async fn a_service_not_ready_for_the_hedge_leaves_the_first_attempt_to_answer() {
    #[derive(Clone)]
    struct ReadyOnce<S> {
        inner: S,
        readied: Arc<AtomicUsize>,
    }
    impl<S: Service<Request<Full<Bytes>>, Error = BoxError>> Service<Request<Full<Bytes>>>
        for ReadyOnce<S>
    {
        type Response = S::Response;
        type Error = BoxError;
        type Future = S::Future;
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            match self.readied.fetch_add(1, Ordering::SeqCst) {
                0 => self.inner.poll_ready(cx),
                _ => Poll::Ready(Err("connection pool closed".into())),
            }
        }
        fn call(&mut self, request: Request<Full<Bytes>>) -> S::Future {
            self.inner.call(request)
        }
    }
    let books = Books::default();
    let budget = ten();
    let inner = backend(&books, |_| answer(10 * SECOND));
    let service = ReadyOnce {
        inner,
        readied: Arc::default(),
    };
    let start = Instant::now();
    let response = hedged(SECOND, &budget)
        .layer(service)
        .oneshot(post(CHAT_URI, CHAT))
        .await;
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(start.elapsed(), 10 * SECOND);
    assert_eq!(books.log.len(), 1);
    assert_eq!(
        budget.snapshot().withdrawals,
        0,
        "the hedge's grant went back"
    );
}

/// Nothing learned yet: a learned delay sends no hedge.
#[tokio::test(start_paused = true)]
async fn a_learned_delay_hedges_nothing_before_it_is_learned() {
    let books = Books::default();
    let client = ClientLayer::default()
        .with_hedging(Hedging::default())
        .layer(backend(&books, |_| answer(5 * SECOND)));
    client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(books.log.len(), 1);
}

/// A delay not learned when an attempt starts waiting is none for that attempt: learned while it
/// waits, it hedges the attempts after it, never this one (however often it is polled).
#[tokio::test(start_paused = true)]
async fn a_delay_learned_while_an_attempt_waits_hedges_the_next_attempt_only() {
    let books = Books::default();
    let budget = ten();
    let clocks = AttemptClocks::new(ClockSettings {
        min_samples: 1,
        ..ClockSettings::default()
    });
    let client = ClientLayer::default()
        .with_budget(budget.clone())
        .with_clocks(clocks.clone())
        .with_hedging(Hedging::default())
        .layer(backend(&books, |n| match n {
            0 => answer(2 * SECOND),
            _ => answer(SECOND),
        }));
    let mut request = std::pin::pin!(client.clone().oneshot(post(CHAT_URI, CHAT)));
    let mut poll = async || std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
    assert!(poll().await.is_pending());
    tokio::time::advance(100 * MS).await;
    for _ in 0..30 {
        clocks.record_to_first_content(false, 50 * MS);
    }
    // Polled again with the delay learned (and long past): still no hedge.
    assert!(poll().await.is_pending());
    tokio::time::advance(SECOND).await;
    assert!(poll().await.is_pending());
    assert_eq!(books.log.len(), 1);
    let start = Instant::now();
    assert_eq!(request.await.unwrap().status(), 200);
    assert_eq!(start.elapsed(), 900 * MS);
    assert_eq!(books.log.len(), 1);
    assert_eq!(budget.snapshot().withdrawals, 0);

    // The next request's attempt is hedged at the delay learned (50 ms: the first request's 2 s
    // is one answer in 31).
    let start = Instant::now();
    assert_eq!(
        client.oneshot(post(CHAT_URI, CHAT)).await.unwrap().status(),
        200
    );
    assert_eq!(books.log.len(), 3);
    assert_eq!(budget.snapshot().withdrawals, 1);
    assert_eq!(start.elapsed(), SECOND);
}

/// What a request leaves behind when its caller drops it, wherever it waits: a stream waiting
/// for its first content, the hedge due, the hedge waiting for its rate-limit slot, for its
/// head, for its first content. Dropped every 100 ms until the hedge answers at 3 s, each time:
/// each attempt sent seen cancelled by the backend, nothing in flight with the breaker, the
/// throttle told of each (abandoned: not accepted), the budget charged for a hedge sent only,
/// and a slot reserved and not used given back.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_anywhere_leaks_no_permit_slot_or_withdrawal() {
    for tenth in 0..29 {
        let after = Duration::from_millis(50 + 100 * tenth);
        let books = Books::default();
        let budget = ten();
        let breaker = CircuitBreaker::default();
        let throttle = AdaptiveThrottle::default();
        // One request every 2 s, a bucket of one: the first attempt takes the slot of 0 s,
        // the hedge (due at 1 s) waits for the slot of 2 s.
        let limit = RateLimit::new(
            RateLimitConfig::default()
                .with_requests_per_minute(Some(30))
                .without_learning(),
        );
        // The first streams its head at once and would send content at 10 s; the hedge's head
        // comes 500 ms after it is sent, its content 500 ms later.
        let client = hedged(SECOND, &budget)
            .with_breaker(breaker.clone())
            .with_throttle(throttle.clone())
            .with_rate_limit(limit.clone())
            .layer(backend(&books, |n| match n {
                0 => stream(10 * SECOND),
                _ => Plan {
                    head: 500 * MS,
                    ..stream(500 * MS)
                },
            }));

        let start = Instant::now();
        let outcome = tokio::time::timeout(after, client.oneshot(post(CHAT_URI, STREAM))).await;
        assert!(outcome.is_err(), "still waiting at {after:?}");
        let hedges = usize::from(after > 2 * SECOND);
        assert_eq!(books.log.len(), 1 + hedges, "at {after:?}");
        assert_eq!(books.cancelled(), 1 + hedges, "at {after:?}");
        assert_eq!(breaker.snapshot().in_flight, 0, "at {after:?}");
        assert_eq!(budget.snapshot().withdrawals, hedges as u64, "at {after:?}");
        let throttle = throttle.snapshot();
        let sent = 1 + hedges as u64;
        assert_eq!(
            (throttle.requests, throttle.accepts),
            (sent, 0),
            "at {after:?}"
        );
        tokio::time::sleep_until(start + 2500 * MS).await;
        let available = limit.snapshot().requests_available;
        assert_eq!(available, Some(1 - hedges as u64), "at {after:?}");
    }
}
