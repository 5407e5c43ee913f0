//! `stormguard-retry`: the retry engine. One tower layer that retries a request only when a retry
//! can help, only as often as the backend can afford, never past the request's deadline, and
//! only at this layer.
//!
//! # The problem
//!
//! Naive retries turn a backend's bad minute into an outage: every client retries every failure
//! a fixed number of times, so a 5% error rate multiplies the load just when the backend is
//! weakest, fixed intervals bring the rejected clients back in lockstep, each layer that retries
//! multiplies the attempts of the layers above it (3 × 3 = 9), and a `400 context_length_exceeded`
//! or `429 insufficient_quota` is retried for nothing but cost.
//!
//! # The algorithm
//!
//! For every request, [`Retry`] sends the first attempt and classifies the result with a
//! [`Classify`](stormguard_classify::Classify) implementation (default
//! [`LlmClassifier`](stormguard_classify::LlmClassifier)). Then:
//!
//! 1. **Success**: deposit into the [`RetryBudget`](stormguard_budget::RetryBudget) (this is
//!    where successes are counted) and return it.
//! 2. **Fatal** (a 4xx that will not get better, a server that said `x-should-retry: false`):
//!    return it as it is.
//! 3. **Retryable**: retry only if every check below passes, in this order, else give up:
//!    * fewer than `max_attempts` attempts were sent (default 3, the per-request limit of the
//!      Google SRE book, "Handling Overload");
//!    * the delay: the next one from the [`Backoff`](stormguard_jitter::Backoff) schedule
//!      (default full jitter, `U(0, min(cap, base × 2^n))`, AWS Architecture Blog "Exponential
//!      Backoff And Jitter"), unless the server gave a hint (`retry-after-ms`, `retry-after`,
//!      `grpc-retry-pushback-ms` ...), which the [`HintPolicy`](stormguard_jitter::HintPolicy)
//!      turns into the delay; a hint above its maximum (default 60 s) means give up now;
//!    * the **deadline rule**: under a [`Deadline`](stormguard_deadline::Deadline) found in the
//!      request's extensions, retry only if `now + delay + (duration of the last attempt) <
//!      deadline`. The engine never sleeps past the deadline, and never starts an attempt that
//!      would need more time than is left (judged by how long the last one took);
//!    * the retry budget grants a withdrawal (asked last, so that nothing is withdrawn for a
//!      retry the other checks rule out, and before sleeping, so that a denied retry costs no
//!      time). The budget allows `ratio × successes + floor` retries per window (SRE book: 10%):
//!      during an outage successes stop, and so do retries. A request dropped before its retry
//!      goes out (during the sleep, say) gives the withdrawal back.
//!
//!    Then it sleeps, re-stamps the downstream deadline header
//!    ([`propagate::refresh`](stormguard_deadline::propagate::refresh)), and sends the request
//!    again on a fresh clone of the service, driven to readiness first.
//!
//! # Retry at one layer only
//!
//! When the engine gives up on a retryable failure (attempts spent, budget denied, deadline,
//! hint too long), whoever is above must not retry it again. A failed response is returned with
//! `x-should-retry: false` (honoured by the official OpenAI and Anthropic SDKs) or, for gRPC,
//! `grpc-retry-pushback-ms: -1` (gRFC A6), and carries the [`GiveUpCause`] in its extensions; a
//! failed call (an error instead of a response) is returned wrapped in [`GaveUp`]. Fatal failed
//! responses get the same mark (no extension): the OpenAI SDKs, for one, would otherwise retry
//! a `429 insufficient_quota` twice more. Only a request this layer could not have retried (a
//! body too large to replay, `max_attempts(1)`) comes back unmarked: the decision stays with the
//! caller.
//!
//! stormguard's own local rejections are final and are returned unwrapped: an error whose source
//! chain contains [`Throttled`](stormguard_adaptive_throttle::Throttled) (the adaptive throttle,
//! which sits inside this layer, refused to send the attempt) or
//! [`DeadlineExceeded`](stormguard_deadline::DeadlineExceeded). Retrying the first would defeat
//! the throttle; the second cannot succeed.
//!
//! # Requests
//!
//! * **Bodies** are replayed from buffered bytes ([`ReplayBody`]): a body whose exact size fits
//!   [`max_replay_body`](RetryLayer::max_replay_body) (default 1 MiB) is read before the first
//!   attempt, and each attempt gets the same `Bytes` (no copy). A body whose size is known to be
//!   larger is sent once, untouched. A body of unknown size is read up to the cap: if it ends,
//!   it is replayed; if not, it is sent once as the prefix read plus the unread rest, and its
//!   failures are returned unmarked (the engine did not retry; only the caller can).
//! * **Attempt numbers**: every HTTP attempt carries `x-retry-attempt: N` (N = attempts before
//!   it, 0 on the first); gRPC retries carry `grpc-previous-rpc-attempts: N` (gRFC A6). A server
//!   can then shed retries first (`stormguard_budget::RetryBudgetLayer`).
//! * **Idempotency**: a request whose method is not idempotent (POST, PATCH ...) and that may be
//!   sent more than once gets an [`IDEMPOTENCY_KEY`] header, the same UUID on every attempt,
//!   unless the caller set one. gRPC calls (always POST on the wire) do not. Keys are version 4
//!   UUIDs made without a system call: per-thread random bits with a scrambled counter in the
//!   last 48 (unique within a thread, see [`ensure_idempotency_key`]).
//!
//! # Responses
//!
//! The response body type is [`ResponseBody`]. Successful responses pass through untouched.
//! When the classifier asks for the body of a failure (`Classify::needs_body`: non-2xx,
//! non-gRPC by default), the engine reads up to
//! [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) (64 KiB) so that the classifier
//! can tell `insufficient_quota` from `rate_limit_exceeded`, and the caller still receives the
//! whole body. Once a response has been handed to the caller it is never retried.
//!
//! # Observability
//!
//! Each retry logs a `WARN` event "retrying request" with `retry_attempt`, `delay_ms` and
//! `reason`; a budget refusal logs "retry budget exhausted: not retrying"; every give-up logs
//! "giving up on a retryable failure" with `attempts`, `reason` and `cause`.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use stormguard_budget::RetryBudget;
//! use stormguard_retry::RetryLayer;
//! use tower::{Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), stormguard_classify::BoxError> {
//! # tokio::time::pause();
//! // A backend that is overloaded once, then answers.
//! let calls = Arc::new(AtomicU32::new(0));
//! let seen = Arc::clone(&calls);
//! let backend = tower::service_fn(move |_request: Request<Full<Bytes>>| {
//!     let status = match seen.fetch_add(1, Ordering::SeqCst) {
//!         0 => StatusCode::SERVICE_UNAVAILABLE,
//!         _ => StatusCode::OK,
//!     };
//!     async move { Response::builder().status(status).body(Full::new(Bytes::new())) }
//! });
//!
//! // One budget for every client of this backend.
//! let budget = RetryBudget::default();
//! let mut client = RetryLayer::new().budget(budget.clone()).layer(backend);
//!
//! let request = Request::post("http://llm.invalid/v1/chat/completions")
//!     .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))?;
//! let response = client.ready().await?.call(request).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! assert_eq!(budget.snapshot().withdrawals, 1);
//! # Ok(())
//! # }
//! ```

mod attempt;
mod body;
mod error;
mod future;
mod layer;
mod rules;
mod service;

pub use attempt::{IDEMPOTENCY_KEY, ensure_idempotency_key, is_idempotent, stamp_attempt};
pub use body::{PartialBody, ReplayBody, ResponseBody};
pub use error::{GaveUp, GiveUpCause};
pub use future::ResponseFuture;
pub use layer::{DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_REPLAY_BODY, RetryLayer};
pub use rules::{Granted, RetryRules};
pub use service::Retry;
