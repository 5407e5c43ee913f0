//! Request bodies the engine can send again: [`ReplayBody`].

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use http_body_util::Full;
use stormguard_classify::body::PartialBody;

/// A request body type the engine can rebuild: from bytes it buffered (to send a request again),
/// or from a prefix it already read plus the unread rest (to send a large or endless body once,
/// untouched past what was read).
///
/// The engine reads a body before the first attempt when its size allows a replay (see
/// [`ClientLayer::with_max_replay_body`](crate::ClientLayer::with_max_replay_body)): every
/// attempt then gets `from_bytes` of the same buffered bytes (a reference-count bump, no copy).
/// When a body of unknown length turns out larger than the cap, the engine stops reading and
/// sends it once as [`from_partial`](Self::from_partial): the prefix it read, then the rest as it
/// streams.
///
/// `Unpin` lets the engine read a prefix and hand the rest on without boxing it; the bodies of
/// hyper, axum, tonic and reqwest are all `Unpin`.
///
/// Implemented for [`Full<Bytes>`] (hyper-util client), `axum::body::Body` (feature `axum`) and
/// `tonic::body::Body` (feature `tonic`); `stormguard-reqwest` implements it for its request body.
pub trait ReplayBody: Body<Data = Bytes> + Unpin + Sized {
    /// A body that yields `bytes` and ends.
    fn from_bytes(bytes: Bytes) -> Self;

    /// A body that yields the already-read prefix of `partial` (and its trailers or read error,
    /// if reading reached them), then whatever the unread rest still holds.
    fn from_partial(partial: PartialBody<Self>) -> Self;
}

/// `Full<Bytes>` reports its exact size, and the engine buffers any body whose exact size fits
/// the cap and sends bigger ones untouched, so it never reads part of a `Full`. The impl is sound
/// all the same: a `Full` yields its one frame without waiting, so `from_partial` reads whatever
/// is left at once and joins it to the prefix.
impl ReplayBody for Full<Bytes> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        let (prefix, rest) = partial.into_parts();
        let Some(mut rest) = rest else {
            return Full::new(prefix);
        };
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
    use stormguard_classify::body::Tail;

    use super::*;

    #[tokio::test]
    async fn full_rebuilt_from_a_partial_read_keeps_every_byte() {
        // Untouched rest: prefix then the rest's one frame.
        let rebuilt = Full::from_partial(PartialBody::new(
            Bytes::from_static(b"{\"a\":"),
            Tail::Open,
            Full::new(Bytes::from_static(b"1}")),
        ));
        let bytes = rebuilt.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes, Bytes::from_static(b"{\"a\":1}"));

        // Nothing read yet: the rest as it was.
        let rebuilt = Full::from_partial(PartialBody::new(
            Bytes::new(),
            Tail::Open,
            Full::new(Bytes::from_static(b"xyz")),
        ));
        assert_eq!(rebuilt.size_hint().exact(), Some(3));

        // Reading reached the end: just the prefix.
        let rebuilt = Full::from_partial(PartialBody::new(
            Bytes::from_static(b"xyz"),
            Tail::Ended,
            Full::new(Bytes::new()),
        ));
        let bytes = rebuilt.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes, Bytes::from_static(b"xyz"));
    }
}
