//! Streamed answers (`"stream": true`): a `200` with `content-type: text/event-stream` whose
//! events ([`events`](super::events)) are written one at a time, paced like a generation.
//!
//! One content event per requested token, the per-token latency apart on tokio's clock, each a
//! word of the mock's sentence, counted on from the words of the request's assistant prefill.
//! [`Fault::ErrorBeforeContent`] sends the opening events and then an error event;
//! [`Fault::CutMidStream`] sends half the content and then fails the connection.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Response, header};
use http_body::Frame;
use tokio::time::Sleep;

use super::Fault;
use super::answers::mark_fault;
use super::events::{Events, token};
use super::stats::{InFlight, Streamed};

/// What a streamed answer holds: its events' format, where its words start, how many tokens,
/// the stream fault that fails it, if any, and the time between two content events.
pub(super) struct Answer {
    pub(super) events: Events,
    /// The index of its first word in the mock's sentence: the words of the prefill it goes on
    /// from.
    pub(super) first_word: u64,
    pub(super) tokens: u32,
    /// Whether its words are numbered ([`MockConfig::numbered`](super::MockConfig::numbered)).
    pub(super) numbered: bool,
    pub(super) fault: Option<Fault>,
    pub(super) pace: Duration,
}

/// The response that streams `answer`. `request` stays in flight until the stream ends, and
/// counts what it sends.
pub(super) fn respond(answer: Answer, request: InFlight) -> Response<Body> {
    request.streamed(Streamed::Begun);
    if answer.first_word > 0 {
        request.streamed(Streamed::Prefilled);
    }
    let fault = answer.fault;
    let body = ChunkStream {
        answer,
        next: Step::Opening,
        sleep: None,
        request,
    };
    let mut response = Response::new(Body::new(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(fault) = fault {
        mark_fault(&mut response, fault);
    }
    response
}

/// The body of a streamed answer, written event by event as the server asks for it.
struct ChunkStream {
    answer: Answer,
    next: Step,
    sleep: Option<Pin<Box<Sleep>>>,
    request: InFlight,
}

/// What the stream sends next.
#[derive(Clone, Copy, Debug)]
enum Step {
    Opening,
    ErrorEvent,
    /// Before content event `n`: the end of the content, the cut, or the pause of one token.
    Pace(u32),
    Content(u32),
    /// Give the server a turn to write out what it holds before the cut: a hyper server drops
    /// what it buffered when a body fails, and the content sent before a cut reached the client.
    Flush,
    Cut,
    Finish,
    Done,
    End,
}

impl ChunkStream {
    /// The content events sent before [`Fault::CutMidStream`] cuts: half of them, at least one.
    fn cut_after(&self) -> Option<u32> {
        (self.answer.fault == Some(Fault::CutMidStream)).then(|| (self.answer.tokens / 2).max(1))
    }

    /// The step after the pause before content event `n`, arming the pause's timer.
    fn pace(&mut self, n: u32) -> Step {
        if self.cut_after() == Some(n) {
            Step::Flush
        } else if n >= self.answer.tokens {
            Step::Finish
        } else {
            if !self.answer.pace.is_zero() {
                self.sleep = Some(Box::pin(tokio::time::sleep(self.answer.pace)));
            }
            Step::Content(n)
        }
    }

    /// Content event `n`: the word after the prefill's and the `n` before it.
    fn content(&mut self, n: u32) -> Bytes {
        self.next = Step::Pace(n.saturating_add(1));
        self.request.streamed(Streamed::Content);
        let index = self.answer.first_word.saturating_add(u64::from(n));
        self.answer
            .events
            .content(&token(index, self.answer.numbered))
    }
}

impl http_body::Body for ChunkStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let data = match self.next {
                Step::Opening => {
                    self.next = if self.answer.fault == Some(Fault::ErrorBeforeContent) {
                        Step::ErrorEvent
                    } else {
                        Step::Pace(0)
                    };
                    self.answer.events.opening()
                }
                Step::ErrorEvent => {
                    self.next = Step::End;
                    self.request.streamed(Streamed::Error);
                    self.answer.events.error()
                }
                Step::Pace(n) => {
                    self.next = self.pace(n);
                    continue;
                }
                Step::Content(n) => self.content(n),
                Step::Flush => {
                    self.next = Step::Cut;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Step::Cut => {
                    self.next = Step::End;
                    self.request.streamed(Streamed::Cut);
                    return Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the mock cut the stream",
                    ))));
                }
                Step::Finish => {
                    self.next = Step::Done;
                    self.answer.events.finish(self.answer.tokens)
                }
                Step::Done => {
                    self.next = Step::End;
                    self.answer.events.done()
                }
                Step::End => return Poll::Ready(None),
            };
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }
}
