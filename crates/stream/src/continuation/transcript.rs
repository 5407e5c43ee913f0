//! [`Transcript`]: what the caller was shown of an answer, read event by event.

use serde_json::{Map, Value};

use super::{Format, NotContinuable, anthropic_type, count, is_set, member, object, string};
use crate::sse::{Event, is_given};

/// Members of an OpenAI chunk's `delta` that carry output other than text.
const CHAT_NOT_TEXT: [&str; 6] = [
    "tool_calls",
    "function_call",
    "audio",
    "refusal",
    "reasoning_content",
    "reasoning",
];

/// The members that name an OpenAI answer: every chunk repeats them, and the splice gives the
/// continuation's chunks the first stream's, so that the caller reads one answer.
pub(super) const CHAT_IDENTITY: [&str; 3] = ["id", "created", "model"];

/// The last content block an Anthropic stream opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Block {
    /// Its index in the message.
    pub(super) index: u64,
    /// No `content_block_stop` came for it: the stream was cut inside it.
    pub(super) open: bool,
}

/// What the caller was shown of an answer, read event by event: every event of the original
/// stream that was handed to the caller, in order.
///
/// It keeps the text delivered (the prefill of a continuation), how much was delivered, whether
/// the answer said it was complete, why it could not be continued if it cannot, and what a
/// [`Splice`](super::Splice) needs to make a continuation look like the same stream (OpenAI's
/// `id`, `created` and `model`; the usage the provider reported; Anthropic's last content
/// block).
#[derive(Clone, Debug)]
pub struct Transcript {
    format: Format,
    text: String,
    content_events: u64,
    /// The provider's own count of the output tokens, the last it sent.
    provider_tokens: Option<u64>,
    finished: bool,
    terminal_seen: bool,
    /// The first reason the events gave why the answer cannot be continued.
    not_continuable: Option<NotContinuable>,
    /// OpenAI: the first value of each [`CHAT_IDENTITY`] member.
    identity: Map<String, Value>,
    /// OpenAI: the last `usage` a chunk carried; Anthropic: `message_start`'s.
    usage: Map<String, Value>,
    /// Anthropic: the last content block opened.
    block: Option<Block>,
}

impl Transcript {
    /// Most text a transcript keeps: 4 MiB. The largest context windows hold about a million
    /// tokens, some 4 MiB of text, so a longer prefill is no request a provider accepts; and
    /// memory stays bounded whatever a stream sends. Past it, the answer is
    /// [`TooLong`](NotContinuable::TooLong) to continue.
    pub const MAX_TEXT: usize = 4 << 20;

    /// A transcript of a stream in `format`, before its first event.
    pub fn new(format: Format) -> Self {
        Self {
            format,
            text: String::new(),
            content_events: 0,
            provider_tokens: None,
            finished: false,
            terminal_seen: false,
            not_continuable: None,
            identity: Map::new(),
            usage: Map::new(),
            block: None,
        }
    }

    /// The stream's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Reads the next event the caller was shown. Any event is accepted, and none makes it
    /// panic: one that is not of the format (not JSON, an unknown type, an error) changes
    /// nothing.
    pub fn read(&mut self, event: &Event) {
        match self.format {
            Format::OpenAiChat => self.read_chat(event),
            Format::AnthropicMessages => self.read_messages(event),
        }
    }

    /// The text content delivered so far, in order (up to [`MAX_TEXT`](Self::MAX_TEXT)).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Events delivered that carried output (text or not).
    pub fn content_events(&self) -> u64 {
        self.content_events
    }

    /// The best estimate of the output tokens delivered: the provider's own count if it sent
    /// one (Anthropic's `message_delta` `usage.output_tokens`, OpenAI's `usage.completion_tokens`),
    /// else one per content event (a streamed delta is about one token).
    pub fn output_tokens(&self) -> u64 {
        self.provider_tokens.unwrap_or(self.content_events)
    }

    /// The answer said it was complete: OpenAI sent a `finish_reason`, Anthropic a `stop_reason`.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The terminal event arrived: OpenAI's `data: [DONE]`, Anthropic's `message_stop`.
    pub fn terminal_seen(&self) -> bool {
        self.terminal_seen
    }

    /// Whether a prefill of [`text`](Self::text) can continue the answer, and if not, why.
    ///
    /// # Errors
    /// The first of: [`NotText`](NotContinuable::NotText) or
    /// [`SeveralChoices`](NotContinuable::SeveralChoices) (or
    /// [`TooLong`](NotContinuable::TooLong)) as the events showed it;
    /// [`Finished`](NotContinuable::Finished) for an answer that said it was complete;
    /// [`Nothing`](NotContinuable::Nothing) before any text other than whitespace (Anthropic
    /// takes no prefill of whitespace alone).
    pub fn continuable(&self) -> Result<(), NotContinuable> {
        if let Some(reason) = self.not_continuable {
            return Err(reason);
        }
        if self.finished || self.terminal_seen {
            return Err(NotContinuable::Finished);
        }
        if self.text.trim().is_empty() {
            return Err(NotContinuable::Nothing);
        }
        Ok(())
    }

