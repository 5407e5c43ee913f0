//! [`ResponseFuture`]: the future of [`ConcurrencyService`](super::ConcurrencyService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_classify::{BoxError, Classify, Permit, polled_after_completion};

use super::ConcurrencyBody;
use crate::{ConcurrencyFull, ConcurrencyPermit};

pin_project! {
    /// Response future of [`ConcurrencyService`](super::ConcurrencyService): a refusal that
    /// resolves at once to [`ConcurrencyFull`], or the inner call, whose answer carries the slot
    /// in its body (a success) or gives it back with what the answer says (a failure).
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: Option<F>,
        // The slot and the classifier of the answer; for a refusal, the refusal.
        held: Option<Result<(ConcurrencyPermit, C), ConcurrencyFull>>,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(inner: F, permit: ConcurrencyPermit, classifier: C) -> Self {
        Self {
            inner: Some(inner),
            held: Some(Ok((permit, classifier))),
        }
    }

    pub(crate) fn refused(full: ConcurrencyFull) -> Self {
        Self {
            inner: None,
            held: Some(Err(full)),
        }
    }
}

impl<F, C, RB, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
    RB: Body<Data = Bytes>,
{
    type Output = Result<http::Response<ConcurrencyBody<RB, C>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return match this.held.take() {
                Some(Err(full)) => Poll::Ready(Err(Box::new(full))),
                _ => polled_after_completion("concurrency limit's response future"),
            };
        };
        let answer = ready!(inner.poll(cx));
        this.inner.set(None);
        let Some(Ok((permit, classifier))) = this.held.take() else {
            polled_after_completion("concurrency limit's response future")
        };
        match answer {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                let outcome = classifier.classify_http(&parts, &[]);
                // A failed answer holds no generation: its slot is given back now, with what it
                // says. A success holds its slot until its body ends.
                let held = if !outcome.is_success() || body.is_end_stream() {
                    permit.record(&outcome, &parts.headers);
                    None
                } else {
                    Some((permit, classifier))
                };
                let body = ConcurrencyBody::new(body, held);
                Poll::Ready(Ok(http::Response::from_parts(parts, body)))
            }
            Err(error) => {
                let error = error.into();
                permit.record(&classifier.classify_error(&*error), &http::HeaderMap::new());
                Poll::Ready(Err(error))
            }
        }
    }
}
