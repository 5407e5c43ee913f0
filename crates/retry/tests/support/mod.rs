//! A scripted fake backend, bodies, a recording classifier and the retries-only engine for the
//! engine's tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use stormguard_classify::body::PartialBody;
use stormguard_classify::{BoxError, Classify, LlmClassifier, Outcome};
use stormguard_retry::{ClientLayer, ReplayBody};
use tokio::time::Instant;
use tower::Service;

pub type Reply = Response<Full<Bytes>>;

/// The engine with retries only: no adaptive throttle and no deadline of its own (a deadline
/// already on a request is still honoured, and stamped on every attempt).
pub fn retries_only() -> ClientLayer {
    ClientLayer::default().without_throttle().without_timeout()
}

/// One attempt as the backend saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

/// Every attempt the backend received, in order.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    /// Record an attempt; returns its index (0-based, over all requests).
    pub fn push(&self, seen: Seen) -> usize {
        let mut log = self.0.lock().unwrap();
        log.push(seen);
        log.len() - 1
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
}

/// A backend that records each attempt, waits `latency`, then answers `respond(index, seen)`.
pub fn scripted<B, F>(
    log: &Log,
    latency: Duration,
    respond: F,
) -> impl Service<Request<B>, Response = Reply, Error = BoxError, Future: Send> + Clone + Send + use<B, F>
where
    B: Body<Data = Bytes, Error: std::fmt::Debug> + Send + 'static,
    F: Fn(usize, &Seen) -> Result<Reply, BoxError> + Clone + Send + Sync + 'static,
{
    let log = log.clone();
    tower::service_fn(move |request: Request<B>| {
        let log = log.clone();
        let respond = respond.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let seen = Seen {
                at: Instant::now(),
                method: parts.method,
                headers: parts.headers,
                body,
            };
            let index = log.push(seen.clone());
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            respond(index, &seen)
        }
    })
}

/// A backend whose n-th attempt (from 0, over all requests) is answered with the status of
/// `plan[n]` after its wait (the last entry for every attempt after).
pub fn planned<B>(
    log: &Log,
    plan: &[(Duration, u16)],
) -> impl Service<Request<B>, Response = Reply, Error = BoxError, Future: Send> + Clone + Send + use<B>
where
    B: Body<Data = Bytes, Error: std::fmt::Debug> + Send + 'static,
{
    let log = log.clone();
    let plan: Arc<[(Duration, u16)]> = plan.into();
    tower::service_fn(move |request: Request<B>| {
        let log = log.clone();
        let plan = Arc::clone(&plan);
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let seen = Seen {
                at: Instant::now(),
                method: parts.method,
                headers: parts.headers,
                body,
            };
            let index = log.push(seen);
            let (wait, code) = plan[index.min(plan.len() - 1)];
            tokio::time::sleep(wait).await;
            Ok(status(code))
        }
    })
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
    B: Body<Data = Bytes, Error: std::fmt::Debug> + Send + 'static,
    F: Fn(usize, &Seen) -> Result<Reply, BoxError> + Clone + Send + Sync + 'static,
{
    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, respond);
    (log, backend)
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

pub fn post(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("http://llm.test/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

pub fn get() -> Request<Full<Bytes>> {
    Request::get("http://llm.test/v1/models")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A body of unknown length, delivered in the given chunks (requests and responses).
#[derive(Debug)]
pub enum Chunked {
    Chunks {
        chunks: VecDeque<Bytes>,
        /// The size the body announces (unknown unless set).
        hint: SizeHint,
        /// Not ready at the first poll, as a body still arriving from the network.
        late: bool,
        /// Never ends once its chunks are delivered, as a peer that stopped sending.
        stalls: bool,
    },
    Partial(Box<PartialBody<Chunked>>),
}

impl Chunked {
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self::Chunks {
            chunks: chunks.into_iter().collect(),
            hint: SizeHint::default(),
            late: false,
            stalls: false,
        }
    }

    /// The same chunks, announcing `announced` as their size, true or not.
    pub fn announcing(mut self, announced: SizeHint) -> Self {
        if let Self::Chunks { hint, .. } = &mut self {
            *hint = announced;
        }
        self
    }

    /// The same chunks, not ready at the first poll.
    pub fn arriving_late(mut self) -> Self {
        if let Self::Chunks { late, .. } = &mut self {
            *late = true;
        }
        self
    }

    /// The same chunks, then nothing ever again: neither a frame nor the end.
    pub fn stalling(mut self) -> Self {
        if let Self::Chunks { stalls, .. } = &mut self {
            *stalls = true;
        }
        self
    }
}

impl Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Self::Chunks {
                late: late @ true, ..
            } => {
                *late = false;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Self::Chunks { chunks, stalls, .. } => match chunks.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None if *stalls => Poll::Pending,
                None => Poll::Ready(None),
            },
            Self::Partial(partial) => Pin::new(partial.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Chunks { chunks, stalls, .. } => chunks.is_empty() && !*stalls,
            Self::Partial(partial) => partial.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Chunks { hint, .. } => *hint,
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
