//! One table of behaviours, run through both of stormguard's clients: `ClientLayer` over
//! hyper-util's legacy client, and `StormguardMiddleware` in a reqwest-middleware client, each
//! given the same `ClientLayer` configuration, against a scripted axum backend on loopback.
//!
//! Each row is written once: the backend's replies, the engine's configuration, the caller's
//! request and the numbers expected. A driver per client runs it, and every row must give the
//! same numbers through both.

#![allow(clippy::unwrap_used)]

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use reqwest_middleware::ClientBuilder;
use stormguard::ClientLayer;
use stormguard::classify::LlmClassifier;
use stormguard::classify::headers::{IDEMPOTENCY_KEY, X_SHOULD_RETRY};
use stormguard::jitter::Constant;
use stormguard::reqwest::StormguardMiddleware;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig, ThrottleSnapshot};
use stormguard_tests::{
    CHAT_REQUEST, RATE_LIMITED, Reply, ScriptedBackend, Seen, hyper_client, idempotency_key,
    retry_attempt, timeout_ms,
};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";

/// OpenAI's `429` for an account out of credit, in its shortest form.
const QUOTA: &str = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#;

/// The engine every row configures.
type Engine = ClientLayer<LlmClassifier, Constant>;

/// Every row's engine unless the row says otherwise: an adaptive throttle of its own (shared by
/// every clone of the layer), a 5 ms backoff and a 2 s deadline.
fn engine() -> Engine {
    ClientLayer::default()
        .with_throttle(AdaptiveThrottle::new(ThrottleConfig::default()))
        .with_backoff(Constant::new(Duration::from_millis(5)))
        .with_timeout(Duration::from_secs(2))
}

/// One behaviour: what the backend answers, how the engine is configured, what the caller
/// sends, and what both clients must show for it.
struct Row {
    name: &'static str,
    replies: Vec<Reply>,
    engine: fn() -> Engine,
    call: Call,
    expect: fn(&Run),
}

/// The caller's request: a chat POST or a bodiless GET, with headers of the caller's own, maybe
/// given up on by the caller.
struct Call {
    method: Method,
    headers: HeaderMap,
    cancel_after: Option<Duration>,
}

impl Call {
    fn post() -> Self {
        Self {
            method: Method::POST,
            headers: HeaderMap::new(),
            cancel_after: None,
        }
    }

    fn get() -> Self {
        Self {
            method: Method::GET,
            ..Self::post()
        }
    }

    fn header(mut self, name: HeaderName, value: &'static str) -> Self {
        self.headers.insert(name, HeaderValue::from_static(value));
        self
    }

    /// The caller drops the call after `after` (`tokio::time::timeout` around it).
    fn cancelled_after(mut self, after: Duration) -> Self {
        self.cancel_after = Some(after);
        self
    }

    fn body(&self) -> Bytes {
        if self.method == Method::GET {
            Bytes::new()
        } else {
            Bytes::from_static(CHAT_REQUEST.as_bytes())
        }
    }

    /// Runs `call` as the caller would: to the end, or until the caller gives up (`None`).
    async fn run<F: Future>(&self, call: F) -> Option<F::Output> {
        match self.cancel_after {
            Some(after) => tokio::time::timeout(after, call).await.ok(),
            None => Some(call.await),
        }
    }
}

/// What one client made of one row.
struct Run {
    row: &'static str,
    client: &'static str,
    /// The answer's status and headers; `None` when the caller cancelled the call.
    answer: Option<(StatusCode, HeaderMap)>,
    /// What the backend saw.
    seen: Vec<Seen>,
    /// The engine's throttle, after the call.
    throttle: ThrottleSnapshot,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} through {}", self.row, self.client)
    }
}

impl Run {
    fn status(&self) -> StatusCode {
        match &self.answer {
            Some((status, _)) => *status,
            None => panic!("{self}: cancelled, no answer"),
        }
    }

    fn should_retry(&self) -> Option<&str> {
        let (_, headers) = self.answer.as_ref()?;
        headers.get(X_SHOULD_RETRY)?.to_str().ok()
    }

    fn hits(&self) -> usize {
        self.seen.len()
    }

    fn attempts(&self) -> Vec<Option<u32>> {
        self.seen.iter().map(retry_attempt).collect()
    }

