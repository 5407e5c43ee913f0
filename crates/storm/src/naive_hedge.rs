//! The naive hedge: every request sent twice at once, the first attempt to produce content
//! answers, the other is dropped ([`NaiveHedge`]).
//!
//! This is what a client that "races two requests" to cut its tail does: no delay, no budget, no
//! reading of the backend's health. The content an attempt produces is its first content event
//! for an event stream (read with stormguard's SSE parser and classifier, as the simulator's
//! callers read theirs), and its response head for anything else. An attempt that fails (an
//! error, a status other than success, a stream that ends or fails before any content) is out of
//! the race and the other goes on; when both fail, the caller gets the first's failure.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use stormguard_storm::naive_hedge::NaiveHedge;
//! use tower::{ServiceExt, service_fn};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let counted = calls.clone();
//! let backend = service_fn(move |_request: Request<Full<Bytes>>| {
//!     counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
//! });
//! let response = NaiveHedge::new(backend)
//!     .oneshot(Request::new(Full::new(Bytes::new())))
//!     .await
//!     .unwrap();
//! assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
//! // Two attempts of the one request.
//! assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
//! # });
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Response, response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard::stream::is_event_stream;
use stormguard::stream::sse::{EventKind, FrameKind, Parser, classify_event};
use tower::util::Oneshot;
use tower::{BoxError, Service};

use crate::pipeline::{SimRequest, clone_request};

/// Sends each request twice at once through `inner`; the first attempt to produce content
/// answers (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct NaiveHedge<S> {
    inner: S,
}

impl<S> NaiveHedge<S> {
    /// Races two attempts of each request through `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S, RB> Service<SimRequest> for NaiveHedge<S>
where
    S: Service<SimRequest, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Raced<RB>>;
    type Error = BoxError;
    type Future = RaceFuture<S, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: SimRequest) -> Self::Future {
        // The second attempt waits for a clone of its own to be ready; the first uses the
        // readied service.
        let second = Oneshot::new(self.inner.clone(), clone_request(&request));
        let clone = self.inner.clone();
        let mut readied = std::mem::replace(&mut self.inner, clone);
        RaceFuture {
            first: Lane::Calling {
                future: readied.call(request),
            },
            second: Lane::Calling { future: second },
            failed: [None, None],
        }
    }
}

/// How one attempt of the race ended: with content (it answers), or out of the race.
enum Finish<RB> {
    Content(Response<Raced<RB>>),
    Failed(Result<Response<Raced<RB>>, BoxError>),
}

pin_project! {
    /// One attempt of the race: waiting for its head, then reading an event stream up to its
    /// first content event.
    #[project = LaneProj]
    enum Lane<F, RB> {
        Calling { #[pin] future: F },
        Reading { head: Option<response::Parts>, body: Option<Pin<Box<RB>>>, read: VecDeque<Bytes>, parser: Parser },
        Out,
    }
}

impl<F, RB, E> Lane<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    /// Polls the attempt until it produces content or is out of the race.
    fn poll_finish(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finish<RB>> {
        loop {
            let next = match self.as_mut().project() {
                LaneProj::Calling { future } => match ready!(future.poll(cx)) {
                    Err(error) => return Poll::Ready(Finish::Failed(Err(error.into()))),
                    Ok(response) => {
                        let (head, body) = response.into_parts();
                        let streaming = is_event_stream(&head.headers);
                        if !head.status.is_success() || !streaming {
                            let whole = Response::from_parts(head, Raced::new([], Box::pin(body)));
                            return Poll::Ready(match whole.status().is_success() {
                                true => Finish::Content(whole),
                                false => Finish::Failed(Ok(whole)),
                            });
                        }
                        Lane::Reading {
                            head: Some(head),
                            body: Some(Box::pin(body)),
                            read: VecDeque::new(),
                            parser: Parser::new(),
                        }
                    }
                },
                LaneProj::Reading {
                    head,
                    body,
                    read,
                    parser,
                } => return poll_first_content(head, body, read, parser, cx),
                LaneProj::Out => return Poll::Pending,
            };
            self.set(next);
        }
    }
}

/// Reads an event stream up to its first content event: the response, with what was read to
/// be read again, once it came (or once the stream failed or ended without it).
fn poll_first_content<RB>(
    head: &mut Option<response::Parts>,
    body: &mut Option<Pin<Box<RB>>>,
    read: &mut VecDeque<Bytes>,
    parser: &mut Parser,
    cx: &mut Context<'_>,
) -> Poll<Finish<RB>>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let Some(stream) = body.as_mut() else {
        return Poll::Pending;
    };
    let mut frames = Vec::new();
    let content = loop {
        match ready!(stream.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let malformed = parser.feed(&data, &mut frames).is_err();
                read.push_back(data);
                let kinds = frames.drain(..).filter_map(|frame| match frame.kind {
                    FrameKind::Event(event) => Some(classify_event(&event)),
                    _ => None,
                });
                match kinds.fold(None, |seen, kind| seen.or(first_verdict(kind))) {
                    Some(content) => break content,
                    None if malformed => break false,
                    None => {}
                }
            }
            Some(Err(error)) => return Poll::Ready(Finish::Failed(Err(error.into()))),
            None => break false,
        }
    };
    let (Some(head), Some(rest)) = (head.take(), body.take()) else {
        return Poll::Pending;
    };
    let response = Response::from_parts(head, Raced::new(std::mem::take(read), rest));
    Poll::Ready(match content {
        true => Finish::Content(response),
        false => Finish::Failed(Ok(response)),
    })
}

