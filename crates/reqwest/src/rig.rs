//! stormguard's engine under [rig]'s providers (feature `rig`).
//!
//! rig (0.42) sends every call of a provider's client through the HTTP client its builder was
//! given (`.http_client(..)`): any type that implements rig's [`HttpClientExt`]. [`RigClient`] is
//! one: it drives stormguard's [`ClientLayer`] over a `reqwest::Client` that sends each attempt,
//! and answers rig as rig's own clients do: a non-success status as
//! [`Error::InvalidStatusCodeWithDetails`] with its headers and body, a stream as its bytes.
//!
//! As with async-openai's `OpenAiService`, the client outlives the call: a stream rig reads is
//! guarded and, for the formats the engine knows (chat completions, which rig's OpenAI client
//! speaks after `completions_api()`), continued after a cut, so that rig yields every token once
//! and in order.
//!
//! rig's own `reqwest-middleware` feature would take
//! [`StormguardMiddleware`](crate::StormguardMiddleware) as well, but it turns on a TLS backend
//! for reqwest (rustls on aws-lc, or native-tls), and a middleware's chain lives only as long as
//! the call, too short to continue a stream. With `RigClient`, rig needs no TLS backend
//! (`rig-core = { version = "0.42", default-features = false }`): the `reqwest::Client` given to
//! [`RigClient::new`] brings the one the application chose.
//!
//! ```no_run
//! use rig_core::client::CompletionClient;
//! use rig_core::completion::CompletionModel;
//! use rig_core::providers::openai;
//! use stormguard_reqwest::RigClient;
//! use stormguard_retry::ClientLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = openai::Client::builder()
//!     .api_key("sk-...")
//!     .base_url("http://127.0.0.1:8080/v1")
//!     .http_client(RigClient::new(ClientLayer::default(), reqwest::Client::new()))
//!     .build()?
//!     .completions_api();
//! let model = client.completion_model("gpt-4o-mini");
//! let answer = model.completion_request("Hello").max_tokens(256).send().await?;
//! println!("{:?}", answer.choice);
//! # Ok(())
//! # }
//! ```
//!
//! [rig]: https://docs.rs/rig-core

use std::fmt;
use std::future::{Future, poll_fn};

use bytes::Bytes;
use futures_util::TryStreamExt;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::{BodyDataStream, BodyExt};
use rig_core::http_client::sse::BoxedStream;
use rig_core::http_client::{
    Error, HttpClientExt, LazyBody, MultipartForm, Request, Response, Result, StreamingResponse,
};
use rig_core::wasm_compat::WasmCompatSend;
use stormguard_classify::body::{Prefix, ResponseBody, Tail};
use stormguard_classify::{Classify, ERROR_BODY_LIMIT, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter};
use stormguard_retry::{ClientLayer, ClientService};
use tower_layer::Layer;
use tower_service::Service;

use crate::next::RequestBody;
use crate::passed_on;
use crate::transport::Transport;

/// The engine over `reqwest::Client`, as the HTTP client of rig's providers (see the
/// [module docs](self)). Clones share the engine's budget, throttle and guards.
pub struct RigClient<C = LlmClassifier, Bk = FullJitter> {
    engine: ClientService<Transport, C, Bk>,
}

impl<C, Bk> RigClient<C, Bk> {
    /// `layer` driving the attempts `client` sends (a layer that continues streams, as
    /// `ClientLayer::default()` does).
    pub fn new(layer: ClientLayer<C, Bk>, client: reqwest::Client) -> Self {
        Self {
            engine: layer.layer(Transport::new(client)),
        }
    }
}

/// rig's providers ask their HTTP client for `Default`: the engine's defaults with `C`'s and
/// `Bk`'s, over a new `reqwest::Client`, with a budget and a throttle of its own.
impl<C, Bk> Default for RigClient<C, Bk>
where
    C: Classify + Default,
    Bk: Backoff + Default,
{
    fn default() -> Self {
        let layer = ClientLayer::default()
            .with_classifier(C::default())
            .with_backoff(Bk::default());
        Self::new(layer, reqwest::Client::new())
    }
}

impl<C, Bk> Clone for RigClient<C, Bk> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
        }
    }
}