    fn keys(&self) -> Vec<Option<&str>> {
        self.seen.iter().map(idempotency_key).collect()
    }

    fn timeouts_ms(&self) -> Vec<Option<u64>> {
        self.seen.iter().map(timeout_ms).collect()
    }

    /// The throttle's requests and accepts.
    fn throttled(&self) -> (u64, u64) {
        (self.throttle.requests, self.throttle.accepts)
    }

    /// The numbers both clients must agree on (keys by how many and how many distinct: their
    /// values are random).
    fn numbers(&self) -> Numbers {
        let keys = self.keys();
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        Numbers {
            status: self.answer.as_ref().map(|(status, _)| status.as_u16()),
            should_retry: self.should_retry().map(str::to_owned),
            hits: self.hits(),
            attempts: self.attempts(),
            keys: (
                keys.iter().flatten().count(),
                distinct.iter().flatten().count(),
            ),
            throttled: self.throttled(),
        }
    }
}

#[derive(Debug, PartialEq)]
struct Numbers {
    status: Option<u16>,
    should_retry: Option<String>,
    hits: usize,
    attempts: Vec<Option<u32>>,
    keys: (usize, usize),
    throttled: (u64, u64),
}

/// Every row, in the order they run.
fn rows() -> Vec<Row> {
    [throttle_rows(), header_rows(), limit_rows()]
        .into_iter()
        .flatten()
        .collect()
}

/// What the throttle counts: a cancelled attempt, and the two kinds of `429`.
fn throttle_rows() -> Vec<Row> {
    vec![
        Row {
            name: "(a) an attempt cancelled by the caller is counted once, not accepted",
            replies: vec![Reply::status(200).delay(Duration::from_secs(30))],
            engine,
            call: Call::post().cancelled_after(Duration::from_millis(300)),
            expect: |run| {
                assert!(run.answer.is_none(), "{run}: the call was cancelled");
                assert_eq!(run.hits(), 1, "{run}");
                assert_eq!(run.throttled(), (1, 0), "{run}");
            },
        },
        Row {
            name: "(b) 429 insufficient_quota is accepted, final and marked",
            replies: vec![Reply::status(429).json(QUOTA), Reply::status(200)],
            engine,
            call: Call::post(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::TOO_MANY_REQUESTS, "{run}");
                assert_eq!(run.should_retry(), Some("false"), "{run}");
                assert_eq!(run.hits(), 1, "{run}");
                assert_eq!(run.throttled(), (1, 1), "{run}");
            },
        },
        Row {
            name: "(b) 429 rate_limit_exceeded is not accepted, and retried after its hint",
            replies: vec![
                Reply::status(429)
                    .json(RATE_LIMITED)
                    .header("retry-after-ms", "10"),
                Reply::status(200),
            ],
            engine,
            call: Call::post(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::OK, "{run}");
                assert_eq!(run.hits(), 2, "{run}");
                // Two attempts recorded, only the second accepted.
                assert_eq!(run.throttled(), (2, 1), "{run}");
                let gap = run.seen[1].at - run.seen[0].at;
                assert!(gap >= Duration::from_millis(10), "{run}: after {gap:?}");
            },
        },
    ]
}

/// What the engine writes on the wire: the attempt's number and the Idempotency-Key.
fn header_rows() -> Vec<Row> {
    vec![
        Row {
            name: "(c) attempts are numbered on the wire",
            replies: vec![Reply::status(503), Reply::status(200)],
            engine,
            call: Call::post(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::OK, "{run}");
                assert_eq!(run.attempts(), [Some(0), Some(1)], "{run}");
            },
        },
        Row {
            name: "(d) a POST gets one Idempotency-Key, the same on every attempt",
            replies: vec![Reply::status(503), Reply::status(200)],
            engine,
            call: Call::post(),
            expect: |run| {
                let keys = run.keys();
                assert_eq!(keys.len(), 2, "{run}");
                assert_eq!(keys[0], keys[1], "{run}");
                assert_eq!(keys[0].map(str::len), Some(36), "{run}: {keys:?}");
            },
        },
        Row {
            name: "(d) a GET gets no Idempotency-Key",
            replies: vec![Reply::status(503), Reply::status(200)],
            engine,
            call: Call::get(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::OK, "{run}");
                assert_eq!(run.keys(), [None, None], "{run}");
            },
        },
        Row {
            name: "(d) the caller's Idempotency-Key is kept",
            replies: vec![Reply::status(503), Reply::status(200)],
            engine,
            call: Call::post().header(IDEMPOTENCY_KEY, "caller-key"),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::OK, "{run}");
                let keys = run.keys();
                assert_eq!(keys, [Some("caller-key"), Some("caller-key")], "{run}");
            },
        },
    ]
}

