//! A circuit breaker for tower services: stop sending to a backend that is failing or has stopped
//! answering, answer locally in the meantime, and find its return within seconds.
//!
//! # The incident
//!
//! A provider drops every packet for 10 s: connections open, requests go out, nothing comes back.
//! Clients that retry on timeouts pile up 2,400 open connections and run out of memory. Nothing
//! that learns from answers can help, since there are none: every request waits for its
//! deadline. A sliding-window breaker cut the traffic at the 3rd second, answered locally with a
//! fallback, and half-open probes brought traffic back within 2 s of the provider's return.
//!
//! # The algorithm
//!
//! A [`CircuitBreaker`] is shared by every client of one backend. Each attempt asks it for a
//! [`BreakerPermit`] and records its [`Outcome`](stormguard_classify::Outcome) on it.
//!
//! - **Closed.** Attempts go through. Over a sliding window (10 s in 1 s slices) the breaker
//!   counts *calls* (attempts that came back or timed out) and *health failures*: what the
//!   classifier says the backend did not accept (5xx, 529, timeouts, transport errors, an
//!   aborted stream). A 429 or a fatal 4xx is no health failure: a rate limit is the rate
//!   limiter's business, and a bad request says nothing about the backend. When the window holds
//!   at least 20 calls and half of them failed, the breaker opens.
//! - **Stall detection.** A backend that answers nothing produces no failure to count until the
//!   timeouts, which for LLM calls are minutes away. So while attempts are in flight the breaker
//!   also watches the silence: the time since the last answer (or since attempts went out again
//!   after none were in flight). It opens, with cause [`OpenCause::Stall`], when the silence is
//!   longer than all of: 2 s; the quickest answer of the window before it (a wave of long
//!   generations sent at once is silent until the first of them could have finished); and the
//!   time in which the answer rate of that window promised 20 answers (at 1 answer a second,
//!   20 s: a chance silence that long has odds of `e^-20`), counting at most one answer per
//!   attempt in flight (fewer than 20 in flight are never a stall). The window judged is the one
//!   that ended with the last answer, so that the silence does not drain the rate it is judged
//!   by, and only if the backend answered within a window of the attempts going out. At 100
//!   requests per second or more the 2 s decide: a black hole is cut
//!   about 2 s after its last answer. Opening on a stall also cuts the attempts in flight (they
//!   fail with [`BreakerOpen`], or get the fallback), so that a black hole cannot hold thousands
//!   of connections until their deadlines (unless
//!   [`without_cancel_on_stall`](BreakerConfig::without_cancel_on_stall)).
//!   The check runs when an attempt asks for a permit, at most every 50 ms: a client that sends
//!   nothing has nothing to protect.
//! - **Open.** Every attempt is refused at once with [`BreakerOpen`], which says when to come
//!   back, or answered by the caller's [`Fallback`]. The refusal is final for that request on
//!   that backend: the retry engine never retries it (failover may send it elsewhere). The open
//!   wait is 1 s, or the server's `Retry-After` when the failure that opened the breaker carried
//!   one, doubled for each probe that failed since the breaker last closed, at most 30 s, and
//!   stretched by a random 0 to 25% so that clients that opened together probe apart.
//! - **Half-open.** When the wait is over, probes go through: at most 3 in flight, spaced a
//!   lease apart divided among them (2 s / 3). Each probe holds its slot for its 2 s lease at
//!   most: a probe that never finishes cannot keep the others out, and its slot goes to the next
//!   probe (the probe itself carries on, to its answer or its deadline: a long generation may well
//!   be healthy, and should it succeed after its lease, it still closes the breaker).
//!   A healthy answer closes the breaker (and clears the window); a health failure of a probe
//!   opens it again, with a longer wait. Other attempts are refused.
//!
//! A lapsed probe is not a failed probe, deliberately: in a black hole every probe lapses, and
//! re-opening on each would add a lease plus an open wait to every probing cycle; spaced probes
//! find the provider's return about a second after it. A probe that is *answered* with a failure
//! is what doubles the wait: that backend is answering, and is spared the probes.
//!
//! An optional **bulkhead** caps the attempts in flight to the backend
//! ([`with_max_in_flight`](BreakerConfig::with_max_in_flight)): beyond it attempts are refused with
//! [`BulkheadFull`], whatever the state.
//!
//! # Breaker or throttle?
//!
//! Both stop sending to a failing backend; they answer different failures, and compose.
//!
//! - The **adaptive throttle** (`stormguard-adaptive-throttle`) is probabilistic and learns from
//!   answers: against a backend that rejects, it starts dropping within a second or two, keeps 1%
//!   of the traffic as probes, and is back within about a second of the recovery. It never
//!   refuses everything, so it never needs a way back, and it handles partial failure (a backend
//!   that rejects a third of the traffic is sent a share it can take). It is in the default
//!   pipeline.
//! - The **breaker** is binary and learns from silence as well: only it notices a backend that
//!   answers nothing (the throttle counts an attempt when it ends, and in a black hole none does),
//!   only it cuts the attempts already in flight, caps them (bulkhead), and answers locally (the
//!   fallback). Against a backend that answers with errors it is slower than the throttle both
//!   ways: it waits for 20 calls and a 50% failure ratio to open, and for a probe to close.
//!
//! So the default pipeline of the retry engine has the throttle and no breaker: a breaker is one
//! per backend, with a fallback only the caller can write, and costs every attempt a permit. Add
//! one with the engine's `with_breaker` when the backend can black-hole (a provider behind a
//! load balancer, a self-hosted model that hangs) or when a local answer beats an error.
//!
//! Together, in the engine, each attempt asks the breaker first and the throttle second, and
//! neither slows the other's recovery:
//!
//! - a request the breaker refuses never reaches the throttle, and an attempt the breaker cuts is
//!   not recorded with it: the throttle's window holds no drops or silences to unlearn after the
//!   recovery. After a black hole, the first probe's success closes the breaker, and the
//!   throttle, which saw nothing of the silence, lets everything through;
//! - the throttle never drops a probe (it only learns from the probe's answer): a throttle still
//!   dropping 99% after an outage would otherwise hold the breaker open;
//! - the throttle's drops reach the breaker as attempts never sent: no health failure.
//!
//! Each keeps its own pace, though: against an answered outage the pipeline with a breaker comes
//! back when a probe succeeds (after waits that double while probes fail), the throttle alone
//! within about a second.
//!
//! # Sources
//!
//! - Thresholds: Hystrix (`circuitBreaker.requestVolumeThreshold` 20,
//!   `errorThresholdPercentage` 50, a 10 s rolling window in 1 s buckets) and Resilience4j
//!   (`failureRateThreshold` 50%, a sliding window, `permittedNumberOfCallsInHalfOpenState`).
//! - The growing open wait: Envoy's outlier detection, whose ejection time grows with each
//!   ejection of the same host (`base_ejection_time` times the ejection count, up to
//!   `max_ejection_time`).
//! - The incident above, for the stall detector, the cut of attempts in flight, and the targets
//!   (cut within 3 s, traffic back within 2 s).
//!
//! Each default's reasoning is on its constant in [`BreakerConfig`].
//!
//! # Example
//!
//! ```
//! use http::HeaderMap;
//! use stormguard_breaker::{BreakerConfig, CircuitBreaker, State};
//! use stormguard_classify::{Outcome, Permit, Reason};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(4));
//! for _ in 0..4 {
//!     let permit = breaker.try_acquire().expect("closed");
//!     let unavailable = Outcome::retryable(Reason::Unavailable).with_accepted(false);
//!     permit.record(&unavailable, &HeaderMap::new());
//! }
//! assert_eq!(breaker.state(), State::Open);
//! let refused = breaker.try_acquire().expect_err("open");
//! assert_eq!(refused.outcome().reason(), Reason::BreakerOpen);
//! # }
//! ```
//!
//! As a layer, with a fallback:
//!
//! ```
//! use bytes::Bytes;
//! use stormguard_breaker::{BreakerLayer, CircuitBreaker, Fallback};
//! use stormguard_classify::LocalAnswer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), stormguard_classify::BoxError> {
//! let breaker = CircuitBreaker::default();
//! let fallback = Fallback::new(|_head, _refusal| http::Response::new(Bytes::from("later")));
//! let service = ServiceBuilder::new()
//!     .layer(BreakerLayer::new(breaker.clone()).with_fallback(fallback))
//!     .service_fn(|_request: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
//!     });
//! let response = service.oneshot(http::Request::new(String::new())).await?;
//! assert!(response.extensions().get::<LocalAnswer>().is_none());
//! assert_eq!(breaker.snapshot().calls, 1);
//! # Ok(())
//! # }
//! ```

mod breaker;
mod config;
mod error;
mod fallback;
mod service;
mod sync;

pub use breaker::{BreakerPermit, BreakerSnapshot, CircuitBreaker, State};
pub use config::BreakerConfig;
pub use error::{BreakerOpen, BulkheadFull, OpenCause, Rejected};
pub use fallback::Fallback;
pub use service::{BreakerLayer, BreakerService, ResponseFuture};
