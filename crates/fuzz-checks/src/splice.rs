//! The continuation of a cut stream (`stormguard_stream::continuation`), as the stream guard
//! drives it, on arbitrary bytes: an original stream (OpenAI Chat Completions or Anthropic
//! Messages), handed on up to its first error event and cut there or at its end, read by a
//! `Transcript`; an arbitrary original request body, from which `continuation_body` builds the
//! continuation request; and an arbitrary continuation stream, whose events go through a
//! `Splice`.
//!
//! No panic (non-UTF-8, hostile or deeply nested JSON); the transcript keeps at most
//! `Transcript::MAX_TEXT` bytes and is continuable only when unfinished with text; a continuation
//! body is a JSON object whose last message is the assistant's, ending in the text received, with
//! every output limit reduced by the tokens delivered, and its size bounded by the original's and
//! the text's; each piece the splice hands on is whole SSE events, none of them an error, with at
//! most one terminal event, last; the caller's stream (what was handed on of the original, then
//! the splice's output) parses into exactly the original's events followed by the splice's.

use serde_json::Value;
use stormguard_stream::continuation::{
    Format, NotContinuable, Splice, Transcript, continuation_body,
};
use stormguard_stream::sse::{Event, EventKind, FrameKind, Parser, classify_event};

/// The frames of a stream (each event, or `None` for a comment, and where the stream can be cut
/// after it), and whether it parsed to its end without error.
fn frames(stream: &[u8]) -> (Vec<(Option<Event>, u64)>, bool) {
    let mut parser = Parser::new();
    let mut input = stream;
    let mut frames = Vec::new();
    loop {
        match parser.next_frame(&mut input) {
            Ok(Some(frame)) => {
                let event = match frame.kind {
                    FrameKind::Event(event) => Some(event),
                    FrameKind::Comment => None,
                };
                frames.push((event, frame.boundary));
            }
            Ok(None) => return (frames, true),
            Err(_) => return (frames, false),
        }
    }
}

/// The events of bytes that must be whole SSE events: every byte read, the last frame ending
/// at the end, no comment.
fn whole_events(bytes: &[u8]) -> Vec<Event> {
    let (frames, ok) = frames(bytes);
    assert!(
        ok,
        "spliced bytes do not parse: {:?}",
        String::from_utf8_lossy(bytes)
    );
    assert_eq!(
        frames.last().map(|(_, end)| *end),
        Some(bytes.len() as u64),
        "spliced bytes are not whole events: {:?}",
        String::from_utf8_lossy(bytes)
    );
    frames
        .into_iter()
        .map(|(event, _)| event.expect("spliced bytes hold events only"))
        .collect()
}

/// What the caller's parser makes of an event: its type and data (ids are not written).
fn seen(event: &Event) -> (&str, &str) {
    (&event.event_type, &event.data)
}

fn check_transcript(transcript: &Transcript, events: u64) {
    assert!(transcript.text().len() <= Transcript::MAX_TEXT);
    assert!(transcript.content_events() <= events);
    if transcript.continuable().is_ok() {
        assert!(!transcript.finished() && !transcript.terminal_seen());
        assert!(!transcript.text().trim().is_empty());
    }
}

fn check_body(
    transcript: &Transcript,
    original: &[u8],
    body: Result<bytes::Bytes, NotContinuable>,
) {
    let body = match body {
        Ok(body) => body,
        Err(reason) => {
            if let Err(not) = transcript.continuable() {
                assert_eq!(reason, not);
            }
            return;
        }
    };
    assert_eq!(transcript.continuable(), Ok(()));
    // serde_json writes what it read at most 4.5 times longer (`1e15` is written
    // `1000000000000000.0`), and a byte of text as at most 6 (`\u001f`).
    let bound = 5 * original.len() + 6 * transcript.text().len() + 64;
    assert!(body.len() <= bound, "{} bytes > {bound}", body.len());

    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        panic!("not a JSON object: {:?}", String::from_utf8_lossy(&body));
    };
    let Ok(Value::Object(before)) = serde_json::from_slice::<Value>(original) else {
        panic!("continued a body that is no JSON object");
    };
    for limit in ["max_tokens", "max_completion_tokens"] {
        if let Some(was) = before.get(limit).and_then(Value::as_u64) {
            let left = was - transcript.output_tokens();
            assert_eq!(body.get(limit).and_then(Value::as_u64), Some(left));
            assert!(left > 0);
        }
    }
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|messages| messages.last())
        .expect("messages");
    assert_eq!(last.get("role").and_then(Value::as_str), Some("assistant"));
    let prefill = match last.get("content") {
        Some(Value::String(text)) => text.as_str(),
        Some(Value::Array(parts)) => parts
            .last()
            .and_then(|part| part.get("text"))
            .and_then(Value::as_str)
            .expect("a text part"),
        other => panic!("prefill content {other:?}"),
    };
    let text = match transcript.format() {
        // Anthropic refuses a prefill that ends in whitespace.
        Format::AnthropicMessages => {
            assert_eq!(prefill, prefill.trim_end());
            transcript.text().trim_end()
        }
        Format::OpenAiChat => transcript.text(),
    };
    assert!(prefill.ends_with(text));
}

