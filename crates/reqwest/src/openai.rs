//! stormguard's engine under [async-openai]'s client (feature `async-openai`).
//!
//! async-openai (0.41, feature `middleware`) runs every API call through a tower service of its
//! own request type, a replayable [`HttpRequestFactory`], answered with a `reqwest::Response`:
//! [`Client::with_http_service`] takes any such service. [`OpenAiService`] is one: it builds the
//! request once, converts it to an `http::Request`, and drives stormguard's [`ClientLayer`] over a
//! `reqwest::Client` that sends each attempt. The engine buffers the body and replays it, so the
//! factory is built once per call, not once per attempt.
//!
//! Unlike [`StormguardMiddleware`](crate::StormguardMiddleware), whose chain lives only as long
//! as the call, the client here outlives it: a stream async-openai reads is guarded and, for the
//! formats the engine knows (chat completions), continued after a cut, so that
//! `create_stream` yields every token once and in order.
//!
//! Leave async-openai's own retry off: its default executor retries 429s and 5xx itself, but a
//! client given a service uses that service alone, so the engine's budget is the only one.
//!
//! ```no_run
//! use async_openai::Client;
//! use async_openai::config::OpenAIConfig;
//! use stormguard_reqwest::OpenAiService;
//! use stormguard_retry::ClientLayer;
//!
//! let config = OpenAIConfig::new().with_api_base("http://127.0.0.1:8080/v1");
//! let client = Client::with_config(config)
//!     .with_http_service(OpenAiService::new(ClientLayer::default(), reqwest::Client::new()));
//! # drop(client);
//! ```
//!
//! [async-openai]: https://docs.rs/async-openai
//! [`HttpRequestFactory`]: async_openai::middleware::HttpRequestFactory
//! [`Client::with_http_service`]: async_openai::Client::with_http_service

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use stormguard_classify::{Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_retry::{ClientLayer, ClientService};
use tower_layer::Layer;
use tower_service::Service;

use crate::next::{RequestBody, into_reqwest};
use crate::passed_on;
pub use crate::transport::Transport;

/// The engine over `reqwest::Client`, as async-openai's HTTP service (see the
/// [module docs](self)). Clones share the engine's budget, throttle and guards.
pub struct OpenAiService<C = LlmClassifier, Bk = FullJitter> {
    engine: ClientService<Transport, C, Bk>,
}

impl<C, Bk> OpenAiService<C, Bk> {
    /// `layer` driving the attempts `client` sends (a layer that continues streams, as
    /// `ClientLayer::default()` does).
    pub fn new(layer: ClientLayer<C, Bk>, client: reqwest::Client) -> Self {
        Self {
            engine: layer.layer(Transport::new(client)),
        }
    }
}

impl<C, Bk> Clone for OpenAiService<C, Bk> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
        }
    }
}

impl<C, Bk> fmt::Debug for OpenAiService<C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiService").finish_non_exhaustive()
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

impl<C, Bk> Service<HttpRequestFactory> for OpenAiService<C, Bk>
where
    C: Classify + Send + Sync + 'static,
    Bk: Backoff + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        // The engine is asked in the call: its waits (a rate limit's) belong to the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Answer {
        let mut engine = self.engine.clone();
        Box::pin(async move {
            let request = factory.build().await?;
            let url = request.url().clone();
            let request = http::Request::try_from(request)?.map(RequestBody::new);
            poll_fn(|cx| engine.poll_ready(cx))
                .await
                .map_err(into_openai_error)?;
            match engine.call(request).await {
                Ok(response) => Ok(into_reqwest(response, url)),
                Err(error) => Err(into_openai_error(error)),
            }
        })
    }
}

/// An error the engine passed on as it came (a connection the client could not make, a failure
/// it does not retry) goes back as reqwest's, so that async-openai reports it as it would have;
/// stormguard's own outcomes (throttled, out of time, given up on) as the engine's error.
fn into_openai_error(error: stormguard_retry::Error) -> OpenAIError {
    match passed_on::<reqwest::Error>(error) {
        Ok(original) => OpenAIError::Reqwest(original),
        Err(error) => OpenAIError::Boxed(Box::new(error)),
    }
}
