//! The demo provider's streamed answers (`"stream": true`): a `200` with
//! `content-type: text/event-stream`, one content event per word, [`WORD_PACE`] apart.
//!
//! OpenAI's chat completion chunks (the role, one chunk per word, one with the `finish_reason`,
//! `data: [DONE]`), or Anthropic's events (`message_start`, `content_block_start`, one
//! `content_block_delta` per word, `content_block_stop`, `message_delta` with the `stop_reason`
//! and the output tokens, `message_stop`). A cut stream stops after its cut word and fails its
//! body, so that the server resets the connection, as a provider that falls over mid-answer does.

use std::time::Duration;

use axum::body::{Body, Bytes};
use http::{HeaderValue, Response, header};
use http_body_util::channel::{Channel, Sender};
use serde_json::{Value, json};

/// The pause between two words of a streamed answer: long enough for a reader to see the words
/// arrive one by one in `curl -N`, short enough that an answer of twelve words takes under a
/// second.
pub const WORD_PACE: Duration = Duration::from_millis(50);

/// The API a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// OpenAI's chat completions.
    Chat,
    /// Anthropic's messages.
    Messages,
}

impl Api {
    /// Its place in per-API arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            Self::Chat => 0,
            Self::Messages => 1,
        }
    }
}

/// Where the writing task sends a stream's events, or the failure that cuts it.
type Events = Sender<Bytes, std::io::Error>;

/// The streamed answer of the words `span.0` to `span.1` from `model`, cut after word `cut` if
/// given. The events are written by a task of their own, paced; it ends when the caller leaves.
pub(crate) fn respond(
    api: Api,
    model: String,
    span: (u64, u64),
    cut: Option<u64>,
) -> Response<Body> {
    let (events, body) = Channel::new(4);
    tokio::spawn(write(Writer { api, model }, span, cut, events));
    let mut response = Response::new(Body::new(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Sends the stream's events, a word each [`WORD_PACE`]; stops as soon as the caller is gone.
async fn write(writer: Writer, (first, last): (u64, u64), cut: Option<u64>, mut events: Events) {
    if events.send_data(writer.opening()).await.is_err() {
        return;
    }
    for word in first..=last {
        tokio::time::sleep(WORD_PACE).await;
        let space = if word == 1 { "" } else { " " };
        if events
            .send_data(writer.content(&format!("{space}{word}")))
            .await
            .is_err()
        {
            return;
        }
        if cut == Some(word) {
            // A pause before the reset, so that the words before it are written out: a server
            // drops what it still holds when a body fails.
            tokio::time::sleep(WORD_PACE).await;
            let reset = std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the demo provider cut the stream",
            );
            events.abort(reset);
            return;
        }
    }
    let words = last.saturating_sub(first).saturating_add(1);
    for event in [writer.finish(words), writer.done()] {
        if events.send_data(event).await.is_err() {
            return;
        }
    }
}

/// Writes one stream's events in its API's format.
struct Writer {
    api: Api,
    model: String,
}

impl Writer {
    /// What a stream opens with: OpenAI's role chunk; Anthropic's `message_start` and
    /// `content_block_start`.
    fn opening(&self) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({ "role": "assistant", "content": "" }), None),
            Api::Messages => {
                let message = json!({
                    "id": "msg_demo", "type": "message", "role": "assistant",
                    "model": self.model, "content": [], "stop_reason": null,
                    "stop_sequence": null, "usage": { "input_tokens": 1, "output_tokens": 1 },
                });
                let block = json!({ "type": "text", "text": "" });
                concat([
                    named("message_start", json!({ "message": message })),
                    named(
                        "content_block_start",
                        json!({ "index": 0, "content_block": block }),
                    ),
                ])
            }
        }
    }

    /// One content event carrying `text`.
    fn content(&self, text: &str) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({ "content": text }), None),
            Api::Messages => named(
                "content_block_delta",
                json!({ "index": 0, "delta": { "type": "text_delta", "text": text } }),
            ),
        }
    }

    /// What says the answer of `words` words is complete.
    fn finish(&self, words: u64) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({}), Some("stop")),
            Api::Messages => concat([
                named("content_block_stop", json!({ "index": 0 })),
                named(
                    "message_delta",
                    json!({
                        "delta": { "stop_reason": "end_turn", "stop_sequence": null },
                        "usage": { "output_tokens": words },
                    }),
                ),
            ]),
        }
    }

    /// The terminal event.
    fn done(&self) -> Bytes {
        match self.api {
            Api::Chat => Bytes::from_static(b"data: [DONE]\n\n"),
            Api::Messages => named("message_stop", json!({})),
        }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        let chunk = json!({
            "id": "chatcmpl-demo",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
        });
        Bytes::from(format!("data: {chunk}\n\n"))
    }
}

/// One Anthropic event: its name on the `event:` line and as its data's `type`.
fn named(name: &str, mut data: Value) -> Bytes {
    if let Some(object) = data.as_object_mut() {
        object.insert("type".to_owned(), name.into());
    }
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

fn concat<const N: usize>(events: [Bytes; N]) -> Bytes {
    events.concat().into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// The stream's text and whether it ended in a failure.
    async fn read(response: Response<Body>) -> (String, bool) {
        let mut body = response.into_body();
        let mut text = String::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => text.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap())),
                Err(_) => return (text, true),
            }
        }
        (text, false)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_sends_each_word_once_and_a_cut_one_fails_after_its_cut() {
        let (text, failed) = read(respond(Api::Chat, "m".into(), (1, 3), None)).await;
        assert!(!failed);
        assert_eq!(text.matches(r#""content":" 2""#).count(), 1, "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("\"finish_reason\":\"stop\"").count(), 1);

        let started = tokio::time::Instant::now();
        let (text, failed) = read(respond(Api::Messages, "m".into(), (5, 12), Some(7))).await;
        assert!(failed, "a cut stream's body fails");
        assert_eq!(text.matches("content_block_delta").count(), 2 * 3, "{text}");
        assert!(
            text.contains(r#""text":" 7""#) && !text.contains(r#"" 8""#),
            "{text}"
        );
        assert!(!text.contains("message_stop"));
        // Three words and the pause before the cut.
        assert_eq!(started.elapsed(), WORD_PACE * 4);
    }
}
