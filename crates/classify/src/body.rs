//! Reading the start of a body without taking it from whoever reads it next: the error body a
//! classifier needs, and the request body the retry engine replays.
//!
//! [`Prefix`] reads a body until it ends or more than a limit was read, and hands back what it
//! read, where it stopped ([`Tail`]) and the unread rest; [`PartialBody`] puts the three together
//! again, so the next reader sees every byte, trailer and error where it was. [`classify_response`]
//! uses them to classify a failed response with the start of its body (the JSON error of an LLM
//! API) while the caller still receives the whole body, as a [`ResponseBody`].

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::{BoxError, Classify, ERROR_BODY_LIMIT, Outcome};

/// Where reading the start of a body stopped.
#[derive(Debug)]
pub enum Tail<E> {
    /// More than the limit was read: the rest is still to be read.
    Open,
    /// At the end of the body.
    Ended,
    /// At the trailers, the body's last frame.
    Trailers(HeaderMap),
    /// At an error.
    Failed(E),
}

/// Reads a body until it ends or more than `limit` bytes were read (see the [module docs](self)).
/// Resolves to the bytes read (one `Bytes`, copied only when the body came in several frames),
/// where reading stopped, and the body itself for the rest.
#[derive(Debug)]
pub struct Prefix<B> {
    body: Option<B>,
    read: Collected,
    limit: usize,
}

impl<B> Prefix<B> {
    /// Starts reading `body`, stopping once more than `limit` bytes are in.
    pub fn new(body: B, limit: usize) -> Self {
        Self {
            body: Some(body),
            read: Collected::default(),
            limit,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Future for Prefix<B> {
    type Output = (Bytes, Tail<B::Error>, B);

    // Inlined into the engine's request path, where a whole body is read in one poll.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            // Polled again after it resolved: there is nothing left to give.
            return Poll::Pending;
        };
        let tail = loop {
            if this.read.len() > this.limit {
                break Tail::Open;
            }
            if body.is_end_stream() {
                break Tail::Ended;
            }
            match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                None => break Tail::Ended,
                Some(Err(error)) => break Tail::Failed(error),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.read.push(data),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            break Tail::Trailers(trailers);
                        }
                    }
                },
            }
        };
        let read = std::mem::take(&mut this.read).into_bytes();
        match this.body.take() {
            Some(body) => Poll::Ready((read, tail, body)),
            None => Poll::Pending,
        }
    }
}

/// Data frames gathered from a body. A body that arrives in one frame (a `Full<Bytes>`, a small
/// JSON error) is kept as that frame's `Bytes`, without a copy; a second frame switches to one
/// contiguous buffer, because a replay hands out one `Bytes` and a classifier reads one slice.
#[derive(Debug, Default)]
enum Collected {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Collected {
    fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Self::Empty => Self::One(chunk),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len().saturating_add(chunk.len()));
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&chunk);
                Self::Many(joined)
            }
            Self::Many(mut joined) => {
                joined.extend_from_slice(&chunk);
                Self::Many(joined)
            }
        };
    }

    fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::One(bytes) => bytes.len(),
            Self::Many(joined) => joined.len(),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Self::Empty => Bytes::new(),
            Self::One(bytes) => bytes,
            Self::Many(joined) => joined.freeze(),
        }
    }
}

pin_project! {
    /// A body whose first bytes were already read: yields those bytes as one data frame, then
    /// what reading met after them (the trailers, which end the body, or a read error), otherwise
    /// every frame of the unread rest.
    pub struct PartialBody<B>
    where
        B: Body,
    {
        prefix: Option<Bytes>,
        // Boxed: few bodies end in trailers, and a `ResponseBody` (every response the engine
        // hands back) is as large as this; a `HeaderMap` inline would make it cost more to move.
        trailers: Option<Box<HeaderMap>>,
        // A read error met while reading the prefix, handed on after it.
        error: Option<B::Error>,
        // Reading already reached the end of the rest: never poll it again.
        rest_done: bool,
        #[pin]
        rest: B,
    }
}

