//! [`ClassifyLayer`]: turns responses the classifier calls failures into errors (the layer, its
//! service, future and error).

mod error;
mod future;
mod layer;

use std::task::{Context, Poll};

use tower_service::Service;

pub use self::error::ClassifiedError;
pub use self::future::ResponseFuture;
pub use self::layer::ClassifyLayer;
use crate::{BoxError, LlmClassifier, MakeClassify};

/// The service of [`ClassifyLayer`] (see its docs).
#[derive(Clone, Debug)]
pub struct ClassifyService<S, M = LlmClassifier> {
    inner: S,
    make_classifier: M,
}

impl<S, M> ClassifyService<S, M> {
    /// Wraps `inner`, classifying its responses with classifiers made by `make_classifier`.
    pub const fn new(inner: S, make_classifier: M) -> Self {
        ClassifyService {
            inner,
            make_classifier,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, M, B, RB> Service<http::Request<B>> for ClassifyService<S, M>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    M: MakeClassify,
    RB: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, M::Classifier>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let classifier = self.make_classifier.make_classifier(&request);
        ResponseFuture::new(self.inner.call(request), classifier)
    }
}

#[cfg(test)]
mod tests;
