//! Loopback backends and clients for stormguard's cross-crate integration tests.
//!
//! [`ScriptedBackend`] is a real axum server on `127.0.0.1:0` that answers a configured sequence
//! of [`Reply`]s (the last one repeats) and records what it saw of every request ([`Seen`]): the
//! attempt number, the idempotency key, the deadline it was given. The tests in `tests/` put real
//! clients (hyper-util, tonic, reqwest-middleware) in front of it and check, with numbers, what
//! reached the wire. [`DeadUpstream`] closes every connection it accepts, and
//! [`BlackHoleProvider`] answers until it goes silent (accepts, never replies) and then resumes.
//!
//! Real sockets need real time (tokio's paused clock does not drive them), so the tests use short
//! durations instead: a backoff of 1 to 5 ms ([`fast_backoff`]) and hints of tens of
//! milliseconds.
//!
//! The workspace's README is compiled here too: its Rust examples are this crate's doc tests
//! ([`Readme`], built only for them), so `cargo test --workspace` fails when one drifts.

/// The workspace's `README.md`, whose examples run as doc tests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct Readme;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::classify::headers::{
    GRPC_TIMEOUT, IDEMPOTENCY_KEY, X_REQUEST_TIMEOUT_MS, X_RETRY_ATTEMPT, X_SHOULD_RETRY,
};
use stormguard::deadline::propagate::parse_grpc_timeout;
use stormguard::jitter::FullJitter;
use stormguard::{ClientLayer, ClientService};
use stormguard_test_kit::{self as kit, Log, OPENAI_CHAT, ScriptedBody, openai_chat};
pub use stormguard_test_kit::{Reply, Seen};

pub mod provider;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower::Layer;
use tower::Service;

/// OpenAI's error body for an account out of credit: `429` that no retry can fix.
pub const INSUFFICIENT_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

/// OpenAI's error body for a request-rate limit: `429` that a later retry can fix.
pub const RATE_LIMITED: &str = r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

/// A small chat completion request body.
pub const CHAT_REQUEST: &str = OPENAI_CHAT;

/// A full-jitter backoff of 1 ms growing to at most 5 ms: real retries on real sockets that keep
/// the suite fast.
pub fn fast_backoff() -> FullJitter {
    FullJitter::new(Duration::from_millis(1), Duration::from_millis(5))
}

/// The hyper-util client the tests use: HTTP/1 over plain TCP, `Full<Bytes>` request bodies.
pub type HyperClient = LegacyClient<HttpConnector, Full<Bytes>>;

/// A plain hyper-util client ([`HyperClient`]).
pub fn hyper_client() -> HyperClient {
    LegacyClient::builder(TokioExecutor::new()).build_http()
}

/// `ClientLayer::default()` drawing retries on `budget`, with the [`fast_backoff`].
pub fn fast_client_layer(budget: RetryBudget) -> ClientLayer {
    ClientLayer::default()
        .with_budget(budget)
        .with_backoff(fast_backoff())
}

/// The budget of the outage tests: a 10 s window with a floor of 1 retry per second (10 free
/// retries) and 10% of successes.
pub fn outage_budget() -> RetryBudget {
    RetryBudget::new(BudgetConfig::default())
}

/// [`fast_client_layer`]`(budget)` without an adaptive throttle: the budget alone has to hold the
/// line.
pub fn unthrottled_client_layer(budget: RetryBudget) -> ClientLayer {
    fast_client_layer(budget).without_throttle()
}

/// A [`HyperClient`] behind [`fast_client_layer`]`(budget)`.
pub fn guarded_hyper(budget: RetryBudget) -> ClientService<HyperClient> {
    fast_client_layer(budget).layer(hyper_client())
}

/// A JSON POST of [`CHAT_REQUEST`] to `url`.
///
/// # Panics
///
/// If `url` is not a valid URI.
pub fn chat_post(url: &str) -> http::Request<Full<Bytes>> {
    openai_chat(url, 16)
}