impl<B: Body> PartialBody<B> {
    /// `prefix` was read from `rest`, and reading stopped at `tail` (see [`Prefix`]).
    pub fn new(prefix: Bytes, tail: Tail<B::Error>, rest: B) -> Self {
        let (trailers, error, rest_done) = match tail {
            Tail::Open => (None, None, false),
            Tail::Ended => (None, None, true),
            Tail::Trailers(trailers) => (Some(Box::new(trailers)), None, true),
            Tail::Failed(error) => (None, Some(error), true),
        };
        Self {
            prefix: (!prefix.is_empty()).then_some(prefix),
            trailers,
            error,
            rest_done,
            rest,
        }
    }

    /// The whole body, if reading its prefix reached its end with nothing after it (no trailers,
    /// no error) and the prefix was not yielded yet: its bytes.
    pub fn into_whole(self) -> Option<Bytes> {
        let whole = self.rest_done && self.trailers.is_none() && self.error.is_none();
        whole.then(|| self.prefix.unwrap_or_default())
    }

    /// Takes the body apart again: the prefix not yet yielded (empty once it was), and the rest
    /// unless reading had already reached its end.
    pub fn into_parts(self) -> (Bytes, Option<B>) {
        let rest = (!self.rest_done).then_some(self.rest);
        (self.prefix.unwrap_or_default(), rest)
    }
}

impl<B: Body<Data = Bytes>> Body for PartialBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(*trailers))));
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if *this.rest_done {
            return Poll::Ready(None);
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none()
            && self.trailers.is_none()
            && self.error.is_none()
            && (self.rest_done || self.rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        if self.rest_done {
            return SizeHint::with_exact(prefix);
        }
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(prefix));
        if let Some(upper) = rest.upper().and_then(|upper| upper.checked_add(prefix)) {
            hint.set_upper(upper);
        }
        hint
    }
}

impl<B: Body> fmt::Debug for PartialBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartialBody")
            .field("prefix_len", &self.prefix.as_ref().map_or(0, Bytes::len))
            .field("trailers", &self.trailers.is_some())
            .field("error", &self.error.is_some())
            .field("rest_done", &self.rest_done)
            .finish()
    }
}

pin_project! {
    /// The body of a response stormguard classified: the backend's body untouched when the
    /// classifier needed only the head (every success), or, for a failure whose body it read,
    /// the bytes read (about [`ERROR_BODY_LIMIT`] at most) followed by the unread rest, with
    /// trailers and a read error passed on where they occurred. Either way the caller reads the
    /// body exactly as the backend sent it. A response stormguard answered itself (a circuit
    /// breaker's fallback) has a body of its own ([`local`](ResponseBody::local)), and one that
    /// another stormguard layer made of the backend's (a guarded event stream) is
    /// [boxed](ResponseBody::boxed). A layer that wants to see the body as its reader reads it
    /// (a rate limit reading the `usage` of an answer) [watches](ResponseBody::watched) it.
    pub struct ResponseBody<RB>
    where
        RB: Body,
    {
        #[pin]
        kind: Kind<RB>,
        watch: Option<Box<Watch>>,
        // The deadline on its reading (`ResponseBody::set_deadline`), and the error it ends
        // with then; taken when it passes.
        deadline: Option<(Instant, fn() -> BoxError)>,
        // Made the first time the body has to wait under a deadline: a body whose bytes are all
        // there never touches the timer wheel.
        timer: Option<Pin<Box<Sleep>>>,
    }
}

/// What is done at the end of a watched body, with its bytes.
type AtEnd = Box<dyn FnOnce(&[u8]) + Send + Sync>;

/// The bytes of a body as its reader read them, up to a cap, for a function called at its end.
struct Watch {
    seen: BytesMut,
    cap: usize,
    /// Taken when called; dropped uncalled if the body outgrew the cap or failed.
    at_end: Option<AtEnd>,
    /// Held until the body ends, fails or is dropped (see [`ResponseBody::holding`]).
    held: Option<Box<dyn Any + Send + Sync>>,
}

