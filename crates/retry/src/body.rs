//! Request bodies the engine can send again: [`ReplayBody`] and [`PartialBody`].

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::Tail;

/// A request body type the retry engine can rebuild: from bytes it buffered (to send a request
/// again), or from a prefix it already read plus the unread rest (to send a large or streaming
/// body once, untouched past what was read).
///
/// The engine reads a body before the first attempt when its size allows a replay (see
/// [`RetryLayer::max_replay_body`](crate::RetryLayer::max_replay_body)): every attempt then gets
/// `from_bytes` of the same buffered bytes (a reference-count bump, no copy). When a body of
/// unknown length turns out larger than the cap, the engine stops reading and sends it once as
/// [`from_partial`](Self::from_partial): the prefix it read, then the rest as it streams.
///
/// `Unpin` lets the engine read a prefix and hand the rest on without boxing it; the bodies of
/// hyper, axum and tonic are all `Unpin`.
///
/// Implemented for [`Full<Bytes>`] (hyper-util client), `axum::body::Body` (feature `axum`) and
/// `tonic::body::Body` (feature `tonic`).
pub trait ReplayBody: Body<Data = Bytes> + Unpin + Sized {
    /// A body that yields `bytes` and ends.
    fn from_bytes(bytes: Bytes) -> Self;

    /// A body that yields the already-read `partial` prefix (and its trailers, if reading reached
    /// them), then whatever the unread rest still holds.
    fn from_partial(partial: PartialBody<Self>) -> Self;
}

pin_project! {
    /// A body whose first bytes were already read: yields those bytes as one data frame, then
    /// what reading met after them (the trailers, which end the body, or a read error), otherwise
    /// every frame of the unread rest.
    ///
    /// The engine hands one to [`ReplayBody::from_partial`] for a request body too large to
    /// replay, and keeps one inside [`ResponseBody`](crate::ResponseBody) for an error response
    /// whose start it read to classify it.
    pub struct PartialBody<B>
    where
        B: Body,
    {
        prefix: Option<Bytes>,
        trailers: Option<HeaderMap>,
        // A read error met while reading the prefix, handed on after it.
        error: Option<B::Error>,
        // Reading already reached the end of the rest: never poll it again.
        rest_done: bool,
        #[pin]
        rest: B,
    }
}

impl<B: Body> PartialBody<B> {
    /// The bytes already read, the trailers if reading reached them (then `rest` must have
    /// ended, and it is never polled), and the unread rest.
    pub fn new(prefix: Bytes, trailers: Option<HeaderMap>, rest: B) -> Self {
        let rest_done = trailers.is_some();
        Self {
            prefix: (!prefix.is_empty()).then_some(prefix),
            trailers,
            error: None,
            rest_done,
            rest,
        }
    }

    /// `prefix` was read from `rest`, and reading stopped at `end`: at a cap (the rest is still
    /// to be read), at the end of the body, at its trailers or at an error.
    pub(crate) fn after_read(prefix: Bytes, end: Tail<B::Error>, rest: B) -> Self {
        let (trailers, error, rest_done) = match end {
            Tail::Open => (None, None, false),
            Tail::Ended => (None, None, true),
            Tail::Trailers(trailers) => (Some(trailers), None, true),
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

    /// Takes the body apart again: the prefix not yet yielded (empty once it was), the trailers
    /// not yet yielded, and the rest. (Bodies built by [`new`](Self::new) hold no read error.)
    pub fn into_parts(self) -> (Bytes, Option<HeaderMap>, B) {
        (self.prefix.unwrap_or_default(), self.trailers, self.rest)
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
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
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

/// `Full<Bytes>` reports its exact size, and the engine buffers any body whose exact size fits
/// the cap and sends bigger ones untouched, so it never reads part of a `Full`. The impl is sound
/// all the same: a `Full` yields its one frame without waiting, so `from_partial` reads whatever
/// is left at once and joins it to the prefix. Trailers cannot occur (a `Full` has none).
impl ReplayBody for Full<Bytes> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        let (prefix, _trailers, mut rest) = partial.into_parts();
        if rest.is_end_stream() {
            return Full::new(prefix);
        }
        if prefix.is_empty() {
            return rest;
        }
        let mut joined = BytesMut::from(prefix);
        let mut cx = Context::from_waker(Waker::noop());
        // `Full::poll_frame` is always ready: its one frame, then the end.
        while let Poll::Ready(Some(frame)) = Pin::new(&mut rest).poll_frame(&mut cx) {
            let frame: Result<Frame<Bytes>, Infallible> = frame;
            let Ok(frame) = frame;
            if let Ok(data) = frame.into_data() {
                joined.extend_from_slice(&data);
            }
        }
        Full::new(joined.freeze())
    }
}

#[cfg(feature = "axum")]
impl ReplayBody for axum::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        axum::body::Body::new(partial)
    }
}

#[cfg(feature = "tonic")]
impl ReplayBody for tonic::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        tonic::body::Body::new(Full::new(bytes))
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        tonic::body::Body::new(partial)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn partial_body_yields_prefix_then_rest() {
        let body = PartialBody::new(
            Bytes::from_static(b"hello "),
            None,
            Full::new(Bytes::from_static(b"world")),
        );
        assert_eq!(body.size_hint().exact(), Some(11));
        let collected = body.collect().await.expect("infallible").to_bytes();
        assert_eq!(collected, Bytes::from_static(b"hello world"));
    }

    #[tokio::test]
    async fn partial_body_ends_with_its_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        let rest = Full::new(Bytes::new());
        let body = PartialBody::new(Bytes::from_static(b"data"), Some(trailers.clone()), rest);
        assert_eq!(body.size_hint().exact(), Some(4));
        let collected = body.collect().await.expect("infallible");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"data"));
    }

    #[tokio::test]
    async fn full_rebuilt_from_a_partial_read_keeps_every_byte() {
        // Untouched rest: prefix then the rest's one frame.
        let rebuilt = Full::from_partial(PartialBody::new(
            Bytes::from_static(b"{\"a\":"),
            None,
            Full::new(Bytes::from_static(b"1}")),
        ));
        let bytes = rebuilt.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes, Bytes::from_static(b"{\"a\":1}"));

        // Nothing read yet: the rest as it was.
        let rebuilt = Full::from_partial(PartialBody::new(
            Bytes::new(),
            None,
            Full::new(Bytes::from_static(b"xyz")),
        ));
        assert_eq!(rebuilt.size_hint().exact(), Some(3));

        // Rest already drained: just the prefix.
        let mut drained = Full::new(Bytes::from_static(b"xyz"));
        let _ = drained.frame().await;
        let rebuilt =
            Full::from_partial(PartialBody::new(Bytes::from_static(b"xyz"), None, drained));
        let bytes = rebuilt.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes, Bytes::from_static(b"xyz"));
    }
}