/// Reads the whole body of `response` as UTF-8 text.
///
/// # Panics
///
/// If the body fails or is not UTF-8.
pub async fn body_text<B>(response: http::Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("readable body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("UTF-8 body")
}

/// The deadline the caller sent with the request `seen`, in milliseconds: `x-request-timeout-ms`,
/// or `grpc-timeout`.
pub fn timeout_ms(seen: &Seen) -> Option<u64> {
    if let Some(ms) = seen.header(&X_REQUEST_TIMEOUT_MS) {
        return ms.parse().ok();
    }
    let grpc = seen.headers.get(GRPC_TIMEOUT)?;
    let timeout = parse_grpc_timeout(grpc.as_bytes())?;
    u64::try_from(timeout.as_millis()).ok()
}

/// The `x-retry-attempt` header of the request `seen`, parsed.
pub fn retry_attempt(seen: &Seen) -> Option<u32> {
    seen.header(&X_RETRY_ATTEMPT).and_then(|v| v.parse().ok())
}

/// The `Idempotency-Key` header of the request `seen`.
pub fn idempotency_key(seen: &Seen) -> Option<&str> {
    seen.header(&IDEMPOTENCY_KEY)
}

/// A loopback HTTP server that serves a [`Router`] until dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `router` on `127.0.0.1` at an ephemeral port.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn spawn(router: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            // Serves until the task is aborted; an accept error ends the test server.
            let _ = axum::serve(listener, router).await;
        });
        Self { addr, task }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The kit's [`kit::ScriptedBackend`] served on loopback: an HTTP backend that answers a scripted
/// sequence of replies, the last one repeating forever, and records every request it received.
///
/// ```no_run
/// # async fn run() {
/// use stormguard_tests::{Reply, ScriptedBackend};
///
/// let backend = ScriptedBackend::spawn([Reply::status(503), Reply::status(200)]).await;
/// // ... send requests to backend.url("/v1/chat/completions") ...
/// assert_eq!(backend.hits(), 2);
/// # }
/// ```
#[derive(Debug)]
pub struct ScriptedBackend {
    server: Server,
    log: Log,
}

impl ScriptedBackend {
    /// Serves `replies` in order on `127.0.0.1` at an ephemeral port; once they are used up the
    /// last one answers every further request.
    ///
    /// # Panics
    ///
    /// If `replies` is empty, or no loopback port can be bound.
    pub async fn spawn(replies: impl IntoIterator<Item = Reply>) -> Self {
        let backend = kit::ScriptedBackend::replies(replies);
        let log = backend.log().clone();
        let router = Router::new().fallback(move |request: Request| {
            let mut backend = backend.clone();
            async move {
                match backend.call(request).await {
                    Ok(response) => response.map(Body::new),
                    // A script of replies always answers.
                    Err(_) => Response::new(Body::empty()),
                }
            }
        });
        let server = Server::spawn(router).await;
        Self { server, log }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// The address the backend listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Every request received so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.log.all()
    }

    /// How many requests were received so far.
    pub fn hits(&self) -> usize {
        self.log.len()
    }
}

