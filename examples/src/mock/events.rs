//! The events of a streamed answer, written the way each API streams them.
//!
//! OpenAI Chat Completions: `data:` lines only, a chunk with the role, one per token, one with
//! the `finish_reason`, then `data: [DONE]`:
//!
//! ```text
//! data: {"id":"chatcmpl-mock","object":"chat.completion.chunk",...,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}
//!
//! data: {...,"choices":[{"index":0,"delta":{"content":"This"},"finish_reason":null}]}
//!
//! data: {...,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}
//!
//! data: [DONE]
//! ```
//!
//! Anthropic Messages: named events, `message_start`, `content_block_start` (a text block),
//! `ping`, one `content_block_delta` (`text_delta`) per token, `content_block_stop`,
//! `message_delta` (`stop_reason`, `usage.output_tokens`), `message_stop`:
//!
//! ```text
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" is"}}
//! ```
//!
//! Every token is a word of the mock's sentence, repeated as long as `max_tokens` asks; or,
//! with [`MockConfig::numbered`](super::MockConfig::numbered), a word that says its place in the
//! answer (`w0`, `w1`, ...), so that a reader can tell a word shown twice or missing.

use axum::body::Bytes;
use serde_json::{Value, json};

use super::request::Api;

/// The mock's sentence: a streamed answer's n-th token is its n-th word, counted from the start
/// of the answer (after the words of an assistant prefill, if the request had one).
const WORDS: [&str; 5] = ["This", "is", "the", "mock", "speaking."];

/// The text of a streamed answer of `tokens` tokens to a request without a prefill: the mock's
/// sentence, repeated and cut to `tokens` words. What a caller reads of a whole answer,
/// however many continuations it took.
///
/// ```
/// assert_eq!(
///     stormguard_examples::mock::streamed_text(7),
///     "This is the mock speaking. This is"
/// );
/// ```
pub fn streamed_text(tokens: u32) -> String {
    (0..u64::from(tokens))
        .map(|index| token(index, false))
        .collect()
}

/// The text of the answer's token at `index` (counted from the start of the whole answer): its
/// word (numbered: `w{index}`), after a space unless it is the first.
pub(super) fn token(index: u64, numbered: bool) -> String {
    let space = if index == 0 { "" } else { " " };
    if numbered {
        format!("{space}w{index}")
    } else {
        let word = WORDS[usize::try_from(index % WORDS.len() as u64).unwrap_or(0)];
        format!("{space}{word}")
    }
}

/// The numbers of the words of a numbered answer's text ([`MockConfig::numbered`](super::MockConfig::numbered)),
/// in the order they came; `None` if a word is not one of the mock's numbered words.
///
/// ```
/// use stormguard_examples::mock::word_numbers;
///
/// assert_eq!(word_numbers("w0 w1 w2"), Some(vec![0, 1, 2]));
/// assert_eq!(word_numbers("w0 w1 w1"), Some(vec![0, 1, 1])); // a word shown twice
/// assert_eq!(word_numbers("This is"), None);
/// ```
pub fn word_numbers(text: &str) -> Option<Vec<u64>> {
    text.split_whitespace().map(word_number).collect()
}

/// The number of one of a numbered answer's words (`w7`: 7), `None` if it is not one.
pub fn word_number(word: &str) -> Option<u64> {
    word.strip_prefix('w')?.parse().ok()
}

/// Writes the events of one streamed answer in its API's format.
pub(super) struct Events {
    api: Api,
    model: String,
    prompt_tokens: usize,
}

impl Events {
    /// The events of an answer to `api`, to a prompt of `prompt_tokens`, from `model`.
    pub(super) fn new(api: Api, prompt_tokens: usize, model: String) -> Self {
        Self {
            api,
            model,
            prompt_tokens,
        }
    }

    /// What a stream opens with, before any content: OpenAI's role chunk; Anthropic's
    /// `message_start`, the text block's `content_block_start` and a `ping`.
    pub(super) fn opening(&self) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({ "role": "assistant", "content": "" }), None),
            Api::Messages => {
                let message = json!({
                    "id": "msg_mock",
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    // Anthropic counts the first output token here already.
                    "usage": { "input_tokens": self.prompt_tokens, "output_tokens": 1 },
                });
                let block = json!({ "type": "text", "text": "" });
                [
                    named("message_start", &json!({ "message": message })),
                    named(
                        "content_block_start",
                        &json!({ "index": 0, "content_block": block }),
                    ),
                    named("ping", &json!({})),
                ]
                .concat()
                .into()
            }
        }
    }

    /// One content event carrying `text`.
    pub(super) fn content(&self, text: &str) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({ "content": text }), None),
            Api::Messages => {
                let delta = json!({ "type": "text_delta", "text": text });
                named(
                    "content_block_delta",
                    &json!({ "index": 0, "delta": delta }),
                )
            }
        }
    }

    /// The error event of [`Fault::ErrorBeforeContent`](super::Fault::ErrorBeforeContent):
    /// OpenAI's error frame (a 503's body), Anthropic's `event: error` with an
    /// `overloaded_error` (the provider's own, shared with `stormguard::chaos`).
    pub(super) fn error(&self) -> Bytes {
        self.api.provider().error_event()
    }

    /// What says the answer is complete, after `tokens` content events: OpenAI's chunk with the
    /// `finish_reason`; Anthropic's `content_block_stop` and `message_delta` with the
    /// `stop_reason` and the output tokens.
    pub(super) fn finish(&self, tokens: u32) -> Bytes {
        match self.api {
            Api::Chat => self.chunk(json!({}), Some("stop")),
            Api::Messages => {
                let delta = json!({ "stop_reason": "end_turn", "stop_sequence": null });
                let usage = json!({ "output_tokens": tokens });
                [
                    named("content_block_stop", &json!({ "index": 0 })),
                    named("message_delta", &json!({ "delta": delta, "usage": usage })),
                ]
                .concat()
                .into()
            }
        }
    }

    /// The stream's terminal event: `data: [DONE]`, or `message_stop`.
    pub(super) fn done(&self) -> Bytes {
        match self.api {
            Api::Chat => Bytes::from_static(b"data: [DONE]\n\n"),
            Api::Messages => named("message_stop", &json!({})),
        }
    }

    /// One `data:` event carrying a chat completion chunk with `delta` and `finish_reason`.
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        let chunk = json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
        });
        Bytes::from(format!("data: {chunk}\n\n"))
    }
}

/// One Anthropic event: its name on the `event:` line, and again as the `type` of its data, as
/// Anthropic sends both.
fn named(name: &str, data: &Value) -> Bytes {
    let mut data = data.clone();
    if let Some(object) = data.as_object_mut() {
        object.insert("type".to_owned(), name.into());
    }
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}
