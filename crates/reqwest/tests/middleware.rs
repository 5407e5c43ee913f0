//! StormguardMiddleware against a scripted axum server on loopback.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard_adaptive_throttle::{AdaptiveThrottle, Throttled};
use stormguard_budget::RetryBudget;
use stormguard_deadline::Deadline;
use stormguard_jitter::FullJitter;
use stormguard_reqwest::StormguardMiddleware;
use stormguard_retry::GiveUpCause;
use tokio::time::Instant;

/// One scripted answer: status, headers, body.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
        body: String::new(),
    }
}

fn json(status: u16, body: &str) -> Reply {
    Reply {
        status,
        headers: vec![("content-type", "application/json")],
        body: body.to_owned(),
    }
}

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    headers: HeaderMap,
}

#[derive(Clone)]
struct Server {
    script: Arc<Vec<Reply>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn header_values(&self, name: &str) -> Vec<String> {
        self.seen()
            .iter()
            .map(|seen| {
                seen.headers
                    .get(name)
                    .map(|value| value.to_str().unwrap().to_owned())
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// Serves `script` in order, repeating its last reply; returns the URL and the server's log.
async fn serve(script: Vec<Reply>) -> (String, Server) {
    async fn answer(State(server): State<Server>, headers: HeaderMap) -> Response<Body> {
        let n = {
            let mut seen = server.seen.lock().unwrap();
            seen.push(Seen {
                at: Instant::now(),
                headers,
            });
            seen.len() - 1
        };
        let reply = &server.script[n.min(server.script.len() - 1)];
        let mut response = Response::builder().status(reply.status);
        for (name, value) in &reply.headers {
            response = response.header(*name, *value);
        }
        response.body(Body::from(reply.body.clone())).unwrap()
    }

    let server = Server {
        script: Arc::new(script),
        seen: Arc::default(),
    };
    let app = Router::new().fallback(answer).with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/chat/completions"), server)
}

/// The middleware with short delays, a throttle that never drops and a generous budget.
fn fast() -> StormguardMiddleware {
    StormguardMiddleware::default()
        .backoff(FullJitter::new(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .throttle(AdaptiveThrottle::default().with_min_rate(f64::INFINITY))
        .budget(RetryBudget::new(Duration::from_secs(10), 100, 0.1))
}

fn client(
    middleware: StormguardMiddleware<stormguard_classify::LlmClassifier, FullJitter>,
) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;

#[tokio::test]
async fn post_503_503_200_succeeds_with_attempt_numbers_and_one_idempotency_key() {
    let (url, server) = serve(vec![reply(503), reply(503), json(200, "{}")]).await;
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
    let (url, server) = serve(vec![reply(503), json(200, "{}")]).await;
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

    let (url, server) = serve(vec![json(200, "{}")]).await;
    client.get(&url).send().await.unwrap();
    assert_eq!(server.header_values("idempotency-key"), [""]);
}

#[tokio::test]
async fn bad_request_is_not_retried_and_its_body_reaches_the_caller() {
    let body = r#"{"error":{"message":"maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
    let (url, server) = serve(vec![json(400, body), json(200, "{}")]).await;
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
    let (url, server) = serve(vec![json(429, body), json(200, "{}")]).await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 429);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(response.text().await.unwrap(), body);
}

#[tokio::test]
async fn rate_limit_429_is_retried_after_the_retry_after_ms_hint() {
    let limited = Reply {
        headers: vec![
            ("retry-after-ms", "50"),
            ("content-type", "application/json"),
        ],
        ..json(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        )
    };
    let (url, server) = serve(vec![limited, json(200, "{}")]).await;
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
    let come_back_later = Reply {
        headers: vec![("retry-after-ms", "120000")],
        ..reply(503)
    };
    let (url, server) = serve(vec![come_back_later, json(200, "{}")]).await;
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
    let (url, server) = serve(vec![reply(503)]).await;
    let response = client(fast().max_attempts(4))
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
    let (url, server) = serve(vec![reply(503)]).await;
    // Floor: 2 retries per second over 5 s = 10 retries; no successes, so nothing more.
    let budget = RetryBudget::new(Duration::from_secs(5), 2, 0.1);
    let client = client(fast().budget(budget.clone()));
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
    let (url, server) = serve(vec![json(200, "{}")]).await;
    let throttle = AdaptiveThrottle::new(2.0, Duration::from_secs(60))
        .with_min_rate(0.0)
        .with_max_probability(1.0)
        .with_seed(3);
    // The backend rejected everything lately.
    for _ in 0..1_000 {
        if throttle.try_acquire().is_ok() {
            throttle.record(false);
        }
    }
    let before = throttle.snapshot().requests;
    let client = client(fast().throttle(throttle.clone()));

    for _ in 0..5 {
        let error = client.post(&url).body(CHAT).send().await.unwrap_err();
        let reqwest_middleware::Error::Middleware(error) = error else {
            panic!("expected a middleware error, got {error:?}");
        };
        assert!(error.is::<Throttled>(), "{error}");
    }
    assert!(server.seen().is_empty());
    // One draw per request: a drop is never retried.
    assert_eq!(throttle.snapshot().requests - before, 5);
}

#[tokio::test]
async fn streaming_request_body_goes_through_once_unmarked_without_a_key() {
    let (url, server) = serve(vec![reply(503)]).await;
    let body = reqwest::Body::wrap(http_body_util::Full::new(bytes_of(CHAT)));
    let response = client(fast()).post(&url).body(body).send().await.unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
    // This layer could not retry it: the decision stays with the caller.
    assert!(response.headers().get("x-should-retry").is_none());
    assert_eq!(server.header_values("idempotency-key"), [""]);
    assert_eq!(server.header_values("x-retry-attempt"), ["0"]);
}

fn bytes_of(text: &'static str) -> axum::body::Bytes {
    axum::body::Bytes::from_static(text.as_bytes())
}

#[tokio::test]
async fn callers_deadline_stops_a_retry_whose_hint_would_pass_it() {
    let slow_down = Reply {
        headers: vec![("retry-after-ms", "300")],
        ..reply(503)
    };
    let (url, server) = serve(vec![slow_down, json(200, "{}")]).await;
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
        "x".repeat(3 * stormguard_reqwest::ERROR_BODY_LIMIT)
    );
    let (url, server) = serve(vec![json(400, &big)]).await;
    let response = client(fast()).post(&url).body(CHAT).send().await.unwrap();

    assert_eq!(response.status(), 400);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(response.text().await.unwrap().len(), big.len());
}

#[tokio::test]
async fn connection_refused_is_retried_within_the_budget() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let budget = RetryBudget::new(Duration::from_secs(10), 100, 0.1);
    let client = client(fast().budget(budget.clone()));

    let error = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error}");
    assert_eq!(budget.snapshot().withdrawals, 2);
}

#[tokio::test]
async fn dropping_the_request_during_the_backoff_refunds_the_retry() {
    let (url, server) = serve(vec![reply(503), json(200, "{}")]).await;
    let budget = RetryBudget::new(Duration::from_secs(10), 100, 0.1);
    // A backoff of up to a minute (seeded: the same delay every run): the retry waits in it.
    let backoff = FullJitter::new(Duration::from_secs(60), Duration::from_secs(60)).with_seed(7);
    let client = client(fast().budget(budget.clone()).backoff(backoff));
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
    let (url, server) = serve(vec![reply(503), json(200, "{}")]).await;
    // A throttle that lets the first attempt through (nothing recorded yet) and, once that
    // attempt was rejected, drops with probability 1/2: the seed is picked so that the retry's
    // draw drops, replaying the same draws on a probe throttle first.
    let throttle = |seed| {
        AdaptiveThrottle::new(2.0, Duration::from_secs(60))
            .with_min_rate(0.0)
            .with_max_probability(1.0)
            .with_seed(seed)
    };
    let seed = (0..64)
        .find(|&seed| {
            let probe = throttle(seed);
            let first = probe.try_acquire().is_ok();
            probe.record(false);
            first && probe.try_acquire().is_err()
        })
        .unwrap();
    let budget = RetryBudget::new(Duration::from_secs(10), 100, 0.1);
    let client = client(fast().throttle(throttle(seed)).budget(budget.clone()));

    let error = client.post(&url).body(CHAT).send().await.unwrap_err();
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("expected a middleware error, got {error:?}");
    };
    assert!(error.is::<Throttled>(), "{error}");
    assert_eq!(server.seen().len(), 1);
    let snapshot = budget.snapshot();
    assert_eq!((snapshot.withdrawals, snapshot.rejected), (0, 0));
}