pin_project! {
    #[project = KindProj]
    enum Kind<RB>
    where
        RB: Body,
    {
        Inner {
            #[pin]
            body: RB,
        },
        // The rest sits in a `Box` so that a body that is not `Unpin` can be read in place and
        // then handed on; the allocation happens only on this error path.
        Read {
            body: PartialBody<Pin<Box<RB>>>,
        },
        // Bytes of stormguard's own, in place of a backend's answer.
        Local {
            body: Full<Bytes>,
        },
        // A body another stormguard layer made of the backend's. The mutex is never locked to
        // read it (`poll_frame` has `&mut` and uses `get_mut`); it is there so that the body
        // stays `Sync` when the backend's is, as reqwest's `Body::wrap` requires, without
        // asking `Sync` of the wrapped body: tonic's and axum's bodies are not.
        Boxed {
            body: Mutex<BoxedBody>,
        },
    }
}

/// The body of [`ResponseBody::boxed`].
type BoxedBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

impl<RB: Body> ResponseBody<RB> {
    /// Wraps a body nobody read.
    pub fn new(body: RB) -> Self {
        Self {
            kind: Kind::Inner { body },
            watch: None,
            deadline: None,
            timer: None,
        }
    }

    /// A body of stormguard's own: `bytes`, in place of a backend's answer.
    pub fn local(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Local {
                body: Full::new(bytes),
            },
            watch: None,
            deadline: None,
            timer: None,
        }
    }

    /// A body another stormguard layer made of the backend's: an event stream under the stream
    /// guard (`stormguard-stream`'s `GuardedStream`), handed back by the retry engine.
    pub fn boxed<B>(body: B) -> Self
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        Self {
            kind: Kind::Boxed {
                body: Mutex::new(Box::pin(body)),
            },
            watch: None,
            deadline: None,
            timer: None,
        }
    }

    /// A body whose first bytes, `read`, were read already; `rest` follows them.
    pub fn from_read(read: Bytes, rest: Pin<Box<RB>>) -> Self {
        Self {
            kind: Kind::Read {
                body: PartialBody::new(read, Tail::Open, rest),
            },
            watch: None,
            deadline: None,
            timer: None,
        }
    }

    /// The same body, calling `at_end` with all its bytes once its reader has read it to the
    /// end, if it is `cap` bytes at most (a longer body, or one that fails, calls nothing). The
    /// reader gets every byte as before; the watch keeps a copy of at most `cap` bytes.
    pub fn watched<F>(mut self, cap: usize, at_end: F) -> Self
    where
        F: FnOnce(&[u8]) + Send + Sync + 'static,
    {
        let held = self.watch.take().and_then(|watch| watch.held);
        self.watch = Some(Box::new(Watch {
            seen: BytesMut::new(),
            cap,
            at_end: Some(Box::new(at_end)),
            held,
        }));
        self
    }

    /// The same body, holding `value` until its reader has read it to the end, it fails, or it
    /// is dropped: a guard's place that an answer keeps while its bytes are still read (the
    /// concurrency limit's slot). Nothing of the body is copied for it.
    pub fn holding<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        let held: Box<dyn Any + Send + Sync> = Box::new(value);
        match &mut self.watch {
            Some(watch) => watch.held = Some(held),
            None => {
                self.watch = Some(Box::new(Watch {
                    seen: BytesMut::new(),
                    cap: 0,
                    at_end: None,
                    held: Some(held),
                }));
            }
        }
        self
    }

    /// Bounds the reading of this body by `until`: a body still waiting for its next frame then
    /// ends with the error `error` makes (the retry engine's: the request's deadline passed), and
    /// nothing after it. The deadline is checked whenever the body has to wait, so bytes that are
    /// there already are read to their end.
    pub fn set_deadline(&mut self, until: Instant, error: fn() -> BoxError) {
        self.deadline = Some((until, error));
    }

    /// The whole body, if reading it to classify the response reached its end (a small error
    /// body, read whole) and nobody read it since: its bytes, for a copy of the answer; `None`
    /// for any other body.
    pub fn into_whole(self) -> Option<Bytes> {
        match self.kind {
            Kind::Read { body } => body.into_whole(),
            Kind::Local { .. } | Kind::Inner { .. } | Kind::Boxed { .. } => None,
        }
    }

    /// Whether the start of this body was read to classify the response (it still yields every
    /// byte).
    pub fn was_read(&self) -> bool {
        matches!(self.kind, Kind::Read { .. })
    }

    /// Whether stormguard wrote this body itself ([`local`](Self::local)).
    pub fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local { .. })
    }
}

