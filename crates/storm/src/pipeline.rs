//! The client pipelines compared, all real tower code.
//!
//! | name | what it is |
//! |---|---|
//! | `none` | `tower::timeout::Timeout` per attempt, no retries |
//! | `naive` | `tower::retry::Retry` with [`NaivePolicy`]: retry every failure 3 times, 1 s apart, no budget |
//! | `naive+failover` | `tower::retry::Retry` with [`NaiveFailoverPolicy`]: every failure goes to the other provider at once, 3 retries on each |
//! | `naive-hedge` | [`NaiveHedge`](crate::naive_hedge::NaiveHedge): every request sent twice at once, the first attempt to produce content answers, the other is dropped |
//! | `tower` | `tower::retry::Retry` with [`TowerPolicy`]: `ExponentialBackoff` and `TpsBudget` (10 s, 10/s, 20%) |
//! | `tower-hedge` | `tower::hedge::Hedge` with [`TowerHedgePolicy`]: a second attempt once the first has waited the 95th percentile of the latencies it recorded (20 at least, over 2 s) |
//! | `stormguard` | `stormguard::ClientLayer::default().without_continuation()`: the stream guard alone, a stream cut after content ends with `StreamInterrupted` |
//! | `stormguard+continuation` | `stormguard::ClientLayer::default()`: a stream cut after content is continued |
//! | `stormguard+hedge` | `stormguard::ClientLayer::default().without_continuation().with_hedging(Hedging::default())`: a hedge once an attempt has waited the 95th percentile of the backend's time to first content |
//! | `stormguard+breaker` | `ClientLayer::default()`, with a [`CircuitBreaker`] (`BreakerConfig::default()`) and a [`Fallback`] that answers a degraded 200 locally |
//! | `stormguard+rate-limit` | the same, with a [`RateLimit`] configured with the provider's quota ([`Scenario::quota_per_minute`]) |
//! | `stormguard+adaptive` | the same, with `RateLimit::default()`: no numbers, it learns them from the provider |
//! | `stormguard+bulkhead` | `ClientLayer::default()` with a fixed concurrency limit sized for the healthy provider ([`bulkhead_size`]): the limit of `stormguard+concurrency` without its adaptation |
//! | `resilience-adaptive` | `ClientLayer::default()` over tower-resilience 0.13's `AdaptiveService` (its AIMD, on the bounds and decrease of `stormguard+concurrency`) instead of stormguard's limit |
//! | `stormguard+concurrency` | `ClientLayer::default()` with `ConcurrencyLimit::default()`: learned from the provider's overload answers, held until a stream ends |
//! | `stormguard+failover-no-clocks` | the same failover made from `ClientLayer::default().without_clocks()`: no per-attempt clocks, only the deadline bounds an attempt |
//! | `stormguard+failover` | [`Failover`] over the primary and the secondary, made from the same `ClientLayer` (each provider with the default backend breaker, [`failover::Backend::default_breaker`], and clocks of its own) |
//! | `round-robin` | [`RoundRobin`] over the deployments: each request to the next in turn, each deployment behind an engine of its own made from the same `ClientLayer` |
//! | `ordered-failover` | [`Failover`] over the deployments as ranks of one, in order (`with_backend` for each), each backend with `RateLimit::default()` |
//! | `stormguard+balance` | [`Failover`] with the deployments sharing one rank (`with_rank`): the balancer; each backend with `RateLimit::default()` |
//! | `stormguard+balance+cooldowns` | the same, its replicas sharing their backends' cooldowns (`with_cooldowns(Cooldowns::local())`) |
//!
//! `stormguard` turns continuation off in every scenario, not only where streams are cut, so
//! that a row's name means one configuration: continuation acts on event streams cut after
//! content alone, so where nothing streams (and in `silent`, whose streams are slow to start
//! but never cut) the row is `ClientLayer::default()` in all it does. Every other stormguard
//! row keeps the default, continuation on.
//!
//! Today's pipelines (`none`, `naive`, `naive+failover`, `naive-hedge`, `tower`, `tower-hedge`)
//! time out each attempt after the scenario's `attempt_timeout`; the retry (or hedging) layer sits
//! outside the timeout, so a timed-out attempt is retried. The failover rows need a scenario with
//! two providers (`failover`, `silent`); every other row sends to the primary alone. Where the
//! scenario gives its callers a deadline (`silent`), stormguard's layer is given it too
//! (`ClientLayer::with_timeout`).
//!
//! Where the provider streams (the `streams` scenario), a retry policy sees only the response
//! head, a `200` for a stream that fails later. The `naive` row then also restarts, from its
//! caller, any stream that fails (an error event, a cut), as applications do today: after
//! [`NaivePolicy::INTERVAL`], at most [`NaivePolicy::RETRIES`] times per request (see
//! `sim`). No other row restarts a stream; stormguard's engine retries a stream that fails
//! before its first content event itself, and never restarts one after it: `stormguard` ends it
//! with `StreamInterrupted`, `stormguard+continuation` asks the provider for the rest of the
//! answer (the text received as an assistant prefill) and splices it in.
//!
//! The balance rows (`round-robin`, `ordered-failover`, `stormguard+balance`,
//! `stormguard+balance+cooldowns`) need a scenario with deployments (`balance`, `balance-fleet`)
//! and send to them alone. Every one of them is made of the engine the other stormguard rows use
//! (`ClientLayer::default()`, seeded): the rows differ in how a request finds a deployment, not
//! in how it is retried. `round-robin` gives each deployment an engine of its own (a throttle and
//! clocks of its own, the retry budget shared, as a failover's backends have them) and no rate
//! limit: a round robin knows no quota, and each request stays on its deployment (its retries
//! with it, after the deployment's `Retry-After`), as with a gateway that picks the deployment
//! once. The failover rows give each deployment the backend a gateway operator would configure
//! for it: its name, its origin ([`Adapter::with_origin`]), the default backend breaker and
//! `RateLimit::default()`, which knows no numbers and learns the deployment's quota from the
//! `x-ratelimit-*` headers of its first answer. `ordered-failover` puts them in order as ranks of
//! one (today's failover: the next only when the one before cannot take the request, here when
//! its rate limit cannot fit it within its 2 s wait), `stormguard+balance` in one rank, shared by
//! the balancer. Where the scenario has several replicas (`balance-fleet`), each row is that many
//! of its pipeline, each sent every replica-th request in turn ([`RoundRobin`]), each with its own
//! engines, breakers and throttles, and the replicas' rate limits shared (one per deployment, as
//! a fleet shares a quota through Redis, `RateLimitConfig::with_fleet`);
//! `stormguard+balance+cooldowns` shares their cooldowns too, through one `Cooldowns::local()`.
//!
//! The hedging rows (the `tail` scenario's) differ in what they wait for. stormguard's engine
//! hedges an attempt that has produced no content: for an event stream, no first content event,
//! after the backend's learned 95th percentile of the time to it. The naive hedge races two
//! attempts from the start, and also waits for content. tower's `hedge` sees only the response
//! future, which for a stream ends with its head: it learns the heads' latency, hedges a slow
//! head, and takes the first head as the answer, however late that stream's first token.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use tower::BoxError;
use tower::Layer;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::rng::Rng;

