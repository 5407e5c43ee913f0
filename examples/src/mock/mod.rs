//! A fault-injecting mock of an LLM provider: OpenAI's chat completions and Anthropic's
//! messages.
//!
//! `POST /v1/chat/completions` and `POST /v1/messages` take the usual JSON (`model`,
//! `messages`, `max_tokens`, `stream`) and answer a `chat.completion` object (an Anthropic
//! `message`) after a latency proportional to `max_tokens`, or one of the providers' failures
//! ([`Fault`]) at the configured rate, each in the shape of the API it came to. Past its
//! capacity it degrades like a real overloaded backend: excess requests are shed with 503 or 529
//! and everyone waits longer. Every request is counted in [`MockStats`], with its
//! `x-retry-attempt` and `Idempotency-Key`; every failed answer names its fault in
//! [`MOCK_FAULT`].
//!
//! With `"stream": true` the answer is streamed like each provider streams it
//! (`text/event-stream`): OpenAI's chunks (the role, one per token paced by the per-token
//! latency, the `finish_reason`, `data: [DONE]`), or Anthropic's events (`message_start`,
//! `content_block_start`, `ping`, a `content_block_delta` per token, `content_block_stop`,
//! `message_delta`, `message_stop`). Like a real provider it honours an assistant prefill: when
//! the last message is the assistant's, the answer goes on after the words of that prefill,
//! which is what a continuation of a cut stream asks for. Two faults fail a stream after its
//! `200`: [`Fault::ErrorBeforeContent`] and [`Fault::CutMidStream`]. [`Transcript`] reads such a
//! stream back.

mod answers;
mod config;
mod events;
mod request;
mod stats;
mod stream;
mod transcript;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use axum::serve::ListenerExt;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use stormguard::classify::headers::{IDEMPOTENCY_KEY, X_RETRY_ATTEMPT};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use answers::{completion, fault_response, invalid_request};
use events::Events;
use request::{Api, ChatRequest};
use stats::InFlight;

pub use config::{Fault, MockConfig};
pub use events::{streamed_text, word_number, word_numbers};
pub use stats::{MockStats, StatsSnapshot};
pub use transcript::Transcript;

/// The path of the chat completions endpoint (OpenAI's API).
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
/// The path of the messages endpoint (Anthropic's API).
pub const MESSAGES: &str = "/v1/messages";
/// The response header that names the fault the mock failed an answer with
/// ([`Fault::name`]): a test double's confession, so that a client behind a gateway can tell
/// which of its answers went through a fault (a cut stream's head says so before the cut).
pub const MOCK_FAULT: &str = "x-mock-fault";

/// A running mock server on loopback.
#[derive(Debug)]
pub struct MockHandle {
    /// Where it listens (127.0.0.1, ephemeral port).
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: MockStats,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl MockHandle {
    /// The URL of the chat completions endpoint.
    pub fn url(&self) -> String {
        format!("http://{}{CHAT_COMPLETIONS}", self.addr)
    }

    /// The URL of the messages endpoint.
    pub fn messages_url(&self) -> String {
        format!("http://{}{MESSAGES}", self.addr)
    }

    /// Stops accepting requests, lets the ones in flight finish (for up to a second) and waits.
    pub async fn shutdown(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if tokio::time::timeout(Duration::from_secs(1), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

/// Starts a mock server with `config` on 127.0.0.1 with an ephemeral port.
pub async fn spawn(config: MockConfig) -> std::io::Result<MockHandle> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let stats = MockStats::default();
    let shared = Arc::new(Shared {
        rng: Mutex::new(SmallRng::seed_from_u64(config.seed)),
        config,
        stats: stats.clone(),
    });
    let app = Router::new()
        .route(CHAT_COMPLETIONS, post(chat_completions))
        .route(MESSAGES, post(messages))
        .with_state(shared);
    // A streamed answer is many small writes: sent at once, not held back by Nagle's algorithm
    // until the client acknowledges the last one (up to 40 ms with delayed ACKs).
    let listener = listener.tap_io(|connection| {
        let _ = connection.set_nodelay(true);
    });
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        if let Err(error) = served.await {
            eprintln!("mock LLM server stopped: {error}");
        }
    });
    Ok(MockHandle {
        addr,
        stats,
        shutdown: Some(shutdown),
        task,
    })
}

struct Shared {
    config: MockConfig,
    stats: MockStats,
    rng: Mutex<SmallRng>,
}

/// What an answer will be, decided when the request arrives.
enum Verdict {
    Shed(Fault),
    Fail(Fault),
    Complete,
    /// A streamed answer, failed by a stream fault or clean.
    Stream(Option<Fault>),
}

impl Verdict {
    /// The answer to a request that fails with `fault`.
    fn failed(fault: Fault) -> Self {
        if fault.is_stream() {
            Verdict::Stream(Some(fault))
        } else {
            Verdict::Fail(fault)
        }
    }

