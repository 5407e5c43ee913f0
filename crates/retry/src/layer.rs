//! [`ClientLayer`]: the engine's configuration, applied to a service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_breaker::{CircuitBreaker, Fallback};
use stormguard_budget::{RetryBudget, RetryTokens};
use stormguard_classify::{Classify, LlmClassifier};
use stormguard_concurrency::ConcurrencyLimit;
use stormguard_deadline::client::FromFn;
use stormguard_deadline::clocks::AttemptClocks;
use stormguard_deadline::propagate::DEFAULT_MARGIN;
use stormguard_deadline::{DEFAULT_TIMEOUT, LlmDeadline};
use stormguard_jitter::{Backoff, FullJitter, HintPolicy};
use stormguard_rate_limit::RateLimit;
use stormguard_stream::{MakeResume, StreamPolicy};
use tower_layer::Layer;

use crate::admission::{Guard, Guards};
use crate::config::Config;
use crate::continuing::{Continuing, NotContinuing};
use crate::hedge::Hedging;
use crate::policy::RetryPolicy;
use crate::service::ClientService;

/// Default number of attempts per request, the first one included: 3, the per-request limit of
/// the Google SRE book ("Handling Overload": "implement a per-request retry budget of up to three
/// attempts"), and what the official OpenAI and Anthropic SDKs send (2 retries). Every layer that
/// retries multiplies the attempts of the layers above it, so this stays small; the shared
/// [`RetryBudget`] bounds the total.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// Default largest request body the engine buffers to replay: 1 MiB. Chat-completion requests
/// with long prompts fit (a 128k-token context is about 0.5 MB of text); uploads and streams
/// bigger than this are sent once, untouched, and never retried.
pub const DEFAULT_MAX_REPLAY_BODY: usize = 1024 * 1024;