/// The events of `original` handed on as the guard hands them, up to the boundary of its last
/// frame before its first error event, and where that boundary is; `None` when a terminal event
/// of any format ends it, and then nothing is continued.
fn handed_on(original: &[u8]) -> Option<(Vec<Event>, u64)> {
    let (original_frames, _) = frames(original);
    let mut handed = Vec::new();
    let mut handed_end = 0;
    for (event, end) in original_frames {
        if let Some(event) = event {
            match classify_event(&event) {
                EventKind::Error(_) => break,
                EventKind::Done => return None,
                _ => handed.push(event),
            }
        }
        handed_end = end;
    }
    Some((handed, handed_end))
}

/// What the splice handed on: no error event, at most one terminal event and only last, and as
/// many content events as it counted.
fn check_kinds(splice: &Splice, spliced: &[Event]) {
    let kinds: Vec<EventKind> = spliced.iter().map(classify_event).collect();
    assert!(!kinds.iter().any(|kind| matches!(kind, EventKind::Error(_))));
    let terminal = kinds
        .iter()
        .filter(|kind| **kind == EventKind::Done)
        .count();
    assert!(terminal <= 1);
    assert_eq!(splice.terminal_seen(), terminal == 1);
    if terminal == 1 {
        assert_eq!(kinds.last(), Some(&EventKind::Done));
    }
    let content = kinds
        .iter()
        .filter(|kind| **kind == EventKind::Content)
        .count();
    assert_eq!(content as u64, splice.content_events());
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let format = if flags & 1 == 0 {
        Format::OpenAiChat
    } else {
        Format::AnthropicMessages
    };
    let (original, data) = crate::input::length_prefixed(data);
    let (request, continuation) = crate::input::length_prefixed(data);

    let Some((handed, handed_end)) = handed_on(original) else {
        return;
    };
    let mut transcript = Transcript::new(format);
    for event in &handed {
        transcript.read(event);
    }
    check_transcript(&transcript, handed.len() as u64);
    let body = continuation_body(&transcript, request);
    let continued = body.is_ok();
    check_body(&transcript, request, body);
    if !continued {
        return;
    }

    let mut splice = Splice::new(&transcript);
    let (continuation_frames, _) = frames(continuation);
    let mut out = Vec::new();
    let mut spliced = Vec::new();
    for event in continuation_frames
        .into_iter()
        .filter_map(|(event, _)| event)
    {
        let ended = splice.terminal_seen() || splice.error().is_some();
        let Some(bytes) = splice.event(&event) else {
            continue;
        };
        assert!(!ended, "handed on {event:?} after the end");
        spliced.extend(whole_events(&bytes));
        out.extend_from_slice(&bytes);
        transcript.read(&event);
    }

    check_kinds(&splice, &spliced);

    // The caller reads the original's events, then the splice's, none merged with another.
    let mut caller = original[..handed_end as usize].to_vec();
    caller.extend_from_slice(&out);
    let (read, ok) = frames(&caller);
    assert!(ok);
    let read: Vec<Event> = read.into_iter().filter_map(|(event, _)| event).collect();
    let expected: Vec<(&str, &str)> = handed.iter().chain(&spliced).map(seen).collect();
    assert_eq!(read.iter().map(seen).collect::<Vec<_>>(), expected);

    // The stream cut again: the next continuation asks from the whole transcript.
    check_transcript(&transcript, (handed.len() + spliced.len()) as u64);
    if !splice.terminal_seen() && splice.error().is_none() {
        check_body(
            &transcript,
            request,
            continuation_body(&transcript, request),
        );
    }
}
