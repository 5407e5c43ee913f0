//! An adaptive limit on the attempts in flight to one LLM provider, learned from what the
//! provider says, and held until a streamed answer ends.
//!
//! # The problem
//!
//! A provider's capacity is its GPUs' memory: so many generations at once. When it is short,
//! latency climbs (800 ms to 2,500 ms in the incident behind this project), and at the same
//! request rate three times as many requests are in flight (Little's law), which is what exhausted
//! it. A fixed bulkhead must be sized by hand for one phase and is wrong in the other.
//!
//! The adaptive limits in use do not fit an LLM provider as they are:
//!
//! - Netflix concurrency-limits' Vegas and Gradient2, and Envoy's adaptive concurrency filter,
//!   read rising latency as queueing. An LLM call's latency follows its output length, so they
//!   shrink the limit when answers get longer; their users reported the no-load latency drifting
//!   up (Netflix/concurrency-limits #165), fast rejections skewing it (#176), limits stuck at
//!   their minimum (envoyproxy/envoy #38338) and probe windows synchronised across hosts (#8337).
//! - tower's `ConcurrencyLimit` and tower-resilience's adaptive limiter free the slot when the
//!   response head arrives, while a streamed generation holds the provider until its last token
//!   (vllm-project/router PR #280 found hundreds of generations running under a cap of 8; the fix
//!   for tower-http, PR #447, has been open since 2023).
//!
//! # The algorithm
//!
//! Loss-based AIMD, as palantir/dialogue's `CautiousIncreaseAggressiveDecreaseConcurrencyLimiter`
//! and llm-d's batch gateway do it, with the window rule of TCP congestion control:
//!
//! - **Shrink** by [`DEFAULT_BACKOFF`](ConcurrencyConfig::DEFAULT_BACKOFF) (x0.9, Netflix's
//!   `AIMDLimit`, dialogue, Vector's adaptive request concurrency) when an attempt ends with an
//!   overload answer: 429 rate limited, 503 unavailable, 529 or Anthropic's `overloaded_error`
//!   (also as an in-band event of a stream, read by the retry engine's stream guard), a timeout or
//!   a fired per-attempt clock, gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`.
//!   Once per window: an attempt admitted before the last shrink does not shrink it again, so a
//!   burst of twenty 429s is one signal, not twenty (TCP's one reduction per window of data, RFC
//!   5681 section 3.1; Vector decreases at most once per round trip).
//! - **Start slow, but not for long**: until the first overload signal, each healthy answer adds
//!   one, so the limit doubles with each window of answers (TCP's slow start, RFC 5681 section
//!   3.1; palantir/dialogue PR #3052 found additive growth alone far too slow after a spike). A
//!   client that starts at 20 in front of a provider that takes 400 finds it in a few round trips,
//!   not in hundreds.
//! - **Then grow** by `1 / limit` on each healthy answer (a success, or a 4xx the provider judged),
//!   about one slot per window of `limit` answers: dialogue's rule, llm-d's +1 per clean window.
//!   Only an attempt that went or ended while the limit was **used** counts: at least
//!   [`DEFAULT_USED`](ConcurrencyConfig::DEFAULT_USED) (0.9) of it in flight, dialogue's gate.
//!   An idle or application-limited client never grows its limit, so the limit still means
//!   something when the load comes back.
//! - **Bounds**: never below [`DEFAULT_MIN`](ConcurrencyConfig::DEFAULT_MIN) (3, Envoy's
//!   `min_concurrency`): at the floor, three attempts still go through as probes, and their
//!   healthy answers grow the limit again once the provider has recovered.
//! - **Latency is not read**, raw or normalised: the provider says when it is full (429, 529,
//!   overloaded events), and the per-attempt clocks of the retry engine already turn a response
//!   that is late for its size (time to first content, the gap between events) into a timeout,
//!   which shrinks the limit here. At a fixed request rate under an RPM quota a latency step
//!   needs more in flight, not fewer: a limit that shrank on latency would cut throughput below
//!   what the provider allows.
//! - Answers that say nothing about capacity (a transport failure, a 500, a call its caller
//!   dropped, a hedge that lost its race) free their slot and teach nothing: a black hole is the
//!   circuit breaker's to cut.
//!
//! A slot is held by a [`ConcurrencyPermit`] until the attempt's answer has been read to its end:
//! the last byte of an event stream, a cut, an error, or its body dropped.
//!
//! # Waiting
//!
//! An attempt that finds the limit full waits for a slot, first come first served, for at most
//! [`DEFAULT_MAX_WAIT`](ConcurrencyConfig::DEFAULT_MAX_WAIT) (2 s, as the rate limit waits) and
//! never past the request's deadline; then it fails fast with [`ConcurrencyFull`] (fatal on that
//! backend, not accepted: a failover takes the request to its next backend). Inside the retry
//! engine the limit sits after the rate limit (a wait for quota is not in flight) and before the
//! circuit breaker and the adaptive throttle, which see only the attempts that are sent.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use stormguard_concurrency::{ConcurrencyConfig, ConcurrencyLayer, ConcurrencyLimit};
//! use tower::{Layer, Service, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limit = ConcurrencyLimit::new(ConcurrencyConfig::default().with_initial(8));
//! let mut client = ConcurrencyLayer::new(limit.clone()).layer(service_fn(|_req| async {
//!     Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::from("hi"))))
//! }));
//! let response = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
//! // The answer's body holds its slot until it is read to its end.
//! assert_eq!(limit.snapshot().in_flight, 1);
//! drop(response);
//! assert_eq!(limit.snapshot().in_flight, 0);
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod limit;
mod service;

pub use self::config::ConcurrencyConfig;
pub use self::error::ConcurrencyFull;
pub use self::limit::{Acquire, ConcurrencyLimit, ConcurrencyPermit, Snapshot};
pub use self::service::{ConcurrencyBody, ConcurrencyLayer, ConcurrencyService, ResponseFuture};