/// The whole client pipeline for `http::Request<B>` services, as one [`Layer`] (see the
/// [crate docs](crate) for what it does to each request):
///
/// ```text
/// request ─▶ deadline ─▶ retry (classify · budget · jitter · hints) ─▶ [rate limit] ─▶ [breaker] ─▶ adaptive throttle ─▶ backend
///            one for all   replay the body, attempt headers,             optional:      optional     every attempt; a drop
///            attempts,     Idempotency-Key, x-should-retry: false        waits a slot                is final
///            propagated    on what it gives up on
/// ```
///
/// `ClientLayer::default()` is safe for LLM APIs out of the box:
///
/// * classifier [`LlmClassifier`]: HTTP status, gRPC status, transport errors and the JSON error
///   bodies of LLM APIs;
/// * budget [`RetryBudget::default()`] (retries up to 10% of successes, a floor of 1 per second,
///   over 10 s), one per layer: clones of the layer share it, and
///   [`with_budget`](Self::with_budget) shares one further;
/// * backoff [`FullJitter::default()`]: `U(0, min(8 s, 500 ms × 2^n))`, the official OpenAI
///   SDKs' base and cap (the AWS SDKs use 1 s .. 20 s, but a 20 s pause is as long as many LLM
///   deadlines, and with three attempts the cap is seldom reached anyway);
/// * [`DEFAULT_MAX_ATTEMPTS`] (3) attempts;
/// * hint policy [`HintPolicy::default()`]: server hints honoured up to 60 s, longer ones end the
///   request;
/// * request bodies up to [`DEFAULT_MAX_REPLAY_BODY`] (1 MiB) replayed;
/// * an [`AdaptiveThrottle::default()`] of its own;
/// * no rate limit ([`with_rate_limit`](Self::with_rate_limit) adds one);
/// * no concurrency limit ([`with_concurrency`](Self::with_concurrency) adds one);
/// * no circuit breaker ([`with_breaker`](Self::with_breaker) adds one: see
///   [`stormguard_breaker`] for when it pays, and how it composes with the throttle);
/// * per-attempt clocks ([`AttemptClocks::default`], see [`with_clocks`](Self::with_clocks)), and
///   hedging only while they are cold ([`Hedging::cold`]: a stream with no content 10 s after it
///   was sent, plus its prefill, gets a second attempt beside it, within the retry budget);
/// * a deadline of [`DEFAULT_TIMEOUT`] (600 s) across all attempts, propagated downstream with a
///   [`DEFAULT_MARGIN`] (50 ms) safety margin.
///
/// Each `with_*` method changes one thing; each setting can be read back by the method of the
/// same name without `with_`. `K` says whether the engine continues the event streams it hands
/// back through itself ([`Continuing`], the default; see
/// [`without_continuation`](Self::without_continuation)). The layer is a cheap `Clone` (its configuration sits in an `Arc`),
/// and the budget and the throttle are shared by every clone and every service it builds: hand
/// the same ones to several layers when several clients call one backend.
///
/// ```
/// use std::time::Duration;
/// use stormguard_adaptive_throttle::AdaptiveThrottle;
/// use stormguard_budget::RetryBudget;
/// use stormguard_retry::ClientLayer;
///
/// let budget = RetryBudget::default();
/// let throttle = AdaptiveThrottle::default();
/// let layer = ClientLayer::default()
///     .with_budget(budget.clone())
///     .with_throttle(throttle.clone())
///     .with_max_attempts(4)
///     .with_timeout(Duration::from_secs(30));
/// assert_eq!(layer.max_attempts(), 4);
/// ```
///
/// The defaults, as listed above:
///
/// ```
/// use std::time::Duration;
/// use stormguard_jitter::Backoff;
/// use stormguard_retry::ClientLayer;
///
/// let layer = ClientLayer::default();
/// assert_eq!(layer.max_attempts(), 3);
/// assert_eq!(layer.max_replay_body(), 1024 * 1024);
/// assert_eq!(layer.backoff().cap(), Duration::from_secs(8));
/// assert_eq!(layer.hint_policy().max(), Duration::from_secs(60));
/// assert_eq!(layer.budget().ratio(), 0.1);
/// assert!(layer.throttle().is_some());
/// assert!(layer.breaker().is_none() && layer.rate_limit().is_none());
/// assert!(layer.stream_policy().is_some());
/// assert_eq!(layer.hedging(), Some(&stormguard_retry::Hedging::cold()));
/// let head = http::Request::new(()).into_parts().0;
/// assert_eq!(layer.timeout_for(&head, None), Some(Duration::from_secs(600)));
/// assert_eq!(layer.margin(), Duration::from_millis(50));
/// assert!(layer.propagation());
/// ```
pub struct ClientLayer<C = LlmClassifier, Bk = FullJitter, K = Continuing> {
    config: Arc<Config<C, Bk>>,
    continues: PhantomData<fn() -> K>,
}

impl ClientLayer {
    /// A layer with the defaults listed on [`ClientLayer`].
    pub fn new() -> Self {
        Self::default()
    }
}

impl Default for ClientLayer {
    fn default() -> Self {
        Self::from_config(Config {
            classifier: LlmClassifier::default(),
            policy: RetryPolicy {
                budget: RetryBudget::default(),
                backoff: FullJitter::default(),
                hint_policy: HintPolicy::default(),
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                tokens: None,
            },
            guards: Guards::default().with(Guard::Throttle(AdaptiveThrottle::default())),
            max_replay_body: DEFAULT_MAX_REPLAY_BODY,
            fallback: None,
            timeout: Some(Arc::new(DEFAULT_TIMEOUT)),
            margin: DEFAULT_MARGIN,
            propagation: true,
            streams: Some(StreamPolicy::default()),
            resume: None,
            name: None,
            clocks: Some(AttemptClocks::default()),
            prefill: Arc::default(),
            hedging: Some(Hedging::cold()),
        })
    }
}

impl<C: Classify, Bk: Backoff, K> ClientLayer<C, Bk, K> {
    fn from_config(config: Config<C, Bk>) -> Self {
        Self {
            config: Arc::new(config),
            continues: PhantomData,
        }
    }

    /// The configuration, to change one setting of it.
    fn change(self, change: impl FnOnce(&mut Config<C, Bk>)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        change(&mut config);
        Self::from_config(config)
    }

    /// Name the backend this layer calls (`openai`, `anthropic`, `azure-eastus`...): the
    /// `backend` field of the request's and attempts' spans, and the `gen_ai.provider.name`
    /// label of the metrics (feature `metrics`). A name from a fixed set, never one made from
    /// requests: every name is a series of its own.
    pub fn with_name(self, name: &str) -> Self {
        let name = Arc::from(name);
        self.change(|config| config.name = Some(name))
    }

