//! [`Transcript`]: a streamed answer read back the way a client receives it.

use stormguard::stream::sse::{Event, EventKind, classify_event};

/// A streamed answer as a client received it, read event by event: lines up to a blank line
/// make an event, `data:` lines its data; an event left unfinished (a cut stream) is not read.
/// Each event is sorted by [`classify_event`], the way stormguard's stream guard sorts it, then
/// read as OpenAI's chunk format or as Anthropic's events (a chunk has `choices`).
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
    /// The `finish_reason` of the last chunk that had one (Anthropic: the `stop_reason` of the
    /// last `message_delta`).
    pub finish_reason: Option<String>,
    /// Error events (an `{"error": ...}` frame, an `event: error`).
    pub errors: usize,
    /// Whether the stream's end marker came (`data: [DONE]`, `message_stop`).
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
                let Ok(data) = serde_json::from_str::<serde_json::Value>(data) else {
                    return;
                };
                if data.get("choices").is_some() {
                    self.read_chunk(&data, kind == EventKind::Content);
                } else {
                    self.read_message_event(&data);
                }
            }
        }
    }

    /// An OpenAI chat completion chunk.
    fn read_chunk(&mut self, chunk: &serde_json::Value, content: bool) {
        let choice = &chunk["choices"][0];
        if let Some(role) = choice["delta"]["role"].as_str() {
            self.role = Some(role.to_owned());
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        if content {
            let text = choice["delta"]["content"].as_str().unwrap_or_default();
            self.content.push(text.to_owned());
        }
    }

    /// An Anthropic event other than its end and its errors, by the `type` of its data.
    fn read_message_event(&mut self, data: &serde_json::Value) {
        match data["type"].as_str() {
            Some("message_start") => {
                self.role = data["message"]["role"].as_str().map(str::to_owned);
            }
            Some("content_block_delta") => {
                let text = data["delta"]["text"].as_str().unwrap_or_default();
                self.content.push(text.to_owned());
            }
            Some("message_delta") => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.finish_reason = Some(reason.to_owned());
                }
            }
            _ => {}
        }
    }
}
