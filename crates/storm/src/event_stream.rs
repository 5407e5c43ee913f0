//! The streamed answers of the `streams` and `silent` scenarios: the provider's
//! `text/event-stream` body ([`EventStream`]), and what a caller reads from it ([`Transcript`]).
//!
//! # The stream
//! OpenAI's Chat Completions stream, on the provider's (paused) clock, from its response head
//! (sent when the provider starts on the request, or, where the scenario draws it,
//! [`StreamPlan::head`] later):
//!
//! - at once, with the response head, the opening chunk that names the role (no content);
//! - then one content event every [`StreamShape::event_interval`] (the first
//!   [`StreamPlan::first_content`] after the head: one interval, or the scenario's draw), as
//!   many as the answer's service time holds (at least one), each with
//!   [`StreamShape::tokens_per_event`] tokens. The tokens are numbered in the answer, from 0
//!   (` t0 t1 t2 t3 t4`), so a caller can tell a token it is shown again, or one it never got,
//!   from the next one;
//! - with the last content event, the chunk with the `finish_reason`, then `data: [DONE]`, and
//!   the end of the body.
//!
//! A stream can fail instead ([`StreamFate`]):
//!
//! - **before any content**: when the first content event was due, an error event, in
//!   Anthropic's form (`event: error` with `overloaded_error`) or OpenAI's
//!   (`data: {"error": {...}}`) ([`ErrorForm`]); then the body ends;
//! - **cut after `k` content events**: when the next event was due, the body fails with a
//!   connection reset (`std::io::ErrorKind::ConnectionReset`);
//! - **lost when the provider goes down**, some time after its head: the content events due
//!   before then, then a connection reset at that moment.
//!
//! The body holds the client's attempt open in the provider's count (its connection) until it
//! ends, fails or is dropped.
//!
//! # A continuation
//! A request whose last message is the assistant's carries the start of the answer (a prefill,
//! as stormguard's continuation of a cut stream sends it), and a real model goes on from the
//! end of it rather than from the start. So does this one: the prefill's tokens `t0 ... tN` make
//! the stream's first content event start at `t{N+1}` ([`first_token`],
//! [`StreamPlan::first_token`]). Nothing else about the request changes: its service time, its
//! length and its fate are drawn as for any other.
//!
//! # The caller's reading
//! A [`Transcript`] is what the caller of one request was shown, across the streams it read (a
//! naive caller restarts a failed stream; stormguard never does). It reads the bytes with
//! stormguard's SSE parser ([`stormguard::stream::sse::Parser`]) and classifies each event with
//! [`stormguard::stream::sse::classify_event`], as stormguard's stream guard does, and counts the
//! content tokens by their numbers: a token whose number the caller was already shown is
//! delivered twice ([`Transcript::duplicated_tokens`]), and a number past the next one means the
//! tokens between were never delivered ([`Transcript::lost_tokens`]: a continuation that went on
//! from the wrong place would show as either).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde::Deserialize;
use stormguard::stream::sse::{
    Event, EventKind, Frame as SseFrame, FrameKind, Parser, classify_event,
};
use tokio::time::{Instant, Sleep};

use crate::json_body::{ERROR_BODY, OVERLOADED_BODY};
use crate::scenario::StreamShape;

/// The opening chunk: the role, no content (stormguard's classifier reads it as control).
const ROLE_CHUNK: &[u8] = concat!(
    r#"data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
    "\n\n"
)
.as_bytes();

/// The last chunk, with the `finish_reason`, and OpenAI's end-of-stream marker.
const FINISH_AND_DONE: &[u8] = concat!(
    r#"data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    "\n\ndata: [DONE]\n\n"
)
.as_bytes();

/// In which provider's form a stream's error event comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorForm {
    /// Anthropic's: `event: error` with `{"type":"error","error":{"type":"overloaded_error"}}`
    /// (retryable, like a 529).
    Anthropic,
    /// OpenAI's: `data: {"error":{"type":"server_error",...}}` (retryable, like a 500).
    OpenAi,
}

impl ErrorForm {
    /// The error event, as the provider sends it.
    pub(crate) fn event(self) -> Bytes {
        let (name, body): (&[u8], &[u8]) = match self {
            ErrorForm::Anthropic => (b"event: error\n", OVERLOADED_BODY),
            ErrorForm::OpenAi => (b"", ERROR_BODY),
        };
        Bytes::from([name, b"data: ", body, b"\n\n"].concat())
    }
}

