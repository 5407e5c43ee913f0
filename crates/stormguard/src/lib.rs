//! # stormguard
//!
//! Keep clients of slow, fragile, expensive backends (LLM APIs above all) from turning a small fault
//! into a retry storm.
//!
//! When a provider's error rate goes from 0.01% to 5% and every client retries 3 times at a fixed
//! interval, 12,000 requests per second become 45,000 within seconds and the provider falls over.
//! stormguard bounds what retries can add (a **budget** of 10% of successes), spreads them
//! (**jitter**), stops sending to a backend that rejects everything (**adaptive throttling**, Google
//! SRE), never retries what cannot succeed (**classification** of HTTP, gRPC and LLM error bodies),
//! and gives each request one **deadline** across all its attempts, propagated downstream. For a
//! backend that stops answering altogether, a **circuit breaker** notices the silence, cuts what
//! is in flight and answers locally until the backend is back.
//!
//! ## Start here
//!
//! | you have | use |
//! |---|---|
//! | a hyper, tonic or other tower client | [`ClientLayer::default()`]`.layer(client)` |
//! | an axum or tonic server, or a gateway | [`ServerLayer::default()`] on its routes |
//! | a gateway answering for a failed upstream call | return the [`Error`] (feature `axum`: it is `IntoResponse`), or [`error_response`] |
//! | a reqwest client | [`reqwest::StormguardMiddleware`] (feature `reqwest`) |
//! | several clients of one backend | one [`budget::RetryBudget`] and one [`throttle::AdaptiveThrottle`], handed to each layer |
//! | a provider quota (requests and tokens a minute), known or to be learned | [`ClientLayer::with_rate_limit`] with a [`rate_limit::RateLimit`] |
//! | a provider whose capacity (concurrent generations) is unknown or changes | [`ClientLayer::with_concurrency`] with a [`concurrency::ConcurrencyLimit`] |
//! | a backend that can stop answering, or a local answer better than an error | [`ClientLayer::with_breaker`] with a [`breaker::CircuitBreaker`] (and [`ClientLayer::with_fallback`]) |
//! | two providers or more (or models, or keys) | [`failover::Failover::new`]`(ClientLayer::default())` with a [`failover::Backend`] each, `.layer(client)` |
//! | one provider quota for several gateway replicas | [`rate_limit::RateLimitConfig`]`::with_fleet` (feature `redis`) |
//! | a game day in staging: a provider that fails on a schedule | `chaos::ChaosLayer` under the client (feature `chaos`, never in production) |
//!
//! The modules hold the pieces, each from its own crate, for changing one part of the pipeline
//! or using it alone: [`classify`], [`jitter`], [`budget`], [`deadline`], [`throttle`],
//! [`concurrency`], [`breaker`], [`rate_limit`], [`stream`] and [`sse`], [`failover`], [`retry`].
//!
//! ## The client pipeline
//!
//! ```text
//!            ┌──────────── ClientLayer: one future per request ──────────────────────────────────────────────────────────────┐
//! request ─▶ │ deadline ─▶ retry (classify · budget · jitter · hints) ─▶ [rate limit] ─▶ [concurrency] ─▶ [breaker] ─▶ throttle │ ─▶ backend
//!            └───────────────────────────────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! * **One deadline** spans all attempts; the engine never sleeps past it and never starts an
//!   attempt that cannot finish, and every attempt tells the next hop how much time is left.
//! * **Every attempt is throttled**: while the backend rejects most of what it gets, attempts are
//!   dropped locally and never retried.
//! * **A rate limit, when added**, paces every attempt (retries too) to the provider's quota,
//!   each waiting at most 2 s for its slot, and learns the quota from the provider's headers.
//! * **A concurrency limit, when added**, keeps the attempts in flight (a stream until its last
//!   byte) under a limit learned from the provider's overload answers, each waiting at most 2 s
//!   for a place (see [`concurrency`]).
//! * **A breaker, when added**, refuses every attempt while open, answers with the caller's
//!   fallback, and notices a backend that stopped answering (no default: see [`breaker`] for
//!   breaker versus throttle).
//! * **Retry at one layer only**: every layer that retries multiplies (SDK 3 x gateway 3 = 9
//!   attempts). When stormguard retries, turn the SDK's retries off (OpenAI and Anthropic SDKs:
//!   `max_retries=0`), and put `ServerLayer` on gateways: what stormguard gives up on carries
//!   `x-should-retry: false`, which those SDKs honour.
//!
//! ## Quickstart: hyper
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use stormguard::ClientLayer;
//! use tower::{Layer, ServiceExt};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let client = ClientLayer::default().layer(hyper);
//! let request = http::Request::post("http://127.0.0.1:8080/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"model":"m","max_tokens":50}"#)))?;
//! let response = client.oneshot(request).await?;
//! # let _ = response; Ok(()) }
//! ```
//!
//! ## Quickstart: axum (server and gateway)
//!
//! ```
//! use axum::{Router, routing::post};
//! use stormguard::ServerLayer;
//!
//! // Reads and enforces incoming deadlines, sheds retries beyond 10% of successes. A handler
//! // that calls upstream through a `ClientLayer` inherits the incoming deadline, and answers
//! // the pipeline's errors by returning them (feature `axum`) or with `error_response`.
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "ok" }))
//!     .layer(ServerLayer::default());
//! # let _ = app;
//! ```
//!
//! A gateway whose upstream call fails answers for it with [`error_response`], from the
//! `BoxError` any tower `Service` fails with, as axum's `HandleErrorLayer` hands it over: a
//! deadline that passed upstream is a 504 marked `x-should-retry: false`, so the caller's SDK
//! does not retry what the gateway already gave up on.
//!
//! ```
//! use axum::body::Body;
//! use axum::error_handling::HandleErrorLayer;
//! use stormguard::classify::BoxError;
//! use stormguard::deadline::DeadlineExceeded;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let upstream = tower::service_fn(|_request: http::Request<Body>| async {
//!     Err::<http::Response<Body>, BoxError>(Box::new(DeadlineExceeded::new()))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(HandleErrorLayer::new(|error: BoxError| async move {
//!         stormguard::error_response::<Body>(&error, false)
//!     }))
//!     .service(upstream);
//! let response = gateway.oneshot(http::Request::new(Body::empty())).await?;
//! assert_eq!(response.status(), 504);
//! assert_eq!(response.headers()["x-should-retry"], "false");
//! # Ok(())
//! # }
//! ```
//!
//! ## Quickstart: tonic
//!
//! With the `tonic` feature, wrap a `Channel` and hand it to a generated client:
//!
//! ```ignore
//! let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect().await?;
//! let channel = tower::ServiceBuilder::new().layer(stormguard::ClientLayer::default()).service(channel);
//! let mut client = HealthClient::new(channel);
//! ```
//!
//! On a tonic server, `Server::builder().layer(stormguard::ServerLayer::default())`.
//!
//! ## Features
//!
//! * `axum`: replay of axum request bodies, and `IntoResponse` for [`Error`];
//! * `tonic`: replay of tonic request bodies (a tonic `Channel`), and the `grpc` module: a gRFC A6
//!   service config (per-method retry or hedging policy, timeout, retry throttling) applied
//!   through the engine;
//! * `reqwest`: the [`reqwest`] module, the same engine as reqwest-middleware middleware;
//! * `async-openai`: `reqwest::OpenAiService`, the engine as async-openai's HTTP service
//!   (`Client::with_http_service`), streams continued;
//! * `rig`: `reqwest::RigClient`, the engine as the HTTP client of rig's providers (a provider
//!   builder's `http_client`), streams continued;
//! * `chaos`: the `chaos` module, fault injection for staging and game days, **never for
//!   production**. It is a feature, off by default, rather than a module always there, so that
//!   injecting faults is a choice made in the build: a binary built without it cannot contain a
//!   chaos layer, whatever its configuration says.

