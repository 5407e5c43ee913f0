//! One deadline across all attempts: set, enforced, and propagated from hop to hop.
//!
//! # The problem
//!
//! A single timeout for every request kills long LLM generations half way (and then retries them),
//! while a per-attempt timeout lets three retries of a 30 s timeout keep a caller waiting for 90 s.
//! And a gateway that receives a request with 2 s left, then calls its upstream with a fresh 30 s
//! timeout, keeps working for 28 s on an answer nobody will read.
//!
//! # The design
//!
//! - A [`Deadline`] is an absolute instant (`tokio::time::Instant`) stored in the request's
//!   extensions. Every attempt and every layer reads the same one; when two meet, the tighter wins.
//! - [`DeadlineLayer`] (client side) sets it from a fixed timeout or a function of the request
//!   head ([`TimeoutSource`](client::TimeoutSource)), enforces it ([`DeadlineExceeded`]) and
//!   propagates the time left downstream in `grpc-timeout` (gRPC's "PROTOCOL-HTTP2" format) or
//!   `x-request-timeout-ms` ([`propagate`]), minus a safety margin.
//! - [`LlmDeadline`] sizes a deadline from an LLM request body (prompt size and `max_tokens`). The
//!   body is read where it is buffered anyway: by the client retry engine (`stormguard-retry`'s
//!   `ClientLayer::with_llm_deadline`), which holds any [`TimeoutSource`](client::TimeoutSource),
//!   so that a body is read once.
//! - [`clocks`]: inside the deadline, each attempt's own clocks (time to the response head, to a
//!   stream's first content, between its content events), learned per backend from its answers,
//!   so that an attempt a healthy backend would long have answered is abandoned early.
//! - [`ServerDeadlineLayer`] (server side) reads those headers and Envoy's
//!   `x-envoy-expected-rq-timeout-ms`, caps them, sheds requests that arrive already expired
//!   without running the handler, and times out handlers that overrun (HTTP 504 / gRPC
//!   `DEADLINE_EXCEEDED`), as gRPC deadline propagation does across services.
//!
//! The wire vocabulary (header names, gRPC detection, the one shape of a refusal and its "do not
//! retry" mark, the decimal parser) comes from `stormguard-classify`, the one place it is spelled;
//! this crate depends on nothing else of stormguard's. A [`DeadlineExceeded`] error carries a
//! [`Failure`](stormguard_classify::Failure) in its source chain, so any classifier reads it as
//! fatal and not accepted (`stormguard_classify::outcome_of`).
//!
//! Deadline propagation follows gRPC's model ("gRPC and Deadlines", grpc.io): the deadline is
//! absolute inside a process and travels as a relative timeout between processes, shortened at
//! every hop.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_classify::headers::X_REQUEST_TIMEOUT_MS;
//! use stormguard_deadline::{Deadline, DeadlineLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // The upstream reports the timeout it was told.
//! let upstream = service_fn(|request: http::Request<()>| async move {
//!     let told = request.headers()[X_REQUEST_TIMEOUT_MS].to_str()?.to_owned();
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(told)
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(30)))
//!     .service(upstream);
//!
//! // 30 s, minus the 50 ms margin.
//! let told = client.ready().await?.call(http::Request::new(())).await?;
//! assert_eq!(told, "29950");
//!
//! // A caller with 2 s left is not given a fresh 30 s: the tighter deadline wins.
//! let mut request = http::Request::new(());
//! Deadline::after(Duration::from_secs(2)).apply_to(&mut request);
//! let told = client.ready().await?.call(request).await?;
//! assert_eq!(told, "1950");
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

mod body;
mod deadline;
mod error;
mod llm;
mod timer;

pub mod client;
pub mod clocks;
pub mod enforce;
pub mod propagate;
pub mod server;

pub use client::DeadlineLayer;
pub use deadline::Deadline;
pub use error::DeadlineExceeded;
pub use llm::{ASSUMED_OUTPUT_TOKENS, BYTES_PER_TOKEN, LlmDeadline, TokenEstimate};
pub use server::ServerDeadlineLayer;
pub use timer::poll_until;

/// The default request timeout: 600 s (10 minutes), the default request timeout of the official
/// OpenAI and Anthropic SDKs (`DEFAULT_TIMEOUT` in `_constants.py` of `openai-python` and
/// `anthropic-sdk-python`: 10 minutes). Long non-streaming generations fit: 8,000 output tokens at
/// the ~35 tokens/s of a large model take under 4 minutes.
///
/// It is the longest an [`LlmDeadline`] estimate may be ([`LlmDeadline::max`]), and the longest a
/// caller may ask a server for ([`ServerDeadlineLayer::with_max`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
