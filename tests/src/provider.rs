//! A loopback LLM provider whose every answer is planned by the test (when its head goes, its
//! status, its stream of OpenAI chat chunks), and what a caller reads of such a stream: the
//! incidents' and the cold start's providers.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use stormguard::ClientLayer;
use stormguard::deadline::clocks::AttemptClocks;
use stormguard::failover::{Adapter, Backend, Failover};
use stormguard_test_kit::post;
use tower::{Layer, ServiceExt};

use crate::{HyperClient, Server, Sse, hyper_client, scripted_body, send};

/// The route of every request: OpenAI chat completions.
pub const PATH: &str = "/v1/chat/completions";
/// The words of a whole answer.
pub const WORDS: usize = 60;
/// The request: a stream of at most 100 tokens, no reasoning asked for.
pub const REQUEST: &str = r#"{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"count"}]}"#;

/// What a provider does with one request: when its head goes, its status, its body.
pub struct Plan {
    /// When the head goes, after the request came.
    pub head_after: Duration,
    /// The status of the head.
    pub status: u16,
    /// The body, step by step.
    pub steps: Vec<Sse>,
}

impl Plan {
    /// A healthy answer: words `from..=WORDS`, 10 ms apart, then the finish and `[DONE]`.
    pub fn answer(from: usize) -> Self {
        Self::stream(words(from, WORDS, true))
    }

    /// A 200 event stream at once, playing `steps`.
    pub fn stream(steps: Vec<Sse>) -> Self {
        Self {
            head_after: Duration::ZERO,
            status: 200,
            steps,
        }
    }
}