use stormguard::ClientLayer;
use stormguard::breaker::{BreakerConfig, CircuitBreaker, Fallback};
use stormguard::concurrency::{ConcurrencyConfig, ConcurrencyLimit};
use stormguard::failover::{self, Adapter, Cooldowns, Failover, FailoverService};
use stormguard::jitter::{FullJitter, HintPolicy};
use stormguard::rate_limit::{RateLimit, RateLimitConfig};
use stormguard::retry::Hedging;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use tower_resilience::adaptive::{AdaptiveError, AdaptiveService, Aimd};

use crate::backend::Backend;
use crate::round_robin::RoundRobin;
use crate::router::{
    PRIMARY_AUTHORITY, Router, SECONDARY_AUTHORITY, SECONDARY_ORIGIN, deployment_origin,
};
use crate::scenario::Scenario;

/// The request every pipeline sends.
pub(crate) type SimRequest = Request<Full<Bytes>>;

/// Which client pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pipeline {
    /// One attempt with a timeout.
    None,
    /// Retry 3 times, 1 s apart, no budget.
    Naive,
    /// Switch to the other provider on every failure, at once, 3 retries on each.
    NaiveFailover,
    /// Every request sent twice at once, the first attempt with content answers.
    NaiveHedge,
    /// tower's retry with exponential backoff and `TpsBudget`.
    Tower,
    /// tower's hedge: a second attempt after the 95th percentile of the response futures'
    /// latency.
    TowerHedge,
    /// stormguard's `ClientLayer::default().without_continuation()`: streams guarded, never
    /// continued.
    Stormguard,
    /// stormguard's `ClientLayer::default()`, which continues a stream cut after content.
    StormguardContinuation,
    /// stormguard's `ClientLayer::default().without_continuation()` with hedging at the 95th
    /// percentile of the backend's time to first content.
    StormguardHedge,
    /// stormguard's `ClientLayer::default()` with a circuit breaker and a local fallback.
    StormguardBreaker,
    /// stormguard's `ClientLayer::default()` with a rate limit configured with the provider's
    /// quota.
    StormguardRateLimit,
    /// stormguard's `ClientLayer::default()` with a rate limit that learns the provider's.
    StormguardAdaptive,
    /// stormguard's `ClientLayer::default()` with a fixed concurrency limit sized for the
    /// healthy provider.
    StormguardBulkhead,
    /// stormguard's `ClientLayer::default()` over tower-resilience's adaptive concurrency
    /// limiter.
    ResilienceAdaptive,
    /// stormguard's `ClientLayer::default()` with an adaptive concurrency limit.
    StormguardConcurrency,
    /// stormguard's failover over two providers, made from `ClientLayer::default()` without its
    /// per-attempt clocks.
    StormguardFailoverNoClocks,
    /// stormguard's failover over two providers, made from `ClientLayer::default()`.
    StormguardFailover,
    /// Each request to the next deployment in turn, each deployment behind an engine of its own.
    RoundRobin,
    /// stormguard's failover over the deployments as ranks of one, in order.
    OrderedFailover,
    /// stormguard's failover with the deployments in one rank: the balancer.
    StormguardBalance,
    /// The balancer, its replicas sharing their backends' cooldowns.
    StormguardBalanceCooldowns,
}

impl Pipeline {
    /// Every pipeline, in report order.
    pub const ALL: [Pipeline; 21] = [
        Pipeline::None,
        Pipeline::Naive,
        Pipeline::NaiveFailover,
        Pipeline::NaiveHedge,
        Pipeline::Tower,
        Pipeline::TowerHedge,
        Pipeline::Stormguard,
        Pipeline::StormguardContinuation,
        Pipeline::StormguardHedge,
        Pipeline::StormguardBreaker,
        Pipeline::StormguardRateLimit,
        Pipeline::StormguardAdaptive,
        Pipeline::StormguardBulkhead,
        Pipeline::ResilienceAdaptive,
        Pipeline::StormguardConcurrency,
        Pipeline::StormguardFailoverNoClocks,
        Pipeline::StormguardFailover,
        Pipeline::RoundRobin,
        Pipeline::OrderedFailover,
        Pipeline::StormguardBalance,
        Pipeline::StormguardBalanceCooldowns,
    ];

    /// What the registry says of the pipeline.
    fn entry(self) -> &'static Entry {
        &REGISTRY[self as usize]
    }

    /// How many times the pipeline's caller restarts a stream that failed, from its start: the
    /// `naive` row's, [`NaivePolicy::RETRIES`], as applications do with today's SDKs (whose
    /// retries see only the response head); no other row restarts a stream.
    pub fn stream_restarts(self) -> u32 {
        self.entry().stream_restarts
    }

    /// Whether the pipeline is made of stormguard's layers, whose engine emits the metrics of
    /// `stormguard::metrics` (see [`dashboard`](crate::output::dashboard)).
    pub fn uses_stormguard(self) -> bool {
        self.entry().stormguard
    }

    /// Whether the pipeline shares the load among a balance scenario's deployments (and needs a
    /// scenario that has them).
    pub fn balances(self) -> bool {
        self.entry().needs == Needs::Deployments
    }

    /// Whether the pipeline sends to two providers (and needs a scenario that has them).
    pub fn fails_over(self) -> bool {
        self.entry().needs == Needs::TwoProviders
    }

    /// The name used on the command line and in the report.
    pub fn as_str(self) -> &'static str {
        self.entry().name
    }

    /// What the pipeline is, for `--help`.
    pub fn help(self) -> &'static str {
        self.entry().help
    }

    /// Parse a comma-separated list (`none,naive,tower,stormguard`), keeping report order and
    /// dropping duplicates.
    pub fn parse_list(list: &str) -> Result<Vec<Pipeline>, UnknownPipeline> {
        let mut chosen = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            chosen.push(name.parse::<Pipeline>()?);
        }
        Ok(Pipeline::ALL
            .into_iter()
            .filter(|p| chosen.contains(p))
            .collect())
    }
}

/// What a pipeline needs of the scenario's providers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Any provider: it sends to the primary.
    OneProvider,
    /// Two providers (`failover`, `silent`).
    TwoProviders,
    /// Deployments of one model (`balance`, `balance-fleet`).
    Deployments,
}

/// What the simulator knows of a pipeline, in [`REGISTRY`]; how it is built is [`crate::sim`]'s.
struct Entry {
    /// The pipeline this entry describes (its place in [`REGISTRY`] is the variant's).
    pipeline: Pipeline,
    /// The name on the command line and in the report.
    name: &'static str,
    /// What it is, for `--help` (lines of at most 90 characters).
    help: &'static str,
    /// Whether it is made of stormguard's layers, whose engine emits `stormguard::metrics`.
    stormguard: bool,
    /// The providers it needs.
    needs: Needs,
    /// How many times its caller restarts a stream that failed, from its start.
    stream_restarts: u32,
}