/// How a stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamFate {
    /// Whole: every content event, the finish chunk and `[DONE]`.
    Complete,
    /// An error event when the first content event was due, then the end of the body.
    ErrorBeforeContent(ErrorForm),
    /// A connection reset when the content event after the first `k` (or the finish chunk,
    /// after the last one) was due.
    CutAfter(u32),
    /// A connection reset this long after the head (the provider went down), after the content
    /// events due before it.
    LostAt(Duration),
}

/// One streamed answer: its shape, its length in content events, how it ends, and how long it
/// takes to start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StreamPlan {
    /// Pace and tokens per event.
    pub(crate) shape: StreamShape,
    /// Content events of the whole answer (at least one).
    pub(crate) events: u32,
    /// How it ends.
    pub(crate) fate: StreamFate,
    /// Time from the provider starting on the request to the stream's head (the provider's
    /// business: the body starts with the head).
    pub(crate) head: Duration,
    /// Time from the head to the first content event; one `event_interval` unless the
    /// scenario draws it ([`StreamShape::start`]).
    pub(crate) first_content: Duration,
    /// The number of the first token of the first content event: 0, or where the request's
    /// prefill ends (see [`first_token`]).
    pub(crate) first_token: u64,
    /// Whether its first content event was drawn in the slow tail of the stream's start
    /// ([`StreamStart::slow`](crate::scenario::StreamStart::slow)).
    pub(crate) slow: bool,
}

/// What the stream sends next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Role,
    /// Content event number `n` (from 1).
    Content(u32),
    Finish,
    Error(ErrorForm),
    Reset,
    End,
}

impl StreamPlan {
    /// The answer to a request served for `service`: one content event per `event_interval` of
    /// it (rounded, at least one), ending as `fate` says.
    pub(crate) fn new(shape: StreamShape, service: Duration, fate: StreamFate) -> StreamPlan {
        let interval = shape.event_interval.as_nanos().max(1);
        let events = (service.as_nanos() + interval / 2) / interval;
        let events = u32::try_from(events).unwrap_or(u32::MAX).max(1);
        StreamPlan {
            shape,
            events,
            fate,
            head: Duration::ZERO,
            first_content: shape.event_interval,
            first_token: 0,
            slow: false,
        }
    }

    /// Time from the start of the stream (its head) to its end (or its failure).
    pub(crate) fn length(&self) -> Duration {
        let events = match self.fate {
            StreamFate::Complete => self.events,
            StreamFate::ErrorBeforeContent(_) => 1,
            StreamFate::CutAfter(k) => k.saturating_add(1),
            StreamFate::LostAt(lost) => return lost,
        };
        self.due(events)
    }

    /// Content events due before `lost` from the head (at most the answer's).
    fn due_before(&self, lost: Duration) -> u32 {
        let Some(after_first) = lost
            .checked_sub(self.first_content)
            .filter(|d| !d.is_zero())
        else {
            return 0;
        };
        let interval = self.shape.event_interval.as_nanos().max(1);
        let later = (after_first.as_nanos() - 1) / interval;
        u32::try_from(later.saturating_add(1))
            .unwrap_or(u32::MAX)
            .min(self.events)
    }

    /// When content event number `n` (from 1) is due from the head: the first after
    /// `first_content`, each next one `event_interval` later (0 for `n` = 0).
    fn due(&self, n: u32) -> Duration {
        match n.checked_sub(1) {
            Some(later) => self
                .first_content
                .saturating_add(self.shape.event_interval.saturating_mul(later)),
            None => Duration::ZERO,
        }
    }

    /// Content events the stream delivers.
    #[cfg(test)]
    pub(crate) fn content_events(&self) -> u32 {
        match self.fate {
            StreamFate::Complete => self.events,
            StreamFate::ErrorBeforeContent(_) => 0,
            StreamFate::CutAfter(k) => k.min(self.events),
            StreamFate::LostAt(lost) => self.due_before(lost),
        }
    }

