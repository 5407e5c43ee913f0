//! [`Fallback`]: the caller's own answer while the breaker refuses.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use http_body::Body;
use stormguard_classify::LocalAnswer;
use stormguard_classify::body::ResponseBody;

use crate::Rejected;

/// The function behind a [`Fallback`].
type AnswerFn = dyn Fn(&Parts, &Rejected) -> Response<Bytes> + Send + Sync;

/// An answer of the caller's for a request the breaker refused or cut: a cached reply, a "try
/// again later" message in the API's own format, a smaller local model's canned answer.
///
/// The function gets the request's head and the refusal ([`BreakerOpen`](crate::BreakerOpen),
/// with its `retry_after`, or [`BulkheadFull`](crate::BulkheadFull)), and returns the whole
/// response. It runs inline, so it must be quick and must not block: a fallback that needs I/O
/// (another provider) is a failover, not a fallback. The response reaches the caller with a
/// [`LocalAnswer`](stormguard_classify::LocalAnswer) in its extensions and a body that
/// [`ResponseBody::is_local`](stormguard_classify::body::ResponseBody::is_local) recognises,
/// and is never counted as an answer of the backend.
///
/// ```
/// use bytes::Bytes;
/// use stormguard_breaker::{Fallback, Rejected};
///
/// let fallback = Fallback::new(|_head, rejected: &Rejected| {
///     http::Response::builder()
///         .status(200)
///         .header("content-type", "application/json")
///         .body(Bytes::from_static(br#"{"choices":[],"degraded":true}"#))
///         .unwrap_or_default()
/// });
/// # let _ = fallback;
/// ```
#[derive(Clone)]
pub struct Fallback {
    answer: Arc<AnswerFn>,
}

impl Fallback {
    /// A fallback that answers with `answer`.
    pub fn new<F>(answer: F) -> Self
    where
        F: Fn(&Parts, &Rejected) -> Response<Bytes> + Send + Sync + 'static,
    {
        Self {
            answer: Arc::new(answer),
        }
    }

    /// The fallback's answer to the request with head `head`, refused with `rejected`.
    pub fn answer<RB: Body>(
        &self,
        head: &Parts,
        rejected: &Rejected,
    ) -> Response<ResponseBody<RB>> {
        let (mut parts, body) = (self.answer)(head, rejected).into_parts();
        parts
            .extensions
            .insert(LocalAnswer::new(rejected.outcome()));
        Response::from_parts(parts, ResponseBody::local(body))
    }
}

impl fmt::Debug for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fallback")
    }
}