/// Every pipeline, in report order (the order of [`Pipeline`]'s variants): one entry each.
const REGISTRY: [Entry; 21] = [
    Entry {
        pipeline: Pipeline::None,
        name: "none",
        help: "One attempt, timed out after --attempt-timeout; no retries.",
        stormguard: false,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::Naive,
        name: "naive",
        help: "Retries every failure 3 times, 1 s apart, with no budget; in streams its caller also\n\
             restarts a stream that failed, from the start.",
        stormguard: false,
        needs: Needs::OneProvider,
        stream_restarts: NaivePolicy::RETRIES,
    },
    Entry {
        pipeline: Pipeline::NaiveFailover,
        name: "naive+failover",
        help: "Sends every failure to the other provider at once, 3 retries on each (two providers\n\
             only).",
        stormguard: false,
        needs: Needs::TwoProviders,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::NaiveHedge,
        name: "naive-hedge",
        help: "Sends every request twice at once; the first attempt to produce content (a stream's\n\
             first content event) answers, the other is dropped. No budget.",
        stormguard: false,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::Tower,
        name: "tower",
        help: "tower's retry with ExponentialBackoff and TpsBudget (10 s, 10/s, 20%).",
        stormguard: false,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::TowerHedge,
        name: "tower-hedge",
        help: "tower's hedge: a second attempt once the first has waited the 95th percentile of the\n\
             latencies it recorded (20 at least, over 2 s periods). It sees the response future\n\
             alone: a stream's head, not its first content.",
        stormguard: false,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::Stormguard,
        name: "stormguard",
        help: "stormguard::ClientLayer::default().without_continuation(): one deadline across all\n\
             attempts, a retry budget, adaptive throttling, jitter and the provider's hints, and\n\
             event streams retried before their first content, never restarted after it: a stream\n\
             cut after content ends with StreamInterrupted. Continuation is off in every scenario\n\
             (it acts on cut streams alone: elsewhere the row is ClientLayer::default()).",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardContinuation,
        name: "stormguard+continuation",
        help: "stormguard::ClientLayer::default(), continuation on: a stream cut after content is\n\
             continued (the text received as an assistant prefill, under the retry budget) and\n\
             spliced into the caller's, every token once.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardHedge,
        name: "stormguard+hedge",
        help: "stormguard (continuation off, as its row) with hedging: an attempt that has produced\n\
             no content (a stream's first content event) after the backend's learned 95th\n\
             percentile of the time to it is hedged once, from the retry budget; the first with\n\
             content answers, the other is cancelled.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardBreaker,
        name: "stormguard+breaker",
        help: "ClientLayer::default() with a circuit breaker and a local fallback that answers a\n\
             degraded 200 (counted as a fallback, never as a success).",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardRateLimit,
        name: "stormguard+rate-limit",
        help: "ClientLayer::default() with a rate limit configured with the provider's quota.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardAdaptive,
        name: "stormguard+adaptive",
        help: "ClientLayer::default() with RateLimit::default(), which learns the quota from the\n\
             provider.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardBulkhead,
        name: "stormguard+bulkhead",
        help: "ClientLayer::default() with a fixed concurrency limit sized by hand for the healthy\n\
             provider (its attempts in flight by Little's law, plus a quarter): the\n\
             concurrency row's limit without its adaptation.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::ResilienceAdaptive,
        name: "resilience-adaptive",
        help: "ClientLayer::default() over tower-resilience 0.13's adaptive limiter (AIMD from 20,\n\
             bounds 3 to 1,000, x0.9 on a failure) instead of stormguard's limit: it frees a\n\
             place when the response head arrives and counts an answer that is not an Err\n\
             (a 429 too) as a success.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardConcurrency,
        name: "stormguard+concurrency",
        help: "ClientLayer::default() with ConcurrencyLimit::default(): an adaptive limit on the\n\
             attempts in flight, learned from the provider's overload answers (x0.9 on a 429),\n\
             grown while it is used, a stream holding its place until its end.",
        stormguard: true,
        needs: Needs::OneProvider,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardFailoverNoClocks,
        name: "stormguard+failover-no-clocks",
        help: "stormguard+failover made from ClientLayer::default().without_clocks(): no\n\
             per-attempt clocks, only the deadline bounds an attempt (two providers only).",
        stormguard: true,
        needs: Needs::TwoProviders,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardFailover,
        name: "stormguard+failover",
        help: "stormguard's Failover over the primary and the secondary, each with its default\n\
             breaker and per-attempt clocks of its own (two providers only).",
        stormguard: true,
        needs: Needs::TwoProviders,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::RoundRobin,
        name: "round-robin",
        help: "Each request to the next deployment in turn, behind an engine of its own made from\n\
             ClientLayer::default() (its retries stay on its deployment); no rate limit\n\
             (deployments only).",
        stormguard: true,
        needs: Needs::Deployments,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::OrderedFailover,
        name: "ordered-failover",
        help: "stormguard's Failover with the deployments as ranks of one, in order (with_backend\n\
             each), each with its default breaker and RateLimit::default(), which learns its quota\n\
             from the headers: the next only when the one before cannot take the request\n\
             (deployments only).",
        stormguard: true,
        needs: Needs::Deployments,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardBalance,
        name: "stormguard+balance",
        help: "stormguard's Failover with the deployments in one rank (with_rank), the same backends:\n\
             the balancer sends each request to the cheaper of two drawn (latency, requests in\n\
             flight, rate-limit headroom) (deployments only).",
        stormguard: true,
        needs: Needs::Deployments,
        stream_restarts: 0,
    },
    Entry {
        pipeline: Pipeline::StormguardBalanceCooldowns,
        name: "stormguard+balance+cooldowns",
        help: "stormguard+balance, its replicas sharing their breakers' cooldowns\n\
             (with_cooldowns(Cooldowns::local())): a deployment one replica's breaker left, the\n\
             others leave too (deployments only; with one replica, as stormguard+balance).",
        stormguard: true,
        needs: Needs::Deployments,
        stream_restarts: 0,
    },
];

impl fmt::Display for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown pipeline name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPipeline(pub String);

impl fmt::Display for UnknownPipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = REGISTRY.iter().map(|entry| entry.name).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        write!(
            f,
            "unknown pipeline `{}` (expected {} or {last})",
            self.0,
            rest.join(", ")
        )
    }
}

impl std::error::Error for UnknownPipeline {}

impl FromStr for Pipeline {
    type Err = UnknownPipeline;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        REGISTRY
            .iter()
            .find(|entry| entry.name == s)
            .map(|entry| entry.pipeline)
            .ok_or_else(|| UnknownPipeline(s.to_owned()))
    }
}

/// What today's retry policies count as a failure worth retrying: a transport error or timeout,
/// 429, or any 5xx (529 included).
fn is_failure<B>(result: &Result<Response<B>, BoxError>) -> bool {
    match result {
        Ok(response) => {
            let status = response.status();
            status.is_server_error() || status.as_u16() == 429
        }
        Err(_) => true,
    }
}

/// A copy of `req` to send again.
pub(crate) fn clone_request(req: &SimRequest) -> SimRequest {
    let mut clone = Request::new(req.body().clone());
    *clone.method_mut() = req.method().clone();
    *clone.uri_mut() = req.uri().clone();
    *clone.version_mut() = req.version();
    *clone.headers_mut() = req.headers().clone();
    clone
}

/// The naive policy: retry every failure up to [`NaivePolicy::RETRIES`] times, each after a
/// fixed [`NaivePolicy::INTERVAL`]. No budget, no jitter, no reading of `Retry-After`.
#[derive(Clone, Debug, Default)]
pub(crate) struct NaivePolicy {
    retries: u32,
}

impl NaivePolicy {
    /// Retries per request.
    pub(crate) const RETRIES: u32 = 3;
    /// Fixed pause before each retry.
    pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
}

impl<B> Policy<SimRequest, Response<B>, BoxError> for NaivePolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _req: &mut SimRequest,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        if !is_failure(result) || self.retries >= Self::RETRIES {
            return None;
        }
        self.retries += 1;
        Some(tokio::time::sleep(Self::INTERVAL))
    }

    fn clone_request(&mut self, req: &SimRequest) -> Option<SimRequest> {
        Some(clone_request(req))
    }
}