/// The role chunk, words `from..=to` 10 ms apart, and (`end`) the finish chunk and `[DONE]`.
pub fn words(from: usize, to: usize, end: bool) -> Vec<Sse> {
    let mut steps = vec![send(chunk(r#"{"role":"assistant","content":""}"#, "null"))];
    for word in from..=to {
        steps.push(Sse::Wait(Duration::from_millis(10)));
        steps.push(send(chunk(&format!(r#"{{"content":"w{word} "}}"#), "null")));
    }
    if end {
        steps.push(send(chunk("{}", "\"stop\"")));
        steps.push(send("data: [DONE]\n\n"));
    }
    steps
}

/// An OpenAI chat chunk with this `delta` and `finish` reason (JSON), as a complete event.
pub fn chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// Where a continuation request asks the answer to go on from: the word after the last one of
/// its assistant prefill (1 for a first request).
pub fn resumes_at(body: &str) -> usize {
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    let messages = body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    if last["role"] != "assistant" {
        return 1;
    }
    last["content"].as_str().unwrap().split_whitespace().count() + 1
}

/// A loopback provider whose n-th request (from 0) is answered by `plan(n, body)`.
pub struct Provider {
    /// The axum server.
    pub server: Server,
    /// Requests received.
    pub hits: Arc<AtomicUsize>,
    /// The bodies of the requests received.
    pub bodies: Arc<Mutex<Vec<String>>>,
}

impl Provider {
    /// Serves on 127.0.0.1 at an ephemeral port, answering its n-th request (from 0) with
    /// `plan(n, body)`.
    pub async fn spawn(plan: impl Fn(usize, &str) -> Plan + Send + Sync + 'static) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (counted, seen, plan) = (Arc::clone(&hits), Arc::clone(&bodies), Arc::new(plan));
        let router = axum::Router::new().fallback(move |body: Bytes| {
            let body = String::from_utf8_lossy(&body).into_owned();
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let plan = plan(n, &body);
            seen.lock().unwrap().push(body);
            async move {
                tokio::time::sleep(plan.head_after).await;
                http::Response::builder()
                    .status(plan.status)
                    .header(http::header::CONTENT_TYPE, "text/event-stream")
                    .body(scripted_body(plan.steps))
                    .unwrap()
            }
        });
        Self {
            server: Server::spawn(router).await,
            hits,
            bodies,
        }
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn origin(&self) -> http::Uri {
        self.server.url("").parse().unwrap()
    }
}

/// The test's request to the provider at `origin`.
pub fn chat_request(origin: &http::Uri) -> http::Request<Full<Bytes>> {
    post(&format!("{origin}{}", &PATH[1..]), REQUEST)
}

/// What the caller read: the text of the content chunks, how many `[DONE]`, the error event if
/// one came, and the body's error.
pub struct Read {
    /// The text of the content chunks.
    pub text: String,
    /// How many `[DONE]` came.
    pub done: usize,
    /// An in-band error event came.
    pub error_event: bool,
    /// The body's error, if it failed.
    pub error: Option<stormguard::classify::BoxError>,
    /// The id of each chunk.
    pub ids: Vec<String>,
}

/// Reads `body` to its end or its failure.
pub async fn read<B>(body: B) -> Read
where
    B: http_body::Body<Data = Bytes, Error = stormguard::classify::BoxError> + Unpin,
{
    let mut body = body;
    let mut raw = Vec::new();
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => raw.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Err(failed) => {
                error = Some(failed);
                break;
            }
        }
    }
    let raw = String::from_utf8(raw).unwrap();
    let mut read = Read {
        text: String::new(),
        done: 0,
        error_event: false,
        error,
        ids: Vec::new(),
    };
    for data in raw
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
    {
        if data == "[DONE]" {
            read.done += 1;
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(data).unwrap();
        if value.get("error").is_some() {
            read.error_event = true;
            continue;
        }
        if let Some(id) = value["id"].as_str() {
            read.ids.push(id.to_owned());
        }
        if let Some(text) = value["choices"][0]["delta"]["content"].as_str() {
            read.text.push_str(text);
        }
    }
    read
}

/// The text of a whole answer: `w1 ` to `w60 `.
pub fn whole_answer() -> String {
    (1..=WORDS).map(|word| format!("w{word} ")).collect()
}

/// A gateway's client: a failover from `primary` (its clocks `learned`) to `backup` over one
/// hyper client, the README's shape, with `layer`'s policy and a 30 s deadline.
pub fn gateway(
    layer: ClientLayer,
    primary: &Provider,
    backup: &Provider,
    learned: AttemptClocks,
) -> stormguard::failover::FailoverService<HyperClient> {
    let backend = |name: &str, provider: &Provider| {
        Backend::new(name).with_adapter(Adapter::new().with_origin(provider.origin()))
    };
    Failover::new(layer.with_timeout(Duration::from_secs(30)))
        .with_backend(backend("primary", primary).with_clocks(learned))
        .with_backend(backend("backup", backup))
        .layer(hyper_client())
}

/// A hyper client that opens a connection for each request. On the paused clock, tokio moves
/// time on whenever no task is ready, and bytes crossing the loopback on a reused connection are
/// not a ready task: a test that sends many requests in a row would see its idle timeouts fire
/// while a response is in flight.
pub fn fresh_client() -> HyperClient {
    LegacyClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

/// Twenty healthy answers through `client` first: what its clocks learn.
pub async fn warm_up<S, B>(client: &S, origin: &http::Uri)
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body<Data = Bytes, Error = stormguard::classify::BoxError> + Unpin,
{
    for _ in 0..20 {
        let response = client.clone().oneshot(chat_request(origin)).await.unwrap();
        assert_eq!(read(response.into_body()).await.text, whole_answer());
    }
}

/// The backend that answered, as the failover says.
pub fn backend_of<B>(response: &http::Response<B>) -> &str {
    response.headers()["x-stormguard-backend"].to_str().unwrap()
}

/// What a caller read of an answer relayed by a gateway.
pub struct Relayed {
    /// The status of the answer.
    pub status: u16,
    /// The backend that answered, as the failover says (`x-stormguard-backend`).
    pub backend: Option<String>,
    /// The bytes up to the end of the body or its failure (a body that fails after its in-band
    /// error event).
    pub raw: String,
}

/// What a reqwest client reads when it posts `body` (JSON) to `url`.
pub async fn reqwest_post(url: &str, body: &str) -> Relayed {
    let mut response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let backend = response
        .headers()
        .get("x-stormguard-backend")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let mut read = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        read.extend_from_slice(&chunk);
    }
    let raw = String::from_utf8(read).unwrap();
    Relayed {
        status,
        backend,
        raw,
    }
}

/// The text of the content chunks of a stream read raw.
pub fn text_of(raw: &str) -> String {
    raw.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| {
            let value: serde_json::Value = serde_json::from_str(data).ok()?;
            value["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}
