use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::ClassifiedError;
use crate::{BoxError, Classify};

pin_project! {
    /// Response future of [`ClassifyService`](super::ClassifyService).
    #[derive(Debug)]
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        classifier: C,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) const fn new(inner: F, classifier: C) -> Self {
        ResponseFuture { inner, classifier }
    }
}

impl<F, C, RB, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
    RB: Send + 'static,
{
    type Output = Result<http::Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx)).map_err(Into::into)?;
        let (parts, body) = response.into_parts();
        let outcome = this.classifier.classify_http(&parts, &[]);
        if outcome.is_success() {
            return Poll::Ready(Ok(http::Response::from_parts(parts, body)));
        }
        Poll::Ready(Err(Box::new(ClassifiedError::new(parts, body, outcome))))
    }
}
