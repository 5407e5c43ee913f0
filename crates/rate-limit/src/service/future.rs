//! [`ResponseFuture`]: the future of [`RateLimitService`](super::RateLimitService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use pin_project_lite::pin_project;
use stormguard_classify::{BoxError, Classify};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::{Acquire, Permit, RateLimited, Reservation};

pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService): waits for the
    /// request's slot, then calls the service and shows the answer to the limit. Dropped while
    /// waiting, it gives the slot back.
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
        Acquiring {
            acquire: Acquire,
            service: Option<S>,
            request: Option<http::Request<B>>,
        },
        Waiting {
            #[pin]
            sleep: Sleep,
            service: Option<S>,
            request: Option<http::Request<B>>,
            reservation: Option<Reservation>,
        },
        Calling {
            #[pin]
            future: S::Future,
            permit: Option<Permit>,
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
            state: State::Waiting {
                sleep: tokio::time::sleep_until(reservation.start()),
                service: Some(service),
                request: Some(request),
                reservation: Some(reservation),
            },
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
                service: Some(service),
                request: Some(request),
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
            match this.state.as_mut().project() {
                StateProj::Refused { limited } => {
                    let error: BoxError = match limited.take() {
                        Some(limited) => Box::new(limited),
                        None => polled_again(),
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Err(error));
                }
                StateProj::Acquiring {
                    acquire,
                    service,
                    request,
                } => {
                    let decision = ready!(Pin::new(acquire).poll(cx));
                    let (Some(service), Some(request)) = (service.take(), request.take()) else {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(polled_again()));
                    };
                    match decision {
                        Ok(reservation) => this.state.set(State::Waiting {
                            sleep: tokio::time::sleep_until(reservation.start()),
                            service: Some(service),
                            request: Some(request),
                            reservation: Some(reservation),
                        }),
                        Err(limited) => this.state.set(State::Refused {
                            limited: Some(limited),
                        }),
                    }
                }
                StateProj::Waiting {
                    sleep,
                    service,
                    request,
                    reservation,
                } => {
                    // A slot that has come needs no timer: tokio rounds every sleep up to its
                    // next millisecond tick, so the sleep would still wait.
                    if reservation
                        .as_ref()
                        .is_some_and(|reservation| reservation.start() > Instant::now())
                    {
                        ready!(sleep.poll(cx));
                    }
                    let (Some(mut service), Some(request), Some(reservation)) =
                        (service.take(), request.take(), reservation.take())
                    else {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(polled_again()));
                    };
                    let permit = reservation.send();
                    let future = service.call(request);
                    this.state.set(State::Calling {
                        future,
                        permit: Some(permit),
                    });
                }
                StateProj::Calling { future, permit } => {
                    let result = ready!(future.poll(cx));
                    let permit = permit.take();
                    this.state.set(State::Done);
                    return Poll::Ready(match result {
                        Ok(response) => {
                            let (head, body) = response.into_parts();
                            if let Some(permit) = permit {
                                let outcome = this.classifier.classify_http(&head, &[]);
                                permit.observe(&head.headers, &outcome);
                            }
                            Ok(http::Response::from_parts(head, body))
                        }
                        Err(error) => {
                            let error: BoxError = error.into();
                            if let Some(permit) = permit {
                                let outcome = this.classifier.classify_error(&*error);
                                permit.observe(&HeaderMap::new(), &outcome);
                            }
                            Err(error)
                        }
                    });
                }
                StateProj::Done => {
                    return Poll::Ready(Err(polled_again()));
                }
            }
        }
    }
}

fn polled_again() -> BoxError {
    "stormguard's rate limit ResponseFuture polled after it completed".into()
}
