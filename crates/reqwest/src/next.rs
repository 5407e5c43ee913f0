//! The rest of the middleware chain as a tower service over the `http` types, and the
//! conversions between those and reqwest's.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Extensions;
use http_body::{Body, Frame, SizeHint};
use reqwest::ResponseBuilderExt;
use reqwest_middleware::{Error, Next};
use stormguard_classify::body::{PartialBody, ResponseBody};
use stormguard_retry::ReplayBody;
use tower_service::Service;

/// A reqwest request body, as the engine replays it.
#[derive(Debug)]
pub struct RequestBody(reqwest::Body);

impl RequestBody {
    pub(crate) fn new(body: reqwest::Body) -> Self {
        Self(body)
    }

    #[cfg(any(feature = "async-openai", feature = "rig"))]
    pub(crate) fn into_inner(self) -> reqwest::Body {
        self.0
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

impl ReplayBody for RequestBody {
    fn from_bytes(bytes: Bytes) -> Self {
        Self(reqwest::Body::from(bytes))
    }

    fn from_partial(partial: PartialBody<Self>) -> Self {
        Self(reqwest::Body::wrap(partial))
    }
}

/// The rest of the middleware chain (`Next`) as a tower service: each attempt is converted back
/// to a `reqwest::Request` (with the caller's per-request timeout) and run down the chain with a
/// copy of the caller's extensions as the attempts before it left them, which it leaves in their
/// place when it ends. Two attempts in flight at once (a hedge) each work on their own copy; an
/// attempt cancelled in flight leaves nothing.
#[derive(Clone)]
pub(crate) struct NextService<'a> {
    next: Next<'a>,
    extensions: Arc<Mutex<Extensions>>,
    timeout: Option<Duration>,
}

impl<'a> NextService<'a> {
    pub(crate) fn new(
        next: Next<'a>,
        extensions: Arc<Mutex<Extensions>>,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            next,
            extensions,
            timeout,
        }
    }
}

type Answer = Result<http::Response<reqwest::Body>, Error>;

impl<'a> Service<http::Request<RequestBody>> for NextService<'a> {
    type Response = http::Response<reqwest::Body>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let next = self.next.clone();
        let shared = Arc::clone(&self.extensions);
        let timeout = self.timeout;
        Box::pin(async move {
            let mut request = reqwest::Request::try_from(request.map(|body| body.0))?;
            *request.timeout_mut() = timeout;
            let mut extensions = lock(&shared).clone();
            let answer = next.run(request, &mut extensions).await;
            *lock(&shared) = extensions;
            Ok(from_reqwest(answer?))
        })
    }
}

/// A reqwest response as an `http::Response`, its URL kept for the way back.
pub(crate) fn from_reqwest(response: reqwest::Response) -> http::Response<reqwest::Body> {
    let url = response.url().clone();
    let mut response = http::Response::<reqwest::Body>::from(response);
    keep_url(&mut response, url);
    response
}

fn lock(extensions: &Mutex<Extensions>) -> std::sync::MutexGuard<'_, Extensions> {
    extensions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// reqwest keeps a response's URL beside its head: puts `url` where the conversion back to a
/// `reqwest::Response` looks for it.
fn keep_url<B>(response: &mut http::Response<B>, url: reqwest::Url) {
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        response
            .extensions_mut()
            .extend(with_url.into_parts().0.extensions);
    }
}

/// The engine's response as a `reqwest::Response`, URL included: the URL the chain answered
/// from, or for an answer of stormguard's own (the breaker's fallback), the request's `url`.
pub(crate) fn into_reqwest(
    mut response: http::Response<ResponseBody<reqwest::Body>>,
    url: reqwest::Url,
) -> reqwest::Response {
    if response.body().is_local() {
        keep_url(&mut response, url);
    }
    reqwest::Response::from(response.map(reqwest::Body::wrap))
}
