//! [`ResponseBody`]: the caller's response body, whole even when the engine read part of it.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::PartialBody;

pin_project! {
    /// The body of a response returned by [`Retry`](crate::Retry).
    ///
    /// Successful responses, and failures classified from their head alone (gRPC), keep the
    /// backend's body untouched inside: no buffering, no allocation. A failure whose body the
    /// classifier asked to read (the JSON error of an LLM API) holds the bytes read for
    /// classification (about [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) at
    /// most), then the unread rest, with trailers and a read error passed on where they occurred.
    /// Either way the caller reads the body exactly as the backend sent it.
    pub struct ResponseBody<RB>
    where
        RB: Body,
    {
        #[pin]
        kind: Kind<RB>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<RB>
    where
        RB: Body,
    {
        // The backend's body, never read by the engine.
        Inner {
            #[pin]
            body: RB,
        },
        // A body whose first bytes the engine read to classify the response. The rest sits in a
        // `Box` so that a body that is not `Unpin` can be read in place and then handed on; the
        // allocation happens only on this error path.
        Buffered {
            body: PartialBody<Pin<Box<RB>>>,
        },
    }
}

impl<RB: Body> ResponseBody<RB> {
    /// Wraps a body the engine did not read.
    pub fn new(body: RB) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn buffered(body: PartialBody<Pin<Box<RB>>>) -> Self {
        Self {
            kind: Kind::Buffered { body },
        }
    }

    /// Whether the engine read the start of this body (to classify an error response). Such a
    /// body still yields every byte.
    pub fn is_buffered(&self) -> bool {
        matches!(self.kind, Kind::Buffered { .. })
    }
}

impl<RB: Body<Data = Bytes>> Body for ResponseBody<RB> {
    type Data = Bytes;
    type Error = RB::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RB::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Buffered { body } => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Buffered { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Buffered { body } => body.size_hint(),
        }
    }
}

impl<RB: Body> fmt::Debug for ResponseBody<RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Buffered { body } => f.debug_tuple("ResponseBody::Buffered").field(body).finish(),
        }
    }
}

/// Where reading an error body for classification stopped.
pub(crate) enum Tail<E> {
    /// At the cap: the rest is still to be read.
    Open,
    /// At the end of the body.
    Ended,
    /// At the trailers, the body's last frame.
    Trailers(HeaderMap),
    /// At an error.
    Failed(E),
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[tokio::test]
    async fn buffered_body_yields_prefix_then_rest() {
        let mut rest = Box::pin(Full::new(Bytes::from_static(b"0123456789")));
        // Read the one frame as the engine would, then rebuild.
        let first = rest.frame().await.expect("a frame").expect("infallible");
        let prefix = first.into_data().expect("data");
        let body = ResponseBody::buffered(PartialBody::after_read(prefix, Tail::Ended, rest));
        assert!(body.is_buffered());
        assert_eq!(body.size_hint().exact(), Some(10));
        let bytes = body.collect().await.expect("infallible").to_bytes();
        assert_eq!(bytes, Bytes::from_static(b"0123456789"));
    }

    #[tokio::test]
    async fn buffered_body_keeps_trailers_last() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let rest = Box::pin(Full::new(Bytes::new()));
        let body = PartialBody::after_read(
            Bytes::from_static(b"abc"),
            Tail::Trailers(trailers.clone()),
            rest,
        );
        let collected = body.collect().await.expect("infallible");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"abc"));
    }

    #[tokio::test]
    async fn a_read_error_reaches_the_caller_after_the_prefix() {
        let rest = Box::pin(http_body_util::Empty::<Bytes>::new().map_err(|never| match never {}));
        let mut body: PartialBody<_> =
            PartialBody::after_read(Bytes::from_static(b"partial"), Tail::Failed("reset"), rest);
        assert!(!body.is_end_stream());
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"partial")));
        let error = body
            .frame()
            .await
            .expect("a frame")
            .expect_err("the read error");
        assert_eq!(error, "reset");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }
}
