//! [`Failover`]: the layer and its settings, and [`FailoverService`], what it makes of a service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::headers::IDEMPOTENCY_KEY;
use stormguard_classify::{BoxError, Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_numbers::random::RandomSource;
use stormguard_retry::{ClientLayer, Continuing, Error, Hedging, NotContinuing, ReplayBody};
use stormguard_stream::{AnswerBody, AnswerFuture, Continuer, is_event_stream};
use tower_layer::Layer;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::shared::{Engine, Shared, StickyKey, ranges};
use crate::{Backend, Cooldowns, Cure, Degraded};

/// Failover over an ordered list of backends, each request under one deadline and one retry
/// budget: see the [crate docs](crate).
///
/// Made from the [`ClientLayer`] whose policy every backend follows (deadline, attempts,
/// backoff, classification, and its retry budget, which all backends share); each backend adds
/// its own breaker, throttle and rate limit. `K` says whether the event streams a backend hands
/// back are continued through the failover (see [`without_continuation`](Self::without_continuation)).
pub struct Failover<C = LlmClassifier, Bk = FullJitter, K = Continuing> {
    layer: ClientLayer<C, Bk, K>,
    backends: Vec<Backend>,
    /// Each backend's rank (as many as backends, in order, never decreasing).
    ranks: Vec<usize>,
    cures: Vec<(Cure, Arc<str>)>,
    degraded: Option<Degraded>,
    hedging: Option<Hedging>,
    sticky: Option<StickyKey>,
    seed: Option<u64>,
    cooldowns: Option<Cooldowns>,
    hand_off_429: bool,
}

impl<C: Classify, Bk: Backoff, K> Failover<C, Bk, K> {
    /// A failover with no backend yet, whose backends follow `layer`'s policy and share its
    /// retry budget; it hedges as `layer` does (see [`with_hedging`](Self::with_hedging)), and
    /// continues streams if `layer` does (through its next backend that takes a prefill, the one
    /// that served the stream only when none other can).
    pub fn new(layer: ClientLayer<C, Bk, K>) -> Self {
        let hedging = layer.hedging().copied();
        Self {
            layer,
            backends: Vec::new(),
            ranks: Vec::new(),
            cures: Vec::new(),
            degraded: None,
            hedging,
            sticky: None,
            seed: None,
            cooldowns: None,
            hand_off_429: false,
        }
    }

    /// Hedge requests across the backends as `hedging` says (as the layer the failover is made
    /// from does: by default, only while a backend's clocks are cold): when a backend has produced no content (its answer's
    /// head; a stream, its first content event) after the hedge's delay, fixed or that backend's
    /// learned percentile of time to first content, a second hop goes to the next healthy
    /// backend (the same one when there is no other), without cancelling the first; the first
    /// to answer is handed back and the other cancelled. Each hedge draws on the shared retry
    /// budget (a spent budget sends none) and passes its backend's guards. The failover hedges
    /// in place of its backends' engines, which never hedge on their own.
    #[must_use]
    pub fn with_hedging(mut self, hedging: Hedging) -> Self {
        self.hedging = Some(hedging);
        self
    }

    /// No hedging.
    #[must_use]
    pub fn without_hedging(mut self) -> Self {
        self.hedging = None;
        self
    }

    /// Add `backend` after those already added, as a rank of its own: the first healthy backend
    /// in this order takes each request. A backend without a throttle gets its own here, with
    /// the layer's settings (if the layer has a throttle), shared by every service this failover
    /// makes.
    #[must_use]
    pub fn with_backend(self, backend: Backend) -> Self {
        self.with_rank([backend])
    }

    /// Add `backends` after those already added, as one rank: they share its traffic (several
    /// keys, regions or deployments of one model), each request going to the one the balancer
    /// picks among those of the rank that can take it (healthy, not tried yet), and to the next
    /// rank when none can. The balancer weighs each backend's latency, its hops in flight, its
    /// [weight](Backend::with_weight) and its rate limit's headroom, and picks the cheaper of two
    /// drawn at random (see `balance`): a deployment near its quota, or slow, gets less. Each
    /// backend gets a throttle and clocks of its own as in [`with_backend`](Self::with_backend).
    #[must_use]
    pub fn with_rank(mut self, backends: impl IntoIterator<Item = Backend>) -> Self {
        let rank = self.ranks.last().map_or(0, |last| last + 1);
        for mut backend in backends {
            if backend.throttle().is_none()
                && let Some(template) = self.layer.throttle()
            {
                backend.set_throttle(AdaptiveThrottle::new(*template.config()));
            }
            if backend.clocks().is_none()
                && let Some(template) = self.layer.clocks()
            {
                backend.set_clocks(template.fresh());
            }
            self.backends.push(backend);
            self.ranks.push(rank);
        }
        self
    }

    /// Send the requests of one key to the same backend of a rank, while it can take them
    /// (optional): `key` reads it from a request's head (a conversation's or a user's id, a
    /// hash of a cached prompt), and a request without one is balanced as any. Providers cache
    /// prompt prefixes per deployment (OpenAI's and Anthropic's prompt caching, Azure's): the
    /// requests of one conversation that keep reaching the deployment that cached it keep its
    /// cache hits. Weighted rendezvous hashing over the rank's backends that can take the
    /// request: the same key goes to the same backend on every replica, and when one backend
    /// cannot take it, only its own keys move.
    ///
    /// ```
    /// use stormguard_failover::{Backend, Failover};
    /// use stormguard_retry::ClientLayer;
    ///
    /// let failover = Failover::new(ClientLayer::default())
    ///     .with_rank([Backend::new("east"), Backend::new("west")])
    ///     .with_sticky_key(|head| head.headers.get("x-conversation-id").map(|v| v.as_bytes()));
    /// # let _ = failover;
    /// ```
    #[must_use]
    pub fn with_sticky_key<F>(mut self, key: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a [u8]> + Send + Sync + 'static,
    {
        self.sticky = Some(Arc::new(key));
        self
    }

    /// Share the backends' cooldowns with the other replicas of a fleet through `cooldowns`
    /// (off by default): when a backend's breaker opens here, the others leave it until it lets
    /// a probe through, and when it opens there, this one does, within one decision (see
    /// [`Cooldowns`]). The backends are known by name: give each replica the same names.
    #[must_use]
    pub fn with_cooldowns(mut self, cooldowns: Cooldowns) -> Self {
        self.cooldowns = Some(cooldowns);
        self
    }

    /// Move a request answered 429 to another backend at once (off by default; the gateway
    /// turns it on): when a backend (a key, a deployment) answers 429, with a `Retry-After` or
    /// without, and another backend not tried yet is free for the request (healthy, and not
    /// cooling after a 429 of its own), its engine does not retry it there after the wait but
    /// hands it back, and the next backend takes it (one of the same rank first, as the
    /// balancer picks, then the later ranks), the move paid from the shared budget and fitting
    /// the deadline as every move is. The backend that answered cools for the 429's hint
    /// ([`Backend::DEFAULT_429_COOLDOWN`] without one): while it does, the other backends free
    /// for a request take it first. With no other backend free, the engine retries on the
    /// backend as it would alone (after the hint, if the hint fits). Off by default because it
    /// changes where a rate-limited request goes, and with it the storm simulator's published
    /// figures, made with the default failover: the `ordered-failover` row of its `balance`
    /// scenario (three deployments in order, 2 of its 60,165 requests answered 429) changes its
    /// peak load, p99 and shares when those go on to the next deployment at once.
    #[must_use]
    pub fn with_hand_off_429(mut self) -> Self {
        self.hand_off_429 = true;
        self
    }

    /// Whether a 429 moves a request to another backend at once
    /// ([`with_hand_off_429`](Self::with_hand_off_429)).
    pub fn hand_off_429(&self) -> bool {
        self.hand_off_429
    }

    /// Seed the balancer's random draws (unseeded by default): the same seed, the same draws.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Send a request that failed with `cure`'s error straight to the backend named `backend`
    /// (a larger-context model, another provider, another key), if it was not tried yet. Errors
    /// without a cure (a bad request, a bad key) are returned as they are.
    #[must_use]
    pub fn with_cure(mut self, cure: Cure, backend: &str) -> Self {
        self.cures.retain(|(known, _)| *known != cure);
        self.cures.push((cure, Arc::from(backend)));
        self
    }

    /// Answer with `degraded` when no backend can: every one failed or was unhealthy, the
    /// deadline left no time for another, or the deadline passed (cutting an attempt in flight on
    /// any backend, or before a backend was ready to take the request), at the deadline, with
    /// [`Reason::DeadlineExceeded`](stormguard_classify::Reason::DeadlineExceeded) as its
    /// [`LocalAnswer`](stormguard_classify::LocalAnswer)'s outcome. Without it, the request ends with the
    /// last backend's failure, the deadline error, or [`NoBackend`](crate::NoBackend) when none
    /// could be tried.
    #[must_use]
    pub fn with_degraded(mut self, degraded: Degraded) -> Self {
        self.degraded = Some(degraded);
        self
    }
}

impl<C, Bk, K> Failover<C, Bk, K> {
    /// Never continue a stream through the failover: a stream cut after content ends with its
    /// in-band error event, then `StreamInterrupted`; the services need no more of the service
    /// below than `Clone` (see [`ClientLayer::without_continuation`]).
    pub fn without_continuation(self) -> Failover<C, Bk, NotContinuing> {
        Failover {
            layer: self.layer.without_continuation(),
            backends: self.backends,
            ranks: self.ranks,
            cures: self.cures,
            degraded: self.degraded,
            hedging: self.hedging,
            sticky: self.sticky,
            seed: self.seed,
            cooldowns: self.cooldowns,
            hand_off_429: self.hand_off_429,
        }
    }

    /// The policy every backend follows.
    pub fn policy(&self) -> &ClientLayer<C, Bk, K> {
        &self.layer
    }

    /// The backends, in order.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The degraded answer, if any.
    pub fn degraded(&self) -> Option<&Degraded> {
        self.degraded.as_ref()
    }

    /// When requests are hedged across the backends, if they are.
    pub fn hedging(&self) -> Option<&Hedging> {
        self.hedging.as_ref()
    }
}

impl<S, C, Bk, K> Layer<S> for Failover<C, Bk, K>
where
    S: Clone,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    type Service = FailoverService<S, C, Bk, K>;

    /// One engine per backend over clones of `service`: the failover's layer with the
    /// backend's breaker, throttle, rate limit and concurrency limit. The budget stays the layer's, shared by all.
    fn layer(&self, service: S) -> Self::Service {
        let engines = self
            .backends
            .iter()
            .map(|backend| {
                let backend = backend.clone();
                let mut layer = (self.layer.clone())
                    .without_continuation()
                    .with_name(backend.name())
                    .with_breaker(backend.breaker().clone())
                    // The failover hedges across its backends in their engines' place.
                    .without_hedging();
                if let Some(clocks) = backend.clocks() {
                    layer = layer.with_clocks(clocks.clone());
                }
                if let Some(own) = backend.throttle() {
                    layer = layer.with_throttle(own.clone());
                }
                if let Some(limit) = backend.rate_limit() {
                    layer = layer.with_rate_limit(limit.clone());
                }
                if let Some(limit) = backend.concurrency() {
                    layer = layer.with_concurrency(limit.clone());
                }
                let client = layer.layer(service.clone());
                Engine::new(backend, client)
            })
            .collect::<Vec<_>>();
        let cures = self
            .cures
            .iter()
            .filter_map(|(cure, name)| {
                let index = engines
                    .iter()
                    .position(|engine| engine.backend.name() == &**name)?;
                Some((*cure, index))
            })
            .collect();
        FailoverService {
            shared: Arc::new(Shared {
                layer: self.layer.clone().without_continuation(),
                engines,
                cures,
                degraded: self.degraded.clone(),
                hedging: self.hedging,
                ranks: ranges(&self.ranks),
                sticky: self.sticky.clone(),
                random: RandomSource::from_seed(self.seed),
                cooldowns: self.cooldowns.clone(),
                hand_off_429: self.hand_off_429,
                epoch: tokio::time::Instant::now(),
            }),
            continues: PhantomData,
        }
    }
}

impl<C, Bk, K> Clone for Failover<C, Bk, K> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            backends: self.backends.clone(),
            ranks: self.ranks.clone(),
            cures: self.cures.clone(),
            degraded: self.degraded.clone(),
            hedging: self.hedging,
            sticky: self.sticky.clone(),
            seed: self.seed,
            cooldowns: self.cooldowns.clone(),
            hand_off_429: self.hand_off_429,
        }
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug, K> fmt::Debug for Failover<C, Bk, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failover")
            .field("layer", &self.layer)
            .field("backends", &self.backends)
            .field("cures", &self.cures)
            .field("degraded", &self.degraded.is_some())
            .field("hedging", &self.hedging)
            .field("ranks", &self.ranks)
            .field("sticky", &self.sticky.is_some())
            .field("cooldowns", &self.cooldowns)
            .field("hand_off_429", &self.hand_off_429)
            .finish()
    }
}

