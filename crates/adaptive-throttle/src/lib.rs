//! Client-side adaptive throttling for tower services: stop sending to a backend that is
//! rejecting, and come back as soon as it accepts again.
//!
//! # The problem
//!
//! When a backend is overloaded or down, every request a client sends is wasted work for both
//! sides, and retries multiply it. A client that keeps sending at full rate into a failing backend
//! is part of the reason it stays down.
//!
//! # The algorithm
//!
//! Client-side throttling from the Google SRE book, chapter "Handling Overload", section
//! "Client-Side Throttling". Over a sliding window the client counts
//!
//! - `requests`: requests the application attempted, **including** those dropped locally;
//! - `accepts`: requests the backend accepted (it did the work and answered, even with a 4xx).
//!
//! and drops each new request locally with probability
//!
//! ```text
//! P_drop = max(0, (requests - K * accepts) / (requests + 1))
//! ```
//!
//! With K = 2 (the book's value) nothing is dropped while the backend accepts at least half of
//! what it receives, and under overload the client settles at sending K times what the backend
//! accepts. A local drop fails fast with [`Throttled`], is never retried, and never reaches the
//! backend; it carries its outcome (fatal, [`Reason::Throttled`](stormguard_classify::Reason),
//! not accepted) as a [`Failure`](stormguard_classify::Failure) in its source chain, so every
//! stormguard classifier recognises it. "Accepted" comes from the classifier
//! ([`Outcome::is_accepted`](stormguard_classify::Outcome::is_accepted)), not from success: a 400
//! is an accept, and so is a 429 whose body says `insufficient_quota` (the backend answered: the
//! quota is spent); a 503, a 429 rate limit or a timeout is not. The layer reads a failed
//! response's error body to tell them apart, as the retry engine does.
//!
//! A drop is counted when it happens; a request that was sent is counted when its outcome is
//! recorded. The book counts it when it is sent; with answers that take seconds (LLM
//! generations) and a window of seconds, that would count every request in flight as a rejection,
//! and a cold start with a burst of concurrent requests would throttle a healthy backend before
//! its first answer. In a steady state both count the same rate.
//!
//! # Two speeds
//!
//! The formula is only as good as its window.
//!
//! - **Outage detection.** After healthy traffic, the window is full of accepts, and nothing is
//!   dropped until `requests` exceed K times the accepts left in it (with K = 2: until failures
//!   outnumber those accepts), half a window into a total outage. With the book's two-minute
//!   window, 20 s of healthy traffic mask the first 20 s of an outage: every request of a 10 s
//!   outage reaches the dead backend.
//! - **Recovery.** During an outage the window fills with local drops and no accepts. After the
//!   backend recovers, only the few requests that pass can see it, each accept lets only about K
//!   more through, and the drops themselves keep `requests` high, so the pass rate compounds back
//!   slowly. With the two-minute window, a client at 1,000 requests per second that lived through
//!   a 10 s outage stays above 5% drops for about 610 s (measured).
//!
//! The defaults ([`ThrottleConfig::default`]) handle both:
//!
//! - a **2 s window** in 20 slices of 100 ms. Counts age out slice by slice, with no reset. A
//!   total outage after healthy traffic starts dropping after 1 s and reaches the cap after 1.9 s;
//!   a burst of failures shorter than 1 s drops nothing, and neither does a 5% error rate;
//! - a **cap of 99%** on the drop probability. An outage still sends 1% of the offered load, and
//!   those requests are the probes that see the recovery. Envoy's admission control filter caps at
//!   80% (`max_rejection_probability`), which would send a fifth of the load into a dead backend;
//!   with no cap, the plain formula lets about one request per window through, too few to notice
//!   a recovery quickly;
//! - a **recovery run**: 10 accepts in a row while throttling clear the window. With K = 2 the
//!   formula drops only while the backend accepts under half of what it gets, so ten accepts in
//!   a row happen by chance less than once in a thousand. If the backend is not really back, the
//!   cleared window has no accepts left to mask the failures, and the throttle is dropping again
//!   after a dozen requests;
//! - **no drops below 5 requests per second** (10 in the window): too few samples to judge, and too
//!   little traffic to storm anything. Envoy's `rps_threshold` defaults to 0.
//!
//! Measured for a client offering 1,000 requests per second, 20 s healthy, then a 10 s total
//! outage, then healthy (this crate's `two_speeds` tests): in the outage's first second every
//! request reaches the backend, in its second 45%, and from its third second on 0.4% to 1.3%
//! (1,531 of the outage's 10,000 requests in all; 1,511 to 1,571 over 20 seeds). After the
//! recovery, the drop probability is below 5% for good after 1.1 s: the recovery run needs about
//! a second of 1% probes to see ten accepts. Without the run, the same window and cap take 5.7 to
//! 8.6 s to compound back (20 seeds).
//!
//! The trade-offs: the short window remembers only the last 2 s, so the throttle follows a change
//! of regime within seconds but does not smooth over longer cycles; an outage costs the backend
//! its first 1 to 2 s of traffic and 1% afterwards; and recovery time follows the probe rate, 1%
//! of the offered load. Over 20 seeds, a client at 10,000 requests per second is back within
//! 0.2 s, one at 1,000 within 0.7 to 2.3 s (1 s median over 100 seeds), one at 100 (one probe
//! per second) within 2 to 9 s.
//! Change any of it with the `with_*` methods of [`ThrottleConfig`], before the throttle is made:
//! a throttle's settings are fixed, and shared by all its clones.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, Throttled};
//! use stormguard_classify::{Outcome, Permit};
//!
//! let config = ThrottleConfig::default().with_window(Duration::from_secs(5));
//! let throttle = AdaptiveThrottle::new(config);
//! match throttle.try_acquire() {
//!     Ok(permit) => {
//!         // ... send the request, then tell the permit how it ended (the throttle counts
//!         // whether the backend accepted it); a permit dropped untold counts as not accepted.
//!         permit.record(&Outcome::success(), &http::HeaderMap::new());
//!     }
//!     Err(Throttled) => { /* fail fast: the backend is rejecting */ }
//! }
//! let snapshot = throttle.snapshot();
//! assert_eq!((snapshot.requests, snapshot.accepts), (1, 1));
//! assert_eq!(snapshot.probability, 0.0);
//! assert_eq!(snapshot.window, Duration::from_secs(5));
//! ```
//!
//! As a layer, with the throttle shared so that its numbers can be watched:
//!
//! ```
//! use stormguard_adaptive_throttle::{AdaptiveThrottle, AdaptiveThrottleLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), stormguard_classify::BoxError> {
//! let throttle = AdaptiveThrottle::default();
//! let service = ServiceBuilder::new()
//!     .layer(AdaptiveThrottleLayer::new(throttle.clone()))
//!     .service_fn(|_request: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
//!     });
//! let response = service.oneshot(http::Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(throttle.snapshot().accepts, 1);
//! # Ok(())
//! # }
//! ```

mod config;
mod error;
mod service;
mod sync;
mod throttle;

pub use config::ThrottleConfig;
pub use error::Throttled;
pub use service::{AdaptiveThrottleLayer, AdaptiveThrottleService, ResponseFuture};
pub use throttle::{AdaptiveThrottle, ThrottlePermit, ThrottleSnapshot};
