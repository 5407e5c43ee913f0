//! Hedged requests against real axum providers on loopback, on the paused clock: a stream slow
//! to its first token answered by the hedge through a hyper client, a failover's hedge to the
//! backup, and a reqwest-middleware client; each provider counts the requests it saw and the
//! ones whose answer was dropped before its end (it sees the loser cancelled).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use reqwest_middleware::ClientBuilder;
use stormguard::ClientLayer;
use stormguard::failover::{Adapter, Backend, Failover};
use stormguard::reqwest::StormguardMiddleware;
use stormguard::retry::Hedging;
use stormguard_test_kit::post;
use stormguard_tests::{HyperClient, Server, Sse, send, sse_body};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";
const REQUEST: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}"#;
const WORDS: usize = 20;
const SECOND: Duration = Duration::from_secs(1);

/// A loopback provider that streams twenty words, 10 ms apart; its `slow`-th request (from 0)
/// waits 20 s between its role chunk and its first word. It counts the requests it saw and the
/// answers dropped before their end.
struct Provider {
    server: Server,
    hits: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

impl Provider {
    async fn spawn(slow: Option<usize>) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let cancelled = Arc::new(AtomicUsize::new(0));
        let (counted, dropped) = (Arc::clone(&hits), Arc::clone(&cancelled));
        let router = axum::Router::new().fallback(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let mut steps = vec![send(chunk(r#"{"role":"assistant","content":""}"#, "null"))];
            if Some(n) == slow {
                steps.push(Sse::Wait(20 * SECOND));
            }
            for word in 1..=WORDS {
                steps.push(Sse::Wait(Duration::from_millis(10)));
                steps.push(send(chunk(&format!(r#"{{"content":"w{word} "}}"#), "null")));
            }
            steps.push(send(chunk("{}", "\"stop\"")));
            steps.push(send("data: [DONE]\n\n"));
            let body = sse_body(steps).watched(&dropped);
            async move {
                http::Response::builder()
                    .header(http::header::CONTENT_TYPE, "text/event-stream")
                    .body(axum::body::Body::new(body))
                    .unwrap()
            }
        });
        Self {
            server: Server::spawn(router).await,
            hits,
            cancelled,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn origin(&self) -> http::Uri {
        self.server.url("").parse().unwrap()
    }
}

fn chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// The test's request to the provider at `origin`.
fn chat_request(origin: &http::Uri) -> http::Request<Full<Bytes>> {
    post(&format!("{origin}{}", &PATH[1..]), REQUEST)
}

/// A hyper client that opens a connection for each request (see `incidents.rs`: on the paused
/// clock a reused loopback connection lets the clock run past a response in flight).
fn fresh_client() -> HyperClient {
    LegacyClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

/// The words of an answer, and how many `[DONE]` it had.
fn words(raw: &[u8]) -> (String, usize) {
    let raw = String::from_utf8_lossy(raw);
    let mut text = String::new();
    let mut done = 0;
    for data in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done += 1;
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(content) = value["choices"][0]["delta"]["content"].as_str() {
            text.push_str(content);
        }
    }
    (text, done)
}

fn whole_answer() -> String {
    (1..=WORDS).map(|word| format!("w{word} ")).collect()
}

/// Waits until the provider has seen `n` answers cancelled (the loser's connection closing
/// reaches it a few polls later), or a minute of the paused clock.
async fn until_cancelled(provider: &Provider, n: usize) {
    for _ in 0..6_000 {
        if provider.cancelled() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Through a hyper client: the first attempt's first word would come 20 s after its role
/// chunk; the hedge at 1 s streams its first word 10 ms later, and the caller reads the whole
/// answer once. The provider saw two requests and the first one's answer dropped.
#[tokio::test(start_paused = true)]
async fn a_slow_first_token_is_answered_by_the_hedge_and_the_provider_sees_the_loser_cancelled() {
    let provider = Provider::spawn(Some(0)).await;
    let client = ClientLayer::default()
        .with_hedging(Hedging::after(SECOND))
        .layer(fresh_client());

    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        (SECOND..SECOND + Duration::from_millis(100)).contains(&took),
        "{took:?}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(words(&body), (whole_answer(), 1));
    assert_eq!(provider.hits(), 2);
    until_cancelled(&provider, 1).await;
    assert_eq!(provider.cancelled(), 1);
}

/// Without hedging (not even while cold), the same provider keeps the caller 20 s for its
/// first word.
#[tokio::test(start_paused = true)]
async fn without_hedging_the_slow_first_token_is_waited_for() {
    let provider = Provider::spawn(Some(0)).await;
    let client = ClientLayer::default()
        .without_hedging()
        .layer(fresh_client());
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        (20 * SECOND..20 * SECOND + Duration::from_millis(100)).contains(&took),
        "{took:?}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(words(&body), (whole_answer(), 1));
    assert_eq!((provider.hits(), provider.cancelled()), (1, 0));
}

/// A failover hedges to its backup: the primary's first word would take 20 s, the backup's
/// comes 10 ms after the hedge at 1 s; the answer is the backup's, and the primary sees its
/// request cancelled.
#[tokio::test(start_paused = true)]
async fn a_failover_hedges_a_slow_primary_to_the_backup() {
    let primary = Provider::spawn(Some(0)).await;
    let backup = Provider::spawn(None).await;
    let client = Failover::new(ClientLayer::default())
        .with_backend(Backend::new("primary"))
        .with_backend(
            Backend::new("backup").with_adapter(Adapter::new().with_origin(backup.origin())),
        )
        .with_hedging(Hedging::after(SECOND))
        .layer(fresh_client());

    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        (SECOND..SECOND + Duration::from_millis(100)).contains(&took),
        "{took:?}"
    );
    assert_eq!(response.headers()["x-stormguard-backend"], "backup");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(words(&body), (whole_answer(), 1));
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
    until_cancelled(&primary, 1).await;
    assert_eq!((primary.cancelled(), backup.cancelled()), (1, 0));
}

/// A reqwest-middleware client with the engine's hedging: the same slow first token, answered
/// by the hedge, read whole.
#[tokio::test(start_paused = true)]
async fn a_reqwest_client_gets_the_hedges_answer() {
    let provider = Provider::spawn(Some(0)).await;
    let middleware =
        StormguardMiddleware::new(ClientLayer::default().with_hedging(Hedging::after(SECOND)));
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
    )
    .with(middleware)
    .build();

    let started = Instant::now();
    let response = client
        .post(format!(
            "{}{}",
            provider.origin(),
            PATH.trim_start_matches('/')
        ))
        .header("content-type", "application/json")
        .body(REQUEST)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        (SECOND..SECOND + Duration::from_millis(100)).contains(&took),
        "{took:?}"
    );
    let body = response.bytes().await.unwrap();
    assert_eq!(words(&body), (whole_answer(), 1));
    assert_eq!(provider.hits(), 2);
    until_cancelled(&provider, 1).await;
    assert_eq!(provider.cancelled(), 1);
}
