//! Buffering the head of an error body for classification, without taking it from the caller.
//!
//! LLM providers explain a failure in a small JSON body (`insufficient_quota`,
//! `context_length_exceeded`, ...), so a 4xx/5xx cannot be classified from its status alone. The
//! middleware reads the body's first chunks, up to
//! [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) bytes, and then hands the caller a
//! response whose body starts with those bytes and goes on with the rest of the original stream:
//! a body larger than the cap is never truncated and is never buffered whole.

use bytes::Bytes;
use reqwest::{Body, Response, ResponseBuilderExt};
use stormguard_classify::ERROR_BODY_LIMIT;
use stormguard_retry::PartialBody;

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
        Body::wrap(PartialBody::new(head.bytes, None, rest))
    };
    Response::from(http::Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
