//! What the mock reads of a request: which API it came to, and the members of its JSON that
//! shape the answer.

use serde::Deserialize;
use serde_json::Value;
use stormguard::chaos::Provider;

/// The API a request came to. Both take the same members the mock reads (`model`, `messages`,
/// `max_tokens`, `stream`); they differ in how the answer and its errors are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
}

impl Api {
    /// Whose API it is, which shapes its errors ([`Provider`]'s bodies are the mock's).
    pub(super) fn provider(self) -> Provider {
        match self {
            Api::Chat => Provider::OpenAi,
            Api::Messages => Provider::Anthropic,
        }
    }
}

/// A chat request of either API.
#[derive(Deserialize)]
pub(super) struct ChatRequest {
    pub(super) model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    pub(super) max_tokens: Option<u32>,
    pub(super) stream: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    role: String,
    /// A string, or (both APIs allow it) an array of parts whose text parts are read.
    #[serde(default)]
    content: Value,
}

impl ChatRequest {
    /// The prompt's size in words, the mock's stand-in for tokens.
    pub(super) fn prompt_tokens(&self) -> usize {
        self.messages
            .iter()
            .map(|message| words(&message.content))
            .sum()
    }

    /// The words of the assistant prefill the answer goes on from: the last message's, if it is
    /// the assistant's, else none. A provider continues a prefill rather than answering anew, and
    /// stormguard's continuation of a cut stream relies on it (it sends the text received as
    /// that prefill).
    pub(super) fn prefill_words(&self) -> usize {
        match self.messages.last() {
            Some(last) if last.role == "assistant" => words(&last.content),
            _ => 0,
        }
    }
}

/// The words of a message's content: its string, or the text of its text parts.
fn words(content: &Value) -> usize {
    match content {
        Value::String(text) => text.split_whitespace().count(),
        Value::Array(parts) => parts
            .iter()
            .filter(|part| part["type"] == "text")
            .filter_map(|part| part["text"].as_str())
            .map(|text| text.split_whitespace().count())
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> ChatRequest {
        serde_json::from_str(json).unwrap_or_else(|error| panic!("{json}: {error}"))
    }

    #[test]
    fn the_prefill_is_the_last_message_when_it_is_the_assistants() {
        let prefilled = request(
            r#"{"model":"m","messages":[{"role":"user","content":"Say hello"},
                {"role":"assistant","content":"This is the"}]}"#,
        );
        assert_eq!(prefilled.prefill_words(), 3);
        assert_eq!(prefilled.prompt_tokens(), 5);
        // Anthropic's content parts count by their text.
        let parts = request(
            r#"{"model":"m","messages":[{"role":"user","content":"Hi"},
                {"role":"assistant","content":[{"type":"text","text":"This is"},
                {"type":"image","source":{}},{"type":"text","text":" the mock"}]}]}"#,
        );
        assert_eq!(parts.prefill_words(), 4);
        // An assistant turn followed by the user's is history, not a prefill.
        let history = request(
            r#"{"model":"m","messages":[{"role":"assistant","content":"This is"},
                {"role":"user","content":"go on"}]}"#,
        );
        assert_eq!(history.prefill_words(), 0);
        assert_eq!(request(r#"{"model":"m"}"#).prefill_words(), 0);
    }
}