/// The naive failover: every failure (as [`NaivePolicy`] counts them) sends the next attempt to
/// the other provider, at once, until a provider would get more than
/// [`NaiveFailoverPolicy::RETRIES`] retries: the attempts alternate primary, secondary, primary,
/// ..., at most 4 on the primary and 3 on the secondary. No budget, no health of either
/// provider: every request starts on the primary, whatever happened to the ones before it.
#[derive(Clone, Debug, Default)]
pub(crate) struct NaiveFailoverPolicy {
    /// Retries sent to the primary and to the secondary.
    retries: [u32; 2],
    /// Whether the attempt in flight went to the secondary.
    on_secondary: bool,
}

impl NaiveFailoverPolicy {
    /// Retries per provider.
    pub(crate) const RETRIES: u32 = 3;
}

impl<B> Policy<SimRequest, Response<B>, BoxError> for NaiveFailoverPolicy {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        req: &mut SimRequest,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        let next = usize::from(!self.on_secondary);
        if !is_failure(result) || self.retries[next] >= Self::RETRIES {
            return None;
        }
        self.retries[next] += 1;
        self.on_secondary = !self.on_secondary;
        let authority = if self.on_secondary {
            SECONDARY_AUTHORITY
        } else {
            PRIMARY_AUTHORITY
        };
        let mut parts = req.uri().clone().into_parts();
        parts.authority = http::uri::Authority::from_maybe_shared(authority).ok();
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        Some(std::future::ready(()))
    }

    fn clone_request(&mut self, req: &SimRequest) -> Option<SimRequest> {
        Some(clone_request(req))
    }
}

/// A seeded random source for tower's backoff.
///
/// Like tower's own `HasherRng`, it is copied (not shared) when the backoff maker hands out a
/// backoff, so every request's backoff draws the same sequence of jitter factors.
#[derive(Clone, Debug)]
pub(crate) struct SeededRng(SmallRng);

impl SeededRng {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> SeededRng {
        SeededRng(SmallRng::seed_from_u64(seed))
    }
}

impl Rng for SeededRng {
    fn next_u64(&mut self) -> u64 {
        self.0.random()
    }
}

/// tower's retry as its documentation shows it: `TpsBudget` and `ExponentialBackoff`.
///
/// Every original request deposits into the budget (as Finagle's budget, which `TpsBudget`
/// follows, is used); every retry withdraws. Retries stop after [`TowerPolicy::RETRIES`] or when
/// the budget is empty.
#[derive(Clone, Debug)]
pub(crate) struct TowerPolicy {
    budget: Arc<TpsBudget>,
    backoff: ExponentialBackoff<SeededRng>,
    retries: u32,
}

impl TowerPolicy {
    /// Retries per request at most (as in the naive policy).
    pub(crate) const RETRIES: u32 = 3;
    /// Budget window: tower's default.
    pub(crate) const BUDGET_TTL: Duration = Duration::from_secs(10);
    /// Retries per second always allowed: tower's default.
    pub(crate) const BUDGET_MIN_PER_SEC: u32 = 10;
    /// Retries per deposit: tower's default.
    pub(crate) const BUDGET_RATIO: f32 = 0.2;
    /// First backoff: tower's default.
    pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(50);
    /// Longest backoff.
    pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);
    /// Jitter ratio: tower's default.
    pub(crate) const BACKOFF_JITTER: f64 = 0.99;

    /// A policy (cloned per request by tower) sharing one budget.
    pub fn new(seed: u64) -> Result<TowerPolicy, BoxError> {
        let mut maker = ExponentialBackoffMaker::new(
            Self::BACKOFF_MIN,
            Self::BACKOFF_MAX,
            Self::BACKOFF_JITTER,
            SeededRng::new(seed),
        )?;
        Ok(TowerPolicy {
            budget: Arc::new(TpsBudget::new(
                Self::BUDGET_TTL,
                Self::BUDGET_MIN_PER_SEC,
                Self::BUDGET_RATIO,
            )),
            backoff: maker.make_backoff(),
            retries: 0,
        })
    }
}

impl<B> Policy<SimRequest, Response<B>, BoxError> for TowerPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _req: &mut SimRequest,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        if self.retries == 0 {
            self.budget.deposit();
        }
        if !is_failure(result) || self.retries >= Self::RETRIES || !self.budget.withdraw() {
            return None;
        }
        self.retries += 1;
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, req: &SimRequest) -> Option<SimRequest> {
        Some(clone_request(req))
    }
}

/// tower's hedge policy: every request may be hedged (its body is a `Full`, cloned as it is).
///
/// The settings are those the AWS S3 Transfer Manager for Rust gives tower's hedge
/// (`awslabs/aws-s3-transfer-manager-rs`, `aws-s3-transfer-manager/src/middleware/hedge.rs`): a
/// hedge once the request has waited the 95th percentile of the latencies recorded over the last
/// period, no hedge before 20 are recorded, periods of 2 s. The same percentile and minimum as
/// stormguard's `Hedging::default()` and its clocks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TowerHedgePolicy;

impl TowerHedgePolicy {
    /// Latencies recorded before the first hedge.
    pub(crate) const MIN_DATA_POINTS: u64 = 20;
    /// The quantile (0 to 1) of the recorded latencies a request waits before it is hedged.
    pub(crate) const LATENCY_PERCENTILE: f32 = 0.95;
    /// How long each of tower's two rotating histograms records: a hedge's delay is read from
    /// the previous period's.
    pub(crate) const PERIOD: Duration = Duration::from_secs(2);
}

impl tower::hedge::Policy<SimRequest> for TowerHedgePolicy {
    fn clone_request(&self, req: &SimRequest) -> Option<SimRequest> {
        Some(clone_request(req))
    }

    fn can_retry(&self, _req: &SimRequest) -> bool {
        true
    }
}

/// tower's hedge around `attempt` (the provider, each attempt timed out) with
/// [`TowerHedgePolicy`], shared by the callers ([`Shared`]: tower's `Hedge` is not `Clone`).
pub(crate) fn tower_hedge<S>(attempt: S) -> Shared<tower::hedge::Hedge<S, TowerHedgePolicy>>
where
    S: tower::Service<SimRequest> + Clone,
    S::Error: Into<BoxError>,
{
    Shared::new(tower::hedge::Hedge::new(
        attempt,
        TowerHedgePolicy,
        TowerHedgePolicy::MIN_DATA_POINTS,
        TowerHedgePolicy::LATENCY_PERCENTILE,
        TowerHedgePolicy::PERIOD,
    ))
}

/// One service shared by the callers of a run, on its one thread: what a client does with one
/// instance of a service that is not `Clone` (tower's `Hedge`). Readiness is asked of the shared
/// instance and the call made on it later; sound here because every service under it is always
/// ready (the provider is), so a caller's readiness is never taken by another's call.
pub struct Shared<S>(Rc<RefCell<S>>);

impl<S> Shared<S> {
    /// `service`, shared by the clones.
    pub fn new(service: S) -> Self {
        Self(Rc::new(RefCell::new(service)))
    }
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self(Rc::clone(&self.0))
    }
}

impl<S: tower::Service<R>, R> tower::Service<R> for Shared<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.borrow_mut().poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.0.borrow_mut().call(req)
    }
}

/// The body of the breaker pipeline's fallback: a chat completion that says it is degraded.
const FALLBACK_BODY: &[u8] = br#"{"object":"chat.completion","degraded":true,"choices":[{"message":{"role":"assistant","content":"The model is unavailable right now; this is a local answer."}}]}"#;

