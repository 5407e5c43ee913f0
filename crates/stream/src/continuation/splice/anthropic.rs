//! The Anthropic Messages side of a [`Splice`](super::Splice).

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{Overlap, add_counts, mark};
use crate::continuation::transcript::Block;
use crate::continuation::{Transcript, anthropic_type, count, encode, member, object, string};
use crate::sse::Event;

/// The input-side counts of a Messages `usage`: each request reads its own input, so the
/// answer's input is the sum of both requests'.
const INPUT_USAGE: [&str; 3] = [
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
];

/// The events the splice rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    MessageStart,
    BlockStart,
    BlockDelta,
    BlockStop,
    MessageDelta,
    /// `ping`, `message_stop`, and events it does not know: passed on as they are.
    Other,
}

impl Kind {
    fn of(name: &str) -> Self {
        match name {
            "message_start" => Kind::MessageStart,
            "content_block_start" => Kind::BlockStart,
            "content_block_delta" => Kind::BlockDelta,
            "content_block_stop" => Kind::BlockStop,
            "message_delta" => Kind::MessageDelta,
            _ => Kind::Other,
        }
    }
}

/// Where the continuation's content blocks go in the caller's message: its block `first`
/// becomes `to`, the later ones follow.
#[derive(Clone, Copy, Debug)]
struct Blocks {
    first: u64,
    to: u64,
    /// The first block goes on with the original's open block: its `content_block_start` is
    /// dropped.
    continues: bool,
}

impl Blocks {
    fn map(self, index: u64) -> u64 {
        self.to.saturating_add(index.saturating_sub(self.first))
    }
}

/// What a continuation's events take from the original stream, and what the splice learns of
/// the continuation on the way.
#[derive(Debug)]
pub(super) struct MessagesFraming {
    /// The original's `message_start` usage.
    original_usage: Map<String, Value>,
    /// The output tokens the original delivered.
    delivered: u64,
    /// The original's last content block.
    original_block: Option<Block>,
    /// The continuation's `message_start` usage.
    opening_usage: Map<String, Value>,
    /// Decided at the continuation's first block event.
    blocks: Option<Blocks>,
}

impl MessagesFraming {
    pub(super) fn new(transcript: &Transcript) -> Self {
        Self {
            original_usage: transcript.usage().clone(),
            delivered: transcript.output_tokens(),
            original_block: transcript.block(),
            opening_usage: Map::new(),
            blocks: None,
        }
    }

    /// One event of the continuation.
    pub(super) fn event(&mut self, event: &Event, overlap: &mut Overlap) -> Option<Bytes> {
        let Some(mut data) = object(&event.data) else {
            return Some(encode(&event.event_type, &event.data));
        };
        let kind = Kind::of(anthropic_type(event, &data));
        match kind {
            Kind::MessageStart => {
                let usage = member(&data, "message").and_then(|message| member(message, "usage"));
                self.opening_usage = usage.cloned().unwrap_or_default();
                return None;
            }
            Kind::BlockStart | Kind::BlockDelta | Kind::BlockStop => {
                return self.block_event(event, data, kind, overlap);
            }
            Kind::MessageDelta => self.add_usage(&mut data),
            Kind::Other => return Some(encode(&event.event_type, &event.data)),
        }
        Some(encode(&event.event_type, &Value::Object(data).to_string()))
    }

    /// A block's start, delta or stop, renumbered into the caller's message.
    fn block_event(
        &mut self,
        event: &Event,
        mut data: Map<String, Value>,
        kind: Kind,
        overlap: &mut Overlap,
    ) -> Option<Bytes> {
        let Some(index) = count(&data, "index") else {
            return Some(encode(&event.event_type, &Value::Object(data).to_string()));
        };
        let (blocks, close) = self.blocks(index, is_text(&data, kind));
        let text = text_of(&mut data, kind);
        // The caller has this block's start. Anthropic opens a text block with empty text, so
        // nothing is lost with it.
        if kind == Kind::BlockStart && blocks.continues && index == blocks.first {
            return close;
        }
        if let Some(text) = text {
            overlap.drop_seen(text);
            if text.is_empty() && kind == Kind::BlockDelta {
                return close;
            }
        }
        data.insert("index".to_owned(), blocks.map(index).into());
        let out = encode(&event.event_type, &Value::Object(data).to_string());
        Some(match close {
            Some(close) => [close, out].concat().into(),
            None => out,
        })
    }

    /// How the continuation's blocks map, decided at its first block event (`index`): a text
    /// block goes on with the original's block if the original was cut inside it; any other
    /// block, and any block after a closed one, follows the original's last. The original's
    /// open block is closed first (the bytes returned) when nothing goes on with it.
    fn blocks(&mut self, index: u64, text: bool) -> (Blocks, Option<Bytes>) {
        if let Some(blocks) = self.blocks {
            return (blocks, None);
        }
        let (to, continues) = match self.original_block {
            Some(block) if block.open && text => (block.index, true),
            Some(block) => (block.index.saturating_add(1), false),
            None => (0, false),
        };
        let close = self
            .original_block
            .filter(|block| block.open && !continues)
            .map(|block| {
                let stop = json!({"type": "content_block_stop", "index": block.index});
                encode("content_block_stop", &stop.to_string())
            });
        let blocks = Blocks {
            first: index,
            to,
            continues,
        };
        self.blocks = Some(blocks);
        (blocks, close)
    }

    /// `message_delta`'s usage counts both requests: the output the original delivered and the
    /// continuation's, the input of both.
    fn add_usage(&self, data: &mut Map<String, Value>) {
        let usage = data.entry("usage").or_insert(Value::Null);
        if !usage.is_object() {
            *usage = Value::Object(Map::new());
        }
        let Some(usage) = usage.as_object_mut() else {
            return;
        };
        let output = count(usage, "output_tokens").unwrap_or(0);
        usage.insert(
            "output_tokens".to_owned(),
            output.saturating_add(self.delivered).into(),
        );
        // A `message_delta` need not repeat the input counts `message_start` gave.
        for key in INPUT_USAGE {
            if count(usage, key).is_none()
                && let Some(input) = count(&self.opening_usage, key)
            {
                usage.insert(key.to_owned(), input.into());
            }
        }
        add_counts(usage, &self.original_usage, &INPUT_USAGE);
        mark(usage);
    }
}

/// Where a block event says what it carries: the member, and the type it has when it is text.
/// `None` for a stop, which carries nothing.
fn text_member(kind: Kind) -> Option<(&'static str, &'static str)> {
    match kind {
        Kind::BlockStart => Some(("content_block", "text")),
        Kind::BlockDelta => Some(("delta", "text_delta")),
        _ => None,
    }
}

/// A block event of a text block (a stop counts as one: it does not say).
fn is_text(data: &Map<String, Value>, kind: Kind) -> bool {
    text_member(kind).is_none_or(|(key, text_type)| {
        member(data, key).and_then(|part| string(part, "type")) == Some(text_type)
    })
}

/// The text a block event carries: a text block's opening `text`, a `text_delta`'s `text`.
fn text_of(data: &mut Map<String, Value>, kind: Kind) -> Option<&mut String> {
    let (key, _) = text_member(kind)?;
    if !is_text(data, kind) {
        return None;
    }
    match data.get_mut(key)?.get_mut("text")? {
        Value::String(text) => Some(text),
        _ => None,
    }
}
