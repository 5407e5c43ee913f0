//! [`ScriptedBackend`]: a tower `Service` that records what it saw and answers from a script.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::AsHeaderName;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, SizeHint};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower_service::Service;

use crate::{BoxError, ScriptedBody};

/// What a backend saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When the request's body had been read (tokio's clock).
    pub at: Instant,
    /// The request method.
    pub method: Method,
    /// The request URI.
    pub uri: Uri,
    /// Every request header.
    pub headers: HeaderMap,
    /// The whole request body (empty if reading it failed).
    pub body: Bytes,
}

impl Seen {
    /// Reads `request` to its end and notes it, at the time its body has been read.
    pub async fn read<B>(request: Request<B>) -> Self
    where
        B: Body<Data = Bytes>,
    {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        Self {
            at: Instant::now(),
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
        }
    }

    /// The value of header `name`, if present and visible ASCII.
    pub fn header<K: AsHeaderName>(&self, name: K) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The request path.
    pub fn path(&self) -> &str {
        self.uri.path()
    }
}

/// Every request a [`ScriptedBackend`] saw, in order: a cheap `Clone` handle, shared by the
/// backend's clones and the test that inspects it.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    /// Notes `seen`; returns its index (from 0, over every request).
    pub fn push(&self, seen: Seen) -> usize {
        let mut log = self.lock();
        log.push(seen);
        log.len() - 1
    }

    /// How many requests were seen so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none was seen yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every request seen so far, in order.
    pub fn all(&self) -> Vec<Seen> {
        self.lock().clone()
    }

    /// Locks the log, ignoring poisoning (a panicking test thread leaves the records readable).
    fn lock(&self) -> MutexGuard<'_, Vec<Seen>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

/// One scripted answer of a [`ScriptedBackend`]: a status, headers, a body, and how long the
/// backend waits before answering.
#[derive(Clone, Debug)]
pub struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    delay: Duration,
}

impl Reply {
    /// An answer with status `code` and an empty body.
    ///
    /// # Panics
    ///
    /// If `code` is not a valid HTTP status (100..=999).
    pub fn status(code: u16) -> Self {
        Self {
            status: StatusCode::from_u16(code).expect("a valid status code"),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
        }
    }

    /// Adds the header `name: value`.
    ///
    /// # Panics
    ///
    /// If `name` or `value` is not a valid header name or value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::try_from(name).expect("a valid header name");
        let value = HeaderValue::try_from(value).expect("a valid header value");
        self.headers.append(name, value);
        self
    }

    /// Sets a JSON body, and its `content-type`.
    pub fn json(mut self, body: impl Into<Bytes>) -> Self {
        self.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        self.body = body.into();
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Waits `delay` before answering.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The answer as a response: its body announces its exact size, as a whole body does.
    pub fn to_response(&self) -> Response<ScriptedBody> {
        let size = SizeHint::with_exact(self.body.len() as u64);
        let body = ScriptedBody::from(self.body.clone()).size_hint(size);
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// How a [`ScriptedBackend`] answers the request it saw as its `index`-th (from 0).
///
/// A function `Fn(usize, &Seen) -> Result<Response<B>, BoxError>` is one; so is a script of
/// [`Reply`]s (the last one repeating), built by [`ScriptedBackend::replies`].
pub trait Respond: Clone + Send + Sync + 'static {
    /// The body of the answers.
    type Body;

    /// How long to wait before answering the `index`-th request (nothing unless said).
    fn delay(&self, index: usize) -> Duration {
        let _ = index;
        Duration::ZERO
    }

    /// The answer to the `index`-th request, which was `seen`.
    fn respond(&self, index: usize, seen: &Seen) -> Result<Response<Self::Body>, BoxError>;
}

impl<F, B> Respond for F
where
    F: Fn(usize, &Seen) -> Result<Response<B>, BoxError> + Clone + Send + Sync + 'static,
{
    type Body = B;

    fn respond(&self, index: usize, seen: &Seen) -> Result<Response<B>, BoxError> {
        self(index, seen)
    }
}

/// A script of [`Reply`]s: the n-th request gets the n-th reply, the last one repeating.
#[derive(Clone, Debug)]
pub struct Replies(Arc<[Reply]>);

impl Replies {
    fn get(&self, index: usize) -> &Reply {
        &self.0[index.min(self.0.len() - 1)]
    }
}

impl Respond for Replies {
    type Body = ScriptedBody;

    fn delay(&self, index: usize) -> Duration {
        self.get(index).delay
    }

    fn respond(&self, index: usize, _seen: &Seen) -> Result<Response<ScriptedBody>, BoxError> {
        Ok(self.get(index).to_response())
    }
}

/// A backend as a tower `Service`: it reads each request whole, notes it in its [`Log`], waits
/// its latency (and the reply's delay), then answers as its [`Respond`] says.
///
/// Clones share the log; [`log`](Self::log) hands a handle to inspect it.
///
/// ```
/// use std::time::Duration;
///
/// use http::Response;
/// use stormguard_test_kit::{ScriptedBackend, ScriptedBody, post};
/// use tower_service::Service;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Every attempt waits 100 ms, then the first two answer 503 and the others 200.
/// let mut backend = ScriptedBackend::answering(|index, _seen| {
///     let status = if index < 2 { 503 } else { 200 };
///     let mut response = Response::new(ScriptedBody::new());
///     *response.status_mut() = status.try_into().unwrap();
///     Ok(response)
/// })
/// .latency(Duration::from_millis(100));
/// let response = backend.call(post("http://llm.test/v1/chat/completions", "{}")).await.unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(backend.log().all()[0].body, "{}");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ScriptedBackend<R> {
    log: Log,
    latency: Duration,
    respond: R,
    cancelled: Option<Arc<AtomicUsize>>,
}