/// A service that sends each request to the first healthy of its backends, each through the
/// engine with its own guards, and on to the next when one fails: see the [crate docs](crate).
/// `K` says whether it continues the event streams its backends hand back ([`Continuing`]),
/// which asks the service below to be `Send`, `Sync` and `'static`, or not ([`NotContinuing`]).
pub struct FailoverService<S, C = LlmClassifier, Bk = FullJitter, K = Continuing> {
    shared: Arc<Shared<S, C, Bk>>,
    continues: PhantomData<fn() -> K>,
}

impl<S, C, Bk, K> FailoverService<S, C, Bk, K> {
    /// The backends, in order, with their guards as in use.
    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.shared.engines.iter().map(|engine| &engine.backend)
    }
}

impl<S, C, Bk, K> Clone for FailoverService<S, C, Bk, K> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            continues: PhantomData,
        }
    }
}

impl<S, C, Bk, K> fmt::Debug for FailoverService<S, C, Bk, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.backends()).finish()
    }
}

/// An event stream a backend hands back is continued through the failover itself (its next
/// healthy backend that takes a prefill first, the backend that served it last), which a
/// continuation, sent later, must be able to own: hence `'static`, `Send` and `Sync` (see
/// [`Failover::without_continuation`] for a failover that does not continue).
impl<S, B, RB, C, Bk> Service<Request<B>> for FailoverService<S, C, Bk, Continuing>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Clone + Send + Sync + 'static,
    Bk: Backoff + Clone + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = Error;
    type Future = ResponseFuture<S, B, RB, C, Bk>;

    /// Always ready: each backend's engine is readied when the request reaches it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let continuer = continuer::<S, B, RB, C, Bk>;
        ResponseFuture::new(Arc::clone(&self.shared), request, Some(continuer), None)
    }
}

