//! The drain's side in each request: the signal that the grace has ended, the count of requests
//! in flight, and the event stream that ends with an in-band error event rather than a cut.
//!
//! When the grace ends, a request still waiting for its provider is answered 503 in the caller's
//! format (see [`Refusal::draining`]); a relayed event stream still open hands on the whole
//! events it has, then one error event in its provider's format
//! ([`error_event`](stormguard::stream::continuation::error_event), cause `shutdown`), and ends.
//! A stream whose terminal event (`data: [DONE]`, `message_stop`) already went through ends as
//! it is: its answer is complete.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use stormguard::stream::continuation::{self, error_event};
use stormguard::stream::sse::{EventKind, FrameKind, Parser, classify_event};
use tokio::sync::watch;

use super::refusal::Refusal;
use crate::format::Format;

/// A future boxed to be held in a body.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Requests relayed, and how they ended, since the gateway started.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    started: AtomicU64,
    finished: AtomicU64,
    ended: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) started: u64,
    pub(crate) finished: u64,
    pub(crate) ended: u64,
}

impl Tally {
    /// Requests neither finished nor ended.
    pub(crate) fn in_flight(&self) -> u64 {
        self.started
            .saturating_sub(self.finished)
            .saturating_sub(self.ended)
    }
}

impl Counts {
    pub(crate) fn tally(&self) -> Tally {
        Tally {
            started: self.started.load(Ordering::Acquire),
            finished: self.finished.load(Ordering::Acquire),
            ended: self.ended.load(Ordering::Acquire),
        }
    }
}

/// What a request knows of the drain: whether its grace has ended, and the counts. Every app the
/// gateway builds (the first, each reload) holds a clone of the same one.
#[derive(Clone, Debug)]
pub(crate) struct Ending {
    ended: watch::Receiver<bool>,
    counts: Arc<Counts>,
}

impl Ending {
    /// A new one, and the sender that ends the grace.
    pub(crate) fn new() -> (watch::Sender<bool>, Self) {
        let (sender, ended) = watch::channel(false);
        let ending = Self {
            ended,
            counts: Arc::default(),
        };
        (sender, ending)
    }

    /// The counts of requests relayed.
    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Resolves when the grace has ended (never, while the gateway serves).
    pub(crate) fn ended(&self) -> BoxFuture<'static, ()> {
        let mut ended = self.ended.clone();
        Box::pin(async move {
            // A sender dropped without ending the grace (a test's gateway dropped) ends nothing.
            if ended.wait_for(|ended| *ended).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }

    /// A request begins: counted until its guard is dropped.
    pub(crate) fn begin(&self) -> InFlight {
        self.counts.started.fetch_add(1, Ordering::AcqRel);
        InFlight {
            counts: Arc::clone(&self.counts),
            ended: false,
        }
    }
}

/// One request in flight: counted as finished when dropped, or as ended by the drain.
#[derive(Debug)]
pub(crate) struct InFlight {
    counts: Arc<Counts>,
    ended: bool,
}

impl InFlight {
    /// The drain ended it (a 503, an in-band error event).
    pub(crate) fn end(&mut self) {
        self.ended = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counter = if self.ended {
            &self.counts.ended
        } else {
            &self.counts.finished
        };
        counter.fetch_add(1, Ordering::AcqRel);
    }
}

/// The 503 of a request still waiting when the grace ends.
pub(crate) fn draining_response(format: Format) -> http::Response<Body> {
    let mut response = Refusal::draining().to_response(format);
    let headers = response.headers_mut();
    headers.insert("x-should-retry", http::HeaderValue::from_static("true"));
    headers.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    response
}

/// A relayed event stream that hands on whole events only, and ends with its in-band error event
/// when the grace ends before it does.
pub(crate) struct DrainingStream {
    inner: Body,
    format: continuation::Format,
    ended: BoxFuture<'static, ()>,
    in_flight: InFlight,
    parser: Parser,
    /// Bytes read, not yet handed on: the start of an event not complete yet.
    pending: BytesMut,
    /// Bytes of the stream handed on.
    handed: u64,
    /// Content events handed on.
    content: u64,
    /// Whether the terminal event was handed on.
    done: bool,
    /// Whether the stream is passed on as it comes (it broke the parser's limits).
    raw: bool,
    /// Whether nothing follows.
    over: bool,
}

impl DrainingStream {
    /// `inner`, an event stream in `format`'s API, ended by `ending`.
    pub(crate) fn new(inner: Body, format: Format, ending: &Ending, in_flight: InFlight) -> Self {
        let format = match format {
            Format::OpenAi => continuation::Format::OpenAiChat,
            Format::Anthropic => continuation::Format::AnthropicMessages,
        };
        Self {
            inner,
            format,
            ended: ending.ended(),
            in_flight,
            parser: Parser::new(),
            pending: BytesMut::new(),
            handed: 0,
            content: 0,
            done: false,
            raw: false,
            over: false,
        }
    }