    /// OpenAI: the first `id`, `created` and `model` the stream sent.
    pub(super) fn identity(&self) -> &Map<String, Value> {
        &self.identity
    }

    /// The usage the provider reported (see the field).
    pub(super) fn usage(&self) -> &Map<String, Value> {
        &self.usage
    }

    /// Anthropic: the last content block opened.
    pub(super) fn block(&self) -> Option<Block> {
        self.block
    }

    /// An OpenAI Chat Completions chunk (or `[DONE]`).
    fn read_chat(&mut self, event: &Event) {
        if event.data.trim_ascii() == "[DONE]" {
            self.terminal_seen = true;
            return;
        }
        let Some(chunk) = object(&event.data) else {
            return;
        };
        if is_set(chunk.get("error")) {
            return;
        }
        for key in CHAT_IDENTITY {
            if let Some(value) = chunk.get(key).filter(|value| !value.is_null())
                && !self.identity.contains_key(key)
            {
                self.identity.insert(key.to_owned(), value.clone());
            }
        }
        if let Some(usage) = member(&chunk, "usage") {
            self.provider_tokens = count(usage, "completion_tokens").or(self.provider_tokens);
            self.usage = usage.clone();
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        let mut content = false;
        for choice in choices.into_iter().flatten() {
            content |= self.read_choice(choice);
        }
        if content {
            self.content_events += 1;
        }
    }

    /// One choice of a chunk: whether it carried output.
    fn read_choice(&mut self, choice: &Value) -> bool {
        if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
            self.refuse(NotContinuable::SeveralChoices);
            return true;
        }
        if is_set(choice.get("finish_reason")) {
            self.finished = true;
        }
        let Some(delta) = choice.get("delta") else {
            return false;
        };
        let mut content = false;
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            self.push_text(text);
            content = true;
        }
        if CHAT_NOT_TEXT.iter().any(|key| is_given(delta.get(key))) {
            self.refuse(NotContinuable::NotText);
            content = true;
        }
        content
    }

    /// An Anthropic Messages event.
    fn read_messages(&mut self, event: &Event) {
        let data = object(&event.data).unwrap_or_default();
        match anthropic_type(event, &data) {
            "message_start" => {
                let usage = member(&data, "message").and_then(|message| member(message, "usage"));
                self.usage = usage.cloned().unwrap_or_default();
            }
            "content_block_start" => self.read_block_start(&data),
            "content_block_delta" => {
                self.content_events += 1;
                let delta = member(&data, "delta");
                match delta.filter(|delta| string(delta, "type") == Some("text_delta")) {
                    Some(delta) => self.push_text(string(delta, "text").unwrap_or_default()),
                    None => self.refuse(NotContinuable::NotText),
                }
            }
            "content_block_stop" => {
                if let Some(block) = self.block.as_mut()
                    && count(&data, "index") == Some(block.index)
                {
                    block.open = false;
                }
            }
            "message_delta" => {
                let delta = member(&data, "delta");
                if is_set(delta.and_then(|delta| delta.get("stop_reason"))) {
                    self.finished = true;
                }
                let usage = member(&data, "usage");
                let tokens = usage.and_then(|usage| count(usage, "output_tokens"));
                self.provider_tokens = tokens.or(self.provider_tokens);
            }
            "message_stop" => self.terminal_seen = true,
            _ => {}
        }
    }

    /// Anthropic's `content_block_start`: a text block (its text, if it came with any) or a
    /// block a prefill cannot continue.
    fn read_block_start(&mut self, data: &Map<String, Value>) {
        let Some(index) = count(data, "index") else {
            return;
        };
        self.block = Some(Block { index, open: true });
        let block = member(data, "content_block");
        match block.filter(|block| string(block, "type") == Some("text")) {
            Some(block) => {
                let text = string(block, "text").unwrap_or_default();
                if !text.is_empty() {
                    self.content_events += 1;
                    self.push_text(text);
                }
            }
            None => self.refuse(NotContinuable::NotText),
        }
    }

    /// Keeps delivered text, up to [`MAX_TEXT`](Self::MAX_TEXT).
    fn push_text(&mut self, text: &str) {
        if self.text.len().saturating_add(text.len()) > Self::MAX_TEXT {
            self.refuse(NotContinuable::TooLong);
        } else {
            self.text.push_str(text);
        }
    }

    /// Notes why the answer cannot be continued; the first reason stands.
    fn refuse(&mut self, reason: NotContinuable) {
        self.not_continuable.get_or_insert(reason);
    }
}
