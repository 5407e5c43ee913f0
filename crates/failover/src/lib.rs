//! Failover across LLM providers for tower: an ordered list of backends, each with its own
//! circuit breaker, throttle and rate limit; errors another backend can cure sent straight to
//! it; one deadline and one retry budget per request across every backend; and a degraded
//! answer, marked as such, when none can answer.
//!
//! # The incident
//!
//! Production LLM systems use two providers or more. When the primary fails, its retries fail
//! too, and the request should go to the backup, but only once the primary is really down
//! (3 failures in a row), never on one blip: switching on every error runs both providers at
//! double cost, and each one's own retries multiply the load on both. Gateways that fail over
//! do it per request, with a retry count per provider; none shares one deadline and one retry
//! budget across the whole chain, so their failover multiplies load exactly when providers are
//! struggling.
//!
//! # How a request is routed
//!
//! [`Failover`] is made from a [`ClientLayer`](stormguard_retry::ClientLayer): its policy
//! (deadline, attempts, backoff, classifier) is every backend's, and its retry budget is shared
//! by all. Each [`Backend`] adds its own guards; [`Failover::layer`](tower_layer::Layer) builds
//! one engine per backend over clones of the service below (a hyper client that reaches every
//! provider; the backend's [`Adapter`] rewrites the origin, headers and body fields).
//!
//! 1. The deadline is set once, before the first backend, from the layer's timeout (or the one
//!    already on the request): every attempt on every backend shares it.
//! 2. The request goes to the first *healthy* backend in order: it is not set aside (below),
//!    its breaker is not open (a half-open breaker lets its probes through and refuses the
//!    rest), and its throttle drops less than half of what it gets. The backend's engine retries there as the policy allows.
//! 3. When the backend answers, its answer is handed back, marked with its name
//!    ([`Answered`] in the extensions, `x-stormguard-backend`), unless:
//!    - the answer is an error with a [`Cure`] configured ([`Failover::with_cure`]: context too
//!      long, content filtered, quota exhausted): the request goes to the cure's backend;
//!    - the backend refused the request without sending it (its breaker, throttle, bulkhead or
//!      rate limit): the next healthy backend takes it, for free;
//!    - the backend refuses the credentials it is sent (401, 403: a revoked or wrong key, a
//!      model the key may not use): it is set aside for good ([`Backend::is_set_aside`],
//!      logged once at WARN), never asked again by this failover, and the next healthy backend
//!      takes the request; with none left, its answer is handed back as it is;
//!    - the backend keeps answering 429: every attempt of the request was answered 429
//!      (the engine's [`Report::rate_limited_throughout`](stormguard_retry::Report::rate_limited_throughout)), or the
//!      engine gave up on a 429 whose wait is beyond what the request can wait (a Retry-After
//!      above the hint policy's maximum, 60 s by default, or a wait the deadline cannot fit; a
//!      wait of the backend's rate limit beyond its maximum is a refusal, above): the next
//!      healthy backend takes it at once, at any traffic level. A 429 is no health failure, so
//!      the breaker never leaves such a backend, and its throttle drops nothing at a few
//!      requests a second;
//!    - with [`Failover::with_hand_off_429`] (off by default; the gateway turns it on), the
//!      backend answered 429 once, with a `Retry-After` or without, while another backend is
//!      free for the request: its engine hands the request back instead of retrying it there
//!      after the wait, and the next healthy backend takes it at once (of the same rank first,
//!      as the balancer picks, then the later ranks). The backend cools for the 429's hint
//!      ([`Backend::DEFAULT_429_COOLDOWN`], 1 s, without one): while it does, the other backends
//!      are chosen before it. With no other backend free, the engine waits out a fitting hint
//!      and retries on the backend, as it would alone;
//!    - the backend failed and is now unhealthy (its breaker opened: by default after 3 health
//!      failures in a row, [`Backend::DEFAULT_CONSECUTIVE_FAILURES`]): the next healthy backend
//!      takes it. A backend that failed once and is still healthy is not left: its failure is
//!      the answer (never fail over on a blip).
//!
//!    Other errors with no cure (400, 404, 422) are answered as they are.
//! 4. A move to another backend after an attempt was sent is a retry: it draws on the shared
//!    budget, and is not made when the budget is empty or when the time left is shorter than an
//!    attempt of the last backend took.
//! 5. When no backend is left: the [`Degraded`] answer if there is one (marked with
//!    [`LocalAnswer`](stormguard_classify::LocalAnswer) and `x-stormguard-degraded: true`), else the last backend's failure
//!    (a 429 with its Retry-After and, when its engine gave up on it, `x-should-retry: false`;
//!    also when the backend's own throttle or breaker refused the retry of that 429: the engine
//!    hands the 429 back in place of its refusal),
//!    or, when no backend could take the request at all, [`NoBackend`]: an error whose outcome
//!    (`Reason::NoBackend`) `error_response` answers with 503 and `Retry-After`.
//! 6. When the deadline passes, the request ends there, wherever it is (an attempt in flight or
//!    a backoff on any backend, a wait for a backend to be ready): with the [`Degraded`] answer
//!    if there is one, its [`LocalAnswer`](stormguard_classify::LocalAnswer) saying `Reason::DeadlineExceeded`, else the
//!    engine's deadline error (504 from `error_response`).
//!
//! # Balancing
//!
//! Backends added together with [`Failover::with_rank`] (several keys, regions or deployments
//! of one model) share their rank's traffic: each request goes to the one of them the balancer
//! picks among those that can take it (see [`balance`]: the cheaper of two drawn, by latency,
//! hops in flight, [weight](Backend::with_weight) and rate-limit headroom; or the backend of its
//! [sticky key](Failover::with_sticky_key)). Ranks fail over in order, as single backends do.
//! With [`Failover::with_cooldowns`], a backend's breaker opening is shared by the replicas of a
//! fleet ([`Cooldowns`]).
//!
//! With [`Failover::with_hedging`] (or a layer that hedges), a hop that has produced no content
//! after the hedge's delay gets a second hop on the next healthy backend, the same one when there
//! is no other, under the same deadline and budget: the first to answer is handed back and the
//! other cancelled (see `stormguard_retry::hedge` for the rules a hedge follows).
//!
//! Traffic returns to a recovered primary through its breaker's probes: while it is half-open,
//! the probes go to it and every other request to the next backend; its first successful probe
//! closes it, and requests go to it first again. A backend's default breaker probes again after
//! 1 s, doubling to at most 3 s ([`Backend::DEFAULT_MAX_OPEN_WAIT`]).
//!
//! # A backup's quota
//!
//! When the primary falls, the requests in flight on it fail at once and move to the next backend
//! together, on top of the traffic that now goes there: a backup sized for the load alone cannot
//! take them all at once. Give each backend its quota as its rate limit
//! ([`Backend::with_rate_limit`], a little under what it completes a second, a short burst and a
//! wait of some seconds): the rush then waits its turn instead of overloading the backup (the
//! `failover` scenario of the storm simulator: 99.98% success and the backup at 0.94x its
//! capacity with it, 96% and 1.17x without).
//!
//! # The bound on attempts
//!
//! A request visits each backend at most once, and each visit is one engine's retries: at most
//! `max_attempts × backends` attempts (3 × 2 = 6 with two backends and the default policy).
//! Every attempt after a request's first, on any backend, draws a ticket from the one retry
//! budget, so across all requests the attempts stay within the budget's ratio of the traffic
//! (10% by default) however many backends fail.
//!
//! # How it is built
//!
//! The failover is a router above its backends' engines, and speaks to each through the engine's
//! router interface ([`ClientService::route`](stormguard_retry::ClientService::route)): it hands
//! the request on with a [`Route`](stormguard_retry::Route) (a fired clock handed back rather
//! than retried there, the ticket it drew for the move, the continuer that sends a stream's
//! continuation to the next backend) and reads the engine's
//! [`Report`](stormguard_retry::Report) with the answer. What the next move is (a cure, the next
//! healthy backend, the answer) is decided in one place from that report and the backends'
//! health. A request's hops to its backends run in the engine's own
//! [`Race`](stormguard_retry::race::Race), so a hedge across backends follows the rules of a
//! hedge on one.
//!
//! # Example
//!
//! ```
//! use stormguard_failover::{Adapter, Backend, Failover};
//! use stormguard_retry::ClientLayer;
//!
//! let failover = Failover::new(ClientLayer::default())
//!     .with_backend(Backend::new("openai"))
//!     .with_backend(
//!         Backend::new("backup").with_adapter(
//!             Adapter::new()
//!                 .with_origin("http://127.0.0.1:8081".parse().unwrap())
//!                 .with_model("backup-large"),
//!         ),
//!     );
//! assert_eq!(failover.backends().len(), 2);
//! // let client = tower::ServiceBuilder::new().layer(failover).service(hyper_client);
//! ```

mod backend;
pub mod balance;
mod cooldowns;
mod future;
mod layer;
mod ledger;
mod marks;
mod record;
mod shared;

pub use backend::{Adapter, Backend};
pub use cooldowns::Cooldowns;
pub use future::ResponseFuture;
pub use layer::{Failover, FailoverService};
pub use marks::{Answered, Cure, Degraded, NoBackend};