    /// What frame number `index` (from 0) of the body is, and when it is due from the start.
    fn frame(&self, index: u32) -> (Next, Duration) {
        let at = |n: u32| self.due(n);
        if index == 0 {
            return (Next::Role, Duration::ZERO);
        }
        match self.fate {
            StreamFate::ErrorBeforeContent(form) if index == 1 => (Next::Error(form), at(1)),
            StreamFate::ErrorBeforeContent(_) => (Next::End, at(1)),
            StreamFate::CutAfter(k) => {
                let k = k.min(self.events);
                if index <= k {
                    (Next::Content(index), at(index))
                } else if index == k + 1 {
                    (Next::Reset, at(k + 1))
                } else {
                    (Next::End, at(k + 1))
                }
            }
            StreamFate::LostAt(lost) => {
                let k = self.due_before(lost);
                if index <= k {
                    (Next::Content(index), at(index))
                } else if index == k + 1 {
                    (Next::Reset, lost)
                } else {
                    (Next::End, lost)
                }
            }
            StreamFate::Complete if index <= self.events => (Next::Content(index), at(index)),
            StreamFate::Complete if index == self.events + 1 => (Next::Finish, at(self.events)),
            StreamFate::Complete => (Next::End, at(self.events)),
        }
    }

    /// Content event number `n` (from 1): its tokens, numbered in the answer.
    fn content(&self, n: u32) -> Bytes {
        let per_event = u64::from(self.shape.tokens_per_event);
        let first = self.first_token + u64::from(n.saturating_sub(1)) * per_event;
        let mut text = String::with_capacity(8 * per_event as usize);
        for token in first..first + per_event {
            let _ = write!(text, " t{token}");
        }
        Bytes::from(format!(
            "data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\
             \"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
        ))
    }
}

pin_project! {
    /// The provider's streamed answer (see the [module docs](self)): an `http_body::Body` that
    /// sends each frame when it is due on tokio's clock.
    pub(crate) struct EventStream {
        plan: StreamPlan,
        start: Instant,
        // Frames sent.
        sent: u32,
        #[pin]
        timer: Option<Sleep>,
        // The client's attempt (the provider's `OpenAttempt`), open until the stream ends:
        // dropping it closes it in the provider's count. Boxed as any value, so that the stream
        // does not import the provider, which builds it.
        open: Option<Box<dyn Send + Sync>>,
    }
}

impl EventStream {
    /// The stream of `plan`, starting now.
    pub(crate) fn new(plan: StreamPlan) -> EventStream {
        EventStream {
            plan,
            start: Instant::now(),
            sent: 0,
            timer: None,
            open: None,
        }
    }

    /// Hold the client's attempt open until the stream ends, when `open` is dropped.
    pub(crate) fn hold_open<A: Send + Sync + 'static>(&mut self, open: Option<A>) {
        self.open = open.map(|open| Box::new(open) as Box<dyn Send + Sync>);
    }

    /// What the stream will send.
    #[cfg(test)]
    pub(crate) fn plan(&self) -> &StreamPlan {
        &self.plan
    }
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let mut this = self.project();
        let (next, due) = this.plan.frame(*this.sent);
        let due = *this.start + due;
        if due > Instant::now() {
            if this.timer.is_none() {
                this.timer.set(Some(tokio::time::sleep_until(due)));
            }
            if let Some(timer) = this.timer.as_mut().as_pin_mut() {
                ready!(timer.poll(cx));
            }
        }
        this.timer.set(None);
        let data = match next {
            Next::Role => Bytes::from_static(ROLE_CHUNK),
            Next::Content(n) => this.plan.content(n),
            Next::Finish => Bytes::from_static(FINISH_AND_DONE),
            Next::Error(form) => form.event(),
            Next::Reset => {
                *this.sent += 1;
                this.open.take();
                let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                return Poll::Ready(Some(Err(reset)));
            }
            Next::End => {
                this.open.take();
                return Poll::Ready(None);
            }
        };
        *this.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.plan.frame(self.sent).0 == Next::End
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// How one stream ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Whole: `[DONE]`, then the end of the body, and no error.
    Complete,
    /// Failed (an error event, a body error, or an end without `[DONE]`) before any content.
    BeforeContent,
    /// Failed after content: cut, interrupted.
    Interrupted,
}

/// What the caller of one request was shown, across the streams it read (see the
/// [module docs](self)).
#[derive(Clone, Debug, Default)]
pub(crate) struct Transcript {
    /// The current stream's parser.
    parser: Parser,
    /// The frames the last bytes completed.
    frames: Vec<SseFrame>,
    /// Whether the current stream broke the event-stream format.
    malformed: bool,
    /// The number of the next new token: one past the highest shown so far.
    shown: u64,
    /// Tokens shown a second time.
    duplicated: u64,
    /// Tokens skipped: numbers below a token shown that were never shown before it.
    lost: u64,
    /// Content tokens of the current stream.
    tokens: u64,
    /// Whether the current stream sent `[DONE]`.
    done: bool,
    /// Whether the current stream sent an error event.
    error: bool,
}

