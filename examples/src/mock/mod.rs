//! A fault-injecting mock of an OpenAI-like chat completions API.
//!
//! `POST /v1/chat/completions` takes the usual JSON (`model`, `messages`, `max_tokens`,
//! `stream`) and answers a `chat.completion` object after a latency proportional to
//! `max_tokens`, or one of the providers' failures ([`Fault`]) at the configured rate. Past its
//! capacity it degrades like a real overloaded backend: excess requests are shed with 503 or 529
//! and everyone waits longer. Every request is counted in [`MockStats`], with its
//! `x-retry-attempt` and `Idempotency-Key`.
//!
//! With `"stream": true` the answer is streamed like OpenAI's (`text/event-stream`): a chunk
//! with the role, one chunk per token paced by the per-token latency, a chunk with the
//! `finish_reason`, then `data: [DONE]`. Two faults fail a stream after its `200`:
//! [`Fault::ErrorBeforeContent`] and [`Fault::CutMidStream`]. [`Transcript`] reads such a stream
//! back.

mod config;
mod stats;
mod stream;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use axum::routing::post;
use axum::serve::ListenerExt;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;
use stormguard::classify::headers::{IDEMPOTENCY_KEY, RETRY_AFTER_MS, X_RETRY_ATTEMPT};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{Fault, MockConfig};
pub use stats::{MockStats, StatsSnapshot};
pub use stream::Transcript;

/// The path of the chat completions endpoint.
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";

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

#[derive(Deserialize)]
struct ChatRequest {
    model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    max_tokens: Option<u32>,
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    content: String,
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let attempt = headers
        .get(&X_RETRY_ATTEMPT)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u32>().ok());
    let key = headers
        .get(&IDEMPOTENCY_KEY)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let request = shared.stats.arrive(attempt, key);

    let response = match serde_json::from_slice::<ChatRequest>(&body) {
        Err(error) => invalid_request(&error.to_string()),
        Ok(chat) => {
            let config = &shared.config;
            let max_tokens = chat.max_tokens.unwrap_or(config.default_max_tokens);
            let streaming = chat.stream == Some(true);
            match shared.verdict(request.load(), request.arrival(), streaming) {
                Verdict::Shed(fault) => {
                    // Shedding is cheap work, but an overloaded server is slow at everything.
                    tokio::time::sleep(config.latency(0, request.load())).await;
                    fault_response(fault)
                }
                Verdict::Fail(fault) => {
                    tokio::time::sleep(config.latency(0, request.load())).await;
                    fault_response(fault)
                }
                Verdict::Complete => {
                    tokio::time::sleep(config.latency(max_tokens, request.load())).await;
                    completion(&chat, max_tokens)
                }
                Verdict::Stream(fault) => {
                    // The time to the first byte; the tokens follow, paced, in the stream.
                    tokio::time::sleep(config.latency(0, request.load())).await;
                    let pace = config.token_latency(request.load());
                    request.answered(StatusCode::OK.as_u16());
                    return stream::answer(chat.model, max_tokens, fault, pace, request);
                }
            }
        }
    };
    request.answered(response.status().as_u16());
    response
}

fn completion(chat: &ChatRequest, max_tokens: u32) -> Response<Body> {
    let prompt_tokens: usize = chat
        .messages
        .iter()
        .map(|message| message.content.split_whitespace().count())
        .sum();
    let body = serde_json::json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": chat.model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": "This is the mock speaking." },
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens.saturating_add(max_tokens as usize),
        },
    });
    json_response(StatusCode::OK, &body)
}

fn fault_response(fault: Fault) -> Response<Body> {
    let status = StatusCode::from_u16(fault.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = json_response(status, &error_body(fault));
    if let Fault::RateLimited { retry_after } = fault {
        let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER_MS, HeaderValue::from(millis));
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The provider's error JSON for `fault`. A stream fault's error frame is a 503's body.
fn error_body(fault: Fault) -> serde_json::Value {
    match fault {
        Fault::RateLimited { .. } => serde_json::json!({ "error": {
            "message": "Rate limit reached for requests. Please try again shortly.",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }}),
        Fault::QuotaExhausted => serde_json::json!({ "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }}),
        Fault::Unavailable | Fault::ErrorBeforeContent | Fault::CutMidStream => {
            serde_json::json!({ "error": {
                "message": "The server is overloaded or not ready yet.",
                "type": "server_error",
                "code": null,
            }})
        }
        Fault::Overloaded => serde_json::json!({
            "type": "error",
            "error": { "type": "overloaded_error", "message": "Overloaded" },
        }),
    }
}

fn invalid_request(message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": {
        "message": message,
        "type": "invalid_request_error",
        "code": null,
    }});
    json_response(StatusCode::BAD_REQUEST, &body)
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
