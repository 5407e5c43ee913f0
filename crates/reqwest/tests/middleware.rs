//! StormguardMiddleware against a scripted axum server on loopback.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, Throttled};
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::{ERROR_BODY_LIMIT, Reason, chain};
use stormguard_deadline::Deadline;
use stormguard_jitter::FullJitter;
use stormguard_reqwest::StormguardMiddleware;
use stormguard_retry::{ClientLayer, GiveUpCause};
use stormguard_test_kit::{Log, Reply, ScriptedBackend, ScriptedBody, Seen};
use tokio::time::Instant;
use tower_service::Service;

/// The log of a scripted backend served on loopback.
#[derive(Clone)]
struct Server(Log);

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.0.all()
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.seen().into_iter().map(|seen| seen.body).collect()
    }

    fn header_values(&self, name: &str) -> Vec<String> {
        self.seen()
            .iter()
            .map(|seen| seen.header(name).unwrap_or_default().to_owned())
            .collect()
    }
}

/// Serves `script` in order, repeating its last reply; returns the URL and the server's log.
async fn serve(script: Vec<Reply>) -> (String, Server) {
    let backend = ScriptedBackend::replies(script);
    let server = Server(backend.log().clone());
    let app = Router::new().fallback(move |request: Request| {
        let mut backend = backend.clone();
        async move {
            let response = backend.call(request).await.unwrap();
            response.map(Body::new)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/chat/completions"), server)
}

/// The engine with short delays, a throttle that never drops and a generous budget.
fn fast() -> ClientLayer {
    ClientLayer::default()
        .with_backoff(FullJitter::new(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .with_throttle(AdaptiveThrottle::new(
            ThrottleConfig::default().with_min_rate(f64::INFINITY),
        ))
        .with_budget(RetryBudget::new(
            BudgetConfig::default().with_min_per_sec(100),
        ))
}

fn client(layer: ClientLayer) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(layer))
        .build()
}

/// A throttle over a 60 s window that drops at any rate, up to every request.
fn unbounded_throttle(seed: u64) -> AdaptiveThrottle {
    AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_k(2.0)
            .with_window(Duration::from_secs(60))
            .with_min_rate(0.0)
            .with_max_probability(1.0)
            .with_seed(seed),
    )
}

/// stormguard's own error, which a request it throttled, timed out or gave up on fails with.
fn stormguard_error(error: reqwest_middleware::Error) -> stormguard_retry::Error {
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("expected a middleware error, got {error:?}");
    };
    error
        .downcast::<stormguard_retry::Error>()
        .unwrap_or_else(|error| panic!("expected stormguard's error, got {error:?}"))
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;

#[tokio::test]
async fn post_503_503_200_succeeds_with_attempt_numbers_and_one_idempotency_key() {
    let (url, server) = serve(vec![
        Reply::status(503),
        Reply::status(503),
        Reply::status(200).json("{}"),
    ])
    .await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(server.header_values("x-retry-attempt"), ["0", "1", "2"]);
    let keys = server.header_values("idempotency-key");
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0].len(), 36, "a UUID: {keys:?}");
    assert!(keys.iter().all(|key| *key == keys[0]), "{keys:?}");
    // Every attempt carries the time left of the one deadline (10 minutes by default).
    for timeout in server.header_values("x-request-timeout-ms") {
        let millis: u64 = timeout.parse().unwrap();
        assert!((590_000..=600_000).contains(&millis), "{millis}");
    }
}

#[tokio::test]
async fn callers_idempotency_key_is_kept_and_get_gets_none() {
    let (url, server) = serve(vec![Reply::status(503), Reply::status(200).json("{}")]).await;
    let client = client(fast());
    let response = client
        .post(&url)
        .header("idempotency-key", "caller-key-1")
        .body(CHAT)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        server.header_values("idempotency-key"),
        ["caller-key-1", "caller-key-1"]
    );

    let (url, server) = serve(vec![Reply::status(200).json("{}")]).await;
    client.get(&url).send().await.unwrap();
    assert_eq!(server.header_values("idempotency-key"), [""]);
}

#[tokio::test]
async fn bad_request_is_not_retried_and_its_body_reaches_the_caller() {
    let body = r#"{"error":{"message":"maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
    let (url, server) = serve(vec![
        Reply::status(400).json(body),
        Reply::status(200).json("{}"),
    ])
    .await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 400);
    assert_eq!(server.seen().len(), 1);
    // Fatal: marked so that an SDK above does not retry it either, but not a give-up.
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert!(response.extensions().get::<GiveUpCause>().is_none());
    assert_eq!(response.text().await.unwrap(), body);
}