/// Locks `mutex`, ignoring poisoning (a panicking test thread leaves the records readable).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A dead upstream: a loopback listener that accepts every TCP connection and closes it at
/// once, before any response (what a crashed process behind a load balancer looks like). It
/// counts the connections, which is how many attempts reached it.
#[derive(Debug)]
pub struct DeadUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl DeadUpstream {
    /// Listens on `127.0.0.1` at an ephemeral port.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn spawn() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for DeadUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback LLM provider that can go silent as a black hole does (every packet dropped):
/// healthy, it answers every request with `200` and [`PROVIDER_ANSWER`]; silent, it still
/// accepts TCP connections but never reads from them, and a request on a connection opened
/// before is never answered. It [`resume`](Self::resume)s on demand, and counts the connections
/// it accepted and the requests it received.
#[derive(Debug)]
pub struct BlackHoleProvider {
    addr: SocketAddr,
    silent: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// What a [`BlackHoleProvider`] answers while it answers.
pub const PROVIDER_ANSWER: &str = r#"{"choices":[{"message":{"content":"hi"}}]}"#;

impl BlackHoleProvider {
    /// Serves on `127.0.0.1` at an ephemeral port, healthy.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn spawn() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let silent = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let listener = SilenceableListener {
            listener,
            silent: Arc::clone(&silent),
            connections: Arc::clone(&connections),
            held: Vec::new(),
        };
        let (quiet, received) = (Arc::clone(&silent), Arc::clone(&requests));
        let router = Router::new().fallback(move || {
            let (quiet, received) = (Arc::clone(&quiet), Arc::clone(&received));
            async move {
                received.fetch_add(1, Ordering::SeqCst);
                if quiet.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                PROVIDER_ANSWER
            }
        });
        let task = tokio::spawn(async move {
            // Serves until the task is aborted.
            let _ = axum::serve(listener, router).await;
        });
        Self {
            addr,
            silent,
            connections,
            requests,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops answering: connections are still accepted, nothing is ever answered.
    pub fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    /// Answers again (new requests; those it swallowed stay unanswered).
    pub fn resume(&self) {
        self.silent.store(false, Ordering::SeqCst);
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests received so far on connections it serves (a silent provider does not read the
    /// connections it accepted while silent: see [`connections`](Self::connections)).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHoleProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The listener of a [`BlackHoleProvider`]: while silent, it keeps the connections it accepts
/// to itself, unread.
struct SilenceableListener {
    listener: TcpListener,
    silent: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    held: Vec<TcpStream>,
}

impl axum::serve::Listener for SilenceableListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Ok((stream, peer)) = self.listener.accept().await else {
                // Out of file descriptors, say: try again shortly, as axum's own listener does.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            self.connections.fetch_add(1, Ordering::SeqCst);
            if !self.silent.load(Ordering::SeqCst) {
                return (stream, peer);
            }
            self.held.push(stream);
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// `backend_attempts / requests`, the load multiplier a client put on its backend.
pub fn amplification(backend_attempts: usize, requests: usize) -> f64 {
    // Test-sized counts: exact in f64.
    backend_attempts as f64 / requests.max(1) as f64
}

/// Checks a request that succeeded on its third attempt: three attempts numbered 0, 1, 2 on the
/// wire, all sharing one 36-character `Idempotency-Key`.
///
/// # Panics
///
/// If any of that does not hold.
pub fn assert_three_attempts_with_one_idempotency_key(seen: &[Seen]) {
    assert_eq!(seen.len(), 3);
    let attempts: Vec<_> = seen.iter().map(retry_attempt).collect();
    assert_eq!(attempts, [Some(0), Some(1), Some(2)]);
    let keys: HashSet<_> = seen.iter().map(idempotency_key).collect();
    assert_eq!(
        keys.len(),
        1,
        "one Idempotency-Key for all attempts: {keys:?}"
    );
    assert!(keys.iter().all(|key| key.is_some_and(|k| k.len() == 36)));
}

/// Checks two POSTs retried once each, then a GET retried once: one key per POST, none for GET.
///
/// # Panics
///
/// If any of that does not hold.
pub fn assert_one_key_per_post_and_none_for_get(seen: &[Seen]) {
    assert_eq!(seen.len(), 6);
    let keys: Vec<_> = seen.iter().map(idempotency_key).collect();
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[2], keys[3]);
    assert_ne!(keys[0], keys[2]);
    assert!(keys[..4].iter().all(Option::is_some));
    assert_eq!(keys[4..], [None, None], "GET is idempotent: no key");
    assert_eq!(retry_attempt(&seen[5]), Some(1));
}

/// Checks a request retried once after a `retry-after-ms: 50` hint (with `retry-after: 30`):
/// the retry came at least 50 ms later, and well before 30 s.
///
/// # Panics
///
/// If any of that does not hold.
pub fn assert_retried_after_the_ms_hint(seen: &[Seen]) {
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    // The 1..5 ms backoff would have come back much sooner; the ms header beats `retry-after: 30`.
    assert!(gap >= Duration::from_millis(50), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(30), "retried after {gap:?}");
}

/// Checks an answer handed back at once: status `expected`, marked `x-should-retry: false`.
///
/// # Panics
///
/// If either does not hold.
pub fn assert_final(status: StatusCode, headers: &HeaderMap, expected: StatusCode) {
    assert_eq!(status, expected);
    assert_eq!(headers[X_SHOULD_RETRY], "false");
}

/// The deadline each request to `backend` carried, in milliseconds, in arrival order.
///
/// # Panics
///
/// If a request carried none.
pub fn sent_timeouts_ms(backend: &ScriptedBackend) -> Vec<u64> {
    backend
        .seen()
        .iter()
        .map(|s| timeout_ms(s).expect("a deadline on the wire"))
        .collect()
}

/// Reports an outage of `requests` requests that made `attempts` backend attempts (as `client`),
/// and checks that the budget held amplification to at most `floor` retries.
///
/// # Panics
///
/// If fewer than `requests` or more than `requests + floor` attempts were made.
pub fn assert_outage_within_floor(client: &str, requests: usize, attempts: usize, floor: usize) {
    eprintln!(
        "{client} outage: {requests} requests -> {attempts} backend attempts, amplification {:.2}x (naive 3 attempts: 3.00x)",
        amplification(attempts, requests)
    );
    assert!(attempts >= requests);
    assert!(
        attempts <= requests + floor,
        "{attempts} attempts for {requests} requests"
    );
}

/// Reports a dead upstream that accepted `connections` for `requests` requests (as `client`,
/// budget only), and checks that at most `floor` of them were retries.
///
/// # Panics
///
/// If `connections` is outside `requests..=requests + floor`.
pub fn assert_dead_upstream_within_floor(
    client: &str,
    requests: usize,
    connections: usize,
    floor: usize,
) {
    eprintln!(
        "{client} dead upstream, budget only: {requests} requests -> {connections} connections, amplification {:.2}x",
        amplification(connections, requests)
    );
    assert!((requests..=requests + floor).contains(&connections));
}

/// One step of a [`StreamingProvider`]'s answer.
#[derive(Clone, Debug)]
pub enum Sse {
    /// Send these bytes (one or more events, or part of one).
    Send(String),
    /// Wait this long before the next step.
    Wait(Duration),
    /// Fail the connection: the body ends with an error.
    Cut,
    /// Send nothing more, and never end.
    Stall,
}

/// Send `text`.
pub fn send(text: impl Into<String>) -> Sse {
    Sse::Send(text.into())
}

/// An OpenAI chat chunk carrying `content`, as a complete event.
pub fn openai_chunk(content: &'static str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// OpenAI's first chunk: the role, no content yet.
pub const OPENAI_ROLE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";

/// Anthropic's opening events.
pub const ANTHROPIC_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n";

/// Anthropic's error event when it is overloaded, sent after a 200.
pub const ANTHROPIC_OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

/// The end of an OpenAI stream.
pub const OPENAI_DONE: &str = "data: [DONE]\n\n";

/// A loopback LLM provider that streams scripted answers (`text/event-stream`): the n-th request
/// gets the n-th script, the last one repeating.
pub struct StreamingProvider {
    server: Server,
    hits: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl StreamingProvider {
    /// Serves `scripts` on `127.0.0.1` at an ephemeral port.
    ///
    /// # Panics
    ///
    /// If `scripts` is empty, or no loopback port can be bound.
    pub async fn spawn(scripts: Vec<Vec<Sse>>) -> Self {
        assert!(!scripts.is_empty(), "a provider needs at least one script");
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&bodies);
        let scripts = Arc::new(scripts);
        let router = Router::new().fallback(move |body: Bytes| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            lock(&seen).push(String::from_utf8_lossy(&body).into_owned());
            let script = scripts[n.min(scripts.len() - 1)].clone();
            async move {
                Response::builder()
                    .header(http::header::CONTENT_TYPE, "text/event-stream")
                    .body(scripted_body(script))
                    .expect("valid response")
            }
        });
        Self {
            server: Server::spawn(router).await,
            hits,
            bodies,
        }
    }

    /// The bodies of the requests received so far.
    pub fn bodies(&self) -> Vec<String> {
        lock(&self.bodies).clone()
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A response body that plays `steps`, as a [`StreamingProvider`]'s answers do.
pub fn scripted_body(steps: Vec<Sse>) -> axum::body::Body {
    axum::body::Body::new(sse_body(steps))
}

/// The kit's [`ScriptedBody`] playing `steps`: a [`Sse::Cut`] is a connection reset.
pub fn sse_body(steps: Vec<Sse>) -> ScriptedBody {
    steps
        .into_iter()
        .fold(ScriptedBody::new(), |body, step| match step {
            Sse::Send(text) => body.data(text),
            Sse::Wait(delay) => body.delay(delay),
            Sse::Cut => body.error(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "cut mid-stream",
            )),
            Sse::Stall => body.hang(),
        })
}
