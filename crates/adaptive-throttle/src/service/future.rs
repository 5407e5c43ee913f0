//! [`ResponseFuture`]: the future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_classify::body::{ClassifyResponse, ResponseBody, classify_response};
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, Classify, Permit};

use crate::{ThrottlePermit, Throttled};

pin_project! {
    /// Response future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService): a local
    /// drop that resolves at once to a [`Throttled`] error, or the inner call, whose outcome is
    /// recorded with the throttle once the response (with the start of its body, for a failure)
    /// or the error is classified.
    ///
    /// A call dropped before it is recorded (a deadline ran out, the caller gave up, while
    /// waiting for the backend or while reading its error body) is recorded as not accepted: a
    /// backend that hangs must not look healthy.
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
    pub struct ResponseFuture<F, C, RB>
    where
        RB: Body,
    {
        #[pin]
        state: State<F, C, RB>,
        // The throttle's permit for the call in flight: told its outcome, or, dropped untold with
        // the future, counted as not accepted.
        permit: Option<ThrottlePermit>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, C, RB>
    where
        RB: Body,
    {
        // Dropped locally: the inner service was never called.
        Dropped,
        // Waiting for the inner service.
        Calling {
            #[pin]
            future: F,
            classifier: C,
        },
        // Reading the start of a failed response's body to classify it.
        Classifying {
            classify: ClassifyResponse<RB, C>,
        },
        // The output was handed back.
        Done,
    }
}

impl<F, C, RB: Body> ResponseFuture<F, C, RB> {
    pub(super) fn called(future: F, permit: ThrottlePermit, classifier: C) -> Self {
        Self {
            state: State::Calling { future, classifier },
            permit: Some(permit),
        }
    }

    pub(super) fn dropped() -> Self {
        Self {
            state: State::Dropped,
            permit: None,
        }
    }
}

impl<F, C, RB, E> Future for ResponseFuture<F, C, RB>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
    RB: Body<Data = Bytes>,
{
    type Output = Result<http::Response<ResponseBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Dropped => {
                    this.state.set(State::Done);
                    return Poll::Ready(Err(Box::new(Throttled)));
                }
                StateProj::Calling { future, classifier } => match ready!(future.poll(cx)) {
                    Ok(response) => {
                        let classify = classify_response(classifier, response);
                        this.state.set(State::Classifying { classify });
                    }
                    Err(error) => {
                        let error: BoxError = error.into();
                        if let Some(permit) = this.permit.take() {
                            permit.record(&classifier.classify_error(&*error), &HeaderMap::new());
                        }
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                },
                StateProj::Classifying { classify } => {
                    let (response, outcome) = ready!(Pin::new(classify).poll(cx));
                    if let Some(permit) = this.permit.take() {
                        permit.record(&outcome, response.headers());
                    }
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => polled_after_completion("throttle ResponseFuture"),
            }
        }
    }
}

impl<F, C, RB: Body> std::fmt::Debug for ResponseFuture<F, C, RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Dropped => "throttled",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "reading the error body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
