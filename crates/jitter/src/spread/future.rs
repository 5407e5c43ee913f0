use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

pin_project! {
    /// Response future of [`Spread`](super::Spread): sleeps for the drawn delay, then calls the
    /// inner service that was made ready in `poll_ready`.
    pub struct ResponseFuture<S, Request>
    where
        S: Service<Request>,
    {
        #[pin]
        state: State<S, Request, S::Future>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Request, F> {
        Sleeping {
            #[pin]
            sleep: Sleep,
            // `Some` until the sleep ends.
            call: Option<(S, Request)>,
        },
        Calling {
            #[pin]
            future: F,
        },
    }
}

impl<S, Request> ResponseFuture<S, Request>
where
    S: Service<Request>,
{
    pub(super) fn sleeping(sleep: Sleep, service: S, request: Request) -> Self {
        Self {
            state: State::Sleeping {
                sleep,
                call: Some((service, request)),
            },
        }
    }

    pub(super) fn calling(future: S::Future) -> Self {
        Self {
            state: State::Calling { future },
        }
    }
}

impl<S, Request> Future for ResponseFuture<S, Request>
where
    S: Service<Request>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Sleeping { sleep, call } => {
                    ready!(sleep.poll(cx));
                    // The state moves on below, so the pair is taken exactly once; `None` cannot
                    // be seen here, and is treated as still sleeping rather than a panic.
                    let Some((mut service, request)) = call.take() else {
                        return Poll::Pending;
                    };
                    let future = service.call(request);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => return future.poll(cx),
            }
        }
    }
}
