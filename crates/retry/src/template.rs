//! What each attempt of a request is made from ([`Origin`], [`Template`]), and what it carries
//! ([`Stamp`]).

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request};
use stormguard_classify::body::{PartialBody, Tail};
use stormguard_deadline::clocks::{BodyShape, RequestShape, SharedBodyShape};
use stormguard_deadline::{Deadline, LlmDeadline, TokenEstimate, propagate};
use tokio::time::Instant;

use crate::body::ReplayBody;
use crate::config::SharedTimeout;
use crate::headers::stamp_attempt;

/// How a request's attempts are made.
// One per request, never moved once made: the template stays inline, the rarer head is boxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Origin {
    /// Rebuilt, each one, from the head and body buffered before the first.
    Replay(Template),
    /// Sent once, as it came (its body too large or endless to buffer); its head is kept only
    /// for a breaker's fallback, which answers from it.
    Once(Option<Box<Parts>>),
}

/// A request's head and buffered body, from which each attempt is rebuilt.
pub(crate) struct Template {
    pub(crate) head: Parts,
    pub(crate) body: Bytes,
    /// Request trailers, if the body had any (replayed after the bytes).
    pub(crate) trailers: Option<Box<HeaderMap>>,
    /// The request's weight in tokens for a rate limit, estimated once from the body.
    tokens: Option<u64>,
    /// What the request is for its clocks, read once from the body.
    shape: Option<RequestShape>,
    /// What a router above reads of the body, shared with it ([`crate::Route`]).
    pub(crate) body_shape: Option<SharedBodyShape>,
}

impl Origin {
    /// Whether this layer can send the request again.
    pub(crate) fn is_replay(&self) -> bool {
        matches!(self, Self::Replay(_))
    }

    /// The request's head as the caller sent it, if it was kept.
    pub(crate) fn head(&self) -> Option<&Parts> {
        match self {
            Self::Replay(template) => Some(&template.head),
            Self::Once(head) => head.as_deref(),
        }
    }

    /// What the request is for its clocks (streamed or not, its size), read once from its
    /// buffered body; a request sent once is sized at the estimate's maximum.
    pub(crate) fn shape(&mut self, estimate: &LlmDeadline) -> RequestShape {
        match self {
            Self::Replay(template) => *template.shape.get_or_insert_with(|| {
                let (uri, body) = (&template.head.uri, &template.body);
                let read = match &template.body_shape {
                    Some(shared) => shared.get_or_read(uri, body),
                    None => BodyShape::of_request(uri, body),
                };
                read.sized(estimate)
            }),
            Self::Once(_) => RequestShape::of(None, estimate),
        }
    }
}

/// The weight in tokens of a request sent once (its body was not read): an empty body's.
pub(crate) fn tokens_unread() -> u64 {
    TokenEstimate::of(&[]).total()
}

impl Template {
    /// The request's head as every attempt is made from it (what the guards read), and its weight
    /// in tokens, estimated from its buffered body the first time it is asked.
    pub(crate) fn head_and_tokens(&mut self) -> (&Parts, impl FnOnce() -> u64 + '_) {
        let Self {
            head, body, tokens, ..
        } = self;
        let tokens = move || *tokens.get_or_insert_with(|| TokenEstimate::of(body).total());
        (head, tokens)
    }

    pub(crate) fn new(head: Parts) -> Self {
        Self {
            head,
            body: Bytes::new(),
            trailers: None,
            tokens: None,
            shape: None,
            body_shape: None,
        }
    }

    /// An attempt: the head and the buffered body, as they were.
    pub(crate) fn request<B: ReplayBody>(&self) -> Request<B> {
        let body = match &self.trailers {
            None => B::from_bytes(self.body.clone()),
            Some(trailers) => B::from_partial(PartialBody::new(
                self.body.clone(),
                Tail::Trailers(HeaderMap::clone(trailers)),
                B::from_bytes(Bytes::new()),
            )),
        };
        Request::from_parts(self.head.clone(), body)
    }
}

/// The request's deadline: `timeout`'s for it from now (`body`: the buffered body, for a
/// timeout that reads it), written into its extensions, unless a tighter one is there already.
pub(crate) fn deadline_of(
    timeout: Option<&SharedTimeout>,
    head: &mut Parts,
    body: Option<&[u8]>,
    now: &mut Now,
) -> Option<Deadline> {
    if let Some(timeout) = timeout.and_then(|source| source.timeout(head, body)) {
        Deadline::after_from(now.get(), timeout).apply_to_extensions(&mut head.extensions);
    }
    Deadline::from_extensions(&head.extensions)
}

/// What the next attempt carries: its number (`sent` attempts went before it) and, when the
/// layer propagates it, the time left until the deadline, minus the layer's margin.
pub(crate) struct Stamp {
    pub(crate) sent: u32,
    pub(crate) grpc: bool,
    pub(crate) time_left: Option<(Deadline, std::time::Duration)>,
}

impl Stamp {
    pub(crate) fn write(&self, headers: &mut HeaderMap, now: &mut Now) {
        stamp_attempt(headers, self.sent, self.grpc);
        if let Some((deadline, margin)) = self.time_left {
            let left = deadline.instant().saturating_duration_since(now.get());
            propagate::stamp_headers(headers, left.saturating_sub(margin));
        }
    }
}

/// The time of one step of a request, read from the clock at most once, and only if the step
/// needs it (a request with no deadline never reads it to be sent).
#[derive(Default)]
pub(crate) struct Now(Option<Instant>);

impl Now {
    pub(crate) fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}