mod ext;
mod server;

pub use ext::ServiceBuilderExt;
pub use server::ServerLayer;
pub use stormguard_classify::error_response;
pub use stormguard_retry::{ClientLayer, ClientService, Error, GiveUpCause};

/// Failure classification ([`stormguard_classify`]): outcomes, classifiers, server hints.
pub mod classify {
    pub use stormguard_classify::body::ResponseBody;
    pub use stormguard_classify::{
        AsError, BoxError, Classify, ClassifyLayer, ERROR_BODY_LIMIT, Failure, GrpcClassifier,
        GrpcCode, GrpcCodes, HttpClassifier, ListedCodesClassifier, LlmClassifier, LocalAnswer,
        MakeClassify, Outcome, Permit, Reason, TransportClassifier, Verdict, chain, headers, hint,
        is_grpc, outcome_of, refusal_response,
    };
}

/// Backoff schedules and server hints ([`stormguard_jitter`]).
pub mod jitter {
    pub use stormguard_jitter::{
        Backoff, Constant, DEFAULT_BASE, DEFAULT_CAP, DecorrelatedJitter, EqualJitter, Exponential,
        FullJitter, GrpcBackoff, HintPolicy, HintedDelay, SmoothDecorrelatedJitter, Spread,
        SpreadLayer,
    };
}

/// The retry budget, and shedding retries on a server ([`stormguard_budget`]).
pub mod budget {
    pub use stormguard_budget::{
        BudgetConfig, BudgetSnapshot, DEFAULT_MIN_PER_SEC, DEFAULT_RATIO, DEFAULT_TTL,
        MAX_RETRY_TOKENS, RetryBudget, RetryTokens, ShedRetries, ShedRetriesLayer,
        previous_attempts,
    };
}

/// Deadlines across attempts and hops ([`stormguard_deadline`]).
pub mod deadline {
    pub use stormguard_deadline::{
        DEFAULT_TIMEOUT, Deadline, DeadlineExceeded, DeadlineLayer, LlmDeadline,
        ServerDeadlineLayer, clocks, propagate,
    };
}