impl ScriptedBackend<Replies> {
    /// Answers `replies` in order, each after its delay; once they are used up, the last one
    /// answers every further request.
    ///
    /// # Panics
    ///
    /// If `replies` is empty.
    pub fn replies(replies: impl IntoIterator<Item = Reply>) -> Self {
        let replies: Arc<[Reply]> = replies.into_iter().collect();
        assert!(!replies.is_empty(), "a script needs at least one reply");
        Self::new(Replies(replies))
    }
}

impl<F> ScriptedBackend<F> {
    /// Answers the `index`-th request (from 0), which was `seen`, with `respond(index, seen)`.
    pub fn answering<B>(respond: F) -> Self
    where
        F: Fn(usize, &Seen) -> Result<Response<B>, BoxError> + Clone + Send + Sync + 'static,
    {
        Self::new(respond)
    }
}

impl<R> ScriptedBackend<R> {
    /// Answers as `respond` says, with a log of its own.
    pub fn new(respond: R) -> Self {
        Self {
            log: Log::default(),
            latency: Duration::ZERO,
            respond,
            cancelled: None,
        }
    }

    /// Notes requests in `log` (shared with other backends, say) instead of a log of its own.
    pub fn logging_to(mut self, log: &Log) -> Self {
        self.log = log.clone();
        self
    }

    /// Waits `latency` before every answer, after noting the request.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Counts one into `cancelled` for every request dropped after it was noted and before it
    /// was answered (a caller that gave up on it while the backend was still working).
    pub fn watched(mut self, cancelled: &Arc<AtomicUsize>) -> Self {
        self.cancelled = Some(Arc::clone(cancelled));
        self
    }

    /// The log of what the backend saw.
    pub fn log(&self) -> &Log {
        &self.log
    }
}

impl<R, B> Service<Request<B>> for ScriptedBackend<R>
where
    R: Respond,
    R::Body: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<R::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R::Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let log = self.log.clone();
        let latency = self.latency;
        let respond = self.respond.clone();
        let cancelled = self.cancelled.clone();
        Box::pin(async move {
            let seen = Seen::read(request).await;
            let index = log.push(seen.clone());
            let mut unanswered = Unanswered(cancelled);
            let wait = latency + respond.delay(index);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let answer = respond.respond(index, &seen);
            unanswered.0 = None;
            answer
        })
    }
}

/// Counts a cancellation when dropped while it still holds its counter: a request noted but not
/// answered yet.
struct Unanswered(Option<Arc<AtomicUsize>>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(cancelled) = self.0.take() {
            cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}
