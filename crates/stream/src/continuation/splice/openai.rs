//! The OpenAI Chat Completions side of a [`Splice`](super::Splice).

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Overlap, add_counts, mark};
use crate::continuation::{Transcript, encode, object};
use crate::sse::{Event, is_given};

/// The counts of a Chat Completions `usage`.
const CHAT_USAGE: [&str; 3] = ["prompt_tokens", "completion_tokens", "total_tokens"];

/// What a continuation's chunks take from the original stream.
#[derive(Debug)]
pub(super) struct ChatFraming {
    /// The original's first `id`, `created` and `model`.
    identity: Map<String, Value>,
    /// The usage the original reported, empty if none.
    usage: Map<String, Value>,
}

impl ChatFraming {
    pub(super) fn new(transcript: &Transcript) -> Self {
        Self {
            identity: transcript.identity().clone(),
            usage: transcript.usage().clone(),
        }
    }

    /// One chunk of the continuation (or `[DONE]`, or anything else, passed on as it is).
    pub(super) fn event(&self, event: &Event, overlap: &mut Overlap) -> Option<Bytes> {
        let Some(mut chunk) = object(&event.data) else {
            return Some(encode(&event.event_type, &event.data));
        };
        // The original's id and time: one answer to the caller. Not its model: each chunk says
        // which model wrote it, so a continuation another backend wrote is visible as such.
        for (key, value) in self.identity.iter().filter(|(key, _)| *key != "model") {
            chunk.insert(key.clone(), value.clone());
        }
        let choices = chunk.get_mut("choices").and_then(Value::as_array_mut);
        for choice in choices
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            // A continuation is asked for one choice: it is the original's, the first.
            choice.insert("index".to_owned(), 0.into());
            let delta = choice.get_mut("delta");
            if let Some(Value::String(text)) = delta.and_then(|delta| delta.get_mut("content")) {
                overlap.drop_seen(text);
            }
        }
        if carries_nothing(&chunk) {
            return None;
        }
        if let Some(usage) = chunk.get_mut("usage").and_then(Value::as_object_mut) {
            add_counts(usage, &self.usage, &CHAT_USAGE);
            mark(usage);
        }
        Some(encode(&event.event_type, &Value::Object(chunk).to_string()))
    }
}

/// A chunk with choices that say nothing the caller has not been told: the opening chunk that
/// only names the `role` (the original's opening named it), or one whose text was all dropped.
fn carries_nothing(chunk: &Map<String, Value>) -> bool {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return false;
    };
    !is_given(chunk.get("usage"))
        && !choices.is_empty()
        && choices.iter().all(|choice| {
            !is_given(choice.get("finish_reason"))
                && choice
                    .get("delta")
                    .and_then(Value::as_object)
                    .is_some_and(|delta| {
                        delta
                            .iter()
                            .all(|(key, value)| key == "role" || !is_given(Some(value)))
                    })
        })
}
