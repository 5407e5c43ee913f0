//! The retry engine against a scripted backend, on tokio's paused clock.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use rand::RngExt;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, Throttled};
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::headers::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_RETRY_PUSHBACK_MS, IDEMPOTENCY_KEY, X_REQUEST_TIMEOUT_MS,
    X_RETRY_ATTEMPT, X_SHOULD_RETRY,
};
use stormguard_classify::{BoxError, Reason, chain};
use stormguard_deadline::{Deadline, DeadlineExceeded};
use stormguard_jitter::{Constant, FullJitter, HintPolicy};
use stormguard_numbers::random::RandomSource;
use stormguard_retry::{ClientLayer, GiveUpCause, Route};
use stormguard_test_kit::post;
use support::{CHAT_URI, Log, Reply, body_bytes, instant, reply, retries_only, scripted, status};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}"#;

fn no_retry_mark(response: &http::Response<impl http_body::Body>) -> Option<&str> {
    response
        .headers()
        .get(X_SHOULD_RETRY)
        .map(|value| value.to_str().unwrap())
}

/// Why the engine gave up on `response`, if it did.
fn give_up_cause<B>(response: &http::Response<B>) -> Option<&GiveUpCause> {
    response.extensions().get::<GiveUpCause>()
}

/// A fresh default budget, and the retries-only engine drawing on it.
fn budgeted() -> (RetryBudget, ClientLayer) {
    let budget = RetryBudget::default();
    (budget.clone(), retries_only().with_budget(budget))
}

/// A chat request whose caller set a deadline `after` from now.
fn chat_due_in(after: Duration) -> Request<Full<Bytes>> {
    let mut request = post(CHAT_URI, CHAT);
    Deadline::after(after).apply_to(&mut request);
    request
}

/// Sends `requests` chat requests through `client`, one every 10 ms (100 per second), each in its
/// own task, and returns their results in the order they finish.
async fn at_100_per_second<S>(client: S, requests: usize) -> Vec<Result<S::Response, S::Error>>
where
    S: Service<Request<Full<Bytes>>, Future: Send, Response: Send, Error: Send>
        + Clone
        + Send
        + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..requests {
        let client = client.clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(10) * i as u32).await;
            client.oneshot(post(CHAT_URI, CHAT)).await
        });
    }
    tasks.join_all().await
}