/// Adaptive client-side throttling ([`stormguard_adaptive_throttle`]).
pub mod throttle {
    pub use stormguard_adaptive_throttle::{
        AdaptiveThrottle, AdaptiveThrottleLayer, ThrottleConfig, ThrottlePermit, ThrottleSnapshot,
        Throttled,
    };
}

/// The circuit breaker ([`stormguard_breaker`]): failure window, stall detection, bulkhead,
/// leased probes, fallback.
pub mod breaker {
    pub use stormguard_breaker::{
        BreakerConfig, BreakerLayer, BreakerOpen, BreakerPermit, BreakerService, BreakerSnapshot,
        BulkheadFull, CircuitBreaker, Fallback, OpenCause, Rejected, State,
    };
}

/// The adaptive concurrency limit ([`stormguard_concurrency`]): loss-based, held until a stream
/// ends, grown only while it is used.
pub mod concurrency {
    pub use stormguard_concurrency::{
        Acquire, ConcurrencyBody, ConcurrencyConfig, ConcurrencyFull, ConcurrencyLayer,
        ConcurrencyLimit, ConcurrencyPermit, ConcurrencyService, ResponseFuture, Snapshot,
    };
}

/// The requests- and tokens-per-minute rate limit ([`stormguard_rate_limit`]): GCRA pacing with
/// a bounded wait, token weights, limits learned from the provider.
pub mod rate_limit {
    pub use stormguard_rate_limit::{
        Acquire, RateLimit, RateLimitCause, RateLimitConfig, RateLimitLayer, RateLimitPermit,
        RateLimitService, RateLimitSnapshot, RateLimited, Reservation, Usage,
    };
    #[cfg(feature = "redis")]
    pub use stormguard_rate_limit::{Fleet, FleetError, FleetSnapshot};
}

/// The stream guard for `text/event-stream` answers ([`stormguard_stream`]): read up to the
/// first content event (an error event before it is retried), never restarted after it, ended
/// with [`StreamInterrupted`](stream::StreamInterrupted) when it breaks. The engine applies it to
/// every event stream ([`ClientLayer::with_stream_policy`]).
pub mod stream {
    pub use stormguard_stream::continuation;
    pub use stormguard_stream::sse;
    pub use stormguard_stream::{
        AnswerBody, AnswerFuture, GuardedStream, InterruptCause, MakeResume, Received, Resume,
        ResumeFn, Resumption, StreamInterrupted, StreamPolicy, is_event_stream,
    };
}

/// Failover across providers ([`stormguard_failover`]): ordered backends with their own guards,
/// per-error cures, one deadline and one retry budget per request, a degraded answer.
pub mod failover {
    pub use stormguard_failover::balance;
    pub use stormguard_failover::{
        Adapter, Answered, Backend, Cooldowns, Cure, Degraded, Failover, FailoverService,
        NoBackend, ResponseFuture,
    };
}

/// The client engine's parts ([`stormguard_retry`]): what [`ClientLayer`] is made of.
pub mod retry {
    pub use stormguard_retry::race;
    pub use stormguard_retry::{
        Continuing, DEFAULT_HEDGE_PERCENTILE, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_HEDGES,
        DEFAULT_MAX_REPLAY_BODY, HedgeDelay, Hedging, NoHedge, NotContinuing, PartialBody,
        ReplayBody, Report, Route, Routed, ensure_idempotency_key, is_idempotent, stamp_attempt,
    };
}

/// gRPC service configs (gRFC A6) for tonic clients (feature `tonic`): parse the JSON every
/// other gRPC language reads, and send each call through the engine with its method's retry or
/// hedging policy, timeout and the channel's retry throttling ([`stormguard_retry::grpc`]).
#[cfg(feature = "tonic")]
pub use stormguard_retry::grpc;

/// What the pipeline counts and measures, through the `metrics` facade (feature `metrics`): every
/// name, type, unit and label ([`stormguard_retry::metrics`]).
#[cfg(feature = "metrics")]
pub use stormguard_retry::metrics;

/// Fault injection for staging and game days ([`stormguard_chaos`]; feature `chaos`, never for
/// production): the providers' error answers, latency, silence, resets, and event streams cut,
/// stalled or broken, by rate and schedule, seeded.
#[cfg(feature = "chaos")]
pub mod chaos {
    pub use stormguard_chaos::{
        ChaosBody, ChaosLayer, ChaosService, ChaosSnapshot, ErrorAnswer, Fault, FaultKind,
        FaultSnapshot, Provider, ResponseFuture, placement,
    };
}

/// The client engine as reqwest-middleware middleware ([`stormguard_reqwest`]), and under
/// async-openai's client (feature `async-openai`) and rig's providers (feature `rig`).
#[cfg(feature = "reqwest")]
pub mod reqwest {
    #[cfg(feature = "async-openai")]
    pub use stormguard_reqwest::openai::{OpenAiService, Transport};
    #[cfg(feature = "rig")]
    pub use stormguard_reqwest::rig::RigClient;
    pub use stormguard_reqwest::{RequestBody, StormguardMiddleware};
}
