//! stormguard's client protections for [reqwest] users, as [reqwest-middleware] middleware.
//!
//! A plain retry loop around an LLM API turns a provider's bad minute into a retry storm: every
//! client retries every failure at the same fixed interval, quota errors are retried as if they
//! could heal, and a long generation that timed out is started again from scratch.
//! [`StormguardMiddleware`] puts the same protections in front of a reqwest client as
//! stormguard's tower `ClientLayer`, built from the same shared pieces:
//!
//! - classification ([`stormguard_classify::LlmClassifier`]): 408/5xx/529 and rate limits are
//!   retryable, `insufficient_quota`, `context_length_exceeded`, 401/403/... are not; the JSON
//!   error body of a non-2xx response is read (up to 64 KiB) to tell them apart, and the caller
//!   still gets the whole body;
//! - a retry budget ([`stormguard_budget::RetryBudget`]): retries stay below a ratio of successes,
//!   so an outage gets almost no retries (the SRE book, "Handling Overload");
//! - jittered exponential backoff ([`stormguard_jitter::FullJitter`], AWS Architecture Blog,
//!   "Exponential Backoff And Jitter"), replaced by the server's `retry-after-ms` / `Retry-After`
//!   hint when there is one (RFC 9110 section 10.2.3);
//! - client-side adaptive throttling ([`stormguard_adaptive_throttle::AdaptiveThrottle`], the SRE
//!   book, "Handling Overload"): when the backend rejects most requests, attempts are dropped
//!   locally before they reach it;
//! - one deadline for all attempts ([`stormguard_deadline::Deadline`]), sent downstream as
//!   `x-request-timeout-ms`;
//! - `x-retry-attempt` on every attempt, one `Idempotency-Key` per POST (or other
//!   non-idempotent) request, and `x-should-retry: false` on a failed response it gave up on or
//!   that can never succeed, so that no layer above multiplies the retries.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use stormguard_reqwest::StormguardMiddleware;
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(StormguardMiddleware::default().timeout(Duration::from_secs(120)))
//!     .build();
//! let response = client
//!     .post("http://127.0.0.1:8080/v1/chat/completions")
//!     .body(r#"{"model":"m","messages":[],"max_tokens":64}"#)
//!     .send()
//!     .await?;
//! println!("{}", response.status());
//! # Ok(())
//! # }
//! ```
//!
//! [reqwest]: https://docs.rs/reqwest
//! [reqwest-middleware]: https://docs.rs/reqwest-middleware

mod error_body;
mod middleware;

pub use middleware::{DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT, StormguardMiddleware};
pub use stormguard_classify::ERROR_BODY_LIMIT;