#[tokio::test]
async fn insufficient_quota_429_is_not_retried() {
    let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let (url, server) = serve(vec![
        Reply::status(429).json(body),
        Reply::status(200).json("{}"),
    ])
    .await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 429);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(response.text().await.unwrap(), body);
}

#[tokio::test]
async fn rate_limit_429_is_retried_after_the_retry_after_ms_hint() {
    let limited = Reply::status(429).header("retry-after-ms", "50").json(
        r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
    );
    let (url, server) = serve(vec![limited, Reply::status(200).json("{}")]).await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 200);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    // The backoff alone would wait at most 10 ms: the 50 ms are the server's.
    let waited = seen[1].at - seen[0].at;
    assert!(waited >= Duration::from_millis(50), "{waited:?}");
}

#[tokio::test]
async fn hint_above_the_maximum_ends_the_request_at_once() {
    let come_back_later = Reply::status(503).header("retry-after-ms", "120000");
    let (url, server) = serve(vec![come_back_later, Reply::status(200).json("{}")]).await;
    let response = client(fast()).get(&url).send().await.unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(
        response.extensions().get::<GiveUpCause>(),
        Some(&GiveUpCause::HintTooLong)
    );
}

#[tokio::test]
async fn gives_up_after_max_attempts_and_marks_the_response() {
    let (url, server) = serve(vec![Reply::status(503)]).await;
    let response = client(fast().with_max_attempts(4))
        .get(&url)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 4);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(
        response.extensions().get::<GiveUpCause>(),
        Some(&GiveUpCause::AttemptsExhausted)
    );
}

#[tokio::test]
async fn total_outage_is_amplified_at_most_by_the_budget_floor() {
    let (url, server) = serve(vec![Reply::status(503)]).await;
    // Floor: 2 retries per second over 5 s = 10 retries; no successes, so nothing more.
    let budget = RetryBudget::new(
        BudgetConfig::default()
            .with_ttl(Duration::from_secs(5))
            .with_min_per_sec(2),
    );
    let client = client(fast().with_budget(budget.clone()));
    let requests = 40;
    for _ in 0..requests {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["x-should-retry"], "false");
    }

    let attempts = server.seen().len();
    assert!(attempts <= requests + 10, "{attempts} attempts");
    assert!(
        attempts > requests,
        "the floor allows some retries: {attempts}"
    );
    assert_eq!(budget.snapshot().withdrawals as usize, attempts - requests);
}

#[tokio::test]
async fn throttle_drop_fails_at_once_and_never_reaches_the_server() {
    let (url, server) = serve(vec![Reply::status(200).json("{}")]).await;
    let throttle = unbounded_throttle(3);
    // The backend rejected everything lately.
    for _ in 0..1_000 {
        // A rejection: a permit dropped untold counts as not accepted.
        drop(throttle.try_acquire());
    }
    let before = throttle.snapshot().requests;
    let client = client(fast().with_throttle(throttle.clone()));

    for _ in 0..5 {
        let error = stormguard_error(client.post(&url).body(CHAT).send().await.unwrap_err());
        assert_eq!(error.reason(), Reason::Throttled, "{error}");
        assert!(chain(&error).any(|link| link.is::<Throttled>()), "{error}");
        assert_eq!(error.attempts(), 0);
    }
    assert!(server.seen().is_empty());
    // One draw per request: a drop is never retried.
    assert_eq!(throttle.snapshot().requests - before, 5);
}

/// A request body of unknown length: `count` frames of `chunk`.
fn chunks(chunk: &'static [u8], count: usize) -> reqwest::Body {
    let chunks = std::iter::repeat_n(Bytes::from_static(chunk), count);
    reqwest::Body::wrap(ScriptedBody::chunks(chunks))
}

#[tokio::test]
async fn streaming_request_body_goes_through_once_unmarked_without_a_key() {
    let (url, server) = serve(vec![Reply::status(503)]).await;
    // 4 KiB of unknown length against a 1 KiB replay cap: read up to the cap, then sent once.
    let body = chunks(&[b'x'; 256], 16);
    let response = client(fast().with_max_replay_body(1024))
        .post(&url)
        .body(body)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
    // This layer could not retry it: the decision stays with the caller.
    assert!(response.headers().get("x-should-retry").is_none());
    assert_eq!(server.header_values("idempotency-key"), [""]);
    assert_eq!(server.header_values("x-retry-attempt"), ["0"]);
    // The bytes read up to the cap, then the rest: the whole body, once.
    assert_eq!(server.bodies(), [Bytes::from(vec![b'x'; 4096])]);
}

