//! [`Failover`]: the layer and its settings, and [`FailoverService`], what it makes of a service.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_classify::body::{Prefix, ResponseBody};
use stormguard_classify::random::RandomSource;
use stormguard_classify::{BoxError, Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_retry::{ClientLayer, ClientService, Error, Hedging, ReplayBody, continuing_stream};
use tower_layer::Layer;
use tower_service::Service;

use crate::balance::Load;
use crate::future::{Call, ContinuesFrom, Hops, ResponseFuture};
use crate::{Backend, Cooldowns, Cure, Degraded};
use stormguard_stream::continuation::Format;
use stormguard_stream::{AnswerFuture, ContinuationRequest, Continuer};

/// Failover over an ordered list of backends, each request under one deadline and one retry
/// budget: see the [crate docs](crate).
///
/// Made from the [`ClientLayer`] whose policy every backend follows (deadline, attempts,
/// backoff, classification, and its retry budget, which all backends share); each backend adds
/// its own breaker, throttle and rate limit.
#[derive(Clone)]
pub struct Failover<C = LlmClassifier, Bk = FullJitter> {
    layer: ClientLayer<C, Bk>,
    backends: Vec<Backend>,
    /// Each backend's rank (as many as backends, in order, never decreasing).
    ranks: Vec<usize>,
    cures: Vec<(Cure, Arc<str>)>,
    degraded: Option<Degraded>,
    hedging: Option<Hedging>,
    sticky: Option<StickyKey>,
    seed: Option<u64>,
    cooldowns: Option<Cooldowns>,
}

/// What a sticky key is read with (see [`Failover::with_sticky_key`]).
pub(crate) type StickyKey = Arc<dyn for<'a> Fn(&'a Parts) -> Option<&'a [u8]> + Send + Sync>;

impl<C: Classify, Bk: Backoff> Failover<C, Bk> {
    /// A failover with no backend yet, whose backends follow `layer`'s policy and share its
    /// retry budget; it hedges as `layer` does (see [`with_hedging`](Self::with_hedging)).
    pub fn new(layer: ClientLayer<C, Bk>) -> Self {
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
        }
    }

    /// Hedge requests across the backends as `hedging` says (off by default, unless the layer
    /// the failover is made from hedges): when a backend has produced no content (its answer's
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
    /// [`DegradedAnswer`](crate::DegradedAnswer)'s outcome. Without it, the request ends with the
    /// last backend's failure, the deadline error, or [`NoBackend`](crate::NoBackend) when none
    /// could be tried.
    #[must_use]
    pub fn with_degraded(mut self, degraded: Degraded) -> Self {
        self.degraded = Some(degraded);
        self
    }
}

impl<C, Bk> Failover<C, Bk> {
    /// The policy every backend follows.
    pub fn policy(&self) -> &ClientLayer<C, Bk> {
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

impl<S, C, Bk> Layer<S> for Failover<C, Bk>
where
    S: Clone,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    type Service = FailoverService<S, C, Bk>;

    /// One engine per backend over clones of `service`: the failover's layer with the
    /// backend's breaker, throttle and rate limit. The budget stays the layer's, shared by all.
    fn layer(&self, service: S) -> Self::Service {
        let backends = self
            .backends
            .iter()
            .map(|backend| {
                let backend = backend.clone();
                // A fired clock hands the request on to the next backend instead of retrying
                // where it fired.
                let mut layer = (self.layer.clone())
                    .with_name(backend.name())
                    .with_breaker(backend.breaker().clone())
                    .with_hand_off(true)
                    // The failover hedges across its backends in their engines' place.
                    .without_hedging()
                    // Its own memory of whether it takes an assistant prefill.
                    .with_continuation(self.layer.continues());
                if let Some(clocks) = backend.clocks() {
                    layer = layer.with_clocks(clocks.clone());
                }
                if let Some(own) = backend.throttle() {
                    layer = layer.with_throttle(own.clone());
                }
                if let Some(limit) = backend.rate_limit() {
                    layer = layer.with_rate_limit(limit.clone());
                }
                let client = layer.layer(service.clone());
                if !backend.takes_prefill() {
                    client.reject_prefill();
                }
                Route {
                    backend,
                    client,
                    load: Arc::default(),
                    published: AtomicU64::new(0),
                }
            })
            .collect::<Vec<_>>();
        let ranks = ranges(&self.ranks);
        let cures = self
            .cures
            .iter()
            .filter_map(|(cure, name)| {
                let index = backends
                    .iter()
                    .position(|route| route.backend.name() == &**name)?;
                Some((*cure, index))
            })
            .collect();
        FailoverService {
            shared: Arc::new(Shared {
                layer: self.layer.clone(),
                routes: backends,
                cures,
                degraded: self.degraded.clone(),
                hedging: self.hedging,
                ranks,
                sticky: self.sticky.clone(),
                random: RandomSource::from_seed(self.seed),
                cooldowns: self.cooldowns.clone(),
            }),
        }
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for Failover<C, Bk> {
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
            .finish()
    }
}

/// A service that sends each request to the first healthy of its backends, each through the
/// engine with its own guards, and on to the next when one fails: see the [crate docs](crate).
pub struct FailoverService<S, C = LlmClassifier, Bk = FullJitter> {
    shared: Arc<Shared<S, C, Bk>>,
}

/// What every clone of a [`FailoverService`] shares.
pub(crate) struct Shared<S, C, Bk> {
    pub(crate) layer: ClientLayer<C, Bk>,
    pub(crate) routes: Vec<Route<S, C, Bk>>,
    pub(crate) cures: Vec<(Cure, usize)>,
    pub(crate) degraded: Option<Degraded>,
    pub(crate) hedging: Option<Hedging>,
    /// The routes of each rank, in order.
    pub(crate) ranks: Vec<Range<usize>>,
    pub(crate) sticky: Option<StickyKey>,
    /// The balancer's draws.
    pub(crate) random: RandomSource,
    pub(crate) cooldowns: Option<Cooldowns>,
}

/// A backend, its engine, and what the balancer knows of it.
pub(crate) struct Route<S, C, Bk> {
    pub(crate) backend: Backend,
    pub(crate) client: ClientService<S, C, Bk>,
    pub(crate) load: Arc<Load>,
    /// How many times its breaker had opened when its cooldown was last shared.
    pub(crate) published: AtomicU64,
}

/// The routes of each rank, from each backend's rank (in order, never decreasing).
fn ranges(ranks: &[usize]) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    for (index, rank) in ranks.iter().enumerate() {
        match ranges.last_mut() {
            Some(last) if ranks.get(last.start) == Some(rank) => last.end = index + 1,
            _ => ranges.push(index..index + 1),
        }
    }
    ranges
}

impl<S, C, Bk> FailoverService<S, C, Bk> {
    /// The backends, in order, with their guards as in use.
    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.shared.routes.iter().map(|route| &route.backend)
    }
}

