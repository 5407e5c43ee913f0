//! [`FaultyStream`]: an event stream that a stream fault cuts, stalls or breaks after its n-th
//! event.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use stormguard_classify::BoxError;

use super::events::EventEnds;
use super::reset;
use crate::{Fault, FaultKind, Provider};

pin_project! {
    /// The inner event stream, passed on event by event until the fault's place (a data frame
    /// that holds it is split there), where the fault acts: a cut fails the body, a stall
    /// sends nothing more (the inner body is held, unread), a malformed event goes in and the
    /// stream goes on after it.
    pub(super) struct FaultyStream<RB> {
        #[pin]
        body: RB,
        fault: Fault,
        provider: Provider,
        // Events still to pass before the fault acts; `None` once it has.
        before: Option<u32>,
        ends: EventEnds,
        // What the last data frame held past the fault's place, to go after it.
        held: Option<Bytes>,
        flow: Flow,
    }
}

/// Where the stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Flowing,
    /// Cut: the error is next.
    Cut,
    Stalled,
    Ended,
}

impl<RB> FaultyStream<RB> {
    /// `body` with `fault`, a cut, a stall or a malformed event after its events.
    pub(super) fn new(body: RB, fault: Fault, provider: Provider) -> Self {
        let before = match fault.kind() {
            FaultKind::CutAfter(events)
            | FaultKind::StallAfter(events)
            | FaultKind::MalformedAfter(events) => events,
            _ => 0,
        };
        Self {
            body,
            fault,
            provider,
            before: Some(before),
            ends: EventEnds::default(),
            held: None,
            flow: Flow::Flowing,
        }
    }
}

impl<RB> FaultyStream<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    pub(super) fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.before == Some(0) {
                *this.before = None;
                this.fault.count();
                act(this.fault.kind(), *this.provider, this.flow, this.held);
            }
            match *this.flow {
                Flow::Flowing => {}
                // Never woken: pending until the reader drops it.
                Flow::Stalled => return Poll::Pending,
                Flow::Cut => {
                    *this.flow = Flow::Ended;
                    return Poll::Ready(Some(Err(Box::new(reset()))));
                }
                Flow::Ended => return Poll::Ready(None),
            }
            let data = match this.held.take() {
                Some(held) => held,
                None => match ready!(this.body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                    Some(Err(error)) => {
                        *this.flow = Flow::Ended;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                    None => {
                        *this.flow = Flow::Ended;
                        return Poll::Ready(None);
                    }
                },
            };
            let data = pass(data, this.before, this.ends, this.held);
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
        }
    }
}

/// What of `data` goes on before the fault: all of it, or (when the fault's place is in it) the
/// bytes up to that place, the rest held.
fn pass(
    mut data: Bytes,
    before: &mut Option<u32>,
    ends: &mut EventEnds,
    held: &mut Option<Bytes>,
) -> Bytes {
    let Some(wanted) = before.filter(|wanted| *wanted > 0) else {
        return data;
    };
    match ends.find(&data, wanted) {
        Ok(end) => {
            *before = Some(0);
            let rest = data.split_off(end);
            if !rest.is_empty() {
                *held = Some(rest);
            }
        }
        Err(ended) => *before = Some(wanted - ended),
    }
    data
}

/// The fault acts: a cut or a stall drops what was held past its place; a malformed event goes
/// before it.
fn act(kind: FaultKind, provider: Provider, flow: &mut Flow, held: &mut Option<Bytes>) {
    match kind {
        FaultKind::CutAfter(_) => {
            *flow = Flow::Cut;
            *held = None;
        }
        FaultKind::StallAfter(_) => {
            *flow = Flow::Stalled;
            *held = None;
        }
        FaultKind::MalformedAfter(_) => {
            let malformed = provider.malformed_event();
            *held = Some(match held.take() {
                Some(rest) => {
                    let mut joined = BytesMut::with_capacity(malformed.len() + rest.len());
                    joined.extend_from_slice(&malformed);
                    joined.extend_from_slice(&rest);
                    joined.freeze()
                }
                None => malformed,
            });
        }
        // Never made into a faulty stream.
        _ => {}
    }
}
