//! One deadline across all attempts: set, sized for LLM requests, enforced, and propagated.
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
//! - [`DeadlineLayer`] (client side) sets it from a fixed timeout, a function of the request, or an
//!   estimate from the LLM request body ([`LlmDeadline`]: prompt size and `max_tokens`), enforces it
//!   ([`DeadlineExceeded`]) and propagates the time left downstream in `grpc-timeout` (gRPC's
//!   "PROTOCOL-HTTP2" format) or `x-request-timeout-ms` ([`propagate`]), minus a safety margin.
//! - [`ServerDeadlineLayer`] (server side) reads those headers and Envoy's
//!   `x-envoy-expected-rq-timeout-ms`, caps them, sheds requests that arrive already expired
//!   without running the handler, and times out handlers that overrun (HTTP 504 / gRPC
//!   `DEADLINE_EXCEEDED`), as gRPC deadline propagation does across services.
//!
//! The wire vocabulary (gRPC detection, gRPC status headers, the "do not retry" mark on the 504s this
//! crate answers with) comes from `stormguard-classify`, the one place it is spelled; this crate
//! depends on nothing else of stormguard's.
//!
//! Deadline propagation follows gRPC's model ("gRPC and Deadlines", grpc.io): the deadline is
//! absolute inside a process and travels as a relative timeout between processes, shortened at
//! every hop.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_deadline::{Deadline, DeadlineLayer, LlmDeadline, propagate};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // The upstream reports the timeout it was told.
//! let upstream = service_fn(|request: http::Request<http_body_util::Full<bytes::Bytes>>| async move {
//!     let told = request.headers()[propagate::X_REQUEST_TIMEOUT_MS].to_str()?.to_owned();
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(told)
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(DeadlineLayer::llm(LlmDeadline::default()))
//!     .service(upstream);
//!
//! let body = r#"{"max_tokens": 4000, "messages": [{"role": "user", "content": "Write a story"}]}"#;
//! let request = http::Request::new(http_body_util::Full::from(body));
//! let told = client.ready().await?.call(request).await?;
//! // 10 s base + 5 prompt tokens x 1 ms + 4000 output tokens x 28 ms, minus the 50 ms margin.
//! assert_eq!(told, "121955");
//! # Ok(())
//! # }
//! ```

mod deadline;
mod error;
mod llm;

pub mod client;
pub mod enforce;
pub mod propagate;
pub mod server;

pub use client::DeadlineLayer;
pub use deadline::Deadline;
pub use error::DeadlineExceeded;
pub use llm::{ASSUMED_OUTPUT_TOKENS, BYTES_PER_TOKEN, LLM_BODY_LIMIT, LlmDeadline};
pub use server::ServerDeadlineLayer;
