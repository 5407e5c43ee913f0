//! [`Backend`]: one provider of a failover, with its own guards, and the [`Adapter`] that rewrites
//! a request for it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_breaker::{BreakerConfig, CircuitBreaker, State};
use stormguard_concurrency::ConcurrencyLimit;
use stormguard_deadline::clocks::AttemptClocks;
use stormguard_rate_limit::RateLimit;

/// One provider (or model, or API key) of a [`Failover`](crate::Failover): its name, how a
/// request is rewritten for it, and its own guards.
///
/// Each backend has its own circuit breaker, which decides when it is left for the next: by
/// default ([`Backend::default_breaker`]) one that also opens after 3 health failures in a row and
/// probes again after 1 s, doubling to at most 3 s. Its throttle is its own too (a fresh one
/// with the failover's layer's settings, unless set), and so is its rate limit, if any.
#[derive(Clone)]
pub struct Backend {
    name: Arc<str>,
    mark: HeaderValue,
    adapter: Adapter,
    breaker: CircuitBreaker,
    throttle: Option<AdaptiveThrottle>,
    rate_limit: Option<RateLimit>,
    concurrency: Option<ConcurrencyLimit>,
    clocks: Option<AttemptClocks>,
    takes_prefill: bool,
    weight: f64,
    // Shared by every clone: refused the failover's credentials (401, 403).
    set_aside: Arc<AtomicBool>,
}

impl Backend {
    /// Health failures in a row after which a backend is left for the next: 3, the threshold
    /// LLM gateways use so that one blip never moves traffic (and never doubles its cost).
    pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 3;

    /// Longest wait between probes of a backend that failed: 3 s (from 1 s, doubling), so that
    /// traffic is back on a recovered primary within a few seconds.
    pub const DEFAULT_MAX_OPEN_WAIT: Duration = Duration::from_secs(3);

    /// How long a backend that answered 429 without a `Retry-After` (or any reset header) is
    /// passed over for the other backends free for a request
    /// ([`Failover::with_hand_off_429`](crate::Failover::with_hand_off_429)): 1 s. Such a 429
    /// says nothing of when the key has room again; OpenAI meters its per-minute limits over
    /// periods as short as a second ("60,000 requests/minute may be enforced as 1,000
    /// requests/second", <https://platform.openai.com/docs/guides/rate-limits>), so a second is
    /// the shortest wait after which the key may have room, and short enough that a key that
    /// does is not left idle for long.
    pub const DEFAULT_429_COOLDOWN: Duration = Duration::from_secs(1);

    /// A backend named `name` (its mark on the responses it answers: printable ASCII; other
    /// characters are replaced by `_`), sent the request as it comes, with the default breaker.
    pub fn new(name: &str) -> Self {
        let printable: String = name
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .collect();
        let mark =
            HeaderValue::from_str(&printable).unwrap_or_else(|_| HeaderValue::from_static("_"));
        Self {
            name: Arc::from(name),
            mark,
            adapter: Adapter::default(),
            breaker: Self::default_breaker(),
            throttle: None,
            rate_limit: None,
            concurrency: None,
            clocks: None,
            takes_prefill: true,
            weight: 1.0,
            set_aside: Arc::default(),
        }
    }

    /// The breaker a backend gets unless one is set: the defaults of [`BreakerConfig`], and
    /// also open after [`DEFAULT_CONSECUTIVE_FAILURES`](Self::DEFAULT_CONSECUTIVE_FAILURES) in a
    /// row, probing again within [`DEFAULT_MAX_OPEN_WAIT`](Self::DEFAULT_MAX_OPEN_WAIT).
    pub fn default_breaker() -> CircuitBreaker {
        CircuitBreaker::new(
            BreakerConfig::default()
                .with_consecutive_failures(Some(Self::DEFAULT_CONSECUTIVE_FAILURES))
                .with_open_wait(Duration::from_secs(1), Self::DEFAULT_MAX_OPEN_WAIT),
        )
    }

    /// Rewrite each request for this backend with `adapter`.
    #[must_use]
    pub fn with_adapter(mut self, adapter: Adapter) -> Self {
        self.adapter = adapter;
        self
    }