    /// Decide what succeeded, what may be retried and what the backend accepted with
    /// `classifier` (for the retry decision and the throttle alike).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> ClientLayer<C2, Bk, K> {
        let config = Arc::unwrap_or_clone(self.config);
        let backoff = config.policy.backoff.clone();
        ClientLayer::from_config(config.retyped(classifier, backoff))
    }

    /// Wait between attempts as `backoff` schedules, when the server gives no hint.
    pub fn with_backoff<Bk2: Backoff>(self, backoff: Bk2) -> ClientLayer<C, Bk2, K> {
        let config = Arc::unwrap_or_clone(self.config);
        let classifier = config.classifier.clone();
        ClientLayer::from_config(config.retyped(classifier, backoff))
    }

    /// Draw retries from `budget` (and deposit successes into it). Pass clones of one budget to
    /// every layer that talks to the same backend so that they share it.
    pub fn with_budget(self, budget: RetryBudget) -> Self {
        self.change(|config| config.policy.budget = budget)
    }

    /// Also throttle retries and hedges with gRPC's retry tokens (gRFC A6's `retryThrottling`,
    /// see [`RetryTokens`]): each attempt that fails in a way a retry could help (or that the
    /// server pushed back on) takes a token, each success gives some back, and no retry or
    /// hedge goes while half the tokens or fewer are left. The [budget](Self::with_budget) is
    /// still asked, after the tokens: both must grant. Pass clones of one bucket to every layer
    /// that talks to the same server. A retry the tokens refuse gives up as
    /// [`GiveUpCause::BudgetExhausted`](crate::GiveUpCause::BudgetExhausted).
    pub fn with_retry_tokens(self, tokens: RetryTokens) -> Self {
        self.change(|config| config.policy.tokens = Some(tokens))
    }

    /// The gRPC retry tokens, if retries are throttled with them.
    pub fn retry_tokens(&self) -> Option<&RetryTokens> {
        self.config.policy.tokens.as_ref()
    }

    /// Turn server hints (`retry-after` and friends) into delays with `policy`; a hint above
    /// [`policy.max()`](HintPolicy::max) is not retried.
    pub fn with_hint_policy(self, policy: HintPolicy) -> Self {
        self.change(|config| config.policy.hint_policy = policy)
    }

    /// Send each request at most `attempts` times, the first included (0 counts as 1: no retry).
    pub fn with_max_attempts(self, attempts: u32) -> Self {
        self.change(|config| config.policy.max_attempts = attempts.max(1))
    }

    /// Buffer and replay request bodies of up to `bytes` bytes; bigger ones are sent once.
    pub fn with_max_replay_body(self, bytes: usize) -> Self {
        self.change(|config| config.max_replay_body = bytes)
    }

    /// Throttle every attempt with `throttle` (shared state: one per backend).
    pub fn with_throttle(self, throttle: AdaptiveThrottle) -> Self {
        self.with_guard(Guard::Throttle(throttle))
    }

    /// No adaptive throttle: every attempt the retry rules allow is sent.
    pub fn without_throttle(self) -> Self {
        let throttle = |guard: &Guard| matches!(guard, Guard::Throttle(_));
        self.change(|config| config.guards = std::mem::take(&mut config.guards).without(throttle))
    }

    /// The guards with `guard` in its place.
    fn with_guard(self, guard: Guard) -> Self {
        self.change(|config| config.guards = std::mem::take(&mut config.guards).with(guard))
    }

    /// Ask `breaker` (shared state: one per backend) before every attempt, after the deadline and
    /// before the throttle. A refused attempt ends the request at once, never retried: with the
    /// [fallback](Self::with_fallback)'s answer, or an [`Error`](crate::Error) whose source is
    /// the [`BreakerOpen`](stormguard_breaker::BreakerOpen) or
    /// [`BulkheadFull`](stormguard_breaker::BulkheadFull). Every attempt's outcome is recorded
    /// with it, an attempt in flight when the deadline passes as a timeout, and an attempt a
    /// stall cuts ends the request the same way as a refusal.
    pub fn with_breaker(self, breaker: CircuitBreaker) -> Self {
        self.with_guard(Guard::Breaker(breaker))
    }

    /// Answer the requests the breaker refuses or cuts with `fallback` (its response has a
    /// [`LocalAnswer`](stormguard_classify::LocalAnswer) in its extensions) instead of an
    /// error. Without a breaker it is never used.
    pub fn with_fallback(self, fallback: Fallback) -> Self {
        self.change(|config| config.fallback = Some(fallback))
    }

    /// Pace every attempt, retries included, with `limit` (shared state: one per provider quota),
    /// before the breaker and the throttle: each waits for its slot (within the limit's
    /// `max_wait` and the request's deadline) or ends the request at once with an
    /// [`Error`](crate::Error) whose source is the
    /// [`RateLimited`](stormguard_rate_limit::RateLimited), never retried. Requests are weighed in
    /// tokens by their buffered body (prompt and `max_tokens`) when the limit counts tokens, and
    /// every answer is shown to it, so that it learns the provider's limits.
    pub fn with_rate_limit(self, limit: RateLimit) -> Self {
        self.with_guard(Guard::RateLimit(limit))
    }

    /// Keep the attempts in flight under `limit` (shared state: one per backend), an adaptive
    /// limit learned from the provider's overload answers (see [`stormguard_concurrency`]). It
    /// admits every attempt, retries and hedges alike, after the rate limit (a wait for quota
    /// holds no place) and before the breaker and the throttle: a full limit is waited for
    /// (within its [`max_wait`](stormguard_concurrency::ConcurrencyConfig::max_wait) and the
    /// request's deadline), then the request ends at once with an [`Error`](crate::Error) whose
    /// source is the [`ConcurrencyFull`](stormguard_concurrency::ConcurrencyFull), never retried
    /// (a failover takes it to its next backend). An event stream handed back holds its place
    /// until its last byte, and its end is told to the limit (an in-band `overloaded_error`
    /// shrinks it); an attempt in flight when the deadline passes, or whose clock fires, counts
    /// as a timeout.
    pub fn with_concurrency(self, limit: ConcurrencyLimit) -> Self {
        self.with_guard(Guard::Concurrency(limit))
    }

    /// One fixed deadline of `timeout` for each request, across all its attempts.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.change(|config| config.timeout = Some(Arc::new(timeout)))
    }

    /// Each request's deadline from a function of its head (`None`: no deadline of the layer's
    /// own).
    pub fn with_timeout_fn<F>(self, timeout: F) -> Self
    where
        F: Fn(&Parts) -> Option<Duration> + Send + Sync + 'static,
    {
        self.change(|config| config.timeout = Some(Arc::new(FromFn::new(timeout))))
    }

    /// Size each request's deadline from its LLM request body (prompt size and `max_tokens`; see
    /// [`LlmDeadline`]): the body the engine buffers for replay is read for it, so a 4,000-token
    /// generation gets a longer deadline than a 50-token one. A body too large to buffer gets
    /// [`LlmDeadline::max`](LlmDeadline).
    pub fn with_llm_deadline(self, estimate: LlmDeadline) -> Self {
        self.change(|config| config.timeout = Some(Arc::new(estimate)))
    }

    /// No deadline of the layer's own: only one already on the request (from an incoming
    /// request, or set by a layer above) is honoured, stamped and enforced.
    pub fn without_timeout(self) -> Self {
        self.change(|config| config.timeout = None)
    }

    /// Guard event streams with `policy` (the default: [`StreamPolicy::default`]): a
    /// `text/event-stream` success is read up to its first content event before it is handed
    /// back, an error event before it is retried like a 529, and an interruption after it ends
    /// the body with `StreamInterrupted` (see `stormguard_stream`).
    pub fn with_stream_policy(self, policy: StreamPolicy) -> Self {
        self.change(|config| config.streams = Some(policy))
    }

    /// Resume an event stream interrupted after its first content with the hook `resume` makes
    /// for it instead of ending it (opt-in; see `stormguard_stream::resume`;
    /// `stormguard_stream::ResumeFn` makes one of a closure, which gets what was received and
    /// the request, its head carrying the deadline, and may send a continuation through a
    /// client sharing this layer's budget). Requests whose body was not buffered (larger than
    /// the replay cap) are not resumed.
    pub fn with_stream_resume(self, resume: impl MakeResume + 'static) -> Self {
        let resume: Arc<dyn MakeResume> = Arc::new(resume);
        self.change(|config| config.resume = Some(resume))
    }

    /// Time each attempt with `clocks` (the default: [`AttemptClocks::default`], this layer's
    /// own): an attempt whose response head, first content event or next content event is
    /// later than the backend's learned clock allows is abandoned (a timeout for the breaker and
    /// the throttle) and the request goes on, a retry within the one deadline and budget; when
    /// the request cannot go on (no attempt left, the budget spent), a late head keeps its
    /// attempt, which may still answer within the deadline. See
    /// `stormguard_deadline::clocks` for the clocks and their defaults. Hand the same clocks
    /// only to layers that call the same backend: they learn what it is like.
    pub fn with_clocks(self, clocks: AttemptClocks) -> Self {
        self.change(|config| config.clocks = Some(clocks))
    }

    /// No per-attempt clocks: only the deadline and the stream guard's own limits bound an
    /// attempt.
    pub fn without_clocks(self) -> Self {
        self.change(|config| config.clocks = None)
    }

    /// The per-attempt clocks, if on.
    pub fn clocks(&self) -> Option<&AttemptClocks> {
        self.config.clocks.as_ref()
    }

    /// Hedge requests as `hedging` says (by default only while the backend is cold:
    /// [`Hedging::cold`]; see [`Hedging`]): when an attempt has
    /// produced no content (its head; a stream, its first content event) after the hedge's
    /// delay, fixed or the backend's learned percentile of time to first content (which needs
    /// the [clocks](Self::with_clocks)), a second attempt goes to the same backend, without
    /// cancelling the first; the first to produce content answers and the other is cancelled.
    /// Each hedge draws on the retry budget like a retry (a spent budget sends none, so a storm
    /// turns hedging off by itself), counts against `max_attempts`, and passes the rate limit,
    /// the breaker and the throttle like every attempt.
    pub fn with_hedging(self, hedging: Hedging) -> Self {
        self.change(|config| config.hedging = Some(hedging))
    }

    /// No hedging, not even while the backend is cold.
    pub fn without_hedging(self) -> Self {
        self.change(|config| config.hedging = None)
    }

    /// When requests are hedged, if they are.
    pub fn hedging(&self) -> Option<&Hedging> {
        self.config.hedging.as_ref()
    }

    /// Hand event streams back as they come, unguarded.
    pub fn without_stream_guard(self) -> Self {
        self.change(|config| config.streams = None)
    }

    /// The stream guard's policy, if streams are guarded.
    pub fn stream_policy(&self) -> Option<&StreamPolicy> {
        self.config.streams.as_ref()
    }

    /// The timeout this layer gives the request with head `head` and body `body` (`None`: no
    /// deadline of its own), as it would set it: for a layer above (a failover over several
    /// backends) that sets one deadline for all of them first.
    pub fn timeout_for(&self, head: &Parts, body: Option<&[u8]>) -> Option<Duration> {
        self.config.timeout.as_ref()?.timeout(head, body)
    }

    /// Subtract `margin` from the time left before sending it downstream (default 50 ms), so that
    /// the next hop gives up slightly before this one does.
    pub fn with_margin(self, margin: Duration) -> Self {
        self.change(|config| config.margin = margin)
    }

    /// The time left is no longer sent downstream on each attempt (`x-request-timeout-ms`, gRPC
    /// `grpc-timeout`); by default it is.
    pub fn without_propagation(self) -> Self {
        self.change(|config| config.propagation = false)
    }

    /// The classifier.
    pub fn classifier(&self) -> &C {
        &self.config.classifier
    }

    /// The retry budget, shared by every service this layer builds (for its
    /// [`snapshot`](RetryBudget::snapshot)).
    pub fn budget(&self) -> &RetryBudget {
        &self.config.policy.budget
    }

    /// The backoff.
    pub fn backoff(&self) -> &Bk {
        &self.config.policy.backoff
    }

    /// The name given with [`with_name`](Self::with_name).
    pub fn name(&self) -> Option<&str> {
        self.config.name.as_deref()
    }

    /// The hint policy.
    pub fn hint_policy(&self) -> &HintPolicy {
        &self.config.policy.hint_policy
    }

    /// Most attempts per request, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.config.policy.max_attempts
    }

    /// Largest request body buffered for replay.
    pub fn max_replay_body(&self) -> usize {
        self.config.max_replay_body
    }

    /// The adaptive throttle, shared by every service this layer builds (for its
    /// [`snapshot`](AdaptiveThrottle::snapshot)); `None` without one.
    pub fn throttle(&self) -> Option<&AdaptiveThrottle> {
        self.config.guards.throttle()
    }

    /// The circuit breaker, shared by every service this layer builds (for its
    /// [`snapshot`](CircuitBreaker::snapshot)); `None` without one.
    pub fn breaker(&self) -> Option<&CircuitBreaker> {
        self.config.guards.breaker()
    }

    /// The rate limit, shared by every service this layer builds; `None` without one.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.config.guards.rate_limit()
    }

    /// The concurrency limit, shared by every service this layer builds; `None` without one.
    pub fn concurrency(&self) -> Option<&ConcurrencyLimit> {
        self.config.guards.concurrency()
    }

    /// The fallback for refused requests, if any.
    pub fn fallback(&self) -> Option<&Fallback> {
        self.config.fallback.as_ref()
    }

    /// The safety margin subtracted from the time left sent downstream.
    pub fn margin(&self) -> Duration {
        self.config.margin
    }

    /// Whether the time left is sent downstream.
    pub fn propagation(&self) -> bool {
        self.config.propagation
    }
}