    /// The answer to a request served as usual.
    fn served(streaming: bool) -> Self {
        if streaming {
            Verdict::Stream(None)
        } else {
            Verdict::Complete
        }
    }
}

impl Shared {
    /// The answer to the request that arrived after `arrival` others, with `load` in flight.
    fn verdict(&self, load: usize, arrival: u64, streaming: bool) -> Verdict {
        // Stream faults fail streams only.
        let applies = |fault: &Fault| streaming || !fault.is_stream();
        let scripted = usize::try_from(arrival)
            .ok()
            .and_then(|n| self.config.first_faults.get(n));
        if let Some(fault) = scripted {
            return if applies(fault) {
                Verdict::failed(*fault)
            } else {
                Verdict::served(streaming)
            };
        }
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        if load > self.config.capacity {
            return Verdict::Shed(if rng.random::<bool>() {
                Fault::Unavailable
            } else {
                Fault::Overloaded
            });
        }
        if rng.random::<f64>() >= self.config.error_rate {
            return Verdict::served(streaming);
        }
        let faults = || {
            self.config
                .faults
                .iter()
                .filter(|(fault, _)| applies(fault))
        };
        let total: u64 = faults().map(|(_, weight)| u64::from(*weight)).sum();
        if total == 0 {
            return if self.config.faults.iter().any(|(fault, _)| !applies(fault)) {
                // Only stream faults, and this request does not stream.
                Verdict::served(streaming)
            } else {
                Verdict::Fail(Fault::Unavailable)
            };
        }
        let mut draw = rng.random_range(0..total);
        for (fault, weight) in faults() {
            let weight = u64::from(*weight);
            if draw < weight {
                return Verdict::failed(*fault);
            }
            draw -= weight;
        }
        Verdict::Fail(Fault::Unavailable)
    }
}

/// `POST /v1/chat/completions`.
async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    answer(Api::Chat, &shared, &headers, &body).await
}

/// `POST /v1/messages`.
async fn messages(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    answer(Api::Messages, &shared, &headers, &body).await
}

/// The answer to a request to `api`: counted, read, then served by its verdict.
async fn answer(api: Api, shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Response<Body> {
    let attempt = headers
        .get(&X_RETRY_ATTEMPT)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u32>().ok());
    let key = headers
        .get(&IDEMPOTENCY_KEY)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let key = key.filter(|_| shared.config.keep_idempotency_keys);
    let request = shared.stats.arrive(attempt, key);
    match serde_json::from_slice::<ChatRequest>(body) {
        Err(error) => {
            let response = invalid_request(api, &error.to_string());
            request.answered(response.status().as_u16());
            response
        }
        Ok(chat) => serve(api, shared, chat, request).await,
    }
}

/// Serves `chat` by the verdict its arrival draws, after the latency of what it is answered.
async fn serve(api: Api, shared: &Shared, chat: ChatRequest, request: InFlight) -> Response<Body> {
    let config = &shared.config;
    let max_tokens = chat.max_tokens.unwrap_or(config.default_max_tokens);
    let streaming = chat.stream == Some(true);
    let response = match shared.verdict(request.load(), request.arrival(), streaming) {
        // Shedding is cheap work, but an overloaded server is slow at everything.
        Verdict::Shed(fault) | Verdict::Fail(fault) => {
            tokio::time::sleep(config.latency(0, request.load())).await;
            fault_response(api, fault)
        }
        Verdict::Complete => {
            tokio::time::sleep(config.latency(max_tokens, request.load())).await;
            completion(api, &chat, max_tokens)
        }
        Verdict::Stream(fault) => {
            // The time to the first byte; the tokens follow, paced, in the stream.
            tokio::time::sleep(config.latency(0, request.load())).await;
            request.answered(StatusCode::OK.as_u16());
            let answer = stream::Answer {
                first_word: u64::try_from(chat.prefill_words()).unwrap_or(u64::MAX),
                events: Events::new(api, chat.prompt_tokens(), chat.model),
                tokens: max_tokens,
                numbered: config.numbered,
                fault,
                pace: config.token_latency(request.load()),
            };
            return stream::respond(answer, request);
        }
    };
    request.answered(response.status().as_u16());
    response
}
