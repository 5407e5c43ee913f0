//! [`ConcurrencyBody`]: a response body that holds its attempt's slot until it ends.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_classify::{BoxError, Classify, Outcome, Permit};

use crate::ConcurrencyPermit;

pin_project! {
    /// The body of an answer let through by [`ConcurrencyService`](super::ConcurrencyService):
    /// the backend's, unchanged, holding the attempt's slot until its last frame (an event
    /// stream holds the provider for its whole length). Its end is a healthy answer; an error
    /// is judged by the classifier (a timeout shrinks the limit); dropped before its end, the slot
    /// is freed and the limit learns nothing.
    pub struct ConcurrencyBody<RB, C> {
        #[pin]
        inner: RB,
        // Taken when the body ends.
        held: Option<(ConcurrencyPermit, C)>,
    }
}

impl<RB, C> ConcurrencyBody<RB, C> {
    pub(crate) fn new(inner: RB, held: Option<(ConcurrencyPermit, C)>) -> Self {
        Self { inner, held }
    }

    /// Whether it still holds its slot.
    pub fn holds_slot(&self) -> bool {
        self.held.is_some()
    }
}

impl<RB, C> Body for ConcurrencyBody<RB, C>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
    C: Classify,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx)).map(|frame| frame.map_err(Into::into));
        match &frame {
            None => {
                if let Some((permit, _)) = this.held.take() {
                    permit.record(&Outcome::success(), &HeaderMap::new());
                }
            }
            Some(Err(error)) => {
                if let Some((permit, classifier)) = this.held.take() {
                    permit.record(&classifier.classify_error(&**error), &HeaderMap::new());
                }
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<RB: std::fmt::Debug, C> std::fmt::Debug for ConcurrencyBody<RB, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("inner", &self.inner)
            .field("holds_slot", &self.held.is_some())
            .finish()
    }
}