#[tokio::test]
async fn streaming_request_body_within_the_cap_is_replayed_with_one_key() {
    let (url, server) = serve(vec![Reply::status(503), Reply::status(200).json("{}")]).await;
    let body = chunks(b"{\"model\":\"m\"}", 3);
    let response = client(fast()).post(&url).body(body).send().await.unwrap();

    assert_eq!(response.status(), 200);
    let whole = Bytes::from_static(b"{\"model\":\"m\"}{\"model\":\"m\"}{\"model\":\"m\"}");
    assert_eq!(server.bodies(), [whole.clone(), whole]);
    assert_eq!(server.header_values("x-retry-attempt"), ["0", "1"]);
    let keys = server.header_values("idempotency-key");
    assert_eq!(keys[0].len(), 36, "a UUID: {keys:?}");
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test]
async fn callers_deadline_stops_a_retry_whose_hint_would_pass_it() {
    let slow_down = Reply::status(503).header("retry-after-ms", "300");
    let (url, server) = serve(vec![slow_down, Reply::status(200).json("{}")]).await;
    let response = client(fast())
        .get(&url)
        .with_extension(Deadline::after(Duration::from_millis(150)))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(
        response.extensions().get::<GiveUpCause>(),
        Some(&GiveUpCause::Deadline)
    );
    let timeout: u64 = server.header_values("x-request-timeout-ms")[0]
        .parse()
        .unwrap();
    assert!(timeout <= 150, "{timeout}");
}

#[tokio::test]
async fn error_body_larger_than_the_cap_is_handed_back_whole() {
    let big = format!(
        r#"{{"error":{{"message":"{}","type":"invalid_request_error"}}}}"#,
        "x".repeat(3 * ERROR_BODY_LIMIT)
    );
    let (url, server) = serve(vec![Reply::status(400).json(big.clone())]).await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 400);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.text().await.unwrap().len(), big.len());
}

/// An address on loopback that nothing listens on.
fn closed_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

#[tokio::test]
async fn connection_refused_is_retried_within_the_budget() {
    let addr = closed_port();
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(100));
    let client = client(fast().with_budget(budget.clone()));

    let error = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap_err();
    // Given up after retries: stormguard's error, with reqwest's below it.
    let error = stormguard_error(error);
    assert_eq!(
        error.gave_up(),
        Some(GiveUpCause::AttemptsExhausted),
        "{error}"
    );
    assert_eq!(error.attempts(), 3);
    let original = error
        .downcast_source::<reqwest_middleware::Error>()
        .unwrap();
    assert!(original.is_connect(), "{original}");
    assert_eq!(budget.snapshot().withdrawals, 2);
}

#[tokio::test]
async fn an_error_the_engine_does_not_retry_comes_back_unchanged() {
    let addr = closed_port();
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(100));
    let client = client(fast().with_budget(budget.clone()).with_max_attempts(1));

    let error = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(error, reqwest_middleware::Error::Reqwest(_)),
        "{error:?}"
    );
    assert!(error.is_connect(), "{error}");
    assert_eq!(budget.snapshot().withdrawals, 0);
}

#[tokio::test]
async fn dropping_the_request_during_the_backoff_refunds_the_retry() {
    let (url, server) = serve(vec![Reply::status(503), Reply::status(200).json("{}")]).await;
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(100));
    // A backoff of up to a minute (seeded: the same delay every run): the retry waits in it.
    let backoff = FullJitter::new(Duration::from_secs(60), Duration::from_secs(60)).with_seed(7);
    let client = client(fast().with_budget(budget.clone()).with_backoff(backoff));
    let mut send = Box::pin(client.post(&url).body(CHAT).send());
    // Drive the request until the 503 came back and the retry was granted: it is then sleeping.
    while budget.snapshot().withdrawals == 0 {
        tokio::select! {
            result = &mut send => panic!("finished before the retry: {result:?}"),
            () = tokio::task::yield_now() => {}
        }
    }
    assert_eq!(server.seen().len(), 1);
    let granted = budget.snapshot();
    drop(send);
    let after = budget.snapshot();
    assert_eq!(
        (after.withdrawals, after.balance),
        (0, granted.balance + 1),
        "the retry that was never sent is given back"
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_retry_the_throttle_drops_is_refunded() {
    let (url, server) = serve(vec![Reply::status(503), Reply::status(200).json("{}")]).await;
    // A throttle that lets the first attempt through (nothing recorded yet) and, once that
    // attempt was rejected, drops with probability 1/2: the seed is picked so that the retry's
    // draw drops, replaying the same draws on a probe throttle first.
    let seed = (0..64)
        .find(|&seed| {
            let probe = unbounded_throttle(seed);
            // The first attempt's permit, dropped untold: rejected.
            let first = probe.try_acquire().is_ok();
            first && probe.try_acquire().is_err()
        })
        .unwrap();
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(100));
    let client = client(
        fast()
            .with_throttle(unbounded_throttle(seed))
            .with_budget(budget.clone()),
    );

    let error = stormguard_error(client.post(&url).body(CHAT).send().await.unwrap_err());
    assert_eq!(error.reason(), Reason::Throttled, "{error}");
    assert!(chain(&error).any(|link| link.is::<Throttled>()), "{error}");
    assert_eq!(server.seen().len(), 1);
    let snapshot = budget.snapshot();
    assert_eq!((snapshot.withdrawals, snapshot.rejected), (0, 0));
}