/// The name of the provider (the primary, where there are two), as stormguard's layers call it:
/// the `gen_ai.provider.name` label of their metrics.
pub(crate) const PRIMARY: &str = "primary";

/// The name of the secondary provider, as stormguard's failover calls it.
pub(crate) const SECONDARY: &str = "secondary";

/// `ClientLayer::default()`, named [`PRIMARY`] (a failover names each backend's), with the
/// scenario's seed handed to every part that draws random numbers (throttle, backoff, hint
/// jitter) so that runs repeat exactly, and the callers' deadline where the scenario gives one
/// ([`Scenario::deadline`]). Nothing else differs from the default: the name is only the label
/// of the metrics and the field of the spans.
fn client_layer(scenario: &Scenario) -> ClientLayer {
    let layer = ClientLayer::default()
        .with_name(PRIMARY)
        .with_throttle(AdaptiveThrottle::new(
            ThrottleConfig::default().with_seed(scenario.seed ^ 0x7407_7e00),
        ))
        .with_backoff(FullJitter::default().with_seed(scenario.seed ^ 0xbac0_ff00))
        .with_hint_policy(HintPolicy::default().with_seed(scenario.seed ^ 0x4147_0000));
    match scenario.deadline {
        Some(deadline) => layer.with_timeout(deadline),
        None => layer,
    }
}

/// The engine around the provider without continuation: a stream cut after content ends with
/// its in-band error event and `StreamInterrupted`.
pub(crate) type NotContinuing = stormguard::ClientService<
    Backend,
    stormguard::classify::LlmClassifier,
    stormguard::jitter::FullJitter,
    stormguard::retry::NotContinuing,
>;

/// stormguard's client pipeline around the provider, its stream guard alone:
/// `ClientLayer::default().without_continuation()`, seeded. A stream cut after content ends
/// with the in-band error event and `StreamInterrupted`; nothing else differs from the default
/// (see the [module docs](self) for why in every scenario).
pub(crate) fn stormguard(backend: Backend, scenario: &Scenario) -> NotContinuing {
    client_layer(scenario).without_continuation().layer(backend)
}

/// stormguard's client pipeline around the provider with hedging:
/// `ClientLayer::default().without_continuation().with_hedging(Hedging::default())`, seeded.
/// An attempt that has produced no content (no first content event, for a stream) after the
/// backend's learned 95th percentile of the time to it is hedged, once, with the retry budget's
/// grant; the first to produce content answers, the other is cancelled. Continuation is off,
/// as in [`stormguard()`]'s row, so that the two rows differ in hedging alone.
pub(crate) fn stormguard_hedge(backend: Backend, scenario: &Scenario) -> NotContinuing {
    client_layer(scenario)
        .without_continuation()
        .with_hedging(Hedging::default())
        .layer(backend)
}

/// stormguard's client pipeline around the provider as it ships: `ClientLayer::default()`,
/// seeded, which continues a stream cut after content (its own withdrawal from the retry
/// budget, the same `REQUEST_ID` header, the text received as the prefill).
pub(crate) fn stormguard_continuation(
    backend: Backend,
    scenario: &Scenario,
) -> stormguard::ClientService<Backend> {
    client_layer(scenario).layer(backend)
}

/// stormguard's client pipeline with a circuit breaker (`BreakerConfig::default()`, seeded) and a
/// fallback that answers 200 with a small degraded chat completion (`FALLBACK_BODY`) while the
/// breaker refuses, and for the attempts a stall cuts. The breaker is returned too, to watch it.
pub(crate) fn stormguard_breaker(
    backend: Backend,
    scenario: &Scenario,
) -> (stormguard::ClientService<Backend>, CircuitBreaker) {
    let breaker =
        CircuitBreaker::new(BreakerConfig::default().with_seed(scenario.seed ^ 0xb4ea_6e00));
    let fallback = Fallback::new(|_head, _refused| {
        let mut answer = Response::new(Bytes::from_static(FALLBACK_BODY));
        answer
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        answer
    });
    let client = client_layer(scenario)
        .with_breaker(breaker.clone())
        .with_fallback(fallback)
        .layer(backend);
    (client, breaker)
}

/// stormguard's client pipeline with a rate limit configured with the provider's quota (its
/// requests and tokens a minute; where the provider states none, the limit has no numbers and
/// learns them, as `stormguard+adaptive`'s): `ClientLayer::default()` (seeded)
/// `.with_rate_limit(RateLimit::new(RateLimitConfig::default().with_requests_per_minute(..)
/// .with_tokens_per_minute(..)))`.
pub(crate) fn stormguard_rate_limit(
    backend: Backend,
    scenario: &Scenario,
) -> stormguard::ClientService<Backend> {
    let (requests, tokens) = scenario.quota_per_minute();
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(requests)
            .with_tokens_per_minute(tokens),
    );
    client_layer(scenario).with_rate_limit(limit).layer(backend)
}

/// The secondary's quota, as its operator would set it: 90% of what it can complete a second,
/// a burst of 100 ms, and a wait of up to 30 s. It paces what fails over to it: the requests in
/// flight on the primary when it falls come on top of the whole load, more than the secondary's
/// spare slots, and wait their turn instead of overloading it.
fn secondary_quota(scenario: &Scenario) -> Option<RateLimit> {
    let secondary = scenario.secondary()?;
    let per_second = secondary.throughput_at(Duration::ZERO) * SECONDARY_QUOTA_SHARE;
    let per_minute = (per_second * 60.0).floor().min(f64::from(u32::MAX)) as u32;
    Some(RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(per_minute.max(1)))
            .without_learning()
            .with_burst(Duration::from_millis(100))
            .with_max_wait(Duration::from_secs(30)),
    ))
}

/// The share of its capacity the secondary's quota allows.
const SECONDARY_QUOTA_SHARE: f64 = 0.9;

/// stormguard's failover over the scenario's two providers: `Failover::new(ClientLayer::default())`
/// (seeded) with a backend [`PRIMARY`] (requests as they are) and a backend [`SECONDARY`] (rewritten
/// for the secondary's origin, [`SECONDARY_ORIGIN`]), each with the default backend breaker
/// ([`failover::Backend::default_breaker`], seeded) and per-attempt clocks of its own (the
/// failover gives each backend fresh ones). The primary's breaker is returned too, to watch it.
pub(crate) fn stormguard_failover(
    router: Router,
    scenario: &Scenario,
) -> (FailoverService<Router>, CircuitBreaker) {
    failover_over(router, scenario, client_layer(scenario))
}

/// [`stormguard_failover`] made from `ClientLayer::default().without_clocks()`: no backend has
/// per-attempt clocks, and only the deadline (and the stream guard's own limits) bound an
/// attempt.
pub(crate) fn stormguard_failover_without_clocks(
    router: Router,
    scenario: &Scenario,
) -> (FailoverService<Router>, CircuitBreaker) {
    failover_over(router, scenario, client_layer(scenario).without_clocks())
}