impl<S, C, Bk> Clone for FailoverService<S, C, Bk> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, C, Bk> fmt::Debug for FailoverService<S, C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.shared.routes.iter().map(|route| &route.backend))
            .finish()
    }
}

impl<S, C, Bk> FailoverService<S, C, Bk> {
    /// Routes `request` as [`Service::call`] does, except that an event stream cut after
    /// content is never continued (it ends with its in-band error event and
    /// `StreamInterrupted`): for a service below that lives only as long as the call (the
    /// reqwest adapter's middleware chain). Always ready, like the service.
    pub fn call_without_continuation<B, RB>(
        &mut self,
        request: Request<B>,
    ) -> ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        B: ReplayBody,
        RB: Body,
        C: Classify + Clone,
        Bk: Backoff + Clone,
    {
        self.route(request, |client, request, _, _| {
            client.call_without_continuation(request)
        })
    }

    fn route<B, RB>(
        &mut self,
        request: Request<B>,
        call: Call<S, B, RB, C, Bk>,
    ) -> ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        B: ReplayBody,
        RB: Body,
        C: Classify + Clone,
        Bk: Backoff + Clone,
    {
        let (head, body) = request.into_parts();
        let cap = self.shared.layer.max_replay_body();
        ResponseFuture::new(
            Hops::new(Arc::clone(&self.shared), head, call),
            Prefix::new(body, cap),
        )
    }
}

/// An event stream a backend hands back is continued through the failover itself (its next
/// healthy backend that takes a prefill first, the backend that served it last), which a
/// continuation, sent later, must be able to own: hence `'static`, `Send` and `Sync` (see
/// [`call_without_continuation`](FailoverService::call_without_continuation)).
impl<S, B, RB, C, Bk> Service<Request<B>> for FailoverService<S, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = bytes::Bytes> + Send + 'static,
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
        self.route(request, hop_continuing::<S, B, RB, C, Bk>)
    }
}

/// A hop whose streams, if its request is in a format the engine continues, are continued
/// through the failover (see [`FailoverService`]'s `Service` impl).
fn hop_continuing<S, B, RB, C, Bk>(
    client: &mut ClientService<S, C, Bk>,
    request: Request<B>,
    shared: &Arc<Shared<S, C, Bk>>,
    from: usize,
) -> stormguard_retry::ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Clone + Send + Sync + 'static,
    Bk: Backoff + Clone + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    let (head, body) = request.into_parts();
    let continues = Format::of_request(&head).is_some()
        && head.extensions.get::<ContinuationRequest>().is_none();
    let request = Request::from_parts(head, body);
    if !continues {
        return client.call_without_continuation(request);
    }
    let continuer = continuer::<S, B, RB, C, Bk>(Arc::clone(shared), from);
    client.call_continuing_with(request, continuer)
}

/// Sends each continuation of a stream backend `from` served through the failover, under the
/// shared retry budget: the answer's body if it is an event stream.
fn continuer<S, B, RB, C, Bk>(shared: Arc<Shared<S, C, Bk>>, from: usize) -> Continuer
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Clone + Send + Sync + 'static,
    Bk: Backoff + Clone + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    Box::new(move |mut request: Request<bytes::Bytes>| -> AnswerFuture {
        let Some(withdrawal) = shared.layer.budget().try_withdraw() else {
            return Box::pin(std::future::ready(None));
        };
        request.extensions_mut().insert(ContinuesFrom(from));
        let mut failover = FailoverService {
            shared: Arc::clone(&shared),
        };
        Box::pin(async move {
            // Spent once sent, like a retry's.
            let _withdrawal = withdrawal;
            let response = failover.call(request.map(B::from_bytes)).await.ok()?;
            continuing_stream(response)
        })
    })
}
