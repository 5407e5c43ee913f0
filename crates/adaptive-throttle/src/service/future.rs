//! [`ResponseFuture`]: the future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_classify::body::{ClassifyResponse, ResponseBody, classify_response};
use stormguard_classify::{BoxError, Classify};

use crate::{AdaptiveThrottle, Throttled};

pin_project! {
    /// Response future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService): a local
    /// drop that resolves at once to a [`Throttled`] error, or the inner call, whose outcome is
    /// recorded with the throttle once the response (with the start of its body, for a failure)
    /// or the error is classified.
    ///
    /// A call dropped before it is recorded (a deadline ran out, the caller gave up, while
    /// waiting for the backend or while reading its error body) is recorded as not accepted: a
    /// backend that hangs must not look healthy.
    pub struct ResponseFuture<F, C, RB>
    where
        RB: Body,
    {
        #[pin]
        state: State<F, C, RB>,
        // The outcome still owed to the throttle.
        pending: Pending,
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
    }
}

/// The outcome owed to the throttle for a request it let through: recorded once, and as not
/// accepted if the future is dropped before that.
struct Pending {
    throttle: Option<AdaptiveThrottle>,
}

impl Pending {
    fn record(&mut self, accepted: bool) {
        if let Some(throttle) = self.throttle.take() {
            throttle.record(accepted);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.record(false);
    }
}

impl<F, C, RB: Body> ResponseFuture<F, C, RB> {
    pub(super) fn called(future: F, throttle: AdaptiveThrottle, classifier: C) -> Self {
        Self {
            state: State::Calling { future, classifier },
            pending: Pending {
                throttle: Some(throttle),
            },
        }
    }

    pub(super) fn dropped() -> Self {
        Self {
            state: State::Dropped,
            pending: Pending { throttle: None },
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
                StateProj::Dropped => return Poll::Ready(Err(Box::new(Throttled))),
                StateProj::Calling { future, classifier } => match ready!(future.poll(cx)) {
                    Ok(response) => {
                        let classify = classify_response(classifier, response);
                        this.state.set(State::Classifying { classify });
                    }
                    Err(error) => {
                        let error: BoxError = error.into();
                        this.pending
                            .record(classifier.classify_error(&*error).is_accepted());
                        return Poll::Ready(Err(error));
                    }
                },
                StateProj::Classifying { classify } => {
                    let (response, outcome) = ready!(Pin::new(classify).poll(cx));
                    this.pending.record(outcome.is_accepted());
                    return Poll::Ready(Ok(response));
                }
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
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
