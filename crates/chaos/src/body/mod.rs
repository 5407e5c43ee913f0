//! [`ChaosBody`]: the body of every answer through a chaos layer: the inner body untouched, an
//! injected error answer's, an event stream with a fault in it, or (in front of a server) a
//! body that fails at once.

mod events;
mod stream;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_classify::BoxError;

use self::stream::FaultyStream;
use crate::snapshot::InFlight;
use crate::{Fault, FaultKind, Provider};

pin_project! {
    /// The body of an answer through a [`ChaosLayer`](crate::ChaosLayer): the inner service's
    /// body as it is (a call no fault touched), the body of an injected error answer, an event
    /// stream with its stream fault in it (see [`FaultKind`]), or, for a reset in front of a
    /// server, a body whose first frame is an error (`ConnectionReset`).
    ///
    /// The call it answers stays in flight for the layer's
    /// [`snapshot`](crate::ChaosLayer::snapshot) until the body ends, fails or is dropped.
    pub struct ChaosBody<RB> {
        #[pin]
        kind: Kind<RB>,
        in_flight: Option<InFlight>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<RB> {
        Inner {
            #[pin]
            body: RB,
        },
        Answer {
            data: Option<Bytes>,
        },
        Reset {
            reported: bool,
        },
        Faulty {
            #[pin]
            stream: FaultyStream<RB>,
        },
    }
}

impl<RB> ChaosBody<RB> {
    /// The inner service's `body`, with the stream `fault` drawn for it, if any. An error
    /// before content replaces the body with the provider's error event (and is counted here);
    /// the other stream faults act, and count, when the stream reaches their place.
    pub(crate) fn new(
        body: RB,
        fault: Option<Fault>,
        provider: Provider,
        in_flight: Option<InFlight>,
    ) -> Self {
        let kind = match fault {
            None => Kind::Inner { body },
            Some(fault) if fault.kind() == FaultKind::ErrorBeforeContent => {
                fault.count();
                Kind::Answer {
                    data: Some(provider.error_event()),
                }
            }
            Some(fault) => Kind::Faulty {
                stream: FaultyStream::new(body, fault, provider),
            },
        };
        Self { kind, in_flight }
    }

    /// An injected answer's body: `data`, then the end.
    pub(crate) fn answer(data: Bytes, in_flight: Option<InFlight>) -> Self {
        Self {
            kind: Kind::Answer { data: Some(data) },
            in_flight,
        }
    }

    /// A body that fails at once with a reset.
    pub(crate) fn reset(in_flight: Option<InFlight>) -> Self {
        Self {
            kind: Kind::Reset { reported: false },
            in_flight,
        }
    }
}

/// The error of an injected connection reset.
pub(crate) fn reset() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "connection reset (injected by stormguard-chaos)",
    )
}

impl<RB> Body for ChaosBody<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let frame = match this.kind.project() {
            KindProj::Inner { body } => {
                ready!(body.poll_frame(cx)).map(|frame| frame.map_err(Into::into))
            }
            KindProj::Answer { data } => data.take().map(|data| Ok(Frame::data(data))),
            KindProj::Reset { reported } => {
                (!std::mem::replace(reported, true)).then(|| Err(Box::new(reset()) as BoxError))
            }
            KindProj::Faulty { stream } => ready!(stream.poll_frame(cx)),
        };
        if !matches!(frame, Some(Ok(_))) {
            // Ended or failed: the call is over.
            *this.in_flight = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Answer { data } => data.is_none(),
            Kind::Reset { reported } => *reported,
            Kind::Faulty { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
            Kind::Reset { .. } | Kind::Faulty { .. } => SizeHint::default(),
        }
    }
}

impl<RB> std::fmt::Debug for ChaosBody<RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Answer { .. } => "injected answer",
            Kind::Reset { .. } => "reset",
            Kind::Faulty { .. } => "faulty stream",
        };
        f.debug_struct("ChaosBody").field("kind", &kind).finish()
    }
}
