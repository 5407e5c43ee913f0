//! Fault injection for tower services: make a provider fail on purpose, the way LLM providers
//! fail, to see what a client or a gateway does about it.
//!
//! **For staging, game days and tests. Never in production.** A chaos layer with faults fails
//! real calls; its only use is to prove, before an incident, that the rest of the stack holds.
//! It is off unless configured: [`ChaosLayer::new()`] injects nothing, and the `stormguard`
//! facade has it only behind its `chaos` feature, off by default.
//!
//! # The problem
//!
//! A retry budget, a breaker, a stream guard or a deadline is only as good as the faults it has
//! met. The faults that matter for an LLM client are specific: a 429 with and without a hint, a
//! quota exhausted (which no retry cures), a 529 `overloaded_error`, a 200 whose event stream
//! fails before its first token or is cut after the tenth, a provider that stops answering. A
//! mock server can play some of them; a chaos layer plays all of them in front of the real
//! thing, at a rate and on a schedule, with the providers' real error bodies.
//!
//! # What it injects
//!
//! A [`ChaosLayer`] holds [`Fault`]s, each a [`FaultKind`], a rate (the share of calls it hits)
//! and a schedule (from `start` after the layer's origin, for `duration`; by default always):
//!
//! - the providers' error answers ([`ErrorAnswer`]: 429 with and without `Retry-After`, 429
//!   `insufficient_quota`, 400 `context_length_exceeded`, 500, 503, 529 `overloaded_error`), in
//!   OpenAI's or Anthropic's shape by the request's path ([`Provider::of_path`]);
//! - latency, silence (a call that never answers), and connection resets;
//! - for event streams (`text/event-stream` successes): an error event before any content, a
//!   cut or a stall after n events, a malformed event after n events.
//!
//! Each call draws once for the faults that act on the call and once for those that act on an
//! event stream; the faults of a sort share the draw in their order, each by its rate (see
//! [`Fault`]), so a fault at 5% hits 5% of the calls however many others there are. The draws
//! come from `stormguard-numbers`'s [`random`](stormguard_numbers::random) source:
//! [`ChaosLayer::with_seed`] replays the same faults call for call. Schedules run on tokio's
//! clock, so tests can run them on a paused one.
//!
//! # Where it sits
//!
//! - **Under a client** ([`ChaosLayer::new`]): between stormguard's `ClientLayer` and the hyper
//!   (or tonic, or reqwest) service, as if the provider failed. A reset is the call's error, an
//!   `io::Error` of kind `ConnectionReset`, which stormguard's classifiers read as a retryable
//!   transport failure.
//! - **In front of a server** ([`ChaosLayer::for_server`]): on an axum `Router`, as if the
//!   server failed its callers. Its service fails only as the server does (never, for axum), and
//!   a reset is an answer whose body fails at once, so the server aborts the connection.
//!
//! [`ChaosLayer::snapshot`] says what was injected, fault by fault, and how many calls are still
//! in flight through the layer (a silence or a stall until its caller gives up).
//!
//! ```
//! use std::convert::Infallible;
//!
//! use axum::Router;
//! use axum::routing::post;
//! use stormguard_chaos::{ChaosLayer, ErrorAnswer, Fault, FaultKind};
//! use tower::ServiceBuilder;
//!
//! let overloaded = Fault::new(FaultKind::Answer(ErrorAnswer::Overloaded), 0.05);
//!
//! // Under a client: the layers above it (stormguard's `ClientLayer` in a gateway) meet a
//! // provider that fails; the client below it never hears of the calls answered in its place.
//! # let hyper_client = tower::service_fn(|_: http::Request<String>| async {
//! #     Ok::<_, Infallible>(http::Response::new(String::new()))
//! # });
//! let client = ServiceBuilder::new()
//!     // .layer(stormguard::ClientLayer::default())
//!     .layer(ChaosLayer::new().with_fault(overloaded.clone()))
//!     .service(hyper_client);
//!
//! // In front of a server: its callers meet a server that fails.
//! let app: Router = Router::new()
//!     .route("/v1/messages", post(|| async { "an answer" }))
//!     .layer(ChaosLayer::for_server().with_fault(overloaded));
//! # let _ = (client, app);
//! ```
//!
//! A stormguard gateway (an axum server calling a provider through `ClientLayer`) takes it in
//! the first place for a game day: the provider fails, and the gateway's guards are what is
//! tested. In front of the gateway, it tests the gateway's own callers instead.
//!
//! # Example: a provider that goes bad for 30 s
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use stormguard_chaos::{ChaosLayer, ErrorAnswer, Fault, FaultKind};
//! use tower::{Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), stormguard_classify::BoxError> {
//! let secs = Duration::from_secs;
//! let chaos = ChaosLayer::new()
//!     .with_seed(7)
//!     // From 10 s to 40 s: one call in five gets a 529, one stream in ten is cut after 3 events.
//!     .with_fault(Fault::new(FaultKind::Answer(ErrorAnswer::Overloaded), 0.2)
//!         .with_start(secs(10))
//!         .with_duration(Some(secs(30))))
//!     .with_fault(Fault::new(FaultKind::CutAfter(3), 0.1)
//!         .with_start(secs(10))
//!         .with_duration(Some(secs(30))));
//!
//! // The provider: here a service that always answers; in staging, the hyper client under
//! // stormguard's `ClientLayer`.
//! let provider = tower::service_fn(|_request: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
//! });
//! let client = chaos.layer(provider);
//!
//! // Before 10 s, nothing is injected.
//! let answer = client.clone().oneshot(http::Request::new(())).await?;
//! assert_eq!(answer.status(), 200);
//! drop(answer); // its call is in flight until its body is done with
//!
//! tokio::time::sleep(secs(10)).await;
//! let mut overloaded = 0;
//! for _ in 0..100 {
//!     let answer = client.clone().oneshot(http::Request::new(())).await?;
//!     overloaded += usize::from(answer.status() == 529);
//! }
//! let snapshot = chaos.snapshot();
//! assert_eq!(snapshot.faults[0].injected, overloaded as u64);
//! assert!((10..=30).contains(&overloaded), "{overloaded}");
//! assert_eq!((snapshot.calls, snapshot.in_flight), (101, 0));
//! # Ok(())
//! # }
//! ```

mod body;
mod fault;
mod injector;
mod provider;
mod service;
mod snapshot;

pub use self::body::ChaosBody;
pub use self::fault::{Fault, FaultKind};
pub use self::provider::{ErrorAnswer, Provider};
pub use self::service::{ChaosLayer, ChaosService, ResponseFuture, placement};
pub use self::snapshot::{ChaosSnapshot, FaultSnapshot};
