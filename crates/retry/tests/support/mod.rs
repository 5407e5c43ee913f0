//! The kit's scripted backend and bodies as the engine's tests use them, a recording classifier
//! and the retries-only engine.

#![allow(dead_code, clippy::unwrap_used)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use stormguard_classify::body::PartialBody;
use stormguard_classify::{BoxError, Classify, LlmClassifier, Outcome};
use stormguard_retry::{ClientLayer, ReplayBody};
use stormguard_test_kit::{self as kit, ScriptedBackend, ScriptedBody};
pub use stormguard_test_kit::{Log, Seen};
use tower::Service;

pub type Reply = Response<Full<Bytes>>;

/// The engine with retries only: no adaptive throttle and no deadline of its own (a deadline
/// already on a request is still honoured, and stamped on every attempt).
pub fn retries_only() -> ClientLayer {
    ClientLayer::default().without_throttle().without_timeout()
}

/// The kit's backend (its type names the requests' body `B`, so that an engine in front of it
/// knows its request type before the first call). Records each attempt, waits `latency`, then answers `respond(index, seen)`.
pub fn scripted<B, F>(
    log: &Log,
    latency: Duration,
    respond: F,
) -> impl Service<Request<B>, Response = Reply, Error = BoxError, Future: Send> + Clone + Send + use<B, F>
where
    B: Body<Data = Bytes> + Send + 'static,
    F: Fn(usize, &Seen) -> Result<Reply, BoxError> + Clone + Send + Sync + 'static,
{
    ScriptedBackend::answering(respond)
        .latency(latency)
        .logging_to(log)
}

/// A backend whose n-th attempt (from 0, over all requests) is answered with the status of
/// `plan[n]` after its wait (the last entry for every attempt after).
pub fn planned<B>(
    log: &Log,
    plan: &[(Duration, u16)],
) -> impl Service<Request<B>, Response = Response<ScriptedBody>, Error = BoxError, Future: Send>
+ Clone
+ Send
+ use<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let replies = plan
        .iter()
        .map(|&(wait, code)| kit::Reply::status(code).delay(wait));
    ScriptedBackend::replies(replies).logging_to(log)
}

/// A fresh log and a backend that records each attempt and answers it at once with `respond`.
pub fn instant<B, F>(
    respond: F,
) -> (
    Log,
    impl Service<Request<B>, Response = Reply, Error = BoxError, Future: Send>
    + Clone
    + Send
    + use<B, F>,
)
where
    B: Body<Data = Bytes> + Send + 'static,
    F: Fn(usize, &Seen) -> Result<Reply, BoxError> + Clone + Send + Sync + 'static,
{
    let backend = ScriptedBackend::answering(respond);
    (backend.log().clone(), backend)
}

/// The whole body of `response`.
pub async fn body_bytes<B>(response: Response<B>) -> Bytes
where
    B: Body<Data = Bytes, Error: std::fmt::Debug>,
{
    response.into_body().collect().await.unwrap().to_bytes()
}

/// A response with `status`, `headers` and `body`.
pub fn reply(status: u16, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

pub fn status(status: u16) -> Reply {
    reply(status, &[], "")
}

/// Where the requests of the engine's tests go.
pub const CHAT_URI: &str = "http://llm.test/v1/chat/completions";

pub fn get() -> Request<Full<Bytes>> {
    Request::get("http://llm.test/v1/models")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A body of unknown length, delivered in the given chunks (requests and responses): the kit's
/// [`ScriptedBody`], here because the engine replays only a body of the `ReplayBody` trait, which
/// a type of this crate must carry.
#[derive(Debug)]
pub enum Chunked {
    Script(ScriptedBody),
    Partial(Box<PartialBody<Chunked>>),
}

impl Chunked {
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self::Script(ScriptedBody::chunks(chunks))
    }

    /// The same chunks, announcing `announced` as their size, true or not.
    pub fn announcing(self, announced: SizeHint) -> Self {
        self.map(|body| body.size_hint(announced))
    }

    /// The same chunks, then nothing ever again: neither a frame nor the end.
    pub fn stalling(self) -> Self {
        self.map(ScriptedBody::hang)
    }

    fn map(self, f: impl FnOnce(ScriptedBody) -> ScriptedBody) -> Self {
        match self {
            Self::Script(body) => Self::Script(f(body)),
            partial @ Self::Partial(_) => partial,
        }
    }
}

impl From<ScriptedBody> for Chunked {
    fn from(body: ScriptedBody) -> Self {
        Self::Script(body)
    }
}

impl Body for Chunked {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Self::Script(body) => Pin::new(body).poll_frame(cx),
            Self::Partial(partial) => Pin::new(partial.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Script(body) => body.is_end_stream(),
            Self::Partial(partial) => partial.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Script(body) => body.size_hint(),
            Self::Partial(partial) => partial.size_hint(),
        }
    }
}

impl ReplayBody for Chunked {
    fn from_bytes(bytes: Bytes) -> Self {
        Self::new([bytes])
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        Self::Partial(Box::new(partial))
    }
}

/// `LlmClassifier`, recording the length of every body it was shown.
#[derive(Clone, Default)]
pub struct Recording {
    pub bodies: Arc<Mutex<Vec<usize>>>,
}

impl Classify for Recording {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        self.bodies.lock().unwrap().push(body.len());
        LlmClassifier::default().classify_http(parts, body)
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        LlmClassifier::default().classify_error(error)
    }
}
