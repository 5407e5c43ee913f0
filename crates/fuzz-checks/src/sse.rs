//! The Server-Sent Events `Parser` of stormguard-stream on arbitrary bytes fed in two chunks,
//! split at a position the first byte picks, with the default limits and with small ones; then
//! `classify_event` on every event. No panic; frames end at strictly increasing offsets, never
//! past the bytes fed; every byte fed is consumed until a limit breaks, after which the parser
//! refuses input with the same error; events stay within the limits; the frames and the error are
//! those of the whole input fed at once (a frame completed by a CR at the end of the first chunk
//! ends one byte earlier, before the LF that follows); only retryable error outcomes carry a hint,
//! bounded by `HINT_CEILING`. Each frame's `boundary` is at most its `end` (equal for an event),
//! never behind an earlier frame's, and a true cut: the stream cut there and followed by another
//! event reads as the events before the cut, then that event.

use stormguard_stream::sse::{EventKind, Frame, FrameKind, Parser, SseError, classify_event};

use crate::llm_body::check_hint;

/// Feeds `chunks` in order, checking the invariants that hold whatever the bytes.
fn read(mut parser: Parser, chunks: &[&[u8]]) -> (Vec<Frame>, Option<SseError>) {
    let mut frames: Vec<Frame> = Vec::new();
    let mut fed = 0_u64;
    for chunk in chunks {
        let mut input = *chunk;
        fed += chunk.len() as u64;
        loop {
            match parser.next_frame(&mut input) {
                Ok(Some(frame)) => {
                    assert!(frame.end <= fed - input.len() as u64);
                    assert!(frames.last().is_none_or(|last| last.end < frame.end));
                    assert!(frame.boundary <= frame.end);
                    assert!(
                        frames
                            .last()
                            .is_none_or(|last| last.boundary <= frame.boundary)
                    );
                    if let FrameKind::Event(_) = frame.kind {
                        assert_eq!(frame.boundary, frame.end);
                    }
                    if let FrameKind::Event(event) = &frame.kind {
                        assert!(event.data.len() <= parser.max_event());
                        assert!(event.id.as_ref().is_none_or(|id| !id.contains('\0')));
                        assert!(!event.event_type.is_empty());
                    }
                    frames.push(frame);
                }
                Ok(None) => {
                    assert!(input.is_empty());
                    assert_eq!(parser.consumed(), fed);
                    break;
                }
                Err(error) => {
                    assert_eq!(parser.next_frame(&mut &b"data: x\n\n"[..]), Err(error));
                    return (frames, Some(error));
                }
            }
        }
    }
    (frames, None)
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let split = stream.len() * usize::from(first) / 255;
    let (head, tail) = stream.split_at(split);
    let crlf_split = head.ends_with(b"\r") && tail.starts_with(b"\n");

    for limits in [None, Some((64, 256))] {
        let parser = || {
            limits.map_or_else(Parser::new, |(line, event)| {
                Parser::with_limits(line, event)
            })
        };
        let (frames, error) = read(parser(), &[head, tail]);
        let (whole, whole_error) = read(parser(), &[stream]);
        assert_eq!(error, whole_error);
        assert_eq!(frames.len(), whole.len());
        for (frame, whole) in frames.iter().zip(&whole) {
            assert_eq!(frame.kind, whole.kind);
            let early = crlf_split && frame.end == split as u64 && whole.end == split as u64 + 1;
            assert!(frame.end == whole.end || early);
        }

        // A cut at the boundary of the frame the first byte picks (and of the last).
        let picks = [usize::from(first), frames.len().saturating_sub(1)];
        for frame in picks
            .iter()
            .filter_map(|&pick| frames.get(pick % frames.len().max(1)))
        {
            let Ok(cut) = usize::try_from(frame.boundary) else {
                continue;
            };
            let Some(before) = stream.get(..cut) else {
                continue;
            };
            let events = |frames: &[Frame]| -> Vec<Frame> {
                let events = frames
                    .iter()
                    .filter(|f| matches!(f.kind, FrameKind::Event(_)));
                events.cloned().collect()
            };
            let (kept, None) = read(parser(), &[before]) else {
                continue;
            };
            let (joined, error) = read(parser(), &[before, b"data: probe\n\n"]);
            assert_eq!(error, None);
            let joined = events(&joined);
            let kept = events(&kept);
            assert_eq!(joined.len(), kept.len() + 1);
            for (joined, kept) in joined.iter().zip(&kept) {
                assert_eq!(joined.kind, kept.kind);
            }
            let FrameKind::Event(probe) = &joined[kept.len()].kind else {
                unreachable!("events only");
            };
            assert_eq!(
                (probe.event_type.as_str(), probe.data.as_str()),
                ("message", "probe")
            );
        }

        check_error_events(&frames);
    }
}

/// An error event is a failure, with a bounded server hint, and none unless retryable.
fn check_error_events(frames: &[Frame]) {
    for frame in frames {
        let FrameKind::Event(event) = &frame.kind else {
            continue;
        };
        if let EventKind::Error(outcome) = classify_event(event) {
            assert!(!outcome.is_success());
            check_hint(&outcome);
        }
    }
}