/// Its errors are boxed: the backend's body's own, or stormguard's (a guarded stream that was
/// interrupted after its first content: `stormguard-stream`'s `StreamInterrupted`).
impl<RB> Body for ResponseBody<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = match this.kind.as_mut().project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Read { body } => Pin::new(body).poll_frame(cx).map_err(Into::into),
            KindProj::Local { body } => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(|never| match never {}))),
            KindProj::Boxed { body } => body
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
                .poll_frame(cx),
        };
        let polled = match (polled, *this.deadline) {
            (Poll::Pending, Some((until, error))) => {
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                ready!(timer.as_mut().poll(cx));
                // Past it: the body ends here, its rest (and its connection) dropped.
                *this.deadline = None;
                *this.timer = None;
                this.kind.set(Kind::Local {
                    body: Full::new(Bytes::new()),
                });
                Poll::Ready(Some(Err(error())))
            }
            (polled, _) => polled,
        };
        if let Some(watch) = this.watch {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        if watch.seen.len() + data.len() > watch.cap {
                            watch.at_end = None;
                        } else if watch.at_end.is_some() {
                            watch.seen.extend_from_slice(data);
                        }
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    watch.at_end = None;
                    watch.held = None;
                }
                Poll::Ready(None) => {
                    if let Some(at_end) = watch.at_end.take() {
                        at_end(&watch.seen);
                    }
                    watch.held = None;
                }
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Read { body } => body.is_end_stream(),
            Kind::Local { body } => body.is_end_stream(),
            Kind::Boxed { body } => lock(body).is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Read { body } => body.size_hint(),
            Kind::Local { body } => body.size_hint(),
            Kind::Boxed { body } => lock(body).size_hint(),
        }
    }
}

impl<RB: Body> fmt::Debug for ResponseBody<RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Read { body } => f.debug_tuple("ResponseBody::Read").field(body).finish(),
            Kind::Local { .. } => f.write_str("ResponseBody::Local"),
            Kind::Boxed { .. } => f.write_str("ResponseBody::Boxed"),
        }
    }
}

/// The boxed body, for a method that has only `&self`.
fn lock(body: &Mutex<BoxedBody>) -> std::sync::MutexGuard<'_, BoxedBody> {
    body.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a response is an event stream: `content-type: text/event-stream`, with or without
/// parameters (`; charset=utf-8`), in any case. Read here, by every crate that treats an event
/// stream apart (the stream guard, the engine, fault injection).
// Asked of every response the engine judges: inlined there, its header lookup folds in.
#[inline]
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(is_event_stream_type)
}

/// [`is_event_stream`] of a `content-type` already read.
pub(crate) fn is_event_stream_type(value: &http::HeaderValue) -> bool {
    const EVENT_STREAM: &[u8] = b"text/event-stream";
    let value = value.as_bytes().trim_ascii_start();
    let Some((media_type, rest)) = value.split_at_checked(EVENT_STREAM.len()) else {
        return false;
    };
    media_type.eq_ignore_ascii_case(EVENT_STREAM)
        && matches!(rest.trim_ascii_start(), [] | [b';', ..])
}

