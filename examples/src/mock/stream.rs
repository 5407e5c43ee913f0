//! Streamed answers (`"stream": true`), written the way OpenAI's Chat Completions API streams
//! them, and read back by [`Transcript`].
//!
//! A stream is a `200` with `content-type: text/event-stream` whose events are `data:` lines
//! (Server-Sent Events):
//!
//! ```text
//! data: {"id":"chatcmpl-mock","object":"chat.completion.chunk",...,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}
//!
//! data: {...,"choices":[{"index":0,"delta":{"content":"This"},"finish_reason":null}]}
//!
//! data: {...,"choices":[{"index":0,"delta":{"content":" is"},"finish_reason":null}]}
//!
//! data: {...,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}
//!
//! data: [DONE]
//! ```
//!
//! One content chunk per requested token, each a word of the mock's sentence, the per-token
//! latency apart on tokio's clock. [`Fault::ErrorBeforeContent`] sends the role chunk and then
//! an error frame; [`Fault::CutMidStream`] sends half the content and then fails the connection.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Response, header};
use http_body::Frame;
use stormguard::sse::{Event, EventKind, classify_event};
use tokio::time::Sleep;

use super::stats::{InFlight, Streamed};
use super::{Fault, error_body};

/// The words of a streamed answer, one per token, repeated as long as `max_tokens` asks.
const WORDS: [&str; 5] = ["This", "is", "the", "mock", "speaking."];

/// The stream's end marker, an event of its own.
const DONE: &str = "data: [DONE]\n\n";

/// The answer to a streaming request: `tokens` content chunks `pace` apart, or the stream
/// `fault`. `request` stays in flight until the stream ends, and counts what it sends.
pub(super) fn answer(
    model: String,
    tokens: u32,
    fault: Option<Fault>,
    pace: Duration,
    request: InFlight,
) -> Response<Body> {
    request.streamed(Streamed::Begun);
    let body = ChunkStream {
        model,
        tokens,
        fault,
        pace,
        next: Step::Role,
        sleep: None,
        request,
    };
    let mut response = Response::new(Body::new(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The body of a streamed answer, written chunk by chunk as the server asks for it.
struct ChunkStream {
    model: String,
    tokens: u32,
    fault: Option<Fault>,
    pace: Duration,
    next: Step,
    sleep: Option<Pin<Box<Sleep>>>,
    request: InFlight,
}

/// What the stream sends next.
#[derive(Clone, Copy, Debug)]
enum Step {
    Role,
    ErrorFrame,
    /// Before content chunk `n`: the end of the content, the cut, or the pause of one token.
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
    /// One `data:` event carrying a chat completion chunk with `delta` and `finish_reason`.
    fn chunk(&self, delta: serde_json::Value, finish_reason: Option<&str>) -> Bytes {
        let chunk = serde_json::json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
        });
        Bytes::from(format!("data: {chunk}\n\n"))
    }

    /// The content chunks sent before [`Fault::CutMidStream`] cuts: half of them, at least one.
    fn cut_after(&self) -> Option<u32> {
        (self.fault == Some(Fault::CutMidStream)).then(|| (self.tokens / 2).max(1))
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
                Step::Role => {
                    self.next = if self.fault == Some(Fault::ErrorBeforeContent) {
                        Step::ErrorFrame
                    } else {
                        Step::Pace(0)
                    };
                    let delta = serde_json::json!({ "role": "assistant", "content": "" });
                    self.chunk(delta, None)
                }
                Step::ErrorFrame => {
                    self.next = Step::End;
                    self.request.streamed(Streamed::Error);
                    let error = error_body(Fault::ErrorBeforeContent);
                    Bytes::from(format!("data: {error}\n\n"))
                }
                Step::Pace(n) => {
                    self.next = if self.cut_after() == Some(n) {
                        Step::Flush
                    } else if n >= self.tokens {
                        Step::Finish
                    } else {
                        if !self.pace.is_zero() {
                            self.sleep = Some(Box::pin(tokio::time::sleep(self.pace)));
                        }
                        Step::Content(n)
                    };
                    continue;
                }
                Step::Content(n) => {
                    self.next = Step::Pace(n.saturating_add(1));
                    self.request.streamed(Streamed::Content);
                    let index = usize::try_from(n).unwrap_or(0) % WORDS.len();
                    let word = WORDS[index];
                    let text = if n == 0 {
                        word.to_owned()
                    } else {
                        format!(" {word}")
                    };
                    self.chunk(serde_json::json!({ "content": text }), None)
                }
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
                    self.chunk(serde_json::json!({}), Some("stop"))
                }
                Step::Done => {
                    self.next = Step::End;
                    Bytes::from_static(DONE.as_bytes())
                }
                Step::End => return Poll::Ready(None),
            };
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }
}

/// A streamed chat completion as a client received it, read event by event: lines up to a
/// blank line make an event, `data:` lines its data; an event left unfinished (a cut stream) is
/// not read. Each event is sorted by [`classify_event`], the way stormguard's stream guard sorts
/// it, then read as OpenAI's chunk format.
///
/// ```
/// use stormguard_examples::mock::Transcript;
///
/// let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
///               data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
///               data: [DONE]\n\n";
/// let read = Transcript::parse(stream);
/// assert_eq!(read.role.as_deref(), Some("assistant"));
/// assert_eq!(read.content, ["Hi"]);
/// assert!(read.done && read.errors == 0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// The role the stream announced, if it did.
    pub role: Option<String>,
    /// The text of each content event, in order.
    pub content: Vec<String>,
    /// The `finish_reason` of the last chunk that had one.
    pub finish_reason: Option<String>,
    /// Error events (an `{"error": ...}` frame, an `event: error`).
    pub errors: usize,
    /// Whether the stream's end marker came (`data: [DONE]`).
    pub done: bool,
}

impl Transcript {
    /// Reads the text of a stream.
    pub fn parse(stream: &str) -> Self {
        let mut transcript = Self::default();
        let mut event_type = String::new();
        let mut data: Vec<&str> = Vec::new();
        for line in stream.lines() {
            if line.is_empty() {
                if !data.is_empty() {
                    transcript.read(&event_type, &data.join("\n"));
                }
                event_type.clear();
                data.clear();
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => value.clone_into(&mut event_type),
                "data" => data.push(value),
                // Comments (keep-alives) and other fields.
                _ => {}
            }
        }
        transcript
    }

    /// The text of the answer, its content events joined.
    pub fn text(&self) -> String {
        self.content.concat()
    }

    fn read(&mut self, event_type: &str, data: &str) {
        let event = Event {
            event_type: if event_type.is_empty() {
                "message".to_owned()
            } else {
                event_type.to_owned()
            },
            data: data.to_owned(),
            id: None,
            retry: None,
        };
        let kind = classify_event(&event);
        match kind {
            EventKind::Done => self.done = true,
            EventKind::Error(_) => self.errors += 1,
            EventKind::Content | EventKind::Control => {
                let Ok(chunk) = serde_json::from_str::<serde_json::Value>(data) else {
                    return;
                };
                let choice = &chunk["choices"][0];
                if let Some(role) = choice["delta"]["role"].as_str() {
                    self.role = Some(role.to_owned());
                }
                if let Some(reason) = choice["finish_reason"].as_str() {
                    self.finish_reason = Some(reason.to_owned());
                }
                if kind == EventKind::Content {
                    let text = choice["delta"]["content"].as_str().unwrap_or_default();
                    self.content.push(text.to_owned());
                }
            }
        }
    }
}
