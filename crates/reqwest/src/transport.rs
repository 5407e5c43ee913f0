//! What sends each attempt of the adapters that own their client ([`OpenAiService`], [`RigClient`]):
//! a `reqwest::Client`.
//!
//! [`OpenAiService`]: crate::OpenAiService
//! [`RigClient`]: crate::RigClient

use std::pin::Pin;
use std::task::{Context, Poll};

use stormguard_classify::BoxError;
use tower_service::Service;

use crate::next::{RequestBody, from_reqwest};

/// The `reqwest::Client` that sends each attempt of an adapter's engine.
#[derive(Clone, Debug)]
pub struct Transport(reqwest::Client);

impl Transport {
    /// Attempts sent by `client`.
    pub(crate) fn new(client: reqwest::Client) -> Self {
        Self(client)
    }
}

type Sent = Pin<Box<dyn Future<Output = Result<http::Response<reqwest::Body>, BoxError>> + Send>>;

impl Service<http::Request<RequestBody>> for Transport {
    type Response = http::Response<reqwest::Body>;
    type Error = BoxError;
    type Future = Sent;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Sent {
        let client = self.0.clone();
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(RequestBody::into_inner))?;
            Ok(from_reqwest(client.execute(request).await?))
        })
    }
}