    /// Guard this backend with `breaker` (shared with whatever else calls the same backend).
    #[must_use]
    pub fn with_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Throttle this backend's attempts with `throttle`.
    #[must_use]
    pub fn with_throttle(mut self, throttle: AdaptiveThrottle) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// Time this backend's attempts with `clocks` (else the failover gives it clocks of its own
    /// with the layer's settings, if the layer has clocks): what one backend's answers teach
    /// says nothing of another's.
    #[must_use]
    pub fn with_clocks(mut self, clocks: AttemptClocks) -> Self {
        self.clocks = Some(clocks);
        self
    }

    /// Its per-attempt clocks, if set (else the failover gives it clocks of its own when it is
    /// built).
    pub fn clocks(&self) -> Option<&AttemptClocks> {
        self.clocks.as_ref()
    }

    /// This backend takes no assistant prefill (some OpenAI-compatible servers answer one with
    /// 400, or as a new turn): a stream cut after content is never continued here, but by
    /// another backend, or it ends with its in-band error. Without it, a backend is found out by
    /// its first 400 to a continuation.
    #[must_use]
    pub fn without_prefill(mut self) -> Self {
        self.takes_prefill = false;
        self
    }

    /// Whether this backend is asked to continue streams (see
    /// [`without_prefill`](Self::without_prefill)).
    pub fn takes_prefill(&self) -> bool {
        self.takes_prefill
    }

    pub(crate) fn set_clocks(&mut self, clocks: AttemptClocks) {
        self.clocks = Some(clocks);
    }

    /// Give this backend `weight` times a backend of weight 1's share of its rank's traffic
    /// (default 1; see [`Failover::with_rank`](crate::Failover::with_rank)): its cost in the
    /// balancer is divided by it. A weight that is not a positive number counts as 0: the
    /// backend takes its rank's requests only when no other of the rank can.
    #[must_use]
    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = if weight > 0.0 && weight.is_finite() {
            weight
        } else {
            0.0
        };
        self
    }

    /// Its weight in its rank.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// Pace this backend's attempts with `limit` (its quota: a provider's, a key's).
    #[must_use]
    pub fn with_rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Keep this backend's attempts in flight under `limit`, an adaptive concurrency limit
    /// learned from its overload answers (shared with whatever else calls the same backend; see
    /// [`ClientLayer::with_concurrency`](stormguard_retry::ClientLayer::with_concurrency)). A
    /// request the full limit refuses after its wait goes to the next backend.
    #[must_use]
    pub fn with_concurrency(mut self, limit: ConcurrencyLimit) -> Self {
        self.concurrency = Some(limit);
        self
    }

    /// Its concurrency limit, if any.
    pub fn concurrency(&self) -> Option<&ConcurrencyLimit> {
        self.concurrency.as_ref()
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How requests are rewritten for it.
    pub fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Its circuit breaker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Its throttle, if set (else the failover gives it one of its own when it is built).
    pub fn throttle(&self) -> Option<&AdaptiveThrottle> {
        self.throttle.as_ref()
    }

    /// Its rate limit, if any.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.rate_limit.as_ref()
    }

    pub(crate) fn mark(&self) -> &HeaderValue {
        &self.mark
    }

    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    pub(crate) fn set_throttle(&mut self, throttle: AdaptiveThrottle) {
        self.throttle = Some(throttle);
    }

    /// Whether the backend was set aside: it answered 401 or 403, so the credentials the
    /// failover sends it are refused (a revoked or wrong key, a model the key may not use).
    /// A backend set aside takes no request again from any clone of its failover; only a new
    /// backend (a new config) brings it back.
    pub fn is_set_aside(&self) -> bool {
        self.set_aside.load(Ordering::Relaxed)
    }

    /// Sets the backend aside (see [`is_set_aside`](Self::is_set_aside)): `true` the first
    /// time, so that it is logged once.
    pub(crate) fn set_aside(&self) -> bool {
        !self.set_aside.swap(true, Ordering::Relaxed)
    }

    /// Whether the backend may be tried: it is not set aside, its breaker is not open
    /// (half-open, a probe may go), and its throttle, if any, drops less than half of what it
    /// gets.
    pub fn is_healthy(&self) -> bool {
        !self.is_set_aside()
            && self.breaker.state() != State::Open
            && self
                .throttle
                .as_ref()
                .is_none_or(|throttle| throttle.drops_less_than(0.5))
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("adapter", &self.adapter)
            .field("breaker", &self.breaker.state())
            .finish()
    }
}