/// What an event says of the race: content (`true`), a failure before content (`false`), or
/// nothing yet.
fn first_verdict(kind: EventKind) -> Option<bool> {
    match kind {
        EventKind::Content => Some(true),
        EventKind::Error(_) | EventKind::Done => Some(false),
        EventKind::Control => None,
    }
}

pin_project! {
    /// The response future of [`NaiveHedge`]: both attempts polled in turn, the first with
    /// content answers and the other is dropped with the future.
    pub struct RaceFuture<S, RB>
    where
        S: Service<SimRequest>,
    {
        #[pin]
        first: Lane<S::Future, RB>,
        #[pin]
        second: Lane<Oneshot<S, SimRequest>, RB>,
        // Each attempt's failure, once it is out of the race.
        failed: [Option<Result<Response<Raced<RB>>, BoxError>>; 2],
    }
}

impl<F, RB, E> Lane<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    /// How the attempt finished, if it did at this poll (it is out of the race then).
    fn poll_once(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Option<Finish<RB>> {
        let Poll::Ready(finish) = self.as_mut().poll_finish(cx) else {
            return None;
        };
        self.set(Lane::Out);
        Some(finish)
    }
}

impl<S, RB> Future for RaceFuture<S, RB>
where
    S: Service<SimRequest, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<Raced<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The second attempt is sent at the first poll (the first was sent by the call), before
        // the first's answer is looked at: both are out at once. The first wins a tie.
        let second = this.second.as_mut().poll_once(cx);
        let first = this.first.as_mut().poll_once(cx);
        for (index, finish) in [first, second].into_iter().enumerate() {
            match finish {
                Some(Finish::Content(response)) => return Poll::Ready(Ok(response)),
                Some(Finish::Failed(failure)) => this.failed[index] = Some(failure),
                None => {}
            }
        }
        if !(matches!(*this.first, Lane::Out) && matches!(*this.second, Lane::Out)) {
            return Poll::Pending;
        }
        // Both failed: the first's failure.
        let [first, second] = this.failed;
        let failure = first.take().or_else(|| second.take());
        Poll::Ready(failure.unwrap_or_else(|| Err(BoxError::from("neither attempt answered"))))
    }
}

pin_project! {
    /// The winner's body: what was read of it to find its first content, then the rest.
    pub struct Raced<RB> {
        read: VecDeque<Bytes>,
        rest: Pin<Box<RB>>,
    }
}

impl<RB> Raced<RB> {
    fn new(read: impl Into<VecDeque<Bytes>>, rest: Pin<Box<RB>>) -> Self {
        Self {
            read: read.into(),
            rest,
        }
    }
}

impl<RB: Body<Data = Bytes>> Body for Raced<RB> {
    type Data = Bytes;
    type Error = RB::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(data) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        this.rest.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    use http::Request;
    use http_body_util::{BodyExt, Full};
    use tokio::time::Instant;
    use tower::ServiceExt;

    use crate::backend::{Backend, REQUEST_ID};
    use crate::event_stream::Transcript;
    use crate::scenarios;

    fn request(id: u64) -> SimRequest {
        let mut request = Request::new(Full::new(Bytes::from_static(b"{}")));
        request
            .headers_mut()
            .insert(REQUEST_ID, http::HeaderValue::from(id));
        request
    }

    /// Every request reaches the provider twice, at once, and the caller reads one whole stream
    /// that started with the first content event of the two (20 requests one after the other,
    /// about a second each: before the scenario's outage).
    #[tokio::test(start_paused = true)]
    async fn both_attempts_go_at_once_and_the_first_content_answers() {
        let scenario = scenarios::TAIL.scenario().with_qps(100.0);
        let backend = Backend::new(&scenario, Instant::now());
        let hedge = NaiveHedge::new(backend.clone());
        let mut first_tokens = Vec::new();
        for id in 0..20 {
            let start = Instant::now();
            let response = hedge.clone().oneshot(request(id)).await.unwrap();
            assert!(response.status().is_success());
            let mut body = std::pin::pin!(response.into_body());
            let mut transcript = Transcript::default();
            let mut first = None;
            while let Some(frame) = body.frame().await {
                transcript.read(&frame.unwrap().into_data().unwrap());
                if first.is_none() && transcript.tokens() > 0 {
                    first = Some(start.elapsed());
                }
            }
            assert!(transcript.ending(false) == crate::event_stream::Ending::Complete);
            first_tokens.push(first.unwrap());
        }
        let stats = backend.model().stats().clone();
        assert_eq!((stats.attempts, stats.hedges), (40, 20));
        // The faster of two draws: none waited for a slow one (both slow once in 4,400).
        assert!(
            first_tokens.iter().all(|t| *t < Duration::from_secs(2)),
            "{first_tokens:?}"
        );
        assert_eq!(backend.model().open(), 0, "the loser was dropped");
    }

    /// In an outage both attempts fail at once and the caller gets the first's 503.
    #[tokio::test(start_paused = true)]
    async fn when_both_fail_the_first_failure_answers() {
        let scenario = scenarios::TAIL.scenario().with_qps(100.0);
        let backend = Backend::new(&scenario, Instant::now());
        tokio::time::advance(Duration::from_secs(35)).await;
        let response = NaiveHedge::new(backend.clone())
            .oneshot(request(0))
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"{\"error\""), "{body:?}");
        let stats = backend.model().stats().clone();
        assert_eq!((stats.attempts, stats.hedges), (2, 1));
    }
}