/// Classifies `response` the way every stormguard layer does: from its head alone when the
/// classifier says so ([`Classify::needs_body`]: every success, every gRPC response), else from
/// the head and the first [`ERROR_BODY_LIMIT`] bytes of its body. The future resolves to the
/// response, whole again, and its [`Outcome`]; it resolves at once when no body is read.
pub fn classify_response<C: Classify, RB: Body>(
    classifier: &C,
    response: Response<RB>,
) -> ClassifyResponse<RB, C> {
    let (parts, body) = response.into_parts();
    let state = if classifier.needs_body(&parts) {
        State::Reading {
            parts: Some(parts),
            prefix: Prefix::new(Box::pin(body), ERROR_BODY_LIMIT),
            classifier: classifier.clone(),
        }
    } else {
        let outcome = classifier.classify_http(&parts, &[]);
        let response = Response::from_parts(parts, ResponseBody::new(body));
        State::Done {
            classified: Some((response, outcome)),
        }
    };
    ClassifyResponse { state }
}

/// The future of [`classify_response`].
pub struct ClassifyResponse<RB: Body, C> {
    state: State<RB, C>,
}

enum State<RB: Body, C> {
    Done {
        classified: Option<(Response<ResponseBody<RB>>, Outcome)>,
    },
    Reading {
        parts: Option<response::Parts>,
        prefix: Prefix<Pin<Box<RB>>>,
        classifier: C,
    },
}

// Nothing in it is pinned: the body being read sits in a `Box`.
impl<RB: Body, C> Unpin for ClassifyResponse<RB, C> {}

impl<RB: Body<Data = Bytes>, C: Classify> Future for ClassifyResponse<RB, C> {
    type Output = (Response<ResponseBody<RB>>, Outcome);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            State::Done { classified } => classified.take().map_or(Poll::Pending, Poll::Ready),
            State::Reading {
                parts,
                prefix,
                classifier,
            } => {
                let (read, tail, rest) = ready!(Pin::new(prefix).poll(cx));
                let Some(parts) = parts.take() else {
                    return Poll::Pending;
                };
                let seen = &read[..read.len().min(ERROR_BODY_LIMIT)];
                let outcome = classifier.classify_http(&parts, seen);
                let body = ResponseBody {
                    kind: Kind::Read {
                        body: PartialBody::new(read, tail, rest),
                    },
                    watch: None,
                    deadline: None,
                    timer: None,
                };
                Poll::Ready((Response::from_parts(parts, body), outcome))
            }
        }
    }
}

