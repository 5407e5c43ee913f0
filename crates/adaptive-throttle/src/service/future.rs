//! [`ResponseFuture`]: the future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use stormguard_classify::{BoxError, Classify};

use crate::{AdaptiveThrottle, Throttled};

pin_project! {
    /// Response future of [`AdaptiveThrottleService`](super::AdaptiveThrottleService): either the
    /// inner call, whose outcome is recorded with the throttle when it completes, or a local drop
    /// that resolves at once to a [`Throttled`] error.
    ///
    /// A call dropped before it completes (a deadline ran out, the caller gave up) is recorded as
    /// not accepted: a backend that hangs must not look healthy.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            future: F,
            outcome: PendingOutcome<C>,
        },
        Dropped,
    }
}

/// The outcome still owed to the throttle for a request it let through. Recorded as not accepted
/// if dropped unrecorded.
struct PendingOutcome<C> {
    throttle: AdaptiveThrottle,
    classifier: C,
    recorded: bool,
}

impl<C> PendingOutcome<C> {
    fn record(&mut self, accepted: bool) {
        if !self.recorded {
            self.recorded = true;
            self.throttle.record(accepted);
        }
    }
}

impl<C> Drop for PendingOutcome<C> {
    fn drop(&mut self) {
        self.record(false);
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(super) fn called(future: F, throttle: AdaptiveThrottle, classifier: C) -> Self {
        Self {
            kind: Kind::Called {
                future,
                outcome: PendingOutcome {
                    throttle,
                    classifier,
                    recorded: false,
                },
            },
        }
    }

    pub(super) fn dropped() -> Self {
        Self {
            kind: Kind::Dropped,
        }
    }
}

impl<F, C, RB, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<http::Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Dropped => Poll::Ready(Err(Box::new(Throttled))),
            KindProj::Called { future, outcome } => match ready!(future.poll(cx)) {
                Ok(response) => {
                    // Head only: the body may be a long stream, and "accepted" is a property of
                    // the status and headers.
                    let (parts, body) = response.into_parts();
                    let accepted = outcome
                        .classifier
                        .classify_response(&parts, &[])
                        .is_accepted();
                    outcome.record(accepted);
                    Poll::Ready(Ok(http::Response::from_parts(parts, body)))
                }
                Err(error) => {
                    let error: BoxError = error.into();
                    let accepted = outcome.classifier.classify_error(&*error).is_accepted();
                    outcome.record(accepted);
                    Poll::Ready(Err(error))
                }
            },
        }
    }
}
