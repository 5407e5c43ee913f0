//! Three deployments of one model behind real axum providers on loopback, sharing one rank of a
//! failover, through a hyper client, on the paused clock: the quicker ones take more, one that
//! says its quota is nearly spent is sent less, and a conversation's key keeps its deployment.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use stormguard::ClientLayer;
use stormguard::failover::{Adapter, Backend, Failover, FailoverService};
use stormguard::rate_limit::RateLimit;
use stormguard_test_kit::post;
use stormguard_tests::{HyperClient, Server};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";
const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

/// A loopback deployment that answers after `latency`, stating `remaining` of a quota of 6,000
/// requests a minute when it is given (`x-ratelimit-*`, as OpenAI does); it counts its requests.
struct Deployment {
    server: Server,
    hits: Arc<AtomicUsize>,
}

impl Deployment {
    async fn spawn(latency: Duration, remaining: Option<u32>) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let router = axum::Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(latency).await;
                let mut answer = http::Response::builder()
                    .header(http::header::CONTENT_TYPE, "application/json");
                if let Some(remaining) = remaining {
                    answer = answer
                        .header("x-ratelimit-limit-requests", "6000")
                        .header("x-ratelimit-remaining-requests", remaining.to_string())
                        .header("x-ratelimit-reset-requests", "60s");
                }
                answer.body(axum::body::Body::from(ANSWER)).unwrap()
            }
        });
        Self {
            server: Server::spawn(router).await,
            hits,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn backend(&self, name: &str) -> Backend {
        let origin = self.server.url("").parse().unwrap();
        Backend::new(name).with_adapter(Adapter::new().with_origin(origin))
    }
}

/// A hyper client that opens a connection for each request (see `incidents.rs`: on the paused
/// clock a reused loopback connection lets the clock run past a response in flight).
fn fresh_client() -> HyperClient {
    LegacyClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

/// The test's request to `origin`, in the conversation `key` if any.
fn conversation(origin: &str, key: Option<String>) -> http::Request<Full<Bytes>> {
    let mut request = post(&format!("{origin}{PATH}"), r#"{"model":"m","messages":[]}"#);
    if let Some(key) = key {
        request
            .headers_mut()
            .insert("x-conversation-id", key.parse().unwrap());
    }
    request
}

/// `rate` requests a second for `seconds`, each in a task of its own: the deployment that
/// answered each (`x-stormguard-backend`).
async fn drive(
    client: &FailoverService<HyperClient>,
    origin: &str,
    rate: u32,
    seconds: u32,
    key: fn(u32) -> Option<String>,
) -> Vec<String> {
    let mut tasks = Vec::new();
    for n in 0..rate * seconds {
        let (client, request) = (client.clone(), conversation(origin, key(n)));
        tasks.push(tokio::spawn(async move {
            let response = client.oneshot(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let backend = response.headers()["x-stormguard-backend"].to_str().unwrap();
            backend.to_owned()
        }));
        tokio::time::sleep(Duration::from_secs(1) / rate).await;
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

fn count(answers: &[String], name: &str) -> usize {
    answers.iter().filter(|answer| *answer == name).count()
}

/// Deployments answering in 600, 800 and 1,200 ms share a rank: every request is answered,
/// each deployment gets some, the quickest the most and the slowest the least.
#[tokio::test(start_paused = true)]
async fn the_quicker_deployments_take_more() {
    let ms = Duration::from_millis;
    let east = Deployment::spawn(ms(600), None).await;
    let west = Deployment::spawn(ms(800), None).await;
    let eu = Deployment::spawn(ms(1_200), None).await;
    let client = Failover::new(ClientLayer::default())
        .with_rank([east.backend("east"), west.backend("west"), eu.backend("eu")])
        .with_seed(5)
        .layer(fresh_client());
    let origin = east.server.url("");
    let answers = drive(&client, &origin, 20, 15, |_| None).await;
    let (e, w, u) = (
        count(&answers, "east"),
        count(&answers, "west"),
        count(&answers, "eu"),
    );
    assert_eq!(e + w + u, 300);
    assert!(e > w && w > u && u > 0, "east {e}, west {w}, eu {u}");
    assert_eq!((east.hits(), west.hits(), eu.hits()), (e, w, u));
}

/// Two deployments alike but that one says it has 1% of its quota left (its rate limit learns
/// it from the headers): it is sent less.
#[tokio::test(start_paused = true)]
async fn a_deployment_that_says_its_quota_is_nearly_spent_is_sent_less() {
    let ms = Duration::from_millis;
    let full = Deployment::spawn(ms(300), Some(5_900)).await;
    let spent = Deployment::spawn(ms(300), Some(60)).await;
    let client = Failover::new(ClientLayer::default())
        .with_rank([
            full.backend("full").with_rate_limit(RateLimit::default()),
            spent.backend("spent").with_rate_limit(RateLimit::default()),
        ])
        .with_seed(6)
        .layer(fresh_client());
    let origin = full.server.url("");
    let answers = drive(&client, &origin, 20, 10, |_| None).await;
    let (f, s) = (count(&answers, "full"), count(&answers, "spent"));
    assert_eq!(f + s, 200);
    assert!(s * 4 < f, "full {f}, spent {s}");
}

/// Each conversation's requests reach one deployment; the conversations spread over all three.
#[tokio::test(start_paused = true)]
async fn a_conversation_keeps_its_deployment() {
    let ms = Duration::from_millis;
    let mut deployments = Vec::new();
    for _ in 0..3 {
        deployments.push(Deployment::spawn(ms(200), None).await);
    }
    let names = ["east", "west", "eu"];
    let backends = deployments
        .iter()
        .zip(names)
        .map(|(d, name)| d.backend(name));
    let client = Failover::new(ClientLayer::default())
        .with_rank(backends)
        .with_sticky_key(|head| head.headers.get("x-conversation-id").map(|v| v.as_bytes()))
        .layer(fresh_client());
    let origin = deployments[0].server.url("");
    let key = |n: u32| Some(format!("conversation-{}", n % 12));
    let answers = drive(&client, &origin, 12, 5, key).await;
    let mut homes: HashMap<String, HashSet<&String>> = HashMap::new();
    for (n, answer) in (0..).zip(&answers) {
        homes.entry(key(n).unwrap()).or_default().insert(answer);
    }
    assert!(homes.values().all(|homes| homes.len() == 1), "{homes:?}");
    let used: HashSet<&String> = homes.values().flatten().copied().collect();
    assert_eq!(used.len(), 3, "{homes:?}");
}
