//! [`ResponseFuture`]: the future of [`ChaosService`](super::ChaosService).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, is_event_stream};
use tokio::time::Sleep;
use tower_service::Service;

use super::placement::{Client, Server};
use crate::body::{ChaosBody, reset};
use crate::injector::Draw;
use crate::snapshot::InFlight;
use crate::{Fault, FaultKind, Provider};

pin_project! {
    /// Response future of [`ChaosService`](super::ChaosService): the inner call, delayed by a
    /// latency fault, with a stream fault put on its answer's body if that is an event stream;
    /// or, in its place, an error answer, a reset, or a silence that never resolves.
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
    pub struct ResponseFuture<F, P> {
        #[pin]
        state: State<F>,
        // The API the call went to: the shape of an error event.
        provider: Provider,
        // The stream fault drawn for the answer, if it is an event stream.
        stream: Option<Fault>,
        // The call, counted in flight until its answer's body is done with.
        in_flight: Option<InFlight>,
        placement: PhantomData<P>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Waiting for the inner call, after a latency fault's delay if there is one.
        Calling {
            #[pin]
            future: F,
            // Boxed: only a latency fault has one.
            delay: Option<Pin<Box<Sleep>>>,
        },
        // An error answer in the inner service's place.
        Answer { response: Response<Bytes> },
        // A silence: never ready.
        Silent,
        // A connection reset in the inner service's place.
        Reset,
        // The output was handed back.
        Done,
    }
}

/// How a call failed, before the placement says what a reset is.
enum Failed<E> {
    /// The inner service's error.
    Inner(E),
    /// An injected reset, and the call in flight (the body that fails, in front of a server,
    /// keeps it).
    Reset(Option<InFlight>),
}

impl<F, P> ResponseFuture<F, P> {
    /// Starts the call with what it drew: calls `inner` unless the call's fault answers in its
    /// place. The fault is counted here, when it is injected.
    pub(super) fn start<S, B>(
        inner: &mut S,
        request: Request<B>,
        in_flight: InFlight,
        draw: Draw,
    ) -> Self
    where
        S: Service<Request<B>, Future = F>,
    {
        let provider = Provider::of_path(request.uri().path());
        let kind = draw.call.as_ref().map(|fault| {
            fault.count();
            fault.kind()
        });
        let state = match kind {
            Some(FaultKind::Answer(answer)) => State::Answer {
                response: answer.response(provider),
            },
            Some(FaultKind::Silence) => State::Silent,
            Some(FaultKind::Reset) => State::Reset,
            Some(FaultKind::Latency(delay)) => State::Calling {
                future: inner.call(request),
                delay: Some(Box::pin(tokio::time::sleep(delay))),
            },
            // No fault (stream faults are never drawn for the call).
            _ => State::Calling {
                future: inner.call(request),
                delay: None,
            },
        };
        Self {
            state,
            provider,
            stream: draw.stream,
            in_flight: Some(in_flight),
            placement: PhantomData,
        }
    }

    fn poll_step<RB, E>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<ChaosBody<RB>>, Failed<E>>>
    where
        F: Future<Output = Result<Response<RB>, E>>,
    {
        let mut this = self.project();
        let step = match this.state.as_mut().project() {
            StateProj::Calling { future, delay } => {
                if let Some(sleep) = delay {
                    ready!(sleep.as_mut().poll(cx));
                    *delay = None;
                }
                match ready!(future.poll(cx)) {
                    Ok(response) => {
                        let (parts, body) = response.into_parts();
                        // A stream fault acts on a successful event stream only.
                        let streaming =
                            parts.status.is_success() && is_event_stream(&parts.headers);
                        let fault = this.stream.take().filter(|_| streaming);
                        let body =
                            ChaosBody::new(body, fault, *this.provider, this.in_flight.take());
                        Ok(Response::from_parts(parts, body))
                    }
                    Err(error) => Err(Failed::Inner(error)),
                }
            }
            StateProj::Answer { response } => {
                let (parts, data) = std::mem::take(response).into_parts();
                let body = ChaosBody::answer(data, this.in_flight.take());
                Ok(Response::from_parts(parts, body))
            }
            StateProj::Silent => return Poll::Pending,
            StateProj::Reset => Err(Failed::Reset(this.in_flight.take())),
            StateProj::Done => polled_after_completion("chaos ResponseFuture"),
        };
        this.state.set(State::Done);
        Poll::Ready(step)
    }
}

impl<F, RB, E> Future for ResponseFuture<F, Client>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ChaosBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.poll_step(cx)) {
            Ok(response) => Ok(response),
            Err(Failed::Inner(error)) => Err(error.into()),
            // Under a client, a reset is the call's error, as the connection's would be.
            Err(Failed::Reset(_in_flight)) => Err(Box::new(reset())),
        })
    }
}

impl<F, RB, E> Future for ResponseFuture<F, Server>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<ChaosBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.poll_step(cx)) {
            Ok(response) => Ok(response),
            Err(Failed::Inner(error)) => Err(error),
            // In front of a server, a reset is an answer whose body fails: the server aborts
            // the connection.
            Err(Failed::Reset(in_flight)) => Ok(Response::new(ChaosBody::reset(in_flight))),
        })
    }
}

impl<F, P> fmt::Debug for ResponseFuture<F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Answer { .. } => "error answer",
            State::Silent => "silent",
            State::Reset => "reset",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("provider", &self.provider)
            .field("stream", &self.stream.as_ref().map(Fault::kind))
            .finish()
    }
}
