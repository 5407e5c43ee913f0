use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use http_body::Body;
use http_body_util::Limited;
use http_body_util::combinators::Collect;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{Prepared, Settings, prepare};
use crate::LlmDeadline;
use crate::enforce::{BoxError, OnExpiry, ResponseFuture};

pin_project! {
    /// Response future of a [`DeadlineLayer::llm`](crate::DeadlineLayer::llm) service: reads the
    /// request body (up to the limit), estimates the deadline, then calls the inner service that
    /// was made ready in `poll_ready` and enforces the deadline on it.
    pub struct EstimateFuture<S, B, M>
    where
        S: Service<Request<B>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<S, B, M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, M>
    where
        S: Service<Request<B>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        Reading {
            #[pin]
            body: Collect<Limited<B>>,
            // `Some` until the body is read.
            call: Option<PendingCall<S>>,
        },
        Running {
            #[pin]
            future: ResponseFuture<S::Future, M>,
        },
    }
}

/// What the call needs once the body is read.
struct PendingCall<S> {
    service: S,
    parts: Parts,
    estimate: LlmDeadline,
    settings: Settings,
}

impl<S, B, M> EstimateFuture<S, B, M>
where
    S: Service<Request<B>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(super) fn reading(
        body: Collect<Limited<B>>,
        service: S,
        parts: Parts,
        estimate: LlmDeadline,
        settings: Settings,
    ) -> Self {
        Self {
            state: State::Reading {
                body,
                call: Some(PendingCall {
                    service,
                    parts,
                    estimate,
                    settings,
                }),
            },
        }
    }

    pub(super) fn running(future: ResponseFuture<S::Future, M>) -> Self {
        Self {
            state: State::Running { future },
        }
    }
}

impl<S, B, M> Future for EstimateFuture<S, B, M>
where
    S: Service<Request<B>>,
    B: Body + From<Bytes>,
    B::Error: Into<BoxError>,
    M: OnExpiry<S::Response, S::Error>,
{
    type Output = Result<S::Response, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Reading { body, call } => {
                    let read = ready!(body.poll(cx));
                    // Taken exactly once: the state moves on (or the future completes) below.
                    let Some(PendingCall {
                        mut service,
                        mut parts,
                        estimate,
                        settings,
                    }) = call.take()
                    else {
                        return Poll::Pending;
                    };
                    let bytes = match read {
                        Ok(collected) => collected.to_bytes(),
                        Err(error) => {
                            let grpc = crate::propagate::is_grpc(&parts.headers);
                            return Poll::Ready(M::unreadable_body(error, grpc));
                        }
                    };
                    let timeout = estimate.estimate(&bytes);
                    let future = match prepare(&mut parts, Some(timeout), settings) {
                        Prepared::Expired { grpc } => ResponseFuture::expired(grpc),
                        Prepared::Ready { deadline, grpc } => {
                            let request = Request::from_parts(parts, B::from(bytes));
                            ResponseFuture::new(service.call(request), deadline, grpc)
                        }
                    };
                    this.state.set(State::Running { future });
                }
                StateProj::Running { future } => return future.poll(cx),
            }
        }
    }
}
