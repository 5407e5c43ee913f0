//! A loopback provider whose every answer is planned by the test (when its head goes, its
//! status, its stream of OpenAI chat chunks, step by step), and what a reqwest caller of the
//! gateway reads of such a stream: the cold start's faults.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::Response;

/// The route of every request: OpenAI chat completions.
pub const PATH: &str = "/v1/chat/completions";
/// The words of a whole answer.
pub const WORDS: usize = 60;
/// The request: a stream of at most 100 tokens of the model `m`, no reasoning asked for.
pub const REQUEST: &str = r#"{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"count"}]}"#;

/// One step of a planned body.
#[derive(Clone, Debug)]
pub enum Step {
    /// Send these bytes.
    Send(String),
    /// Wait this long before the next step.
    Wait(Duration),
    /// Send nothing more, and never end.
    Stall,
}

/// What a provider does with one request.
pub struct Plan {
    /// When the head goes, after the request came.
    pub head_after: Duration,
    /// The status of the head.
    pub status: u16,
    /// The content type of the head.
    pub content_type: &'static str,
    /// The body, step by step (it ends after the last, unless that is a stall).
    pub steps: Vec<Step>,
}

impl Plan {
    /// A healthy answer: words `from..=WORDS`, 10 ms apart, then the finish and `[DONE]`.
    pub fn answer(from: usize) -> Self {
        Self::stream(words(from, WORDS, true))
    }

    /// A 200 event stream at once, playing `steps`.
    pub fn stream(steps: Vec<Step>) -> Self {
        Self {
            head_after: Duration::ZERO,
            status: 200,
            content_type: "text/event-stream",
            steps,
        }
    }
}

/// Send `text`.
pub fn send(text: impl Into<String>) -> Step {
    Step::Send(text.into())
}

/// The role chunk, words `from..=to` 10 ms apart, and (`end`) the finish chunk and `[DONE]`.
pub fn words(from: usize, to: usize, end: bool) -> Vec<Step> {
    let mut steps = vec![send(chunk(r#"{"role":"assistant","content":""}"#, "null"))];
    for word in from..=to {
        steps.push(Step::Wait(Duration::from_millis(10)));
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

/// Where a request asks the answer to go on from: the word after the last one of its assistant
/// prefill (1 for a first request).
pub fn resumes_at(body: &str) -> usize {
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    let messages = body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    if last["role"] != "assistant" {
        return 1;
    }
    last["content"].as_str().unwrap().split_whitespace().count() + 1
}

/// The text of a whole answer: `w1 ` to `w60 `.
pub fn whole_answer() -> String {
    (1..=WORDS).map(|word| format!("w{word} ")).collect()
}

/// How a provider plans its n-th request (from 0) with its body.
type Planner = Arc<dyn Fn(usize, &str) -> Plan + Send + Sync>;

/// A loopback provider whose n-th request (from 0) is answered by its plan.
pub struct Provider {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl Provider {
    /// Serves on 127.0.0.1 at an ephemeral port, answering its n-th request (from 0) with
    /// `plan(n, body)`.
    pub async fn spawn(plan: impl Fn(usize, &str) -> Plan + Send + Sync + 'static) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let planner: Planner = Arc::new(plan);
        let state = (Arc::clone(&hits), Arc::clone(&bodies), planner);
        let app = axum::Router::new().fallback(answer).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, hits, bodies }
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The bodies of the requests received so far.
    pub fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type ProviderState = (Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>, Planner);

async fn answer(
    axum::extract::State((hits, bodies, plan)): axum::extract::State<ProviderState>,
    body: Bytes,
) -> Response<Body> {
    let body = String::from_utf8_lossy(&body).into_owned();
    let n = hits.fetch_add(1, Ordering::SeqCst);
    let plan = plan(n, &body);
    bodies.lock().unwrap().push(body);
    tokio::time::sleep(plan.head_after).await;
    Response::builder()
        .status(plan.status)
        .header(http::header::CONTENT_TYPE, plan.content_type)
        .body(Body::new(played(plan.steps)))
        .unwrap()
}

/// A body that plays `steps`, written by a task of its own.
fn played(steps: Vec<Step>) -> StepBody {
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for step in steps {
            match step {
                Step::Send(text) => {
                    if sender.send(Bytes::from(text)).await.is_err() {
                        return;
                    }
                }
                Step::Wait(wait) => tokio::time::sleep(wait).await,
                Step::Stall => {
                    // Held open until the reader goes.
                    sender.closed().await;
                    return;
                }
            }
        }
    });
    StepBody(receiver)
}

/// A body written by a channel, frame by frame.
struct StepBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for StepBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(http_body::Frame::data(chunk))))
    }
}

/// What a reqwest caller read of an answer the gateway relayed.
pub struct Relayed {
    /// The status of the answer.
    pub status: u16,
    /// The deployment that answered (`x-stormguard-backend`).
    pub backend: Option<String>,
    /// The attempts it took (`x-stormguard-attempts`).
    pub attempts: Option<String>,
    /// The bytes up to the end of the body or its failure.
    pub raw: String,
}

impl Relayed {
    /// The text of the content chunks.
    pub fn text(&self) -> String {
        self.raw
            .split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .filter_map(|data| {
                let value: serde_json::Value = serde_json::from_str(data).ok()?;
                value["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    /// How many times `[DONE]` came.
    pub fn done(&self) -> usize {
        self.raw.matches("data: [DONE]").count()
    }
}

/// What a reqwest caller reads when it posts `body` to the gateway at `addr`.
pub async fn post_read(addr: std::net::SocketAddr, body: &str) -> Relayed {
    let mut response = super::client()
        .post(format!("http://{addr}{PATH}"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        let value = response.headers().get(name)?;
        value.to_str().ok().map(str::to_owned)
    };
    let (backend, attempts) = (
        header("x-stormguard-backend"),
        header("x-stormguard-attempts"),
    );
    let status = response.status().as_u16();
    let mut read = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        read.extend_from_slice(&chunk);
    }
    Relayed {
        status,
        backend,
        attempts,
        raw: String::from_utf8(read).unwrap(),
    }
}