    /// Reads `chunk`: the whole events it completes, to hand on now (empty: none yet).
    fn read(&mut self, chunk: &Bytes) -> Bytes {
        if self.raw {
            self.handed += chunk.len() as u64;
            return chunk.clone();
        }
        self.pending.extend_from_slice(chunk);
        let mut input = &chunk[..];
        let mut boundary = self.handed;
        loop {
            match self.parser.next_frame(&mut input) {
                Ok(Some(frame)) => {
                    boundary = frame.boundary;
                    if let FrameKind::Event(event) = &frame.kind {
                        match classify_event(event) {
                            EventKind::Content => self.content += 1,
                            EventKind::Done => self.done = true,
                            _ => {}
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    // Past the parser's limits: passed on as it comes from now on.
                    self.raw = true;
                    boundary = self.handed + self.pending.len() as u64;
                    break;
                }
            }
        }
        let whole = usize::try_from(boundary.saturating_sub(self.handed))
            .unwrap_or(usize::MAX)
            .min(self.pending.len());
        self.handed += whole as u64;
        self.pending.split_to(whole).freeze()
    }

    /// The last bytes, once the grace has ended: the in-band error event, unless the answer was
    /// complete.
    fn last_words(&mut self) -> Option<Bytes> {
        self.over = true;
        if self.done {
            return None;
        }
        self.in_flight.end();
        let event = error_event(self.format, "shutdown", self.content, self.handed);
        tracing::info!(
            format = self.format.as_str(),
            content_events = self.content,
            bytes = self.handed,
            "stream ended by the drain with an in-band error event"
        );
        Some(event)
    }
}

impl HttpBody for DrainingStream {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.over {
                return Poll::Ready(None);
            }
            if this.ended.as_mut().poll(cx).is_ready() {
                return Poll::Ready(this.last_words().map(|event| Ok(Frame::data(event))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(chunk) => {
                        let whole = this.read(&chunk);
                        if !whole.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(whole))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => {
                    // The provider's own end: whatever it left unfinished goes on as it was.
                    this.over = true;
                    let rest = std::mem::take(&mut this.pending).freeze();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.over
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stream(format: Format) -> (watch::Sender<bool>, Ending, DrainingStream) {
        let (sender, ending) = Ending::new();
        let in_flight = ending.begin();
        let body = DrainingStream::new(Body::empty(), format, &ending, in_flight);
        (sender, ending, body)
    }

    #[test]
    fn only_whole_events_are_handed_on() {
        let (_sender, _ending, mut body) = stream(Format::OpenAi);
        let first = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        let half = "data: {\"choices\":[{\"delta\":";
        let whole = body.read(&Bytes::from(format!("{first}{half}")));
        assert_eq!(whole, first);
        assert_eq!(body.content, 1);
        let rest = "{\"content\":\"lo\"}}]}\n\n";
        assert_eq!(body.read(&Bytes::from(rest)), format!("{half}{rest}"));
        assert_eq!(body.content, 2);
        assert_eq!(body.handed, (first.len() + half.len() + rest.len()) as u64);
    }

    #[test]
    fn the_drain_counts_what_it_ended() {
        let (_sender, ending, mut body) = stream(Format::Anthropic);
        let event = body.last_words().unwrap();
        assert!(event.starts_with(b"event: error\ndata: {"));
        drop(body);
        let tally = ending.counts().tally();
        assert_eq!((tally.started, tally.finished, tally.ended), (1, 0, 1));
        let (_sender, ending, mut done) = stream(Format::OpenAi);
        done.read(&Bytes::from_static(b"data: [DONE]\n\n"));
        assert_eq!(done.last_words(), None);
        drop(done);
        assert_eq!(ending.counts().tally().finished, 1);
    }
}
