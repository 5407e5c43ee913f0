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
//! and gives each request one **deadline** across all its attempts, propagated downstream.
//!
//! This crate is the facade: [`ClientLayer`] and [`ServerLayer`] compose the pieces with defaults
//! that are safe for LLM APIs, and the pieces are re-exported under short paths:
//!
//! | path | crate | what |
//! |---|---|---|
//! | [`classify`] | `stormguard-classify` | `Outcome`, `LlmClassifier`, hint parsing |
//! | [`jitter`] | `stormguard-jitter` | `FullJitter` and friends, `HintPolicy`, `JitterLayer` |
//! | [`budget`] | `stormguard-budget` | `RetryBudget`, server-side `RetryBudgetLayer` |
//! | [`deadline`] | `stormguard-deadline` | `Deadline`, `DeadlineLayer`, `ServerDeadlineLayer` |
//! | [`throttle`] | `stormguard-adaptive-throttle` | `AdaptiveThrottle`, `AdaptiveThrottleLayer` |
//! | [`retry`] | `stormguard-retry` | `RetryLayer`, the retry engine |
//!
//! ## The client pipeline
//!
//! ```text
//!            ┌──────────── ClientLayer ─────────────────────────────────────────┐
//! request ─▶ │ deadline ─▶ retry (classify · budget · jitter) ─▶ throttle        │ ─▶ backend
//!            └──────────────────────────────────────────────────────────────────┘
//! ```
//!
//! * **Deadline outside the retry**: one deadline spans all attempts; the engine never sleeps past
//!   it and never starts an attempt that cannot finish.
//! * **Throttle inside the retry**: every attempt is counted and may be dropped locally; a local
//!   drop is final and never retried.
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
//! # async fn run() -> Result<(), stormguard::classify::BoxError> {
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
//! // the pipeline's errors with `stormguard::error_response`.
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "ok" }))
//!     .layer(ServerLayer::default());
//! # let _ = app;
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
//! ## Quickstart: reqwest
//!
//! Use `stormguard-reqwest`'s `StormguardMiddleware` with `reqwest-middleware`; it shares the
//! [`budget::RetryBudget`] and [`throttle::AdaptiveThrottle`] types with [`ClientLayer`].

mod client;
mod ext;
mod respond;
mod server;

pub use client::{Client, ClientLayer, DEFAULT_CLIENT_TIMEOUT};
pub use ext::ServiceBuilderExt;
pub use respond::error_response;
pub use server::ServerLayer;

/// Failure classification: [`stormguard_classify`].
pub mod classify {
    pub use stormguard_classify::*;
}

/// Backoff schedules and server hints: [`stormguard_jitter`].
pub mod jitter {
    pub use stormguard_jitter::*;
}

/// The retry budget: [`stormguard_budget`].
pub mod budget {
    pub use stormguard_budget::*;
}

/// Deadlines across attempts: [`stormguard_deadline`].
pub mod deadline {
    pub use stormguard_deadline::*;
}

/// Adaptive client-side throttling: [`stormguard_adaptive_throttle`].
pub mod throttle {
    pub use stormguard_adaptive_throttle::*;
}

/// The retry engine: [`stormguard_retry`].
pub mod retry {
    pub use stormguard_retry::*;
}