/// The failover of [`stormguard_failover`], made from `layer`.
fn failover_over(
    router: Router,
    scenario: &Scenario,
    layer: ClientLayer,
) -> (FailoverService<Router>, CircuitBreaker) {
    let breaker = |salt: u64| {
        CircuitBreaker::new(
            failover::Backend::default_breaker()
                .config()
                .with_seed(scenario.seed ^ salt),
        )
    };
    let primary = breaker(0xb4ea_6e01);
    let secondary = Adapter::new().with_origin(http::Uri::from_static(SECONDARY_ORIGIN));
    let mut backup = failover::Backend::new(SECONDARY)
        .with_adapter(secondary)
        .with_breaker(breaker(0xb4ea_6e02));
    if let Some(quota) = secondary_quota(scenario) {
        backup = backup.with_rate_limit(quota);
    }
    let failover = Failover::new(layer)
        .with_backend(failover::Backend::new(PRIMARY).with_breaker(primary.clone()))
        .with_backend(backup);
    (failover.layer(router), primary)
}

/// stormguard's client pipeline with a rate limit that learns the provider's quota from its
/// headers and its 429s: `ClientLayer::default()` (seeded) `.with_rate_limit(RateLimit::default())`.
pub(crate) fn stormguard_adaptive(
    backend: Backend,
    scenario: &Scenario,
) -> stormguard::ClientService<Backend> {
    client_layer(scenario)
        .with_rate_limit(RateLimit::default())
        .layer(backend)
}

/// The headroom a hand-sized bulkhead gets over the attempts in flight it was sized for: a
/// quarter, as capacity is commonly planned.
const BULKHEAD_HEADROOM: f64 = 1.25;

/// The fixed limit of the `stormguard+bulkhead` row: what someone sizing it by hand from the
/// healthy provider would set, its attempts in flight by Little's law (the offered rate times the
/// healthy mean service time) plus [`BULKHEAD_HEADROOM`].
pub(crate) fn bulkhead_size(scenario: &Scenario) -> u32 {
    let mean = scenario.mean_service_time(scenario.baseline.median);
    let in_flight = scenario.qps * mean.as_secs_f64() * BULKHEAD_HEADROOM;
    in_flight.ceil().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// stormguard's client pipeline with a fixed concurrency limit of [`bulkhead_size`]:
/// `ClientLayer::default()` (seeded) `.with_concurrency(..)` with `ConcurrencyConfig::fixed`.
/// The limit is returned too, to watch it.
pub(crate) fn stormguard_bulkhead(
    backend: Backend,
    scenario: &Scenario,
) -> (stormguard::ClientService<Backend>, ConcurrencyLimit) {
    let size = bulkhead_size(scenario);
    let limit = ConcurrencyLimit::new(ConcurrencyConfig::fixed(size));
    let client = client_layer(scenario)
        .with_concurrency(limit.clone())
        .layer(backend);
    (client, limit)
}

/// The engine of the adaptive rows around tower-resilience's limiter.
pub(crate) type ResilienceClient = stormguard::ClientService<
    tower::util::MapErr<AdaptiveService<Backend, Aimd>, fn(AdaptiveError<Infallible>) -> BoxError>,
>;

/// stormguard's client pipeline over tower-resilience 0.13's adaptive concurrency limiter in
/// place of its own: `ClientLayer::default()` (seeded) around an `AdaptiveService` with its
/// AIMD on the bounds and decrease of [`ConcurrencyConfig::default`] (20 to start, 3 to 1,000,
/// x0.9), growing by one on each answer. Its latency threshold is the scenario's attempt
/// timeout, so that it reads no healthy answer as slow; it measures time with `std::time`,
/// which the simulator's virtual clock does not move, so no answer here is slow to it anyway.
/// The algorithm is returned too, to watch its limit.
pub(crate) fn resilience_adaptive(
    backend: Backend,
    scenario: &Scenario,
) -> Result<(ResilienceClient, Arc<Aimd>), BoxError> {
    let defaults = ConcurrencyConfig::default();
    let (min, max) = defaults.bounds();
    let aimd = Aimd::builder()
        .initial_limit(defaults.initial() as usize)
        .min_limit(min as usize)
        .max_limit(max as usize)
        .decrease_factor(defaults.backoff())
        .latency_threshold(scenario.attempt_timeout)
        .build()
        .map_err(|error| BoxError::from(error.to_string()))?;
    let aimd = Arc::new(aimd);
    // The backend never fails; the limiter fails only once its semaphore is closed.
    let unwrap: fn(AdaptiveError<Infallible>) -> BoxError =
        |error| BoxError::from(error.to_string());
    let limited = tower::util::MapErr::new(AdaptiveService::new(backend, aimd.clone()), unwrap);
    Ok((client_layer(scenario).layer(limited), aimd))
}

/// stormguard's client pipeline with an adaptive concurrency limit: `ClientLayer::default()`
/// (seeded) `.with_concurrency(ConcurrencyLimit::default())`. The limit is returned too, to
/// watch it.
pub(crate) fn stormguard_concurrency(
    backend: Backend,
    scenario: &Scenario,
) -> (stormguard::ClientService<Backend>, ConcurrencyLimit) {
    let limit = ConcurrencyLimit::default();
    let client = client_layer(scenario)
        .with_concurrency(limit.clone())
        .layer(backend);
    (client, limit)
}

/// Mixed, times the replica's number, into the seed each replica of a gateway draws with, so
/// that the replicas draw apart; replica 0 draws with the scenario's seed.
const REPLICA_SEED: u64 = 0x4e91_1ca0_0000_0001;

/// `scenario` as replica `replica` of its gateway draws it: its seed, mixed with the replica's
/// number.
fn replica_scenario(scenario: &Scenario, replica: u32) -> Scenario {
    let seed = scenario.seed ^ REPLICA_SEED.wrapping_mul(u64::from(replica));
    scenario.clone().with_seed(seed)
}

/// `layer` for deployment `name` alone: named after it, with a throttle and clocks of its own
/// (the layer's settings), its retry budget shared with every other made from `layer`, as a
/// failover gives each backend its own.
fn own_engine(layer: &ClientLayer, name: &str) -> ClientLayer {
    let throttle = layer.throttle().map(|t| *t.config()).unwrap_or_default();
    let own = layer
        .clone()
        .with_name(name)
        .with_throttle(AdaptiveThrottle::new(throttle));
    match layer.clocks() {
        Some(clocks) => own.with_clocks(clocks.fresh()),
        None => own,
    }
}

/// The `round-robin` row over `scenario`'s deployments (`providers`, one each, in the order of
/// [`Scenario::deployments`]): each request to the next deployment in turn
/// ([`RoundRobin`]), each deployment behind an engine of its own made from
/// `ClientLayer::default()` (seeded; [`own_engine`]) over a router to it alone, no rate limit
/// (see the [module docs](self)). One per replica of the gateway, each sent every replica-th
/// request.
pub(crate) fn round_robin(
    providers: &[Backend],
    scenario: &Scenario,
) -> RoundRobin<RoundRobin<stormguard::ClientService<Router>>> {
    let replicas = (0..scenario.replicas.max(1))
        .map(|replica| {
            let layer = client_layer(&replica_scenario(scenario, replica));
            let engines = scenario
                .deployments
                .iter()
                .zip(providers)
                .map(|(deployment, provider)| {
                    let alone = Router::deployments(vec![(deployment.name, provider.clone())]);
                    own_engine(&layer, deployment.name).layer(alone)
                })
                .collect();
            RoundRobin::new(engines)
        })
        .collect();
    RoundRobin::new(replicas)
}

/// How a balance row ranks the deployments in its failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ranking {
    /// Ranks of one, in the order of the scenario's deployments (`with_backend` for each):
    /// today's ordered failover.
    InOrder,
    /// One rank (`with_rank`), shared by the balancer.
    Balanced,
}