impl<RB: Body, C> fmt::Debug for ClassifyResponse<RB, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Done { .. } => "classified",
            State::Reading { .. } => "reading the error body",
        };
        f.debug_struct("ClassifyResponse")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::{LlmClassifier, Reason};
    use stormguard_test_kit::ScriptedBody;

    #[tokio::test]
    async fn one_frame_is_kept_without_a_copy_and_chunks_are_joined_in_order() {
        let chunk = Bytes::from_static(b"{\"model\":\"m\"}");
        let (read, tail, _) = Prefix::new(Full::new(chunk.clone()), 1024).await;
        assert!(matches!(tail, Tail::Ended));
        assert_eq!(read.as_ptr(), chunk.as_ptr());

        let (read, tail, _) = Prefix::new(ScriptedBody::chunks(["ab", "cd", "ef"]), 1024).await;
        assert!(matches!(tail, Tail::Ended));
        assert_eq!(read, Bytes::from_static(b"abcdef"));
    }

    #[tokio::test]
    async fn reading_stops_past_the_limit_and_the_rest_follows() {
        let body = Full::new(Bytes::from(vec![b'x'; 100]));
        let (read, tail, rest) = Prefix::new(body, 10).await;
        assert!(matches!(tail, Tail::Open));
        let whole = PartialBody::new(read, tail, rest);
        let bytes = whole.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes.len(), 100);
    }

    #[tokio::test]
    async fn partial_body_keeps_trailers_last_and_a_read_error_after_the_prefix() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = PartialBody::new(
            Bytes::from_static(b"abc"),
            Tail::Trailers(trailers.clone()),
            Full::new(Bytes::new()),
        );
        assert_eq!(body.size_hint().exact(), Some(3));
        let collected = body.collect().await.expect("infallible");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"abc"));

        let rest = http_body_util::Empty::<Bytes>::new().map_err(|never| match never {});
        let mut body =
            PartialBody::new(Bytes::from_static(b"partial"), Tail::Failed("reset"), rest);
        assert!(!body.is_end_stream());
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"partial")));
        let error = body.frame().await.expect("a frame").expect_err("the error");
        assert_eq!(error, "reset");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_failed_response_is_classified_from_its_body_and_handed_back_whole() {
        let quota = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let response = Response::builder()
            .status(429)
            .body(Full::new(Bytes::from_static(quota.as_bytes())))
            .expect("response");
        let (response, outcome) = classify_response(&LlmClassifier::default(), response).await;
        assert!(outcome.is_fatal());
        assert_eq!(outcome.reason(), Reason::QuotaExhausted);
        assert!(response.body().was_read());
        let body = response.into_body().collect().await.expect("infallible");
        assert_eq!(body.to_bytes(), Bytes::from_static(quota.as_bytes()));

        let ok = Response::new(Full::new(Bytes::from_static(b"fine")));
        let (ok, outcome) = classify_response(&LlmClassifier::default(), ok).await;
        assert!(outcome.is_success());
        assert!(!ok.body().was_read());
    }
    /// A boxed body is read through as it is, and a response body stays `Sync` (reqwest's
    /// `Body::wrap` asks it) whatever it holds.
    #[tokio::test]
    async fn a_boxed_body_is_read_through_and_the_response_body_stays_sync() {
        fn is_sync<T: Sync>(_: &T) {}
        let inner = Full::new(Bytes::from_static(b"data: hi\n\n")).map_err(BoxError::from);
        let body = ResponseBody::<Full<Bytes>>::boxed(inner);
        is_sync(&body);
        assert!(!body.is_end_stream());
        assert!(!body.was_read() && !body.is_local());
        let read = body.collect().await.map(|c| c.to_bytes());
        assert_eq!(read.ok().as_deref(), Some(&b"data: hi\n\n"[..]));
    }

    /// A watched body hands its bytes over once read to the end, and only then; a body longer
    /// than the cap hands nothing over; the reader gets every byte either way.
    #[tokio::test]
    async fn a_watched_body_hands_its_bytes_over_at_the_end() {
        use http_body_util::BodyExt;
        use std::sync::{Arc, Mutex};

        for (cap, expected) in [(64, Some(b"{\"usage\":1}".to_vec())), (4, None)] {
            let seen = Arc::new(Mutex::new(None));
            let sink = Arc::clone(&seen);
            let body = ResponseBody::new(Full::new(Bytes::from_static(b"{\"usage\":1}"))).watched(
                cap,
                move |bytes| {
                    *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes.to_vec());
                },
            );
            let read = body.collect().await.map(|c| c.to_bytes());
            assert_eq!(read.ok().as_deref(), Some(&b"{\"usage\":1}"[..]));
            assert_eq!(
                *seen.lock().unwrap_or_else(|e| e.into_inner()),
                expected,
                "cap {cap}"
            );
        }
    }

    #[test]
    fn an_event_stream_is_known_by_its_media_type_in_any_case_and_with_any_parameters() {
        let content_type = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(value),
            );
            headers
        };
        for value in [
            "text/event-stream",
            "Text/Event-Stream",
            "text/event-stream;charset=utf-8",
            "text/event-stream ; charset=utf-8",
            " text/event-stream",
        ] {
            assert!(is_event_stream(&content_type(value)), "{value}");
        }
        for value in [
            "application/json",
            "text/event",
            "text/event-streams",
            "text/event-stream x",
            "text/plain; profile=text/event-stream",
        ] {
            assert!(!is_event_stream(&content_type(value)), "{value}");
        }
        assert!(!is_event_stream(&HeaderMap::new()));
    }
}