impl Transcript {
    /// A new stream of the same request begins: what it shows is compared with what the caller
    /// was shown before.
    pub(crate) fn restart(&mut self) {
        self.parser = Parser::new();
        self.malformed = false;
        self.tokens = 0;
        self.done = false;
        self.error = false;
    }

    /// The caller received `bytes` of the current stream.
    pub(crate) fn read(&mut self, bytes: &[u8]) {
        let mut frames = std::mem::take(&mut self.frames);
        self.malformed |= self.parser.feed(bytes, &mut frames).is_err();
        for frame in frames.drain(..) {
            if let FrameKind::Event(event) = frame.kind {
                self.see(&event);
            }
        }
        self.frames = frames;
    }

    fn see(&mut self, event: &Event) {
        match classify_event(event) {
            EventKind::Content => {
                for number in token_numbers(&event.data) {
                    self.tokens += 1;
                    if number < self.shown {
                        self.duplicated += 1;
                    } else {
                        self.lost += number - self.shown;
                        self.shown = number + 1;
                    }
                }
            }
            EventKind::Done => self.done = true,
            EventKind::Error(_) => self.error = true,
            EventKind::Control => {}
        }
    }

    /// How the current stream ended: `failed` when its body ended with an error.
    pub(crate) fn ending(&self, failed: bool) -> Ending {
        if self.done && !self.error && !self.malformed && !failed {
            Ending::Complete
        } else if self.tokens > 0 {
            Ending::Interrupted
        } else {
            Ending::BeforeContent
        }
    }

    /// Content tokens of the current stream.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The number of the next new token: the tokens shown across all streams, and the ones
    /// [lost](Transcript::lost_tokens) between them.
    #[cfg(test)]
    pub(crate) fn shown(&self) -> u64 {
        self.shown
    }

    /// Tokens the caller was shown a second time (a restarted stream repeating what an earlier
    /// one had shown).
    pub(crate) fn duplicated_tokens(&self) -> u64 {
        self.duplicated
    }

    /// Tokens the caller was never shown though a later one was: the gaps in the numbers (a
    /// continuation that skipped part of the answer).
    pub(crate) fn lost_tokens(&self) -> u64 {
        self.lost
    }
}

/// The part of a content chunk that carries its text: `choices[0].delta.content`.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    choices: Vec<Choice<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    delta: Delta<'a>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    content: Option<&'a str>,
}

/// The numbers of the tokens of a content chunk (`" t12 t13"` in its first choice's
/// `delta.content`).
fn token_numbers(data: &str) -> Vec<u64> {
    let Ok(chunk) = serde_json::from_str::<Chunk<'_>>(data) else {
        return Vec::new();
    };
    let text = chunk
        .choices
        .first()
        .and_then(|choice| choice.delta.content);
    numbers(text.unwrap_or_default()).collect()
}

/// The numbers of the tokens of a text (`" t12 t13"`); words that are no token are skipped.
fn numbers(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.split_whitespace()
        .filter_map(|token| token.strip_prefix('t')?.parse().ok())
}

/// The part of a chat completion request that says where its answer starts: its messages.
#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

