//! What a failover adds to what it hands back: the backend that answered ([`Answered`]), the
//! [`Cure`]s of errors another backend can fix, and the caller's [`Degraded`] answer.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response};
use http_body::Body;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::headers::{X_STORMGUARD_BACKEND, X_STORMGUARD_DEGRADED};
use stormguard_classify::{LocalAnswer, Outcome, Reason};

/// In the extensions of every response a backend answered (success or failure), beside the
/// `x-stormguard-backend` header: which backend it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    backend: Arc<str>,
}

impl Answered {
    /// The name of the backend that answered.
    pub fn backend(&self) -> &str {
        &self.backend
    }
}

/// Marks `response` as answered by the backend `name`.
pub(crate) fn mark<B>(response: &mut Response<B>, name: &Arc<str>, header: &HeaderValue) {
    response
        .headers_mut()
        .insert(X_STORMGUARD_BACKEND, header.clone());
    response.extensions_mut().insert(Answered {
        backend: Arc::clone(name),
    });
}

/// An error that another backend can cure: the request goes straight to the backend configured
/// for it ([`Failover::with_cure`](crate::Failover::with_cure)) instead of failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cure {
    /// The prompt does not fit the model's context: a model with a larger one.
    ContextTooLong,
    /// A content policy refused the request or its answer: another provider.
    ContentFiltered,
    /// The key's quota or spend limit is exhausted: another key, or another provider.
    QuotaExhausted,
}

impl Cure {
    /// The cure for a failure, if it has one.
    pub fn of(outcome: &Outcome) -> Option<Self> {
        match outcome.reason() {
            Reason::ContextTooLong => Some(Self::ContextTooLong),
            Reason::ContentFiltered => Some(Self::ContentFiltered),
            Reason::QuotaExhausted => Some(Self::QuotaExhausted),
            _ => None,
        }
    }
}

type AnswerFn = dyn Fn(&Parts, &Outcome) -> Response<Bytes> + Send + Sync;

/// The caller's answer when no backend can answer: a cached or rule-based reply, or a polite
/// "busy, retry later". It gets the request's head and why no backend answered (the last
/// failure's outcome, [`Reason::NoBackend`] when none could be tried, or
/// [`Reason::DeadlineExceeded`]), and its response is marked as degraded: a [`LocalAnswer`](stormguard_classify::LocalAnswer)
/// in its extensions and `x-stormguard-degraded: true`.
///
/// ```
/// use bytes::Bytes;
/// use stormguard_failover::Degraded;
///
/// let busy = Degraded::new(|_head, _why| {
///     http::Response::builder()
///         .status(200)
///         .body(Bytes::from_static(br#"{"choices":[{"message":{"content":"Busy, try again."}}]}"#))
///         .unwrap_or_default()
/// });
/// # let _ = busy;
/// ```
#[derive(Clone)]
pub struct Degraded {
    answer: Arc<AnswerFn>,
}

impl Degraded {
    /// A degraded answer made by `answer`.
    pub fn new<F>(answer: F) -> Self
    where
        F: Fn(&Parts, &Outcome) -> Response<Bytes> + Send + Sync + 'static,
    {
        Self {
            answer: Arc::new(answer),
        }
    }

    /// The answer to the request with head `head`, which no backend answered because of `why`.
    pub fn answer<RB: Body>(&self, head: &Parts, why: &Outcome) -> Response<ResponseBody<RB>> {
        let (mut parts, body) = (self.answer)(head, why).into_parts();
        parts.extensions.insert(LocalAnswer::new(*why));
        parts
            .headers
            .insert(X_STORMGUARD_DEGRADED, HeaderValue::from_static("true"));
        Response::from_parts(parts, ResponseBody::local(body))
    }
}

impl fmt::Debug for Degraded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Degraded")
    }
}

/// A request no backend could take: every one was unhealthy or refused it locally, or the time
/// left could not fit another. Its outcome is fatal, not accepted, [`Reason::NoBackend`], with
/// the soonest time a backend may take requests again as its hint, which `error_response`
/// answers with 503 and `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoBackend {
    pub(crate) tried: usize,
}

impl NoBackend {
    /// Backends that were asked (and refused) before it gave up.
    pub fn tried(&self) -> usize {
        self.tried
    }
}

impl fmt::Display for NoBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no backend could take the request ({} asked, every one unhealthy or refusing)",
            self.tried
        )
    }
}

impl std::error::Error for NoBackend {}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for NoBackend {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}
