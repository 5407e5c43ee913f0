//! `stormguard-retry`: the client engine. One tower layer, [`ClientLayer`], that gives every
//! request one deadline, retries it only when a retry can help, only as often as the backend can
//! afford, never past the deadline, only at this layer, and stops sending at all while the
//! backend rejects most of what it gets.
//!
//! # The problem
//!
//! Naive retries turn a backend's bad minute into an outage: every client retries every failure
//! a fixed number of times, so a 5% error rate multiplies the load just when the backend is
//! weakest, fixed intervals bring the rejected clients back in lockstep, each layer that retries
//! multiplies the attempts of the layers above it (3 × 3 = 9), a `400 context_length_exceeded`
//! or `429 insufficient_quota` is retried for nothing but cost, and one timeout per attempt lets
//! three attempts keep a caller waiting three times as long.
//!
//! # What happens to a request
//!
//! 1. **Deadline.** The request gets one absolute [`Deadline`](stormguard_deadline::Deadline)
//!    across all its attempts: a fixed timeout (default 600 s), a function of its head, or an
//!    estimate from its LLM body (prompt size and `max_tokens`,
//!    [`with_llm_deadline`](ClientLayer::with_llm_deadline)); a tighter deadline already on the
//!    request wins. It is enforced over everything below, and every attempt carries the time left
//!    downstream (`x-request-timeout-ms`, gRPC `grpc-timeout`) minus a small margin.
//! 2. **Body.** A body whose size fits the replay cap (default 1 MiB) is read before the first
//!    attempt, and every attempt gets the same bytes ([`ReplayBody`]). A larger or endless body
//!    is sent once, untouched, and its failures are returned as they are: only the caller can
//!    send it again.
//! 3. **Each attempt** passes the guards, in this order (see [`ClientLayer`] for each):
//!    the rate limit, when one is added, paces it (a wait for a slot is not "in flight"); the
//!    concurrency limit, when one is added, gives it a place among the attempts in flight (held
//!    until its answer's body ends), waiting a bounded time for one (an [`Error`] with reason
//!    `bulkhead_full` after); the circuit breaker, when one is added, admits it or refuses it (answered by its fallback, or
//!    an [`Error`] with reason `breaker_open`); the adaptive throttle
//!    ([`AdaptiveThrottle`](stormguard_adaptive_throttle::AdaptiveThrottle), Google SRE
//!    client-side throttling) drops it while the backend rejects most of what it gets (an
//!    [`Error`] with reason `throttled`). A half-open breaker's probe skips the throttle's draw,
//!    so that a throttle still full of the outage cannot hold the breaker open. A refused attempt
//!    is never retried and never sent, and gives back what the guards before it granted (a
//!    rate-limit slot, the breaker's place in flight). Every guard learns how each attempt it
//!    admitted ended; one dropped on the way (the caller gave up) counts as not accepted for the
//!    throttle, and as nothing for the breaker. An attempt that goes out carries its number
//!    (`x-retry-attempt: N`; gRPC `grpc-previous-rpc-attempts: N` on retries, gRFC A6) and, for a
//!    method that is not idempotent, the request's `Idempotency-Key` (a v4 UUID, the same on
//!    every attempt, never replacing the caller's).
//! 4. **Each result** is classified once, by the [`Classify`](stormguard_classify::Classify)
//!    implementation (default [`LlmClassifier`](stormguard_classify::LlmClassifier)), reading the
//!    first 64 KiB of a failed response's body (the JSON error of an LLM API) while the caller
//!    still gets all of it. That one outcome tells the throttle whether the backend accepted the
//!    attempt and decides the retry. A success is deposited into the
//!    [`RetryBudget`](stormguard_budget::RetryBudget) and returned. A fatal failure is returned.
//! 5. **A retryable failure** is retried only if every check passes, in this order:
//!    * fewer than `max_attempts` attempts were sent (default 3, the per-request limit of the
//!      Google SRE book, "Handling Overload");
//!    * the delay: the next one from the [`Backoff`](stormguard_jitter::Backoff) schedule
//!      (default full jitter, `U(0, min(cap, base × 2^n))`, AWS Architecture Blog "Exponential
//!      Backoff And Jitter"), unless the server gave a hint (`retry-after-ms`, `retry-after`,
//!      `grpc-retry-pushback-ms` ...), which the [`HintPolicy`](stormguard_jitter::HintPolicy)
//!      turns into the delay; a hint above its maximum (default 60 s) means give up now;
//!    * the deadline: retry only if `now + delay + (duration of the last attempt) < deadline`,
//!      so the engine never sleeps past the deadline and never starts an attempt that would need
//!      more time than is left;
//!    * the retry budget grants a [`Ticket`](stormguard_budget::Ticket) (asked last, so that
//!      nothing is drawn for a retry the other checks rule out). Retries stay within
//!      `ratio × successes + floor` per window (SRE book: 10%): during an outage successes
//!      stop, and so do retries. The ticket of a retry that is never sent (the caller gave up
//!      during the backoff, the service failed to get ready, a layer below dropped it) is given
//!      back.
//!
//! # Hedging
//!
//! With [`ClientLayer::with_hedging`], an attempt that has produced no content after a delay
//! (fixed, or the backend's learned 95th percentile of time to first content) gets a second
//! attempt beside it, drawn from the retry budget like a retry; the first to produce content
//! answers and the other is cancelled. By default a stream is hedged only while its backend's
//! clocks are cold ([`Hedging::cold`]: nothing learned yet, at 10 s plus its prefill), so a
//! restarted gateway is protected from its first request. See [`hedge`].
//!
//! # gRPC service config
//!
//! With the `grpc` feature, the `grpc` module parses a gRFC A6 service config and its
//! `ServiceConfigLayer` sends each call through this engine with its method's retry or
//! hedging policy, timeout, and the channel's retry throttling ([`RetryTokens`], which
//! [`ClientLayer::with_retry_tokens`] also adds to any layer).
//!
//! [`RetryTokens`]: stormguard_budget::RetryTokens
//!
//! # Retry at one layer only
//!
//! When the engine gives up on a retryable failure (attempts spent, budget denied, deadline,
//! hint too long), whoever is above must not retry it again. A failed response is returned with
//! `x-should-retry: false` (honoured by the official OpenAI and Anthropic SDKs) or, for gRPC,
//! `grpc-retry-pushback-ms: -1` (gRFC A6), and carries the [`GiveUpCause`] in its extensions; a
//! failed call is returned as an [`Error`] whose outcome is fatal. Fatal failed responses get the
//! same mark: the OpenAI SDKs, for one, would otherwise retry a `429 insufficient_quota` twice
//! more. Only a request this layer could not have retried (a body too large to replay,
//! `with_max_attempts(1)`) comes back unmarked: the decision stays with the caller. A retry of a
//! server's 429 that a guard of this side refuses (the throttle drops it, the breaker is open
//! with no fallback, the rate limit cannot fit it) hands that 429 back, marked so, with its own
//! `Retry-After`, instead of the refusal's 503: the provider's answer and its hint are what the
//! caller can act on.
//!
//! A router above that can send the request elsewhere (a failover) needs more than "do not
//! retry": it sends through [`ClientService::route`], which takes a [`Route`] with the request
//! (hand a fired clock on instead of retrying here, a 429 too when the router has another
//! backend free ([`Route::with_hand_off_429`]), the budget's ticket for the move, who
//! continues the streams) and gives a [`Report`] back with the answer (the last outcome, the
//! attempts sent, why the engine gave up, and whether the server answered 429 to every
//! attempt). A backend that answered 429 throughout is rate-limiting the request whatever this
//! layer's retries do; its breaker cannot tell (a 429 is no health failure), so that is what
//! lets a failover leave it at once. An [`Error`] says the same of itself.
//!
//! # Errors and responses
//!
//! The response body type is [`ResponseBody`](stormguard_classify::body::ResponseBody): the
//! backend's body untouched for a success, or, for a failure whose body was read, the bytes read
//! followed by the rest. A response is handed over as soon as its head arrives (an event stream,
//! once its first content event came), and the deadline holds to the last byte of its body: a
//! body still waiting for bytes when the deadline passes ends with `DeadlineExceeded` (reason
//! `deadline_exceeded`). Bytes that are there already are read to their end. A stream that has
//! started is never restarted: size the deadline to the generation
//! ([`with_llm_deadline`](ClientLayer::with_llm_deadline)).
//!
//! The error type is [`Error`]: throttled, deadline exceeded, given up on, or failed in a way no
//! retry helps, with the underlying error as its source. It says what it is through
//! stormguard-classify's vocabulary, and [`Error::to_response`] (or, with the `axum` feature,
//! `IntoResponse`) answers for it the way a gateway should.
//!
//! # Observability
//!
//! Each retry logs a `WARN` event "retrying request" with `retry_attempt`, `delay_ms` and
//! `reason`; a request that failed after retrying logs "request failed after retrying" at
//! `ERROR`, once. A give-up without a retry (the budget spent, the deadline too close, a hint
//! too long) and a refusal on this side are logged at `DEBUG` ("giving up on a retryable
//! failure", "request refused locally") and summed up every [`SUMMARY_EVERY`] (see [`log`]),
//! so that a storm does not flood the logs. Spans and metrics: see [`log`] and, with the
//! `metrics` feature, the `metrics` module.
//!
//! # How it is built
//!
//! A request is a [`race`] of up to two lanes, its own attempt's and a hedge's. Each lane is one
//! attempt's path, a list of states (its body read, a backoff, the service, the guards, the
//! answer, its error body, a stream's first event), each holding what it waits with. What each
//! step comes to (an answer, an error, a refusal, a cut, a fired clock) is a verdict of the
//! request's books: end the request, retry after a delay, or leave the race. Beside the path:
//! the **admission** of each attempt by the guards, in their order (one protocol,
//! [`Permit`](stormguard_classify::Permit): a permit per guard, told the attempt's outcome, or
//! dropped untold), and the **policy** that decides whether and when to retry, kept apart from
//! the path as tower keeps its retry `Policy` apart from its future. A router above hands the
//! engine a [`Route`] and reads a [`Report`] ([`ClientService::route`]); the failover races its
//! backends with the same [`race`]. `docs/ARCHITECTURE.md` has the map of the files.
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
//! use stormguard_retry::ClientLayer;
//! use tower::{Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), stormguard_classify::BoxError> {
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
//! let mut client = ClientLayer::default().with_budget(budget.clone()).layer(backend);
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

mod admission;
mod attempt;
mod body;
mod config;
mod continuing;
mod error;
mod future;
#[cfg(feature = "grpc")]
pub mod grpc;
mod headers;
pub mod hedge;
mod lane;
mod layer;
mod ledger;
pub mod log;
#[cfg(feature = "metrics")]
pub mod metrics;
mod observe;
mod policy;
pub mod race;
mod record;
mod route;
mod service;
mod template;
mod timed_out;
mod verdict;

pub use body::ReplayBody;
pub use continuing::{Continuing, NotContinuing};
pub use error::{Error, GiveUpCause};
pub use future::ResponseFuture;
pub use headers::{ensure_idempotency_key, is_idempotent, stamp_attempt};
pub use hedge::{DEFAULT_HEDGE_PERCENTILE, DEFAULT_MAX_HEDGES, HedgeDelay, Hedging, NoHedge};
pub use layer::{ClientLayer, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_REPLAY_BODY};
pub use log::SUMMARY_EVERY;
pub use route::{Report, Route};
pub use service::{ClientService, Routed};
pub use stormguard_classify::body::PartialBody;
pub use timed_out::AttemptTimedOut;
