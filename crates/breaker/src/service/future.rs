//! [`ResponseFuture`]: the future of [`BreakerService`](super::BreakerService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_classify::body::{ClassifyResponse, ResponseBody, classify_response};
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, Classify, Permit};

use crate::{BreakerPermit, Fallback, Rejected};

/// What the future hands back.
type Output<RB> = Result<http::Response<ResponseBody<RB>>, BoxError>;

pin_project! {
    /// Response future of [`BreakerService`](super::BreakerService): a refusal that resolves at
    /// once (to the fallback's answer or the error), or the inner call, whose outcome is recorded
    /// with the breaker once it is classified, and which a stall may cut.
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
        // The attempt's permit, while it is in flight; dropped unrecorded, it counts for nothing.
        permit: Option<BreakerPermit>,
        // The fallback and the request's head, to answer a cut call.
        fallback: Option<(Fallback, Parts)>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, C, RB>
    where
        RB: Body,
    {
        // Refused: the output waits for the first poll.
        Refused { output: Option<Output<RB>> },
        // Waiting for the inner service.
        Calling {
            #[pin]
            future: F,
            classifier: C,
        },
        // Reading the start of a failed response's body to classify it.
        Classifying { classify: ClassifyResponse<RB, C> },
        // The output was handed back.
        Done,
    }
}

impl<F, C, RB: Body> ResponseFuture<F, C, RB> {
    pub(super) fn called(
        future: F,
        classifier: C,
        permit: BreakerPermit,
        fallback: Option<(Fallback, Parts)>,
    ) -> Self {
        Self {
            state: State::Calling { future, classifier },
            permit: Some(permit),
            fallback,
        }
    }

    pub(super) fn refused(output: Output<RB>) -> Self {
        Self {
            state: State::Refused {
                output: Some(output),
            },
            permit: None,
            fallback: None,
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
    type Output = Output<RB>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Refused { output } => {
                    let output = output
                        .take()
                        .unwrap_or_else(|| polled_after_completion("breaker ResponseFuture"));
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Calling { future, classifier } => match future.poll(cx) {
                    Poll::Ready(Ok(response)) => {
                        let classify = classify_response(classifier, response);
                        this.state.set(State::Classifying { classify });
                    }
                    Poll::Ready(Err(error)) => {
                        let error: BoxError = error.into();
                        if let Some(permit) = this.permit.take() {
                            permit.record(&classifier.classify_error(&*error), &HeaderMap::new());
                        }
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    Poll::Pending => {
                        let output = ready!(poll_cut(this.permit, this.fallback, cx));
                        // Dropping the call cuts it.
                        this.state.set(State::Done);
                        return Poll::Ready(output);
                    }
                },
                StateProj::Classifying { classify } => match Pin::new(classify).poll(cx) {
                    Poll::Ready((response, outcome)) => {
                        if let Some(permit) = this.permit.take() {
                            permit.record(&outcome, response.headers());
                        }
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                    Poll::Pending => {
                        let output = ready!(poll_cut(this.permit, this.fallback, cx));
                        this.state.set(State::Done);
                        return Poll::Ready(output);
                    }
                },
                StateProj::Done => polled_after_completion("breaker ResponseFuture"),
            }
        }
    }
}

/// Ready with the answer for the call when a stall cut it (waiting for the backend, or for the
/// error body): the fallback's, or the error.
fn poll_cut<RB: Body>(
    permit: &mut Option<BreakerPermit>,
    fallback: &mut Option<(Fallback, Parts)>,
    cx: &mut Context<'_>,
) -> Poll<Output<RB>> {
    let Some(permit) = permit.as_mut() else {
        return Poll::Pending;
    };
    let rejected = Rejected::Open(ready!(permit.poll_cut(cx)));
    Poll::Ready(match fallback.take() {
        Some((fallback, head)) => Ok(fallback.answer(&head, &rejected)),
        None => Err(rejected.into_error()),
    })
}

impl<F, C, RB: Body> std::fmt::Debug for ResponseFuture<F, C, RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Refused { .. } => "refused",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "reading the error body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("permit", &self.permit)
            .finish()
    }
}