impl<C, Bk, K> ClientLayer<C, Bk, K> {
    /// Continue event streams cut after content (the default) for the formats the engine knows,
    /// OpenAI Chat Completions and Anthropic Messages: when a stream is cut, stalls past its gap
    /// clock, sends an error event after content, or ends before its answer is complete, the
    /// same backend is asked for the rest (the text received as an assistant prefill,
    /// `max_tokens` reduced by what was received; a ticket of the retry budget), and its answer
    /// is spliced into the caller's stream: every token once, in order, one terminal event, usage
    /// summed (see `stormguard_stream::continuation`). At most `max_attempts - 1` continuations
    /// per stream. A backend that answers a continuation 400 rejects prefills: it is not asked
    /// again. A stream that cannot be completed ends with its provider's in-band error event,
    /// then `StreamInterrupted`, so that SDKs raise. Requests whose body was not buffered are not
    /// continued; a resume hook ([`with_stream_resume`](Self::with_stream_resume)) takes the
    /// place of the built-in continuation. The services of such a layer ask their inner service
    /// to be `Send` and `'static`: a continuation is sent after the answer was handed back.
    pub fn with_continuation(self) -> ClientLayer<C, Bk, Continuing> {
        ClientLayer {
            config: self.config,
            continues: PhantomData,
        }
    }

    /// Never continue a stream through this engine: a stream cut after content ends with its
    /// in-band error event, then `StreamInterrupted`. Its services ask no more of the inner
    /// service than `Clone` (tower's retry asks the same): for a service that lives only as long
    /// as one call (the reqwest adapter's middleware chain), or that is not `Send`.
    pub fn without_continuation(self) -> ClientLayer<C, Bk, NotContinuing> {
        ClientLayer {
            config: self.config,
            continues: PhantomData,
        }
    }
}

impl<C, Bk, K> ClientLayer<C, Bk, K> {
    /// The configuration every service of this layer shares.
    #[cfg(feature = "grpc")]
    pub(crate) fn shared_config(&self) -> &Config<C, Bk> {
        &self.config
    }
}

impl<C, Bk, K> Clone for ClientLayer<C, Bk, K> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
            continues: PhantomData,
        }
    }
}

impl<S, C, Bk, K> Layer<S> for ClientLayer<C, Bk, K> {
    type Service = ClientService<S, C, Bk, K>;

    fn layer(&self, inner: S) -> ClientService<S, C, Bk, K> {
        ClientService::from_config(inner, Arc::clone(&self.config))
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug, K> fmt::Debug for ClientLayer<C, Bk, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}