/// The number of the first token of the answer to a chat completion request whose JSON body is
/// `body`: one past the highest token of its prefill (a last message of the assistant's, whose
/// text is `" t0 t1 ... tN"`), as a model goes on from the end of a prefill; 0 for any other
/// request (a body that is not such JSON included: the provider answers it from the start).
pub(crate) fn first_token(body: &[u8]) -> u64 {
    let Ok(request) = serde_json::from_slice::<ChatRequest<'_>>(body) else {
        return 0;
    };
    match request.messages.last() {
        Some(Message {
            role,
            content: Some(text),
        }) if role == "assistant" => numbers(text).max().map_or(0, |last| last + 1),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::BodyExt;

    fn plan(events: u32, fate: StreamFate) -> StreamPlan {
        StreamPlan {
            events,
            fate,
            ..StreamPlan::new(StreamShape::LLM, Duration::ZERO, fate)
        }
    }

    /// Every frame of `stream` with the time it came at, in ms from the start.
    async fn frames(stream: EventStream) -> Vec<(u64, Result<Bytes, std::io::ErrorKind>)> {
        let start = Instant::now();
        let mut stream = std::pin::pin!(stream);
        let mut frames = Vec::new();
        while let Some(frame) = stream.frame().await {
            let at = (Instant::now() - start).as_millis() as u64;
            frames.push((
                at,
                frame.map(|f| f.into_data().unwrap()).map_err(|e| e.kind()),
            ));
        }
        frames
    }

    #[test]
    fn an_answer_has_one_content_event_per_interval_of_its_service_time() {
        let shape = StreamShape::LLM;
        let at = |ms| StreamPlan::new(shape, Duration::from_millis(ms), StreamFate::Complete);
        assert_eq!(at(4_000).events, 40);
        assert_eq!(at(4_049).events, 40);
        assert_eq!(at(4_050).events, 41);
        assert_eq!(at(10).events, 1, "at least one");
        assert_eq!(at(4_000).length(), Duration::from_secs(4));
        let failed = StreamPlan {
            fate: StreamFate::ErrorBeforeContent(ErrorForm::OpenAi),
            ..at(4_000)
        };
        assert_eq!(failed.length(), Duration::from_millis(100));
        assert_eq!(failed.content_events(), 0);
        let cut = StreamPlan {
            fate: StreamFate::CutAfter(7),
            ..at(4_000)
        };
        assert_eq!(cut.length(), Duration::from_millis(800));
        assert_eq!(cut.content_events(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_stream_sends_its_events_on_time_and_ends_with_done() {
        let frames = frames(EventStream::new(plan(3, StreamFate::Complete))).await;
        let times: Vec<u64> = frames.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [0, 100, 200, 300, 300]);
        let text: Vec<String> = frames
            .iter()
            .map(|(_, f)| String::from_utf8(f.clone().unwrap().to_vec()).unwrap())
            .collect();
        assert!(text[0].contains(r#""role":"assistant""#));
        assert!(
            text[1].contains(r#""content":" t0 t1 t2 t3 t4""#),
            "{}",
            text[1]
        );
        assert!(text[3].contains(r#""content":" t10 t11 t12 t13 t14""#));
        assert!(text[4].ends_with("data: [DONE]\n\n"));
        // Read by a caller: 15 tokens, complete.
        let mut transcript = Transcript::default();
        for chunk in &text {
            transcript.read(chunk.as_bytes());
        }
        assert_eq!(transcript.ending(false), Ending::Complete);
        assert_eq!((transcript.tokens(), transcript.shown()), (15, 15));
        assert_eq!(transcript.duplicated_tokens(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_fails_before_content_with_an_error_event_stormguard_retries() {
        for form in [ErrorForm::Anthropic, ErrorForm::OpenAi] {
            let stream = EventStream::new(plan(40, StreamFate::ErrorBeforeContent(form)));
            let frames = frames(stream).await;
            assert_eq!(frames.len(), 2, "{form:?}");
            assert_eq!(frames[1].0, 100, "when the first content was due");
            let mut transcript = Transcript::default();
            for (_, frame) in &frames {
                transcript.read(frame.as_ref().unwrap());
            }
            assert_eq!(transcript.ending(false), Ending::BeforeContent);
            // stormguard's classifier reads it as a retryable error.
            let mut parsed = Vec::new();
            let mut parser = Parser::new();
            parser
                .feed(frames[1].1.as_ref().unwrap(), &mut parsed)
                .unwrap();
            let [
                SseFrame {
                    kind: FrameKind::Event(event),
                    ..
                },
            ] = &parsed[..]
            else {
                panic!("one event: {parsed:?}");
            };
            let EventKind::Error(outcome) = classify_event(event) else {
                panic!("an error event: {event:?}");
            };
            assert!(outcome.is_retryable(), "{form:?}: {outcome:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_stream_fails_with_a_reset_after_its_content() {
        let frames = frames(EventStream::new(plan(40, StreamFate::CutAfter(2)))).await;
        let times: Vec<u64> = frames.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [0, 100, 200, 300]);
        assert_eq!(
            frames[3].1,
            Err(std::io::ErrorKind::ConnectionReset),
            "then the body ends"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_lost_with_its_provider_sends_what_was_due_then_a_reset() {
        // 250 ms after the head: the content events due at 100 ms and 200 ms, then the reset.
        let lost = StreamFate::LostAt(Duration::from_millis(250));
        let lost = plan(40, lost);
        assert_eq!(
            (lost.content_events(), lost.length()),
            (2, Duration::from_millis(250))
        );
        let sent = frames(EventStream::new(lost)).await;
        let times: Vec<u64> = sent.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [0, 100, 200, 250]);
        assert_eq!(sent[3].1, Err(std::io::ErrorKind::ConnectionReset));
        // Lost before its first content event: the role chunk, then the reset.
        let early = plan(40, StreamFate::LostAt(Duration::from_millis(100)));
        assert_eq!(early.content_events(), 0);
        let sent = frames(EventStream::new(early)).await;
        assert_eq!(sent.len(), 2);
        assert_eq!(
            (sent[1].0, sent[1].1.clone()),
            (100, Err(std::io::ErrorKind::ConnectionReset))
        );
    }

    #[test]
    fn a_prefill_of_the_assistants_moves_the_answer_on_past_its_last_token() {
        let request = |messages: &str| {
            format!(r#"{{"model":"storm-1","stream":true,"max_tokens":246,"messages":{messages}}}"#)
        };
        let user = r#"{"role":"user","content":"Summarise the incident. t9"}"#;
        let prefill = r#"{"role":"assistant","content":" t0 t1 t2 t3 t4 t5 t6 t7 t8 t9"}"#;
        let continued = request(&format!("[{user},{prefill}]"));
        assert_eq!(first_token(continued.as_bytes()), 10);
        // Only a last message of the assistant's is a prefill; anything else starts at 0.
        assert_eq!(
            first_token(request(&format!("[{prefill},{user}]")).as_bytes()),
            0
        );
        assert_eq!(first_token(request(&format!("[{user}]")).as_bytes()), 0);
        let empty = r#"{"role":"assistant","content":""}"#;
        assert_eq!(
            first_token(request(&format!("[{user},{empty}]")).as_bytes()),
            0
        );
        assert_eq!(first_token(b"not json"), 0);
        assert_eq!(first_token(b""), 0);

        // The stream of a continuation numbers its tokens from there.
        let plan = StreamPlan {
            first_token: 10,
            ..plan(2, StreamFate::Complete)
        };
        let first = String::from_utf8(plan.content(1).to_vec()).unwrap();
        assert!(
            first.contains(r#""content":" t10 t11 t12 t13 t14""#),
            "{first}"
        );
    }

    #[test]
    fn a_continuation_read_after_its_cut_shows_every_token_once_and_a_gap_is_lost() {
        let cut = plan(40, StreamFate::CutAfter(2));
        let mut transcript = Transcript::default();
        transcript.read(ROLE_CHUNK);
        transcript.read(&cut.content(1));
        transcript.read(&cut.content(2));
        // Spliced in the same stream: the continuation goes on from t10.
        let rest = StreamPlan {
            first_token: 10,
            ..plan(2, StreamFate::Complete)
        };
        transcript.read(&rest.content(1));
        transcript.read(&rest.content(2));
        transcript.read(FINISH_AND_DONE);
        assert_eq!(transcript.ending(false), Ending::Complete);
        assert_eq!((transcript.tokens(), transcript.shown()), (20, 20));
        assert_eq!(transcript.duplicated_tokens(), 0);
        assert_eq!(transcript.lost_tokens(), 0);
        // One that went on from t25 would have skipped t20 to t24.
        let skipping = StreamPlan {
            first_token: 25,
            ..rest
        };
        transcript.read(&skipping.content(1));
        assert_eq!(transcript.lost_tokens(), 5);
        assert_eq!(transcript.shown(), 30);
    }

    #[test]
    fn a_restarted_stream_shows_its_first_tokens_twice() {
        let whole = plan(3, StreamFate::Complete);
        let mut transcript = Transcript::default();
        transcript.read(ROLE_CHUNK);
        transcript.read(&whole.content(1));
        transcript.read(&whole.content(2));
        assert_eq!(transcript.ending(true), Ending::Interrupted);
        assert_eq!(transcript.tokens(), 10);
        transcript.restart();
        // Split anywhere: the events are read whole.
        let mut again = ROLE_CHUNK.to_vec();
        for n in 1..=3 {
            again.extend_from_slice(&whole.content(n));
        }
        again.extend_from_slice(FINISH_AND_DONE);
        for piece in again.chunks(7) {
            transcript.read(piece);
        }
        assert_eq!(transcript.ending(false), Ending::Complete);
        assert_eq!(transcript.duplicated_tokens(), 10);
        assert_eq!(transcript.lost_tokens(), 0);
        assert_eq!(transcript.shown(), 15);
    }
}