/// What bounds the request: `max_attempts`, and the deadline each attempt carries.
fn limit_rows() -> Vec<Row> {
    vec![
        Row {
            name: "(e) a server that always answers 503 gets max_attempts hits, then the mark",
            replies: vec![Reply::status(503)],
            engine: || engine().with_max_attempts(4),
            call: Call::post(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::SERVICE_UNAVAILABLE, "{run}");
                assert_eq!(run.hits(), 4, "{run}");
                assert_eq!(run.should_retry(), Some("false"), "{run}");
                assert_eq!(run.throttled(), (4, 0), "{run}");
            },
        },
        Row {
            name: "(f) the deadline travels, and shrinks on the retry",
            replies: vec![
                Reply::status(503).delay(Duration::from_millis(5)),
                Reply::status(200),
            ],
            engine: || engine().with_timeout(Duration::from_secs(10)),
            call: Call::post(),
            expect: |run| {
                assert_eq!(run.status(), StatusCode::OK, "{run}");
                let sent = run.timeouts_ms();
                let (first, retry) = (sent[0].unwrap(), sent[1].unwrap());
                // 10 s minus the 50 ms margin, then re-stamped before the retry.
                assert!((9000..=9950).contains(&first), "{run}: {sent:?}");
                assert!(retry < first, "{run}: {sent:?}");
            },
        },
    ]
}

/// Runs `row` through `ClientLayer` over hyper-util's legacy client.
async fn through_tower(row: &Row) -> Run {
    let backend = ScriptedBackend::spawn(row.replies.clone()).await;
    let engine = (row.engine)();
    let client = engine.clone().layer(hyper_client());
    let mut request = http::Request::builder()
        .method(row.call.method.clone())
        .uri(backend.url(PATH))
        .body(Full::new(row.call.body()))
        .unwrap();
    request.headers_mut().extend(row.call.headers.clone());

    let answer = row.call.run(client.oneshot(request)).await.map(|result| {
        let response = result.unwrap_or_else(|error| panic!("{} (tower): {error}", row.name));
        (response.status(), response.headers().clone())
    });

    finish(row, "tower ClientLayer", answer, &backend, &engine)
}

/// Runs `row` through `StormguardMiddleware` in a reqwest-middleware client.
async fn through_reqwest(row: &Row) -> Run {
    let backend = ScriptedBackend::spawn(row.replies.clone()).await;
    let engine = (row.engine)();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(engine.clone()))
        .build();
    let request = client
        .request(row.call.method.clone(), backend.url(PATH))
        .headers(row.call.headers.clone())
        .body(row.call.body());

    let answer = row.call.run(request.send()).await.map(|result| {
        let response = result.unwrap_or_else(|error| panic!("{} (reqwest): {error}", row.name));
        (response.status(), response.headers().clone())
    });

    finish(
        row,
        "reqwest StormguardMiddleware",
        answer,
        &backend,
        &engine,
    )
}

fn finish(
    row: &Row,
    client: &'static str,
    answer: Option<(StatusCode, HeaderMap)>,
    backend: &ScriptedBackend,
    engine: &Engine,
) -> Run {
    Run {
        row: row.name,
        client,
        answer,
        seen: backend.seen(),
        throttle: engine
            .throttle()
            .expect("every row has a throttle")
            .snapshot(),
    }
}

#[tokio::test]
async fn every_row_gives_the_same_numbers_through_both_clients() {
    for row in rows() {
        let tower = through_tower(&row).await;
        (row.expect)(&tower);
        let reqwest = through_reqwest(&row).await;
        (row.expect)(&reqwest);
        assert_eq!(tower.numbers(), reqwest.numbers(), "{}", row.name);
    }
}