type HeadFn = dyn Fn(&mut Parts) + Send + Sync;

/// How a request is rewritten for a backend: another origin (scheme and host), other headers
/// (a key), other body fields (the model's name, its parameters), or any change to the head.
///
/// ```
/// use stormguard_failover::Adapter;
///
/// let azure = Adapter::new()
///     .with_origin("http://127.0.0.1:8081".parse().unwrap())
///     .with_header(http::HeaderName::from_static("api-key"), http::HeaderValue::from_static("k2"))
///     .with_model("gpt-4o-mini");
/// # let _ = azure;
/// ```
#[derive(Clone, Default)]
pub struct Adapter {
    origin: Option<Uri>,
    headers: Vec<(HeaderName, HeaderValue)>,
    fields: Vec<(String, serde_json::Value)>,
    head: Option<Arc<HeadFn>>,
}

impl Adapter {
    /// An adapter that changes nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Send to `origin`'s scheme and host (its path is ignored: the request keeps its own).
    #[must_use]
    pub fn with_origin(mut self, origin: Uri) -> Self {
        self.origin = Some(origin);
        self
    }

    /// Set the header `name` to `value` (replacing it).
    #[must_use]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Set the JSON body's `model` to `model`.
    #[must_use]
    pub fn with_model(self, model: &str) -> Self {
        self.with_body_field("model", serde_json::Value::from(model))
    }

    /// Set the JSON body's top-level field `name` to `value` (a body that is not a JSON object
    /// is sent as it is).
    #[must_use]
    pub fn with_body_field(mut self, name: &str, value: serde_json::Value) -> Self {
        self.fields.push((name.to_owned(), value));
        self
    }

    /// Change the head with `change`, after the other rewrites.
    #[must_use]
    pub fn with_head<F>(mut self, change: F) -> Self
    where
        F: Fn(&mut Parts) + Send + Sync + 'static,
    {
        self.head = Some(Arc::new(change));
        self
    }

    /// Whether the adapter changes nothing.
    pub fn is_identity(&self) -> bool {
        self.origin.is_none()
            && self.headers.is_empty()
            && self.fields.is_empty()
            && self.head.is_none()
    }

    /// Rewrites the head and the body of a request for the backend.
    pub fn apply(&self, head: &mut Parts, body: &Bytes) -> Bytes {
        let body = self.rewrite_body(body);
        if head.headers.contains_key(CONTENT_LENGTH) {
            head.headers
                .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        self.apply_head(head);
        body
    }

    /// Whether the body is sent as it came (no field of it is rewritten).
    pub fn keeps_body(&self) -> bool {
        self.fields.is_empty()
    }

    /// Rewrites the head alone, for a body sent as it streams (its fields stay as they are).
    pub fn apply_head(&self, head: &mut Parts) {
        if let Some(origin) = &self.origin
            && let (Some(scheme), Some(authority)) = (origin.scheme(), origin.authority())
        {
            let mut parts = head.uri.clone().into_parts();
            parts.scheme = Some(scheme.clone());
            parts.authority = Some(authority.clone());
            if parts.path_and_query.is_none() {
                parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
            }
            if let Ok(uri) = Uri::from_parts(parts) {
                head.uri = uri;
                head.headers.remove(http::header::HOST);
            }
        }
        for (name, value) in &self.headers {
            head.headers.insert(name.clone(), value.clone());
        }
        if let Some(change) = &self.head {
            change(head);
        }
    }

    fn rewrite_body(&self, body: &Bytes) -> Bytes {
        if self.fields.is_empty() {
            return body.clone();
        }
        let Ok(mut object) =
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
        else {
            return body.clone();
        };
        for (name, value) in &self.fields {
            object.insert(name.clone(), value.clone());
        }
        serde_json::to_vec(&object).map_or_else(|_| body.clone(), Bytes::from)
    }
}

impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adapter")
            .field("origin", &self.origin)
            .field("headers", &self.headers.len())
            .field("fields", &self.fields)
            .field("head", &self.head.is_some())
            .finish()
    }
}