/// The balance rows' gateway: one failover per replica, each sent every replica-th request in
/// turn, and the breaker each replica has for the scenario's dying deployment (none without
/// one), to watch.
pub(crate) struct Gateway {
    /// The replicas, in turn.
    pub replicas: RoundRobin<FailoverService<Router>>,
    /// Each replica's breaker of the dying deployment.
    pub dying: Vec<CircuitBreaker>,
}

/// The failover rows over `scenario`'s deployments through `router` (`ordered-failover`,
/// `stormguard+balance`, `stormguard+balance+cooldowns`): per replica of the gateway,
/// `Failover::new(ClientLayer::default())` (seeded) with a backend per deployment, named after
/// it, sent to its origin ([`deployment_origin`]), with the default backend breaker (seeded
/// apart per replica and deployment) and the deployment's rate limit, `RateLimit::default()`,
/// one per deployment that the replicas share (see the [module docs](self)); ranked as
/// `ranking` says, the balancer's draws seeded; with `cooldowns`, the replicas share one
/// `Cooldowns::local()`.
pub(crate) fn gateway(
    router: Router,
    scenario: &Scenario,
    ranking: Ranking,
    cooldowns: bool,
) -> Gateway {
    let limits: Vec<RateLimit> = scenario
        .deployments
        .iter()
        .map(|_| RateLimit::default())
        .collect();
    let shared = Cooldowns::local();
    let mut dying = Vec::new();
    let replicas = (0..scenario.replicas.max(1))
        .map(|replica| {
            let own = replica_scenario(scenario, replica);
            let backends: Vec<failover::Backend> = (scenario.deployments.iter().zip(&limits))
                .enumerate()
                .map(|(index, (deployment, limit))| {
                    let salt = 0xb4ea_6e10 + index as u64;
                    let breaker = CircuitBreaker::new(
                        failover::Backend::default_breaker()
                            .config()
                            .with_seed(own.seed ^ salt),
                    );
                    if scenario.dying == Some(index) {
                        dying.push(breaker.clone());
                    }
                    let origin = Adapter::new().with_origin(deployment_origin(deployment.name));
                    failover::Backend::new(deployment.name)
                        .with_adapter(origin)
                        .with_breaker(breaker)
                        .with_rate_limit(limit.clone())
                })
                .collect();
            let mut failover = Failover::new(client_layer(&own)).with_seed(own.seed ^ 0xba1a_9ce0);
            failover = match ranking {
                Ranking::InOrder => backends
                    .into_iter()
                    .fold(failover, |failover, backend| failover.with_backend(backend)),
                Ranking::Balanced => failover.with_rank(backends),
            };
            if cooldowns {
                failover = failover.with_cooldowns(shared.clone());
            }
            failover.layer(router.clone())
        })
        .collect();
    Gateway {
        replicas: RoundRobin::new(replicas),
        dying,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenarios;

    #[test]
    fn the_registry_has_one_entry_per_pipeline_in_order() {
        for (entry, pipeline) in REGISTRY.iter().zip(Pipeline::ALL) {
            assert_eq!(entry.pipeline, pipeline, "{}", entry.name);
        }
        assert_eq!(REGISTRY.len(), Pipeline::ALL.len());
    }
    use http::StatusCode;

    fn response(status: u16) -> Result<Response<()>, BoxError> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok(r)
    }

    #[tokio::test(start_paused = true)]
    async fn naive_retries_every_failure_three_times_one_second_apart() {
        let mut policy = NaivePolicy::default();
        let mut req = Request::new(Full::new(Bytes::new()));
        assert!(policy.retry(&mut req, &mut response(200)).is_none());
        assert!(policy.retry(&mut req, &mut response(400)).is_none());
        for status in [503, 529, 429] {
            let sleep = policy.retry(&mut req, &mut response(status)).unwrap();
            assert_eq!(
                sleep.deadline() - tokio::time::Instant::now(),
                Duration::from_secs(1)
            );
        }
        assert!(
            policy.retry(&mut req, &mut response(503)).is_none(),
            "three retries at most"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tower_policy_stops_when_the_budget_is_empty() {
        let policy = TowerPolicy::new(1).unwrap();
        let mut req = Request::new(Full::new(Bytes::new()));
        // The reserve is 10/s x 10 s = 100 retries; with no deposits beyond the requests' own
        // (20% each), 1,000 failing requests get 100 + 200 retries, not 1,000.
        let mut retried = 0;
        for _ in 0..1_000 {
            let mut per_request = policy.clone();
            if per_request.retry(&mut req, &mut response(503)).is_some() {
                retried += 1;
            }
        }
        assert!((290..=310).contains(&retried), "{retried}");
    }

    #[test]
    fn pipeline_lists_parse_in_report_order() {
        assert_eq!(
            Pipeline::parse_list("stormguard,naive").unwrap(),
            vec![Pipeline::Naive, Pipeline::Stormguard]
        );
        assert_eq!(
            Pipeline::parse_list("none,none").unwrap(),
            vec![Pipeline::None]
        );
        assert!(Pipeline::parse_list("none,retry").is_err());
        assert_eq!(
            Pipeline::parse_list("stormguard+breaker,naive").unwrap(),
            vec![Pipeline::Naive, Pipeline::StormguardBreaker]
        );
        assert_eq!(
            Pipeline::parse_list("stormguard+adaptive,stormguard+rate-limit").unwrap(),
            vec![Pipeline::StormguardRateLimit, Pipeline::StormguardAdaptive]
        );
    }

    #[test]
    fn the_rate_limit_rows_are_the_defaults_of_the_bursts_only() {
        for kind in scenarios::ALL {
            let defaults = kind.pipelines;
            let burst = kind == scenarios::BURST;
            for row in [Pipeline::StormguardRateLimit, Pipeline::StormguardAdaptive] {
                assert_eq!(defaults.contains(&row), burst, "{kind}");
            }
        }
        assert_eq!(
            scenarios::BURST
                .pipelines
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            [
                "naive",
                "tower",
                "stormguard",
                "stormguard+rate-limit",
                "stormguard+adaptive"
            ]
        );
    }

    #[test]
    fn the_breaker_row_is_a_default_where_the_only_provider_dies() {
        // The tail scenario compares hedging; its outage is there to show that hedges stop.
        // The tail scenario's rows are the hedges; the balance scenarios' share deployments.
        for kind in scenarios::ALL
            .into_iter()
            .filter(|k| *k != scenarios::TAIL && k.scenario().deployments.is_empty())
        {
            let defaults = kind.pipelines;
            let scenario = kind.scenario();
            let alone = scenario.secondary().is_none();
            let dies = scenario.fault.kind.is_dead();
            assert_eq!(
                defaults.contains(&Pipeline::StormguardBreaker),
                dies && alone,
                "{kind}"
            );
            assert!(defaults.contains(&Pipeline::Stormguard));
            // The naive row of a scenario is naive retries, or with two providers, naive failover.
            let naive = if alone {
                Pipeline::Naive
            } else {
                Pipeline::NaiveFailover
            };
            assert!(defaults.contains(&naive), "{kind}");
        }
    }

    #[test]
    fn the_balance_rows_are_the_defaults_of_the_scenarios_with_deployments_only() {
        for kind in scenarios::ALL {
            let balances = !kind.scenario().deployments.is_empty();
            let defaults = kind.pipelines;
            assert!(!defaults.is_empty(), "{kind}");
            assert_eq!(
                defaults.iter().all(|row| row.balances()),
                balances,
                "{kind}"
            );
        }
    }

    #[test]
    fn the_failover_rows_are_the_defaults_of_the_two_providers_only() {
        for kind in scenarios::ALL {
            let two = kind.scenario().secondary().is_some();
            let defaults = kind.pipelines;
            assert_eq!(defaults.iter().any(|p| p.fails_over()), two, "{kind}");
        }
        assert_eq!(
            scenarios::FAILOVER
                .pipelines
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            ["naive+failover", "stormguard", "stormguard+failover"]
        );
        assert_eq!(
            Pipeline::parse_list("stormguard+failover,naive+failover,naive").unwrap(),
            vec![
                Pipeline::Naive,
                Pipeline::NaiveFailover,
                Pipeline::StormguardFailover
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silent_compares_the_failover_without_and_with_clocks_under_the_callers_deadline() {
        assert_eq!(
            scenarios::SILENT
                .pipelines
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            [
                "naive+failover",
                "tower",
                "stormguard",
                "stormguard+failover-no-clocks",
                "stormguard+failover"
            ]
        );
        let scenario = scenarios::SILENT.scenario();
        let head = Request::new(()).into_parts().0;
        let layer = client_layer(&scenario);
        assert_eq!(
            layer.timeout_for(&head, None),
            Some(Duration::from_secs(30))
        );
        let other = client_layer(&scenarios::FAILOVER.scenario());
        assert_eq!(
            other.timeout_for(&head, None),
            Some(stormguard::deadline::DEFAULT_TIMEOUT)
        );
        // Each backend of the failover has clocks of its own, or none at all.
        let epoch = tokio::time::Instant::now();
        let router = || {
            let primary = Backend::new(&scenario, epoch);
            let secondary = Backend::new(&scenario.secondary().unwrap(), epoch);
            Router::new(primary, secondary)
        };
        let (clocked, _) = stormguard_failover(router(), &scenario);
        let clocks: Vec<_> = clocked.backends().map(|b| b.clocks().cloned()).collect();
        assert!(clocks.iter().all(Option::is_some), "{clocks:?}");
        let (unclocked, _) = stormguard_failover_without_clocks(router(), &scenario);
        assert!(unclocked.backends().all(|b| b.clocks().is_none()));
        assert!(Pipeline::StormguardFailoverNoClocks.fails_over());
    }

    #[test]
    fn streams_compare_naive_with_stormguard_and_only_naive_restarts_streams() {
        assert_eq!(
            scenarios::STREAMS.pipelines,
            [
                Pipeline::Naive,
                Pipeline::Stormguard,
                Pipeline::StormguardContinuation
            ]
        );
        assert_eq!(
            Pipeline::parse_list("stormguard+continuation,stormguard").unwrap(),
            [Pipeline::Stormguard, Pipeline::StormguardContinuation]
        );
        assert!(Pipeline::StormguardContinuation.uses_stormguard());
        assert!(!Pipeline::StormguardContinuation.fails_over());
        // `stormguard+continuation` is the layer as the scenario builds it, which continues (its
        // type says so).
        let scenario = scenarios::STREAMS.scenario();
        let _: ClientLayer<_, _, stormguard::retry::Continuing> = client_layer(&scenario);
        for pipeline in Pipeline::ALL {
            let restarts = if pipeline == Pipeline::Naive { 3 } else { 0 };
            assert_eq!(pipeline.stream_restarts(), restarts, "{pipeline}");
        }
    }

    #[test]
    fn tail_compares_the_naive_hedge_towers_and_stormguard_without_and_with_hedging() {
        assert_eq!(
            scenarios::TAIL
                .pipelines
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            [
                "naive-hedge",
                "tower-hedge",
                "stormguard",
                "stormguard+hedge"
            ]
        );
        assert_eq!(
            Pipeline::parse_list("stormguard+hedge,tower-hedge,naive-hedge").unwrap(),
            [
                Pipeline::NaiveHedge,
                Pipeline::TowerHedge,
                Pipeline::StormguardHedge
            ]
        );
        assert!(Pipeline::StormguardHedge.uses_stormguard());
        for row in [Pipeline::NaiveHedge, Pipeline::TowerHedge] {
            assert!(!row.uses_stormguard() && !row.fails_over(), "{row}");
        }
        // The hedging rows are defaults of the tail alone.
        for kind in scenarios::ALL {
            let hedging = kind.pipelines.iter().any(|p| {
                matches!(
                    p,
                    Pipeline::NaiveHedge | Pipeline::TowerHedge | Pipeline::StormguardHedge
                )
            });
            assert_eq!(hedging, kind == scenarios::TAIL, "{kind}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn towers_hedge_is_shared_by_the_callers_and_hedges_a_slow_head() {
        let scenario = scenarios::TAIL.scenario().with_qps(100.0);
        let epoch = tokio::time::Instant::now();
        let backend = Backend::new(&scenario, epoch);
        let hedge = tower_hedge(backend.clone());
        // Requests, one every 10 ms, each on a task of its own.
        let send = |ids: std::ops::Range<u64>| {
            let hedge = hedge.clone();
            async move {
                let mut tasks = Vec::new();
                for id in ids {
                    let mut request = Request::new(Full::new(Bytes::from_static(b"{}")));
                    let header = HeaderValue::from(id);
                    request
                        .headers_mut()
                        .insert(crate::backend::REQUEST_ID, header);
                    let call = tower::ServiceExt::oneshot(hedge.clone(), request);
                    tasks.push(tokio::task::spawn_local(call));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                for task in tasks {
                    assert!(task.await.unwrap().unwrap().status().is_success());
                }
            }
        };
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                // 100 heads (200 ms at the median) recorded in the first 2 s: no hedge before
                // the histogram rotates them into its read half.
                send(0..100).await;
                assert_eq!(backend.model().stats().hedges, 0);
                tokio::time::sleep_until(epoch + TowerHedgePolicy::PERIOD).await;
                send(100..500).await;
            })
            .await;
        // About 5% of the heads come later than the 95th percentile of those recorded.
        let hedged = backend.model().stats().hedges;
        assert!((5..=40).contains(&hedged), "{hedged}");
    }

    fn to(req: &SimRequest) -> &str {
        req.uri().authority().unwrap().as_str()
    }

    #[test]
    fn naive_failover_switches_on_every_failure_at_once_3_retries_on_each() {
        let mut policy = NaiveFailoverPolicy::default();
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = http::Uri::from_static("http://llm.invalid/v1/chat/completions");
        assert!(policy.retry(&mut req, &mut response(200)).is_none());
        assert!(policy.retry(&mut req, &mut response(400)).is_none());
        let mut sent = vec![to(&req).to_owned()];
        for status in [503, 529, 429, 500, 503, 504] {
            assert!(
                policy.retry(&mut req, &mut response(status)).is_some(),
                "{status}"
            );
            sent.push(to(&req).to_owned());
        }
        assert_eq!(
            sent,
            [
                "llm.invalid",
                "secondary.invalid",
                "llm.invalid",
                "secondary.invalid",
                "llm.invalid",
                "secondary.invalid",
                "llm.invalid"
            ]
        );
        assert_eq!(
            req.uri().path(),
            "/v1/chat/completions",
            "only the provider changes"
        );
        assert!(
            policy.retry(&mut req, &mut response(503)).is_none(),
            "3 retries on the secondary: done"
        );
        let timeout: Result<Response<()>, BoxError> = Err("timed out".into());
        let mut fresh = NaiveFailoverPolicy::default();
        assert!(fresh.retry(&mut req, &mut { timeout }).is_some());
    }
}
