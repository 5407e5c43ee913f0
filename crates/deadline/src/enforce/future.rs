use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::OnExpiry;
use crate::Deadline;

pin_project! {
    /// Races the inner service's future against the request's deadline.
    ///
    /// The inner future is polled first, so a response that is ready at the very instant of the
    /// deadline is still delivered.
    pub struct ResponseFuture<F, M> {
        #[pin]
        kind: Kind<F>,
        grpc: bool,
        mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Running {
            #[pin]
            inner: F,
            // `None`: no deadline, nothing to enforce.
            deadline: Option<Instant>,
            // The timer, made the first time the inner future is pending: a call that answers at
            // once (the common case on a fast path) never touches the timer wheel.
            #[pin]
            sleep: Option<Sleep>,
        },
        // The deadline had passed before the inner service was called.
        Expired,
    }
}

impl<F, M> ResponseFuture<F, M> {
    pub(crate) fn new(inner: F, deadline: Option<Deadline>, grpc: bool) -> Self {
        Self {
            kind: Kind::Running {
                inner,
                deadline: deadline.map(|deadline| deadline.instant()),
                sleep: None,
            },
            grpc,
            mode: PhantomData,
        }
    }

    pub(crate) fn expired(grpc: bool) -> Self {
        Self {
            kind: Kind::Expired,
            grpc,
            mode: PhantomData,
        }
    }
}

impl<F, M, Res, E> Future for ResponseFuture<F, M>
where
    F: Future<Output = Result<Res, E>>,
    M: OnExpiry<Res, E>,
{
    type Output = Result<Res, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Running {
                inner,
                deadline,
                sleep,
            } => {
                if let Poll::Ready(result) = inner.poll(cx) {
                    return Poll::Ready(result.map_err(M::inner_error));
                }
                match deadline.map(|at| crate::poll_until(sleep, at, cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(M::expired(*this.grpc)),
                    _ => Poll::Pending,
                }
            }
            KindProj::Expired => Poll::Ready(M::expired(*this.grpc)),
        }
    }
}
