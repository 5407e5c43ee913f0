//! Buffering the head of an error body for classification, without taking it from the caller.
//!
//! LLM providers explain a failure in a small JSON body (`insufficient_quota`,
//! `context_length_exceeded`, ...), so a 4xx/5xx cannot be classified from its status alone. The
//! middleware reads the body's first chunks, up to
//! [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) bytes, and then hands the caller a
//! response whose body starts with those bytes and goes on with the rest of the original stream:
//! a body larger than the cap is never truncated and is never buffered whole.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use reqwest::{Body, Response, ResponseBuilderExt};
use stormguard_classify::ERROR_BODY_LIMIT;

/// The head of an error body, read up to the cap.
pub(crate) struct BufferedBody {
    /// Every byte read from the body, in order. May exceed the cap by less than one chunk.
    pub(crate) bytes: Bytes,
    /// Whether the body ended within what was read.
    pub(crate) complete: bool,
}

impl BufferedBody {
    /// The bytes a classifier sees: at most [`ERROR_BODY_LIMIT`].
    pub(crate) fn for_classifier(&self) -> &[u8] {
        let end = self.bytes.len().min(ERROR_BODY_LIMIT);
        &self.bytes[..end]
    }
}

/// Reads chunks of `response`'s body until the body ends or [`ERROR_BODY_LIMIT`] bytes are in.
///
/// A transport error while reading is returned as is: the caller would have met it too.
pub(crate) async fn read_head(response: &mut Response) -> reqwest::Result<BufferedBody> {
    let mut buffer: Vec<u8> = Vec::new();
    while buffer.len() < ERROR_BODY_LIMIT {
        match response.chunk().await? {
            Some(chunk) => buffer.extend_from_slice(&chunk),
            None => {
                return Ok(BufferedBody {
                    bytes: Bytes::from(buffer),
                    complete: true,
                });
            }
        }
    }
    Ok(BufferedBody {
        bytes: Bytes::from(buffer),
        complete: false,
    })
}

/// Rebuilds `response` (whose body has been partly read into `head`) so that its body yields
/// `head` first and then whatever the original body still holds.
pub(crate) fn restore(response: Response, head: BufferedBody) -> Response {
    let url = response.url().clone();
    let (mut parts, rest) = http::Response::<Body>::from(response).into_parts();
    // reqwest keeps the URL beside the head, not in it: put it back where `From` looks for it.
    let (url_parts, ()) = http::Response::builder()
        .url(url)
        .body(())
        .map(http::Response::into_parts)
        .unwrap_or_else(|_| http::Response::new(()).into_parts());
    parts.extensions.extend(url_parts.extensions);
    let body = if head.complete {
        Body::from(head.bytes)
    } else {
        Body::wrap(Prefixed {
            head: Some(head.bytes),
            rest,
        })
    };
    Response::from(http::Response::from_parts(parts, body))
}

pin_project! {
    /// A body that yields `head` and then the frames of `rest`.
    struct Prefixed<B> {
        head: Option<Bytes>,
        #[pin]
        rest: B,
    }
}

impl<B> HttpBody for Prefixed<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(head) = this.head.take()
            && !head.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.as_ref().is_none_or(Bytes::is_empty) && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |head| head.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(head));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(head));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn prefixed_body_yields_head_then_rest_in_order() {
        let body = Prefixed {
            head: Some(Bytes::from_static(b"hello, ")),
            rest: http_body_util::Full::new(Bytes::from_static(b"world")),
        };
        assert_eq!(body.size_hint().exact(), Some(12));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"hello, world");
    }

    #[tokio::test]
    async fn restored_response_keeps_status_headers_url_and_whole_body() {
        let big = vec![b'x'; ERROR_BODY_LIMIT * 2 + 7];
        let original = http::Response::builder()
            .status(503)
            .header("x-test", "kept")
            .url("http://127.0.0.1:9/v1/chat".parse().unwrap())
            .body(Body::wrap(http_body_util::Full::new(Bytes::from(
                big.clone(),
            ))))
            .unwrap();
        let mut response = Response::from(original);
        let head = read_head(&mut response).await.unwrap();
        assert!(head.for_classifier().len() <= ERROR_BODY_LIMIT);
        let restored = restore(response, head);
        assert_eq!(restored.status(), 503);
        assert_eq!(restored.headers()["x-test"], "kept");
        assert_eq!(restored.url().as_str(), "http://127.0.0.1:9/v1/chat");
        assert_eq!(restored.bytes().await.unwrap().len(), big.len());
    }

    #[tokio::test]
    async fn small_body_is_read_completely_and_handed_back() {
        let original = http::Response::builder()
            .status(429)
            .body(Body::from(r#"{"error":{"code":"insufficient_quota"}}"#))
            .unwrap();
        let mut response = Response::from(original);
        let head = read_head(&mut response).await.unwrap();
        assert!(head.complete);
        assert_eq!(
            head.for_classifier(),
            br#"{"error":{"code":"insufficient_quota"}}"#
        );
        let restored = restore(response, head);
        assert_eq!(
            restored.text().await.unwrap(),
            r#"{"error":{"code":"insufficient_quota"}}"#
        );
    }
}