/// An event stream cut after content ends with its in-band error event: nothing is sent later,
/// so the service below needs no more than `Clone`.
impl<S, B, RB, C, Bk> Service<Request<B>> for FailoverService<S, C, Bk, NotContinuing>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = Error;
    type Future = ResponseFuture<S, B, RB, C, Bk>;

    /// Always ready: each backend's engine is readied when the request reaches it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ResponseFuture::new(Arc::clone(&self.shared), request, None, None)
    }
}

/// Sends each continuation of a stream backend `from` served through the failover, paid for
/// with a ticket of the shared retry budget: the answer's body if it is an event stream.
///
/// A continuation is made from the request as it was sent to `from`, rewritten by its adapter
/// (its origin, path and headers: a key). It goes on with the caller's own head (`head`), so
/// that the backend that continues sees only its own adapter's rewriting, never `from`'s key
/// or path; the body (the prompt and what was received, as a prefill) and the extensions are
/// the continuation's.
fn continuer<S, B, RB, C, Bk>(
    shared: &Arc<Shared<S, C, Bk>>,
    from: usize,
    head: &Arc<Parts>,
) -> Continuer
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Clone + Send + Sync + 'static,
    Bk: Backoff + Clone + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    let shared = Arc::clone(shared);
    let head = Arc::clone(head);
    Box::new(move |request: Request<Bytes>| -> AnswerFuture {
        let Some(ticket) = shared.layer.budget().ticket() else {
            return Box::pin(std::future::ready(None));
        };
        let (mut sent, body) = request.into_parts();
        sent.uri = head.uri.clone();
        sent.headers = head.headers.clone();
        // Another request, as the continuation's head was: its own key, its own length.
        sent.headers.remove(CONTENT_LENGTH);
        sent.headers.remove(IDEMPOTENCY_KEY);
        let request = Request::from_parts(sent, B::from_bytes(body));
        let continues = Some((from, ticket));
        let future = ResponseFuture::new(Arc::clone(&shared), request, None, continues);
        Box::pin(async move {
            let response = future.await.ok()?;
            if !response.status().is_success() || !is_event_stream(response.headers()) {
                return None;
            }
            let body: AnswerBody = Box::pin(response.into_body());
            Some(body)
        })
    })
}
