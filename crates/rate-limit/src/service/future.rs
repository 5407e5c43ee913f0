//! [`ResponseFuture`]: the future of [`RateLimitService`](super::RateLimitService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use pin_project_lite::pin_project;
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, Classify, Permit};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::{Acquire, RateLimitPermit, RateLimited, Reservation};

pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService): waits for the
    /// request's slot, then calls the service and shows the answer to the limit. Dropped while
    /// waiting, it gives the slot back.
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<http::Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        classifier: C,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<http::Request<B>>,
    {
        Refused { limited: Option<RateLimited> },
        // Waiting for the fleet's decision (in Redis) on the request's slot.
        Acquiring { acquire: Acquire, call: Option<(S, http::Request<B>)> },
        // Waiting for the reserved slot's start.
        Waiting {
            #[pin]
            sleep: Sleep,
            call: Option<(S, http::Request<B>, Reservation)>,
        },
        Calling {
            #[pin]
            future: S::Future,
            permit: Option<RateLimitPermit>,
        },
        Done,
    }
}

impl<S, B, C> ResponseFuture<S, B, C>
where
    S: Service<http::Request<B>>,
{
    pub(super) fn waiting(
        service: S,
        request: http::Request<B>,
        reservation: Reservation,
        classifier: C,
    ) -> Self {
        Self {
            state: State::waiting(service, request, reservation),
            classifier,
        }
    }

    pub(super) fn acquiring(
        service: S,
        request: http::Request<B>,
        acquire: Acquire,
        classifier: C,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                call: Some((service, request)),
            },
            classifier,
        }
    }

    pub(super) fn refused(limited: RateLimited, classifier: C) -> Self {
        Self {
            state: State::Refused {
                limited: Some(limited),
            },
            classifier,
        }
    }
}

impl<S, B> State<S, B>
where
    S: Service<http::Request<B>>,
{
    fn waiting(service: S, request: http::Request<B>, reservation: Reservation) -> Self {
        State::Waiting {
            sleep: tokio::time::sleep_until(reservation.start()),
            call: Some((service, request, reservation)),
        }
    }

    /// The limit decided on the request's slot: wait for it, or refuse.
    fn decided(
        decision: Result<Reservation, RateLimited>,
        (service, request): (S, http::Request<B>),
    ) -> Self {
        match decision {
            Ok(reservation) => Self::waiting(service, request, reservation),
            Err(limited) => State::Refused {
                limited: Some(limited),
            },
        }
    }

    /// The slot has come: the request goes, and its slot is spent.
    fn send((mut service, request, reservation): (S, http::Request<B>, Reservation)) -> Self {
        let permit = reservation.send();
        State::Calling {
            future: service.call(request),
            permit: Some(permit),
        }
    }
}

impl<S, B, C, RB> Future for ResponseFuture<S, B, C>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    C: Classify,
{
    type Output = Result<http::Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next =
                match this.state.as_mut().project() {
                    StateProj::Refused { limited } => {
                        let limited = limited.take().unwrap_or_else(|| {
                            polled_after_completion("rate limit ResponseFuture")
                        });
                        this.state.set(State::Done);
                        return Poll::Ready(Err(Box::new(limited)));
                    }
                    StateProj::Acquiring { acquire, call } => {
                        let decision = ready!(Pin::new(acquire).poll(cx));
                        State::decided(
                            decision,
                            call.take().unwrap_or_else(|| {
                                polled_after_completion("rate limit ResponseFuture")
                            }),
                        )
                    }
                    StateProj::Waiting { sleep, call } => {
                        // A slot that has come needs no timer: tokio rounds every sleep up to its
                        // next millisecond tick, so the sleep would still wait.
                        if call
                            .as_ref()
                            .is_some_and(|(_, _, reservation)| reservation.start() > Instant::now())
                        {
                            ready!(sleep.poll(cx));
                        }
                        State::send(call.take().unwrap_or_else(|| {
                            polled_after_completion("rate limit ResponseFuture")
                        }))
                    }
                    StateProj::Calling { future, permit } => {
                        let result = ready!(future.poll(cx));
                        let permit = permit.take();
                        this.state.set(State::Done);
                        return Poll::Ready(answered(&*this.classifier, result, permit));
                    }
                    StateProj::Done => polled_after_completion("rate limit ResponseFuture"),
                };
            this.state.set(next);
        }
    }
}

/// The call's result, shown to the limit (its outcome, and the answer's headers) on the way out.
fn answered<C, RB, E>(
    classifier: &C,
    result: Result<http::Response<RB>, E>,
    permit: Option<RateLimitPermit>,
) -> Result<http::Response<RB>, BoxError>
where
    C: Classify,
    E: Into<BoxError>,
{
    match result {
        Ok(response) => {
            if let Some(permit) = permit {
                let (head, body) = response.into_parts();
                permit.record(&classifier.classify_http(&head, &[]), &head.headers);
                return Ok(http::Response::from_parts(head, body));
            }
            Ok(response)
        }
        Err(error) => {
            let error: BoxError = error.into();
            if let Some(permit) = permit {
                permit.record(&classifier.classify_error(&*error), &HeaderMap::new());
            }
            Err(error)
        }
    }
}