#[tokio::test]
async fn callers_deadline_tighter_than_the_layers_timeout_is_sent_and_stops_the_retry() {
    let slow_down = Reply::status(503).header("retry-after-ms", "300");
    let layer = fast().with_timeout(Duration::from_secs(10));

    // The layer's own 10 s leave room for the retry after the 300 ms hint.
    let (url, server) = serve(vec![slow_down.clone(), Reply::status(200).json("{}")]).await;
    let response = client(layer.clone()).get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.seen().len(), 2);
    let told: u64 = server.header_values("x-request-timeout-ms")[0]
        .parse()
        .unwrap();
    assert!((9_000..=9_950).contains(&told), "{told}");

    // The caller's 250 ms deadline is what the server is told (less the 50 ms margin), and it
    // leaves no room for the hint: the retry is not sent.
    let (url, server) = serve(vec![slow_down, Reply::status(200).json("{}")]).await;
    let response = client(layer)
        .get(&url)
        .with_extension(Deadline::after(Duration::from_millis(250)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(
        response.extensions().get::<GiveUpCause>(),
        Some(&GiveUpCause::Deadline)
    );
    let told: u64 = server.header_values("x-request-timeout-ms")[0]
        .parse()
        .unwrap();
    assert!((100..=200).contains(&told), "{told}");
}

#[tokio::test]
async fn a_per_request_reqwest_timeout_applies_to_each_attempt() {
    let hung = Reply::status(200).json("{}").delay(Duration::from_secs(5));

    // The first attempt times out after 200 ms; the retry gets 200 ms of its own, and answers.
    let (url, server) = serve(vec![hung.clone(), Reply::status(200).json("{}")]).await;
    let started = Instant::now();
    let response = client(fast())
        .get(&url)
        .timeout(Duration::from_millis(200))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.seen().len(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Every attempt hangs: each one is cut at 200 ms, three in all, then the engine gives up.
    let (url, server) = serve(vec![hung]).await;
    let started = Instant::now();
    let error = client(fast())
        .get(&url)
        .timeout(Duration::from_millis(200))
        .send()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(server.seen().len(), 3);
    assert!(elapsed >= Duration::from_millis(600), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let error = stormguard_error(error);
    assert_eq!(
        error.gave_up(),
        Some(GiveUpCause::AttemptsExhausted),
        "{error}"
    );
    let original = error
        .downcast_source::<reqwest_middleware::Error>()
        .unwrap();
    assert!(original.is_timeout(), "{original}");
}

/// A caller's extension, for the middleware below stormguard to find.
#[derive(Clone, Debug, PartialEq)]
struct Tag(&'static str);

/// What the middleware below stormguard found in the extensions on one attempt.
type Found = (Option<Tag>, Option<Deadline>);

/// Middleware below stormguard that notes, on each attempt, the caller's tag and deadline.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Found>>>,
}

impl Middleware for Recorder {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: reqwest::Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Pin<
        Box<
            dyn Future<Output = reqwest_middleware::Result<reqwest::Response>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        let tag = extensions.get::<Tag>().cloned();
        let deadline = extensions.get::<Deadline>().copied();
        self.seen.lock().unwrap().push((tag, deadline));
        Box::pin(next.run(req, extensions))
    }
}

#[tokio::test]
async fn the_callers_extensions_reach_the_rest_of_the_chain_on_every_attempt() {
    let (url, server) = serve(vec![Reply::status(503), Reply::status(200).json("{}")]).await;
    let recorder = Recorder::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(fast()))
        .with(recorder.clone())
        .build();
    let deadline = Deadline::after(Duration::from_secs(30));
    let response = client
        .post(&url)
        .body(CHAT)
        .with_extension(Tag("caller"))
        .with_extension(deadline)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(server.seen().len(), 2);
    let entry = (Some(Tag("caller")), Some(deadline));
    assert_eq!(*recorder.seen.lock().unwrap(), [entry.clone(), entry]);
}
