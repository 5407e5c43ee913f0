//! [`Splice`]: a continuation's events, rewritten into the original stream's framing.

mod anthropic;
mod openai;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use stormguard_classify::Outcome;

use self::anthropic::MessagesFraming;
use self::openai::ChatFraming;
use super::{Format, MARK, Transcript, count, split_trailing_whitespace};
use crate::sse::{Event, EventKind, classify_event};

/// Rewrites a continuation's events into the original stream's framing, so that the caller
/// reads one answer: every token once, in order, with one terminal event.
///
/// - OpenAI: every chunk gets the original's `id` and `created` (its own `model` stays: the caller
///   sees which model wrote which part) and choice index 0; the
///   opening chunk that only names the `role` is dropped (the caller has one); a `usage` is
///   summed with the one the original reported, if any.
/// - Anthropic: `message_start` is dropped (its input tokens are added to the final usage); a
///   text block that goes on with the original's open block is merged into it, later blocks are
///   numbered after the original's; `message_delta`'s `usage.output_tokens` counts the tokens
///   the original delivered as well.
/// - A usage that was summed carries `"stormguard": {"continued": true}`.
/// - Whitespace the prefill left out (Anthropic's trimmed end) and the continuation repeats at
///   the start of its text is dropped: the caller has seen it.
/// - An error event is never passed on: [`error`](Splice::error) reports it, and nothing after it
///   is passed either (the engine ends the stream with the original cause). Nothing after the
///   terminal event is passed.
/// - An event it does not know, or whose data is not JSON, is passed on unchanged.
#[derive(Debug)]
pub struct Splice {
    framing: Framing,
    overlap: Overlap,
    content_events: u64,
    terminal_seen: bool,
    error: Option<Outcome>,
}

/// What each format's rewriting needs from the original stream.
#[derive(Debug)]
enum Framing {
    OpenAiChat(ChatFraming),
    AnthropicMessages(MessagesFraming),
}

impl Splice {
    /// A splice of a continuation into the stream `transcript` read: its ids, index and
    /// usage are the transcript's.
    pub fn new(transcript: &Transcript) -> Self {
        let (framing, overlap) = match transcript.format() {
            Format::OpenAiChat => (
                Framing::OpenAiChat(ChatFraming::new(transcript)),
                Overlap::default(),
            ),
            Format::AnthropicMessages => (
                Framing::AnthropicMessages(MessagesFraming::new(transcript)),
                Overlap::new(split_trailing_whitespace(transcript.text()).1),
            ),
        };
        Self {
            framing,
            overlap,
            content_events: 0,
            terminal_seen: false,
            error: None,
        }
    }

    /// One whole event of the continuation: the bytes (whole SSE events) to hand the caller, or
    /// `None` when the event is dropped.
    pub fn event(&mut self, event: &Event) -> Option<Bytes> {
        if self.error.is_some() || self.terminal_seen {
            return None;
        }
        let kind = classify_event(event);
        if let EventKind::Error(outcome) = kind {
            self.error = Some(outcome);
            return None;
        }
        let bytes = match &mut self.framing {
            Framing::OpenAiChat(chat) => chat.event(event, &mut self.overlap),
            Framing::AnthropicMessages(messages) => messages.event(event, &mut self.overlap),
        }?;
        match kind {
            EventKind::Content => self.content_events += 1,
            EventKind::Done => self.terminal_seen = true,
            _ => {}
        }
        Some(bytes)
    }

    /// The continuation's terminal event was passed on (`[DONE]`, `message_stop`).
    pub fn terminal_seen(&self) -> bool {
        self.terminal_seen
    }

    /// The outcome of the error event the continuation sent, if it sent one. The caller never
    /// sees it: the engine ends the stream with the original cause instead.
    pub fn error(&self) -> Option<Outcome> {
        self.error
    }

    /// The continuation's events with content passed on.
    pub fn content_events(&self) -> u64 {
        self.content_events
    }
}

/// The whitespace the caller has seen that the prefill left out (Anthropic's trimmed end), which
/// the continuation's first text is likely to repeat.
#[derive(Clone, Debug, Default)]
struct Overlap {
    left: String,
}

impl Overlap {
    fn new(seen: &str) -> Self {
        Self {
            left: seen.to_owned(),
        }
    }

    /// Drops from `text`, the continuation's next text, the start the caller has already seen.
    /// Text that only repeats part of the overlap leaves the rest for the next text; text that
    /// differs from it ends it.
    fn drop_seen(&mut self, text: &mut String) {
        if text.is_empty() {
            return;
        }
        let seen: usize = text
            .chars()
            .zip(self.left.chars())
            .take_while(|(next, left)| next == left)
            .map(|(next, _)| next.len_utf8())
            .sum();
        if seen == text.len() {
            self.left.drain(..seen);
        } else {
            self.left.clear();
        }
        text.drain(..seen);
    }
}

/// Adds the original's counts of `keys` to the continuation's `usage`, where either has one.
fn add_counts(usage: &mut Map<String, Value>, original: &Map<String, Value>, keys: &[&str]) {
    for &key in keys {
        let (continuation, original) = (count(usage, key), count(original, key));
        if continuation.is_none() && original.is_none() {
            continue;
        }
        let sum = continuation
            .unwrap_or(0)
            .saturating_add(original.unwrap_or(0));
        usage.insert(key.to_owned(), sum.into());
    }
}

/// Marks a usage as counted over the original and its continuation.
fn mark(usage: &mut Map<String, Value>) {
    usage.insert(MARK.to_owned(), json!({"continued": true}));
}

#[cfg(test)]
mod tests {
    use super::Overlap;

    fn dropped(seen: &str, texts: &[&str]) -> Vec<String> {
        let mut overlap = Overlap::new(seen);
        texts
            .iter()
            .map(|text| {
                let mut text = (*text).to_owned();
                overlap.drop_seen(&mut text);
                text
            })
            .collect()
    }

    #[test]
    fn the_whitespace_seen_is_dropped_once() {
        assert_eq!(dropped("\n\n", &["\n\nNext", "\n\n"]), ["Next", "\n\n"]);
        assert_eq!(dropped(" ", &[" world", " again"]), ["world", " again"]);
    }

    #[test]
    fn whitespace_split_over_texts_is_dropped_across_them() {
        assert_eq!(dropped("\n\n", &["\n", "\nNext"]), ["", "Next"]);
        assert_eq!(dropped("\n\n", &["", "\n\nNext"]), ["", "Next"]);
    }

    #[test]
    fn text_that_differs_keeps_its_own_whitespace() {
        // The model chose other whitespace: the caller has not seen it.
        assert_eq!(dropped("\n\n", &[" Next", "\n\n"]), [" Next", "\n\n"]);
        assert_eq!(dropped("\n\n", &["\n Next"]), [" Next"]);
        assert_eq!(dropped("", &["\nNext"]), ["\nNext"]);
    }
}
