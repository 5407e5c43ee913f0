//! stormguard's client engine for [reqwest] users, as [reqwest-middleware] middleware.
//!
//! [`StormguardMiddleware`] converts each `reqwest::Request` to an `http::Request`, drives
//! stormguard's [`ClientLayer`] over a service that calls the rest of the middleware chain
//! (`Next`), and converts the answer back. There is one retry engine in stormguard, and this is
//! it: one deadline across all attempts, request replay, adaptive throttling, classification of
//! LLM error bodies, the retry budget, jittered backoff and server hints, attempt numbers and
//! idempotency keys, and `x-should-retry: false` on what it gives up on, exactly as the tower
//! `ClientLayer` does them. Configure it with the same [`ClientLayer`] builder.
//!
//! What the conversion keeps: the method, URL, headers, version and body of the request, its
//! per-request timeout (`RequestBuilder::timeout`), and the middleware [`Extensions`]
//! (`http::Extensions`), which every attempt hands on to the rest of the chain and which come
//! back to the caller with what the chain put in them. A [`Deadline`] the caller put into those
//! extensions (`RequestBuilder::with_extension`, from `reqwest-middleware`'s `RequestBuilder`)
//! bounds the request when it is tighter than the layer's timeout. The response keeps its URL.
//!
//! Errors: an error the engine handed back as it came (a failure it does not retry: fatal, or a
//! body it could not replay) is returned unchanged, so that `reqwest`'s `is_connect()` and
//! `is_timeout()` keep working on it. stormguard's own outcomes (a request throttled locally, an
//! expired deadline, a retryable failure it gave up on) come back as
//! [`Error::Middleware`] holding the engine's
//! [`stormguard_retry::Error`] (downcast it with `anyhow`'s `downcast_ref`), whose source chain
//! leads to the original error.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use stormguard_reqwest::StormguardMiddleware;
//! use stormguard_retry::ClientLayer;
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let layer = ClientLayer::default().with_timeout(Duration::from_secs(120));
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(StormguardMiddleware::new(layer))
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
//! [`Deadline`]: stormguard_deadline::Deadline

mod next;
#[cfg(feature = "async-openai")]
pub mod openai;
#[cfg(feature = "rig")]
pub mod rig;
#[cfg(any(feature = "async-openai", feature = "rig"))]
mod transport;

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};
use stormguard_classify::{Classify, LlmClassifier, Reason};
use stormguard_deadline::Deadline;
use stormguard_failover::Failover;
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_retry::{ClientLayer, NotContinuing};
use tower_layer::Layer;
use tower_service::Service;

use crate::next::NextService;
pub use crate::next::RequestBody;
#[cfg(feature = "async-openai")]
pub use crate::openai::OpenAiService;
#[cfg(feature = "rig")]
pub use crate::rig::RigClient;

/// reqwest-middleware [`Middleware`] that sends every request through stormguard's client engine
/// (see the [crate docs](crate)). `StormguardMiddleware::default()` uses
/// `ClientLayer::default()`; [`new`](Self::new) takes any configured [`ClientLayer`]. The budget
/// and the throttle are shared by every clone of the layer: hand the same ones to the tower
/// clients and reqwest clients that call one backend.
#[derive(Clone, Debug)]
pub struct StormguardMiddleware<C = LlmClassifier, Bk = FullJitter> {
    engine: Engine<C, Bk>,
}

/// What drives each request: one engine, or a failover over several backends. Neither continues
/// a stream: the chain below lives only as long as the call, so a stream that cannot be completed
/// ends with its in-band error event.
#[derive(Clone, Debug)]
enum Engine<C, Bk> {
    One(ClientLayer<C, Bk, NotContinuing>),
    Failover(Failover<C, Bk, NotContinuing>),
}

impl Default for StormguardMiddleware {
    fn default() -> Self {
        Self::new(ClientLayer::default())
    }
}

impl<C, Bk> StormguardMiddleware<C, Bk> {
    /// Middleware driving `layer`.
    pub fn new<K>(layer: ClientLayer<C, Bk, K>) -> Self {
        Self {
            engine: Engine::One(layer.without_continuation()),
        }
    }

    /// Middleware driving `failover`: each request goes to its first healthy backend (the
    /// backend's adapter rewrites its URL), each backend through the engine with its own guards,
    /// under one deadline and one retry budget.
    pub fn failover<K>(failover: Failover<C, Bk, K>) -> Self {
        Self {
            engine: Engine::Failover(failover.without_continuation()),
        }
    }

    /// The engine's configuration (its budget and throttle, for their snapshots); a failover's
    /// policy.
    pub fn layer(&self) -> &ClientLayer<C, Bk, NotContinuing> {
        match &self.engine {
            Engine::One(layer) => layer,
            Engine::Failover(failover) => failover.policy(),
        }
    }
}

impl<C: Classify + Clone, Bk: Backoff + Clone> StormguardMiddleware<C, Bk> {
    async fn execute(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let timeout = request.timeout().copied();
        let url = request.url().clone();
        let mut request = http::Request::try_from(request)?.map(RequestBody::new);
        if let Some(deadline) = Deadline::from_extensions(extensions) {
            deadline.apply_to(&mut request);
        }
        let shared = Arc::new(Mutex::new(std::mem::take(extensions)));
        let next = NextService::new(next, Arc::clone(&shared), timeout);
        let result = match &self.engine {
            Engine::One(layer) => {
                let mut client = layer.layer(next);
                match poll_fn(|cx| client.poll_ready(cx)).await {
                    Ok(()) => client.call(request).await,
                    Err(error) => Err(error),
                }
            }
            Engine::Failover(failover) => failover.layer(next).call(request).await,
        };
        *extensions = std::mem::take(&mut *shared.lock().unwrap_or_else(PoisonError::into_inner));
        match result {
            Ok(response) => Ok(next::into_reqwest(response, url)),
            Err(error) => Err(into_middleware_error(error)),
        }
    }
}

/// An error the engine passed on untouched goes back as the chain returned it; stormguard's own
/// outcomes go back as the engine's error.
fn into_middleware_error(error: stormguard_retry::Error) -> Error {
    match passed_on::<Error>(error) {
        Ok(original) => original,
        Err(error) => Error::middleware(error),
    }
}

/// The error below the engine, `E`, when the engine passed it on as it came (a failure it does
/// not retry, a body it could not replay); the engine's error for stormguard's own outcomes (a
/// request throttled locally, an expired deadline, a retryable failure it gave up on), whose
/// source chain leads to the original, and for an error of another type.
pub(crate) fn passed_on<E>(
    error: stormguard_retry::Error,
) -> std::result::Result<E, stormguard_retry::Error>
where
    E: std::error::Error + 'static,
{
    let ours = error.gave_up().is_some()
        || matches!(error.reason(), Reason::Throttled | Reason::DeadlineExceeded);
    if ours {
        return Err(error);
    }
    error.downcast_source::<E>()
}

/// The trait is declared with `async_trait`; this is the signature it expands to, written out so
/// that no macro crate is needed.
impl<C, Bk> Middleware for StormguardMiddleware<C, Bk>
where
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Pin<Box<dyn Future<Output = Result<Response>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.execute(req, extensions, next))
    }
}