impl<C, Bk> fmt::Debug for RigClient<C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RigClient").finish_non_exhaustive()
    }
}

type Answer = http::Response<ResponseBody<reqwest::Body>>;

impl<C, Bk> RigClient<C, Bk>
where
    C: Classify + Send + Sync + 'static,
    Bk: Backoff + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    /// `request` through the engine; the answer of any status, its body still to read.
    fn execute(
        &self,
        request: Request<Bytes>,
    ) -> impl Future<Output = Result<Answer>> + Send + use<C, Bk> {
        let mut engine = self.engine.clone();
        let request = request.map(|body| RequestBody::new(reqwest::Body::from(body)));
        async move {
            poll_fn(|cx| engine.poll_ready(cx))
                .await
                .map_err(into_rig_error)?;
            engine.call(request).await.map_err(into_rig_error)
        }
    }
}

/// A successful answer with its body read lazily, as rig's clients hand it on.
async fn lazy<U: From<Bytes>>(answer: Answer) -> Result<Response<LazyBody<U>>> {
    let answer = success(answer).await?;
    Ok(answer.map(|body| -> LazyBody<U> {
        Box::pin(async move {
            let bytes = body.collect().await.map_err(Error::Instance)?.to_bytes();
            Ok(U::from(bytes))
        })
    }))
}

/// `answer` if its status is a success; else rig's error for it, with its headers and body (its
/// first [`ERROR_BODY_LIMIT`] bytes).
async fn success(answer: Answer) -> Result<Answer> {
    if answer.status().is_success() {
        return Ok(answer);
    }
    let (head, body) = answer.into_parts();
    Err(Error::InvalidStatusCodeWithDetails {
        status: head.status,
        body: error_text(body).await,
        headers: Box::new(head.headers),
    })
}

/// The start of an error answer's body as text: at most [`ERROR_BODY_LIMIT`] bytes (an error's
/// message fits, and a body that never ends is not read to its end), lossily decoded.
async fn error_text(body: ResponseBody<reqwest::Body>) -> String {
    let (read, tail, _rest) = Prefix::new(body, ERROR_BODY_LIMIT).await;
    if let Tail::Failed(error) = tail {
        return format!("failed to read error response body: {error}");
    }
    String::from_utf8_lossy(&read[..read.len().min(ERROR_BODY_LIMIT)]).into_owned()
}

/// An error the engine passed on as it came (a connection the client could not make) goes back
/// as reqwest's, as rig's own client reports it; stormguard's own outcomes (throttled, out of
/// time, given up on) as the engine's error.
fn into_rig_error(error: stormguard_retry::Error) -> Error {
    match passed_on::<reqwest::Error>(error) {
        Ok(original) => Error::Instance(Box::new(original)),
        Err(error) => Error::Instance(Box::new(error)),
    }
}

impl<C, Bk> HttpClientExt for RigClient<C, Bk>
where
    C: Classify + Send + Sync + 'static,
    Bk: Backoff + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    fn send<T, U>(
        &self,
        request: Request<T>,
    ) -> impl Future<Output = Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        T: Into<Bytes> + WasmCompatSend,
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        let answer = self.execute(request.map(Into::into));
        async move { lazy(answer.await?).await }
    }

    fn send_multipart<U>(
        &self,
        request: Request<MultipartForm>,
    ) -> impl Future<Output = Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        // Encoded once, as bytes: the engine replays them to every attempt.
        let (mut head, form) = request.into_parts();
        let (boundary, body) = form.encode();
        let answer = HeaderValue::try_from(format!("multipart/form-data; boundary={boundary}"))
            .map(|content_type| {
                head.headers.insert(CONTENT_TYPE, content_type);
                self.execute(Request::from_parts(head, body))
            });
        async move { lazy(answer?.await?).await }
    }

    fn send_streaming<T>(
        &self,
        request: Request<T>,
    ) -> impl Future<Output = Result<StreamingResponse>> + WasmCompatSend
    where
        T: Into<Bytes> + WasmCompatSend,
    {
        let answer = self.execute(request.map(Into::into));
        async move {
            let answer = success(answer.await?).await?;
            Ok(answer.map(|body| -> BoxedStream {
                Box::pin(BodyDataStream::new(body).map_err(Error::Instance))
            }))
        }
    }
}