#[tokio::test(start_paused = true)]
async fn two_503s_then_success_on_the_third_attempt() {
    let (log, backend) = instant(|n, _| Ok(if n < 2 { status(503) } else { status(200) }));
    let (budget, layer) = budgeted();
    let client = layer.layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(no_retry_mark(&response), None);
    let seen = log.all();
    assert_eq!(seen.len(), 3);
    let attempts: Vec<_> = seen
        .iter()
        .map(|s| s.header("x-retry-attempt").unwrap())
        .collect();
    assert_eq!(attempts, ["0", "1", "2"]);
    // One Idempotency-Key, a UUID v4, on every attempt.
    let keys: HashSet<_> = seen
        .iter()
        .map(|s| s.header("idempotency-key").unwrap())
        .collect();
    assert_eq!(keys.len(), 1);
    let key = keys.into_iter().next().unwrap();
    assert_eq!(uuid::Uuid::parse_str(key).unwrap().get_version_num(), 4);
    // The JSON body arrives byte-identical on every attempt.
    for attempt in &seen {
        assert_eq!(attempt.body, Bytes::from_static(CHAT.as_bytes()));
    }
    let snapshot = budget.snapshot();
    assert_eq!(
        (snapshot.withdrawals, snapshot.deposits, snapshot.rejected),
        (2, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn bad_request_is_never_retried() {
    let error =
        r#"{"error":{"message":"Invalid 'messages'","type":"invalid_request_error","code":null}}"#;
    let (log, backend) = instant(move |_, _| Ok(reply(400, &[], error)));
    let (budget, layer) = budgeted();
    let client = layer.layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 400);
    assert_eq!(log.len(), 1);
    // Decided here: nobody above should retry it either.
    assert_eq!(no_retry_mark(&response), Some("false"));
    assert_eq!(give_up_cause(&response), None);
    let body = body_bytes(response).await;
    assert_eq!(body, Bytes::from_static(error.as_bytes()));
    assert_eq!(budget.snapshot().withdrawals, 0);
}

#[tokio::test(start_paused = true)]
async fn retry_after_ms_hint_sets_the_delay() {
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    let (log, backend) = instant(move |n, _| {
        Ok(match n {
            0 => reply(
                429,
                &[("retry-after-ms", "1500"), ("retry-after", "5")],
                limited,
            ),
            _ => status(200),
        })
    });
    let client = retries_only().layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    let seen = log.all();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].at - seen[0].at;
    // HintPolicy::default() adds U(0, min(10% of the hint, 1 s)) = at most 150 ms here.
    assert!(waited >= Duration::from_millis(1500), "waited {waited:?}");
    assert!(waited <= Duration::from_millis(1650), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn total_outage_amplification_is_bounded_by_the_budget_floor() {
    const REQUESTS: usize = 1000;
    let (log, backend) = instant(|_, _| Ok(status(503)));
    // Defaults: 10 s window, 1 retry per second floor, 10% of successes.
    let budget = RetryBudget::default();
    let floor = u64::from(budget.min_per_sec()) * budget.ttl().as_secs();
    let client = retries_only()
        .with_budget(budget.clone())
        .with_backoff(FullJitter::default().with_seed(11))
        .layer(backend);

    // 1,000 requests spread evenly over 10 s (100 per second), all inside one budget window.
    let mut marked = 0;
    for result in at_100_per_second(client, REQUESTS).await {
        let response = result.unwrap();
        assert_eq!(response.status(), 503);
        if no_retry_mark(&response) == Some("false") {
            marked += 1;
        }
    }

    let attempts = log.len();
    let snapshot = budget.snapshot();
    let amplification = attempts as f64 / REQUESTS as f64;
    println!(
        "total outage: {REQUESTS} requests -> {attempts} backend attempts \
         (amplification {amplification:.3}); budget {snapshot:?}, floor {floor}"
    );
    assert_eq!(
        snapshot.deposits, 0,
        "no successes, so the ratio grants nothing"
    );
    assert_eq!(attempts as u64, REQUESTS as u64 + snapshot.withdrawals);
    assert_eq!(
        snapshot.withdrawals, floor,
        "the floor, and not one retry more"
    );
    assert!(amplification <= 1.01);
    // Every failure handed back says "don't retry" to whoever is above.
    assert_eq!(marked, REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn five_percent_errors_get_every_retry_they_need() {
    const REQUESTS: usize = 2000;
    let log = Log::default();
    let rng = Arc::new(std::sync::Mutex::new(RandomSource::seeded(5).rng()));
    let backend = scripted(&log, Duration::from_millis(50), move |_, _| {
        let fail = rng.lock().unwrap().random::<f64>() < 0.05;
        Ok(if fail { status(503) } else { status(200) })
    });
    let (budget, layer) = budgeted();
    let client = layer
        .with_backoff(FullJitter::default().with_seed(5))
        .layer(backend);

    // 100 requests per second for 20 s.
    let mut succeeded = 0;
    for result in at_100_per_second(client, REQUESTS).await {
        if result.unwrap().status() == 200 {
            succeeded += 1;
        }
    }

    let attempts = log.len();
    let rate = succeeded as f64 / REQUESTS as f64;
    let snapshot = budget.snapshot();
    println!(
        "5% errors: {succeeded}/{REQUESTS} succeeded ({:.2}%), {} retries, budget {snapshot:?}",
        rate * 100.0,
        attempts - REQUESTS,
    );
    assert!(rate >= 0.997, "success rate {rate}");
    assert_eq!(
        snapshot.rejected, 0,
        "the budget refused a retry a 5% error rate needed"
    );
}

#[tokio::test(start_paused = true)]
async fn hint_of_ten_minutes_is_not_waited_for() {
    let (log, backend) = instant(|_, _| Ok(reply(503, &[("retry-after", "600")], "")));
    let (budget, layer) = budgeted();
    let client = layer.layer(backend);

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(log.len(), 1);
    assert_eq!(response.status(), 503);
    assert_eq!(no_retry_mark(&response), Some("false"));
    assert_eq!(give_up_cause(&response), Some(&GiveUpCause::HintTooLong));
    assert_eq!(budget.snapshot().withdrawals, 0);
}

#[tokio::test(start_paused = true)]
async fn never_sleeps_past_the_deadline() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let (budget, layer) = budgeted();
    let client = layer
        .with_backoff(Constant::new(Duration::from_secs(2)))
        .layer(backend);
    let request = chat_due_in(Duration::from_secs(1));

    let start = Instant::now();
    let response = client.oneshot(request).await.unwrap();

    // A 2 s backoff cannot fit in 1 s: the failure comes back at once, marked.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(log.len(), 1);
    assert_eq!(no_retry_mark(&response), Some("false"));
    assert_eq!(give_up_cause(&response), Some(&GiveUpCause::Deadline));
    assert_eq!(budget.snapshot().withdrawals, 0);
}

#[tokio::test(start_paused = true)]
async fn never_starts_an_attempt_that_cannot_finish() {
    // Each attempt takes 400 ms; backoff 300 ms.
    let client_with = |log: &Log| {
        let backend = scripted(log, Duration::from_millis(400), |_, _| Ok(status(503)));
        retries_only()
            .with_backoff(Constant::new(Duration::from_millis(300)))
            .with_margin(Duration::ZERO)
            .layer(backend)
    };

    // 1 s: after attempt 1 (0.4 s) a retry would start at 0.7 s and end at 1.1 s: not sent.
    let log = Log::default();
    let request = chat_due_in(Duration::from_secs(1));
    let start = Instant::now();
    let response = client_with(&log).oneshot(request).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert_eq!(give_up_cause(&response), Some(&GiveUpCause::Deadline));

    // 2 s: attempts at 0, 0.7 and 1.4 s, the last one ending at 1.8 s; every attempt is stamped
    // with the time left when it is sent (no margin here).
    let log = Log::default();
    let request = chat_due_in(Duration::from_secs(2));
    let start = Instant::now();
    let response = client_with(&log).oneshot(request).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(1800));
    let seen = log.all();
    let starts: Vec<_> = seen.iter().map(|s| (s.at - start).as_millis()).collect();
    assert_eq!(starts, [0, 700, 1400]);
    let timeouts: Vec<_> = seen
        .iter()
        .map(|s| {
            s.header(X_REQUEST_TIMEOUT_MS.as_str())
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .collect();
    assert_eq!(timeouts, [2000, 1300, 600]);
    assert_eq!(
        give_up_cause(&response),
        Some(&GiveUpCause::AttemptsExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn body_over_the_cap_is_sent_once_untouched() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let (budget, layer) = budgeted();
    let client = layer.with_max_replay_body(16).layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 503);
    let seen = log.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, Bytes::from_static(CHAT.as_bytes()));
    // Not retried here, so not marked: only the caller, who still holds the body, can retry.
    assert_eq!(no_retry_mark(&response), None);
    // Sent once, so no idempotency key either.
    assert_eq!(seen[0].header("idempotency-key"), None);
    assert_eq!(seen[0].header("x-retry-attempt"), Some("0"));
    assert_eq!(budget.snapshot().withdrawals, 0);
}

#[tokio::test(start_paused = true)]
async fn error_bodies_are_read_for_the_classifier_and_kept_whole_for_the_caller() {
    let big: Bytes = (0..100 * 1024)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<_>>()
        .into();
    let served = big.clone();
    let (log, backend) = instant(move |_, _| {
        Ok(http::Response::builder()
            .status(503)
            .body(Full::new(served.clone()))
            .unwrap())
    });
    let classifier = support::Recording::default();
    let client = retries_only()
        .with_classifier(classifier.clone())
        .with_max_attempts(2)
        .layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(log.len(), 2);
    assert_eq!(*classifier.bodies.lock().unwrap(), [64 * 1024, 64 * 1024]);
    assert_eq!(no_retry_mark(&response), Some("false"));
    assert!(response.body().was_read());
    let body = body_bytes(response).await;
    assert_eq!(body.len(), 100 * 1024);
    assert_eq!(body, big);
}

#[tokio::test(start_paused = true)]
async fn quota_exhausted_is_final_but_rate_limited_is_retried() {
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

    let (log, backend) = instant(move |_, _| Ok(reply(429, &[], quota)));
    let response = retries_only()
        .layer(backend)
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(response.status(), 429);
    // An SDK above would retry a 429 on its own: it is told not to.
    assert_eq!(no_retry_mark(&response), Some("false"));
    let body = body_bytes(response).await;
    assert_eq!(body, Bytes::from_static(quota.as_bytes()));

    let (log, backend) = instant(move |n, _| {
        Ok(if n == 0 {
            reply(429, &[], limited)
        } else {
            status(200)
        })
    });
    let response = retries_only()
        .layer(backend)
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(response.status(), 200);
    assert!(!response.body().was_read());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_backoff_cancels_the_request() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let (budget, layer) = budgeted();
    let client = layer
        .with_backoff(Constant::new(Duration::from_secs(5)))
        .layer(backend);

    let mut future = tokio_test::task::spawn(client.oneshot(post(CHAT_URI, CHAT)));
    assert!(
        future.poll().is_pending(),
        "should be sleeping before the retry"
    );
    assert_eq!(log.len(), 1);
    let during = budget.snapshot();
    assert_eq!(
        (during.withdrawals, during.deposits, during.rejected),
        (1, 0, 0)
    );

    drop(future);
    // The retry was never sent: its withdrawal is given back at once.
    let after = budget.snapshot();
    assert_eq!(
        (after.withdrawals, after.balance),
        (0, during.balance + 1),
        "the unsent retry is refunded"
    );
    // Past the 5 s backoff, still inside the budget's 10 s window.
    tokio::time::sleep(Duration::from_secs(9)).await;

    assert_eq!(log.len(), 1, "nothing may be sent after the drop");
    assert_eq!(budget.snapshot(), after);
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_throttle_below_drops_is_refunded() {
    // Attempt 1 is answered 503; the retry is dropped locally by a throttle under the engine
    // (as in the client stack): it never left, so its withdrawal is given back.
    let (log, backend) = instant(|attempt, _| match attempt {
        0 => Ok(status(503)),
        _ => Err(BoxError::from(Throttled)),
    });
    let (budget, layer) = budgeted();
    let client = layer
        .with_backoff(Constant::new(Duration::ZERO))
        .layer(backend);
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();
    assert!(chain(&error).any(|link| link.is::<Throttled>()), "{error}");
    assert_eq!(error.reason(), Reason::Throttled);
    assert_eq!(error.gave_up(), None);
    assert_eq!(log.len(), 2);
    let snapshot = budget.snapshot();
    assert_eq!((snapshot.withdrawals, snapshot.rejected), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_service_fails_to_get_ready_for_is_refunded() {
    // The backend answers 503 once; then it fails `poll_ready`, so the granted retry never goes
    // out: the engine returns the readiness error and gives the withdrawal back.
    #[derive(Clone)]
    struct ReadyOnce {
        calls: Arc<AtomicUsize>,
    }
    impl Service<Request<Full<Bytes>>> for ReadyOnce {
        type Response = Response<Full<Bytes>>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<Self::Response, BoxError>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.calls.load(Ordering::SeqCst) == 0 {
                Poll::Ready(Ok(()))
            } else {
                Poll::Ready(Err("backend closed".into()))
            }
        }
        fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(status(503)))
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let (budget, layer) = budgeted();
    let client = layer
        .with_backoff(Constant::new(Duration::ZERO))
        .layer(ReadyOnce {
            calls: calls.clone(),
        });
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();
    assert_eq!(error.gave_up(), None);
    assert_eq!(error.into_source().unwrap().to_string(), "backend closed");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(budget.snapshot().withdrawals, 0);
}

/// An error that reports another as its source.
#[derive(Debug)]
struct Wrapped(BoxError);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("wrapped")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Whether `error` is a [`Throttled`].
fn is_throttled(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<Throttled>()
}

/// Whether `error` is a [`DeadlineExceeded`].
fn is_deadline_exceeded(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<DeadlineExceeded>()
}

#[tokio::test(start_paused = true)]
async fn local_rejections_are_final() {
    type Is = fn(&(dyn std::error::Error + 'static)) -> bool;
    for (name, error, is) in [
        (
            "throttled",
            (|| BoxError::from(Throttled)) as fn() -> BoxError,
            is_throttled as Is,
        ),
        (
            "deadline",
            || BoxError::from(DeadlineExceeded::new()),
            is_deadline_exceeded,
        ),
        // Deeper in the chain: inside an io::Error, and as the source of another error.
        (
            "deadline in io",
            || BoxError::from(std::io::Error::other(DeadlineExceeded::new())),
            is_deadline_exceeded,
        ),
        (
            "throttled as a source",
            || BoxError::from(Wrapped(Box::new(Throttled))),
            is_throttled,
        ),
    ] {
        let (log, backend) = instant(move |_, _| Err::<Reply, _>(error()));
        let (budget, layer) = budgeted();
        let client = layer.layer(backend);
        let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();
        assert_eq!(log.len(), 1, "{name}");
        // Returned as it was: not given up on, the original error in its chain.
        assert_eq!(error.gave_up(), None, "{name}");
        assert!(chain(&error).any(is), "{name}: {error}");
        assert_eq!(budget.snapshot().withdrawals, 0, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_retried_then_given_up() {
    let (log, backend) = instant(|_, _| {
        Err::<Reply, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
    });
    let client = retries_only().layer(backend);

    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(log.len(), 3);
    assert_eq!(error.attempts(), 3);
    assert_eq!(error.gave_up(), Some(GiveUpCause::AttemptsExhausted));
    assert_eq!(error.reason(), Reason::Transport);
    let io = error.downcast_source::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// The report a router gets with a failed answer says whether the server answered 429 to every
/// attempt: what a failover reads to leave a backend that rate-limits the request whatever the
/// retries do.
#[tokio::test(start_paused = true)]
async fn the_report_says_whether_every_attempt_was_answered_429() {
    let throughout = |respond: fn(usize) -> Reply| async move {
        let (log, backend) = instant(move |n, _| Ok(respond(n)));
        let mut client = retries_only().layer(backend);
        let ready = client.ready().await.unwrap();
        let (answer, report) = ready.route(post(CHAT_URI, CHAT), Route::new()).await;
        assert!(answer.is_ok());
        (
            log.len(),
            report.attempts(),
            report.rate_limited_throughout(),
        )
    };
    assert_eq!(throughout(|_| status(429)).await, (3, 3, true));
    let hinted = |_| reply(429, &[("retry-after", "120")], "");
    assert_eq!(throughout(hinted).await, (1, 1, true));
    let after_503 = |n| status(if n == 0 { 503 } else { 429 });
    assert_eq!(throughout(after_503).await, (3, 3, false));
    let then_400 = |n| status(if n == 0 { 429 } else { 400 });
    assert_eq!(throughout(then_400).await, (2, 2, false));

    // An error says the same: a 429, then refused connections, is no run of 429s.
    let (log, backend) = instant(|n, _| match n {
        0 => Ok(status(429)),
        _ => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()),
    });
    let error = retries_only()
        .layer(backend)
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap_err();
    assert_eq!((log.len(), error.attempts()), (3, 3));
    assert!(!error.rate_limited_throughout());
}

#[tokio::test(start_paused = true)]
async fn exhausted_budget_gives_up_at_once() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    // No floor and no successes yet: nothing to withdraw.
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let client = retries_only().with_budget(budget.clone()).layer(backend);

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(log.len(), 1);
    assert_eq!(no_retry_mark(&response), Some("false"));
    assert_eq!(
        give_up_cause(&response),
        Some(&GiveUpCause::BudgetExhausted)
    );
    assert_eq!(budget.snapshot().rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn grpc_attempts_use_grpc_headers() {
    let (log, backend) = instant(|_, _| {
        // Trailers-only UNAVAILABLE.
        Ok(reply(
            200,
            &[("content-type", "application/grpc"), ("grpc-status", "14")],
            "",
        ))
    });
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .layer(backend);
    let request = Request::post("http://svc.test/pkg.Service/Method")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x02\x08\x01")))
        .unwrap();

    let response = client.oneshot(request).await.unwrap();

    let seen = log.all();
    let previous: Vec<_> = seen
        .iter()
        .map(|s| s.header(GRPC_PREVIOUS_RPC_ATTEMPTS.as_str()))
        .collect();
    assert_eq!(previous, [None, Some("1"), Some("2")]);
    for attempt in &seen {
        assert_eq!(attempt.header(X_RETRY_ATTEMPT.as_str()), None);
        assert_eq!(attempt.header(IDEMPOTENCY_KEY.as_str()), None);
    }
    assert_eq!(response.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
    assert!(!response.headers().contains_key(X_SHOULD_RETRY));
}

#[tokio::test(start_paused = true)]
async fn idempotency_key_only_where_needed_and_never_replaced() {
    let (log, backend) = instant(|n, _| Ok(if n % 2 == 0 { status(503) } else { status(200) }));
    let client = retries_only().layer(backend);

    let mut request = post(CHAT_URI, CHAT);
    request.headers_mut().insert(
        IDEMPOTENCY_KEY,
        http::HeaderValue::from_static("caller-chosen"),
    );
    client.clone().oneshot(request).await.unwrap();
    client.clone().oneshot(support::get()).await.unwrap();
    let put = Request::put("http://llm.test/v1/files/1")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    client.clone().oneshot(put).await.unwrap();
    let patch = Request::patch("http://llm.test/v1/assistants/1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    client.oneshot(patch).await.unwrap();

    let keys: Vec<_> = log
        .all()
        .iter()
        .map(|s| s.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(keys[0].as_deref(), Some("caller-chosen"));
    assert_eq!(keys[1].as_deref(), Some("caller-chosen"));
    assert_eq!(&keys[2..6], [None, None, None, None]);
    assert!(keys[6].is_some());
    assert_eq!(keys[6], keys[7]);
}

#[tokio::test(start_paused = true)]
async fn success_responses_pass_through_unread() {
    let (log, backend) = instant(|_, _| Ok(reply(200, &[], "{\"ok\":true}")));
    let (budget, layer) = budgeted();
    let client = layer.layer(backend);

    let response = client.oneshot(support::get()).await.unwrap();

    assert!(!response.body().was_read());
    assert_eq!(no_retry_mark(&response), None);
    assert_eq!(log.all()[0].header("x-retry-attempt"), Some("0"));
    let body = body_bytes(response).await;
    assert_eq!(body, Bytes::from_static(b"{\"ok\":true}"));
    assert_eq!(budget.snapshot().deposits, 1);
}

#[tokio::test(start_paused = true)]
async fn longest_hint_followed_comes_from_the_hint_policy() {
    let script = |n: usize, _: &support::Seen| {
        Ok(if n == 0 {
            reply(503, &[("retry-after", "90")], "")
        } else {
            status(200)
        })
    };

    // The policy allows 120 s: the 90 s hint is waited out.
    let (log, backend) = instant(script);
    let client = retries_only()
        .with_hint_policy(HintPolicy::default().with_max(Duration::from_secs(120)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = log.all();
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(90));

    // The policy allows 30 s: the 90 s hint ends the request.
    let (log, backend) = instant(script);
    let client = retries_only()
        .with_hint_policy(HintPolicy::default().with_max(Duration::from_secs(30)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(log.len(), 1);
    assert_eq!(give_up_cause(&response), Some(&GiveUpCause::HintTooLong));
}

#[tokio::test(start_paused = true)]
async fn a_fixed_timeout_is_stamped_on_every_attempt_with_the_time_left() {
    // Each attempt takes 100 ms; the first is answered 503, and the retry waits 200 ms.
    let log = Log::default();
    let backend = scripted(&log, Duration::from_millis(100), |n, _| {
        Ok(if n == 0 { status(503) } else { status(200) })
    });
    let client = ClientLayer::default()
        .without_throttle()
        .with_timeout(Duration::from_secs(10))
        .with_backoff(Constant::new(Duration::from_millis(200)))
        .layer(backend);

    let start = Instant::now();
    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    let seen = log.all();
    let starts: Vec<_> = seen.iter().map(|s| (s.at - start).as_millis()).collect();
    assert_eq!(starts, [0, 300]);
    // 10 s minus the time spent, minus the 50 ms margin.
    let timeouts: Vec<_> = seen
        .iter()
        .map(|s| s.header(X_REQUEST_TIMEOUT_MS.as_str()).unwrap())
        .collect();
    assert_eq!(timeouts, ["9950", "9650"]);
}

#[tokio::test(start_paused = true)]
async fn a_hung_attempt_ends_at_the_deadline_and_is_counted_as_not_accepted() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(3));
    let log = Log::default();
    let backend = scripted(&log, Duration::from_secs(3600), |_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .with_throttle(throttle.clone())
        .with_timeout(Duration::from_secs(5))
        .layer(backend);

    let start = Instant::now();
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert_eq!(error.gave_up(), None);
    assert_eq!(error.attempts(), 1);
    assert!(chain(&error).any(is_deadline_exceeded));
    assert_eq!(log.len(), 1);
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn the_throttle_judges_a_429_by_its_body() {
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

    // Out of quota: the backend did the work and answered; final, and marked so.
    let throttle = AdaptiveThrottle::default();
    let (log, backend) = instant(move |_, _| Ok(reply(429, &[], quota)));
    let response = ClientLayer::default()
        .with_throttle(throttle.clone())
        .layer(backend)
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(log.len(), 1);
    assert_eq!(no_retry_mark(&response), Some("false"));
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 1));

    // Rate limited: rejected (not accepted), then retried and answered.
    let throttle = AdaptiveThrottle::default();
    let (log, backend) = instant(move |n, _| {
        Ok(if n == 0 {
            reply(429, &[], limited)
        } else {
            status(200)
        })
    });
    let response = ClientLayer::default()
        .with_throttle(throttle.clone())
        .with_backoff(Constant::new(Duration::ZERO))
        .layer(backend)
        .oneshot(post(CHAT_URI, CHAT))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.len(), 2);
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_an_attempt_counts_one_request_not_accepted() {
    let throttle = AdaptiveThrottle::default();
    let log = Log::default();
    let backend = scripted(&log, Duration::from_secs(10), |_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .with_throttle(throttle.clone())
        .layer(backend);

    let mut future = tokio_test::task::spawn(client.oneshot(post(CHAT_URI, CHAT)));
    assert!(
        future.poll().is_pending(),
        "the attempt should be in flight"
    );
    assert_eq!(log.len(), 1);
    // In flight: not counted yet.
    assert_eq!(throttle.snapshot().requests, 0);

    drop(future);
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 0));
    // Nothing more is recorded later (still inside the throttle's 2 s window).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let snapshot = throttle.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (1, 0));
    assert_eq!(log.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_already_past_its_deadline_is_never_sent() {
    let throttle = AdaptiveThrottle::default();
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .with_throttle(throttle.clone())
        .layer(backend);
    let request = chat_due_in(Duration::from_millis(100));
    tokio::time::advance(Duration::from_millis(100)).await;

    let start = Instant::now();
    let error = client.oneshot(request).await.unwrap_err();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert_eq!(error.attempts(), 0);
    assert_eq!(error.gave_up(), None);
    assert!(chain(&error).any(is_deadline_exceeded));
    assert_eq!(log.len(), 0);
    // Never offered to the throttle either.
    assert_eq!(throttle.snapshot().requests, 0);
}

/// A router that read the body already hands what it read with the request, and the engine's
/// clocks size the request from it: a whole answer of 10 output tokens is given 10.28 s to its
/// head (cut at a backend that answers in 20 s, the request handed on), one the router read as
/// 1,000 output tokens 38 s (answered).
#[tokio::test(start_paused = true)]
async fn the_clocks_size_a_request_from_what_its_router_read() {
    use stormguard_deadline::clocks::{AttemptClocks, SharedBodyShape};

    let small = r#"{"max_tokens": 10, "messages": []}"#;
    // The router read a body asking for 1,000 tokens (what the engine's clocks then use).
    let large = SharedBodyShape::default();
    let uri: http::Uri = CHAT_URI.parse().unwrap();
    large.get_or_read(&uri, br#"{"max_tokens": 1000, "messages": []}"#);
    for (shape, attempts, answered) in [(None, 1, false), (Some(large.clone()), 1, true)] {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_secs(20), |_, _| Ok(status(200)));
        let mut client = retries_only()
            .with_clocks(AttemptClocks::default())
            .layer(backend);
        let route = match shape.clone() {
            Some(shape) => Route::new().with_body_shape(shape),
            None => Route::new(),
        };
        let start = Instant::now();
        let ready = client.ready().await.unwrap();
        let (answer, report) = ready
            .route(post(CHAT_URI, small), route.with_hand_off())
            .await;
        assert_eq!(answer.is_ok(), answered, "{shape:?}");
        assert_eq!(report.attempts(), attempts, "{shape:?}");
        let waited = start.elapsed();
        match answered {
            true => assert_eq!(waited, Duration::from_secs(20)),
            false => assert_eq!(waited, Duration::from_millis(10_280)),
        }
    }
}
