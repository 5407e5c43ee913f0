#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;
use crate::sse::{event, message};

/// The frames of `chunks` fed in order to a fresh parser with the default limits.
fn frames_of(chunks: &[&[u8]]) -> Vec<Frame> {
    let mut parser = Parser::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, &mut frames).unwrap();
    }
    frames
}

/// The events of a whole stream, fed at once, then fed byte by byte: both must agree.
fn events(stream: &[u8]) -> Vec<Event> {
    let whole = kinds(&frames_of(&[stream]));
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(whole, kinds(&frames_of(&bytes)), "byte by byte");
    whole
        .into_iter()
        .filter_map(|kind| match kind {
            FrameKind::Event(event) => Some(event),
            FrameKind::Comment => None,
        })
        .collect()
}

fn kinds(frames: &[Frame]) -> Vec<FrameKind> {
    frames.iter().map(|frame| frame.kind.clone()).collect()
}

fn ends(frames: &[Frame]) -> Vec<u64> {
    frames.iter().map(|frame| frame.end).collect()
}

fn data_of(stream: &[u8]) -> Vec<String> {
    events(stream).into_iter().map(|event| event.data).collect()
}

#[test]
fn lines_end_in_crlf_lf_or_cr() {
    let stream = b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: d\r\n\ndata: e\n\r\n";
    assert_eq!(data_of(stream), ["a", "b", "c", "d", "e"]);
    // A CR then an LF is one line end; an LF then a CR is two.
    assert_eq!(data_of(b"data: a\r\ndata: b\r\n\r\n"), ["a\nb"]);
    assert_eq!(data_of(b"data: a\n\rdata: b\n\n"), ["a", "b"]);
}

#[test]
fn a_crlf_split_between_chunks_is_one_line_end() {
    // Were the LF a line end of its own, it would be a blank line dispatching "a" alone.
    let frames = frames_of(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
    assert_eq!(kinds(&frames), [FrameKind::Event(message("a\nb"))]);
    // The event completes at the CR that ends its blank line: it is not held back until the
    // next byte. Its end is then just after that CR, one byte short of the stream's 20.
    assert_eq!(ends(&frames), [19]);

    let mut parser = Parser::new();
    let mut input = &b"data: a\n\r"[..];
    let frame = parser.next_frame(&mut input).unwrap().unwrap();
    assert_eq!(frame.end, 9);
    let mut input = &b"\ndata: b\n\n"[..];
    let frame = parser.next_frame(&mut input).unwrap().unwrap();
    assert_eq!(frame.kind, FrameKind::Event(message("b")));
    assert_eq!(frame.end, 19);
    assert_eq!(parser.consumed(), 19);
    // Only the byte right after the CR is skipped when it is an LF.
    assert_eq!(data_of(b"data: a\r\r\n\ndata: b\r\n\n"), ["a", "b"]);
}

#[test]
fn a_leading_byte_order_mark_is_skipped_once() {
    let frames = frames_of(&[b"\xEF\xBB\xBFdata: a\n\n"]);
    assert_eq!(kinds(&frames), [FrameKind::Event(message("a"))]);
    // Offsets count the BOM: they are offsets in the stream as received.
    assert_eq!(ends(&frames), [12]);
    // Split across chunks.
    let frames = frames_of(&[b"\xEF", b"\xBB", b"\xBF", b"data: a\n\n"]);
    assert_eq!(kinds(&frames), [FrameKind::Event(message("a"))]);
    // A second BOM is part of the first field's name, which is then no known field.
    assert_eq!(
        data_of(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n"),
        ["b"]
    );
    // Only at the very start.
    assert_eq!(data_of(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"), ["a"]);
    // The start of a BOM that is not one is the start of the first line.
    assert_eq!(data_of(b"\xEF\xBBdata: a\n\ndata: b\n\n"), ["b"]);
    assert_eq!(
        data_of(b"\xEF\xBB\n\xEF\xBB\xBFx\n\ndata: b\n\n"),
        ["b"],
        "a BOM after a line end is not at the start",
    );
    // A BOM alone, or the stream ending inside one, yields nothing.
    assert_eq!(data_of(b"\xEF\xBB\xBF"), Vec::<String>::new());
    assert_eq!(data_of(b"\xEF\xBB"), Vec::<String>::new());
}

#[test]
fn comments_are_frames_of_their_own_and_do_not_break_an_event() {
    let stream = b": keep-alive\n:\ndata: a\n: ping\ndata: b\n\n";
    let frames = frames_of(&[stream]);
    assert_eq!(
        kinds(&frames),
        [
            FrameKind::Comment,
            FrameKind::Comment,
            FrameKind::Comment,
            FrameKind::Event(message("a\nb")),
        ]
    );
    assert_eq!(ends(&frames), [13, 15, 30, 39]);
}

#[test]
fn data_lines_are_joined_with_line_feeds() {
    assert_eq!(data_of(b"data: a\ndata: b\ndata: c\n\n"), ["a\nb\nc"]);
    assert_eq!(data_of(b"data: a\ndata:\ndata: c\n\n"), ["a\n\nc"]);
    assert_eq!(data_of(b"data: {\"a\":\ndata: 1}\n\n"), ["{\"a\":\n1}"]);
}

#[test]
fn a_line_without_a_colon_is_a_field_with_an_empty_value() {
    // An event whose only data line is empty is dispatched, with empty data.
    assert_eq!(data_of(b"data\n\n"), [""]);
    assert_eq!(data_of(b"data:\n\n"), [""]);
    assert_eq!(data_of(b"data\ndata\n\n"), ["\n"]);
    assert_eq!(data_of(b"data: a\ndata\n\n"), ["a\n"]);
    // `event` without a colon: an empty event type, which is `message`.
    assert_eq!(events(b"event\ndata: a\n\n"), [message("a")]);
}

#[test]
fn one_space_after_the_colon_is_dropped() {
    assert_eq!(
        data_of(b"data:a\n\ndata: a\n\ndata:  a\n\ndata:\ta\n\ndata: a \n\n"),
        ["a", "a", " a", "\ta", "a "]
    );
    // Only the first colon separates the name from the value.
    assert_eq!(data_of(b"data: a: b:c\n\n"), ["a: b:c"]);
    assert_eq!(
        events(b"event:  spaced \ndata: a\n\n"),
        [event(" spaced ", "a")]
    );
}

#[test]
fn the_event_type_defaults_to_message_and_lasts_one_event() {
    assert_eq!(
        events(b"event: add\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n"),
        [event("add", "1"), message("2"), message("3")]
    );
    // The last `event` field wins.
    assert_eq!(
        events(b"event: a\nevent: b\ndata: 1\n\n"),
        [event("b", "1")]
    );
    // An event that was not dispatched still clears the event type.
    assert_eq!(events(b"event: lost\n\ndata: 2\n\n"), [message("2")]);
}

#[test]
fn the_last_event_id_lasts_until_the_stream_changes_it() {
    let with_id = |data: &str, id: Option<&str>| Event {
        id: id.map(str::to_owned),
        ..message(data)
    };
    let stream =
        b"id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: 2\0x\ndata: d\n\nid: 3\n\ndata: e\n\n";
    assert_eq!(
        events(stream),
        [
            with_id("a", Some("1")),
            with_id("b", Some("1")),
            // An empty `id` resets it to the empty string.
            with_id("c", Some("")),
            // An ID containing NUL is ignored.
            with_id("d", Some("")),
            // Set by an event that was not dispatched.
            with_id("e", Some("3")),
        ]
    );
    let mut parser = Parser::new();
    assert_eq!(parser.last_event_id(), None);
    parser.feed(b"id: 7\n\n", &mut Vec::new()).unwrap();
    assert_eq!(parser.last_event_id(), Some("7"));
}

#[test]
fn retry_takes_ascii_digits_only() {
    let mut parser = Parser::new();
    let mut frames = Vec::new();
    // The usual form: alone in an event that is not dispatched.
    parser.feed(b"retry: 1500\n\n", &mut frames).unwrap();
    assert!(frames.is_empty());
    assert_eq!(parser.retry(), Some(1500));
    for invalid in [
        &b"retry: 1.5\n"[..],
        b"retry: -1\n",
        b"retry: +1\n",
        b"retry: 1s\n",
        b"retry: \n",
        b"retry\n",
        b"retry:  10\n",
        b"retry: 99999999999999999999999\n",
    ] {
        parser.feed(invalid, &mut frames).unwrap();
        assert_eq!(parser.retry(), Some(1500), "{invalid:?}");
    }
    parser
        .feed(b"retry: 0300\ndata: a\n\ndata: b\n\n", &mut frames)
        .unwrap();
    let retries: Vec<_> = frames
        .iter()
        .map(|frame| match &frame.kind {
            FrameKind::Event(event) => event.retry,
            FrameKind::Comment => None,
        })
        .collect();
    assert_eq!(retries, [Some(300), Some(300)]);
}

#[test]
fn unknown_fields_are_ignored_and_names_are_case_sensitive() {
    assert_eq!(
        events(b"foo: bar\nDATA: y\nData: z\ndata : w\ndata: x\n\n"),
        [message("x")]
    );
    assert_eq!(data_of(b"foo: bar\n\n"), Vec::<String>::new());
}

#[test]
fn an_event_without_data_is_not_dispatched_but_its_bytes_are_counted() {
    let mut parser = Parser::new();
    let mut frames = Vec::new();
    let stream = b"event: x\n\nid: 1\n\n\n\n\nretry: 5\n\nevent: y\nid: 2\n\n";
    parser.feed(stream, &mut frames).unwrap();
    assert!(frames.is_empty());
    assert_eq!(parser.consumed(), stream.len() as u64);
    parser.feed(b"data: z\n\n", &mut frames).unwrap();
    assert_eq!(ends(&frames), [stream.len() as u64 + 9]);
}

#[test]
fn an_unfinished_event_is_never_dispatched() {
    assert_eq!(data_of(b"data: a"), Vec::<String>::new());
    assert_eq!(data_of(b"data: a\n"), Vec::<String>::new());
    assert_eq!(data_of(b"data: a\ndata: b\n"), Vec::<String>::new());
}

#[test]
fn text_is_utf8_with_invalid_sequences_replaced() {
    assert_eq!(data_of("data: café ☕ 🦀\n\n".as_bytes()), ["café ☕ 🦀"]);
    assert_eq!(
        data_of(b"data: a\xFFb\n\ndata: \xE2\x82\n\ndata: \xF0\x9F\xA6\n\n"),
        ["a\u{FFFD}b", "\u{FFFD}", "\u{FFFD}"]
    );
    // A sequence is not completed across a line end.
    assert_eq!(
        data_of(b"data: \xE2\ndata: \x82\xAC\n\n"),
        ["\u{FFFD}\n\u{FFFD}\u{FFFD}"]
    );
    assert_eq!(
        events(b"event: \xFF\ndata: a\n\n"),
        [event("\u{FFFD}", "a")]
    );
    // NUL is an ordinary character in data.
    assert_eq!(data_of(b"data: a\0b\n\n"), ["a\0b"]);
    // Split inside a sequence, at every byte (`events` feeds byte by byte too).
    assert_eq!(data_of("data: 🦀🦀\r\n\r\n".as_bytes()), ["🦀🦀"]);
}

#[test]
fn frames_say_where_they_end_in_the_stream() {
    let stream = b": hi\r\ndata: a\r\n\r\nevent: e\ndata: b\n\n:\rdata: c\r\r";
    let expected = [6, 17, 35, 37, 46];
    assert_eq!(ends(&frames_of(&[stream])), expected);
    // Fed byte by byte, a frame ended by a CRLF completes at its CR.
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(ends(&frames_of(&bytes)), [5, 16, 35, 37, 46]);
    // The stream's first `end` bytes hold the frame: parsed alone, they yield the same frames.
    for (index, end) in expected.iter().enumerate() {
        let prefix = &stream[..usize::try_from(*end).unwrap()];
        assert_eq!(
            kinds(&frames_of(&[prefix])),
            kinds(&frames_of(&[stream]))[..=index]
        );
    }
}

#[test]
fn a_comment_inside_an_event_is_no_boundary_between_events() {
    // The ping comes after the first data line of "a\nb", and after the event type of the
    // undispatched "x" (whose blank line, with no data, only clears it).
    let stream = b"data: z\n\ndata: a\n: ping\ndata: b\n\n: between\nevent: x\n: in\n\n: after\n";
    let frames = frames_of(&[stream]);
    assert_eq!(ends(&frames), [9, 24, 33, 43, 57, 66]);
    let boundaries: Vec<u64> = frames.iter().map(|frame| frame.boundary).collect();
    assert_eq!(boundaries, [9, 9, 33, 43, 43, 66]);
    // Cut at a boundary and followed by another event, the stream reads as the events before
    // the boundary and that event; cut at the ping's end, "a" would join it.
    let then = b"data: then\n\n";
    for frame in &frames {
        let mut cut = stream[..usize::try_from(frame.boundary).unwrap()].to_vec();
        let before = data_of(&cut);
        cut.extend_from_slice(then);
        assert_eq!(data_of(&cut), [before, vec!["then".to_owned()]].concat());
    }
    assert_eq!(
        data_of(&[&stream[..24], &then[..]].concat()),
        ["z", "a\nthen"]
    );
}

#[test]
fn next_frame_leaves_the_bytes_after_the_frame_in_the_input() {
    let mut parser = Parser::new();
    let chunk = b"data: a\n\n: ping\ndata: b";
    let mut input = &chunk[..];
    let frame = parser.next_frame(&mut input).unwrap().unwrap();
    assert_eq!(frame.kind, FrameKind::Event(message("a")));
    assert_eq!(input, b": ping\ndata: b");
    let frame = parser.next_frame(&mut input).unwrap().unwrap();
    assert_eq!(frame.kind, FrameKind::Comment);
    assert_eq!(input, b"data: b");
    assert_eq!(parser.next_frame(&mut input).unwrap(), None);
    assert!(input.is_empty());
    assert_eq!(parser.consumed(), chunk.len() as u64);
    let mut input = &b"\n\n"[..];
    let frame = parser.next_frame(&mut input).unwrap().unwrap();
    assert_eq!(frame.kind, FrameKind::Event(message("b")));
    assert_eq!(frame.end, chunk.len() as u64 + 2);
}

#[test]
fn a_ten_mib_line_in_four_kib_chunks_fails_without_holding_more_than_the_limit() {
    let mut parser = Parser::new();
    let chunk = vec![b'a'; 4096];
    let mut frames = Vec::new();
    parser.feed(b"data: ", &mut frames).unwrap();
    let mut fed = 6;
    let error = loop {
        assert!(fed < 10 * 1024 * 1024, "no error after {fed} bytes");
        let result = parser.feed(&chunk, &mut frames);
        let (line, data) = parser.held();
        assert!(line <= DEFAULT_MAX_LINE, "holds {line} bytes");
        assert_eq!(data, 0);
        fed += chunk.len();
        if let Err(error) = result {
            break error;
        }
    };
    assert_eq!(
        error,
        SseError::LineTooLong {
            limit: DEFAULT_MAX_LINE
        }
    );
    // It failed with the chunk that crossed the limit.
    assert!(fed > DEFAULT_MAX_LINE && fed <= DEFAULT_MAX_LINE + chunk.len());
    assert!(frames.is_empty());
    // It holds nothing any more, and refuses any input, even a valid event.
    assert_eq!(parser.held(), (0, 0));
    assert_eq!(parser.feed(b"\n\ndata: b\n\n", &mut frames), Err(error));
    assert_eq!(parser.next_frame(&mut &b""[..]), Err(error));
    assert!(frames.is_empty());
}

#[test]
fn the_line_limit_is_exact_whatever_the_chunks() {
    let limit = 16;
    for line in [
        &b"data: 0123456789"[..],
        b": 34567890123456",
        b"id: 456789012345",
    ] {
        assert_eq!(line.len(), limit);
        let longer = [line, b"x"].concat();
        for chunk_size in [1, 3, 64] {
            let mut parser = Parser::with_limits(limit, 1024);
            for chunk in line.chunks(chunk_size) {
                parser.feed(chunk, &mut Vec::new()).unwrap();
            }
            parser.feed(b"\n\n", &mut Vec::new()).unwrap();
            let mut parser = Parser::with_limits(limit, 1024);
            let result = longer
                .chunks(chunk_size)
                .try_for_each(|chunk| parser.feed(chunk, &mut Vec::new()));
            assert_eq!(result, Err(SseError::LineTooLong { limit }), "{line:?}");
            // With its line end in the same chunk, too.
            let mut parser = Parser::with_limits(limit, 1024);
            let ended = [&longer[..], b"\n"].concat();
            assert_eq!(
                parser.feed(&ended, &mut Vec::new()),
                Err(SseError::LineTooLong { limit })
            );
        }
    }
    // A limit of zero allows blank lines only.
    let mut parser = Parser::with_limits(0, 0);
    parser.feed(b"\n\r\n\r", &mut Vec::new()).unwrap();
    assert_eq!(
        parser.feed(b":", &mut Vec::new()),
        Err(SseError::LineTooLong { limit: 0 })
    );
}

#[test]
fn an_event_that_never_ends_grows_to_the_limit_and_fails() {
    let limit = 4096;
    let mut parser = Parser::with_limits(1024, limit);
    let line = [&b"data: "[..], &[b'x'; 99], b"\n"].concat();
    let mut lines = 0;
    let error = loop {
        let result = parser.feed(&line, &mut Vec::new());
        let (_, data) = parser.held();
        assert!(data <= limit, "holds {data} bytes");
        if let Err(error) = result {
            break error;
        }
        lines += 1;
    };
    assert_eq!(error, SseError::EventTooLarge { limit });
    // 40 lines of 99 bytes and their 39 separators fit in 4096 bytes; a 41st does not.
    assert_eq!(lines, 40);
    assert_eq!(parser.held(), (0, 0));
    assert_eq!(parser.feed(b"\n", &mut Vec::new()), Err(error));
}

#[test]
fn the_event_limit_counts_decoded_data_and_separators_exactly() {
    let mut parser = Parser::with_limits(64, 5);
    let mut frames = Vec::new();
    parser.feed(b"data: ab\ndata: cd\n\n", &mut frames).unwrap();
    assert_eq!(kinds(&frames), [FrameKind::Event(message("ab\ncd"))]);
    // The buffer starts again empty after each event.
    parser.feed(b"data: 12345\n\n", &mut frames).unwrap();
    assert_eq!(
        parser.feed(b"data: 1\ndata: 2345\n", &mut frames),
        Err(SseError::EventTooLarge { limit: 5 })
    );
    // An invalid byte decodes to 3 bytes.
    let mut parser = Parser::with_limits(64, 5);
    assert_eq!(
        parser.feed(b"data: \xFF\xFF\n", &mut Vec::new()),
        Err(SseError::EventTooLarge { limit: 5 })
    );
}

#[test]
fn the_errors_say_which_limit() {
    assert_eq!(
        SseError::LineTooLong { limit: 1024 }.to_string(),
        "event stream line longer than 1024 bytes"
    );
    assert_eq!(
        SseError::EventTooLarge { limit: 8 }.to_string(),
        "event stream event with more than 8 bytes of data"
    );
    let parser = Parser::default();
    assert_eq!(
        (parser.max_line(), parser.max_event()),
        (DEFAULT_MAX_LINE, DEFAULT_MAX_EVENT)
    );
}

#[test]
fn a_line_buffer_grown_by_one_long_line_is_released() {
    let mut parser = Parser::new();
    let long = vec![b'x'; 1024 * 1024];
    parser.feed(b"data: ", &mut Vec::new()).unwrap();
    parser.feed(&long, &mut Vec::new()).unwrap();
    assert!(parser.held().0 >= long.len());
    let mut frames = Vec::new();
    parser.feed(b"\n\n", &mut frames).unwrap();
    assert_eq!(parser.held().0, 0);
    let [frame] = &frames[..] else {
        panic!("one frame")
    };
    let FrameKind::Event(event) = &frame.kind else {
        panic!("an event")
    };
    assert_eq!(event.data.len(), long.len());
}

// Generated streams.

/// One block of a generated stream: an optional comment, then an event's fields (with no
/// `data` line, an event that is not dispatched).
#[derive(Clone, Debug)]
struct Block {
    comment: Option<String>,
    event_type: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    data: Vec<String>,
}

fn block() -> impl Strategy<Value = Block> {
    (
        proptest::option::of("[^\r\n]{0,12}"),
        proptest::option::of("[^\r\n]{0,12}"),
        proptest::option::of("[^\r\n\0]{0,12}"),
        proptest::option::of(any::<u64>()),
        prop::collection::vec("[^\r\n]{0,16}", 0..4),
    )
        .prop_map(|(comment, event_type, id, retry, data)| Block {
            comment,
            event_type,
            id,
            retry,
            data,
        })
}

/// A stream of blocks serialized with line ends chosen by `ends` (LF, CR, CRLF), the frames it
/// must yield, and where each frame ends. The other way of writing a field (`name:value` rather
/// than `name: value`) is chosen when the value does not start with a space.
fn serialize(bom: bool, blocks: &[Block], choices: &[u8]) -> (Vec<u8>, Vec<(FrameKind, u64)>) {
    let mut stream = Vec::new();
    if bom {
        stream.extend_from_slice(&BOM);
    }
    let mut choices = choices.iter().copied().cycle();
    let mut after_cr = false;
    let mut line = |stream: &mut Vec<u8>, text: &[u8]| {
        stream.extend_from_slice(text);
        let mut choice = choices.next().unwrap_or(0) % 3;
        // An LF right after a CR would join it as a CRLF: an empty line then needs another end.
        if after_cr && text.is_empty() && choice == 0 {
            choice = 2;
        }
        stream.extend_from_slice([&b"\n"[..], b"\r", b"\r\n"][usize::from(choice)]);
        after_cr = choice == 1;
    };
    let field = |name: &str, value: &str, compact: bool| {
        let space = if compact && !value.starts_with(' ') {
            ""
        } else {
            " "
        };
        format!("{name}:{space}{value}").into_bytes()
    };
    let mut expected = Vec::new();
    let (mut last_id, mut retry) = (None, None);
    for (index, block) in blocks.iter().enumerate() {
        let compact = index % 2 == 0;
        if let Some(comment) = &block.comment {
            line(&mut stream, format!(":{comment}").as_bytes());
            expected.push((FrameKind::Comment, stream.len() as u64));
        }
        if let Some(event_type) = &block.event_type {
            line(&mut stream, &field("event", event_type, compact));
        }
        if let Some(id) = &block.id {
            line(&mut stream, &field("id", id, compact));
            last_id = Some(id.clone());
        }
        if let Some(value) = block.retry {
            line(&mut stream, &field("retry", &value.to_string(), compact));
            retry = Some(value);
        }
        for data in &block.data {
            line(&mut stream, &field("data", data, !compact));
        }
        line(&mut stream, b"");
        if block.data.is_empty() {
            // Not dispatched; its `id` and `retry` still count for the events after it.
            continue;
        }
        let event_type = match block.event_type.as_deref() {
            None | Some("") => "message".to_owned(),
            Some(event_type) => event_type.to_owned(),
        };
        let event = Event {
            event_type,
            data: block.data.join("\n"),
            id: last_id.clone(),
            retry,
        };
        expected.push((FrameKind::Event(event), stream.len() as u64));
    }
    (stream, expected)
}

/// `stream` cut at `cuts` (indexes into it, in any order).
fn cut<'a>(stream: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|at| at.index(stream.len() + 1)).collect();
    cuts.push(0);
    cuts.push(stream.len());
    cuts.sort_unstable();
    cuts.windows(2)
        .map(|pair| &stream[pair[0]..pair[1]])
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn well_formed_events_in_any_chunks_are_read_exactly(
        bom in any::<bool>(),
        blocks in prop::collection::vec(block(), 0..8),
        line_ends in prop::collection::vec(any::<u8>(), 1..64),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let (stream, expected) = serialize(bom, &blocks, &line_ends);
        let chunks = cut(&stream, &cuts);
        let frames = frames_of(&chunks);
        prop_assert_eq!(kinds(&frames), expected.iter().map(|(kind, _)| kind.clone()).collect::<Vec<_>>());
        // Each frame ends after its line end; when a chunk ended between the CR and the LF of a
        // CRLF, just after the CR.
        let chunk_ends: Vec<usize> = chunks.iter().scan(0, |at, chunk| {
            *at += chunk.len();
            Some(*at)
        }).collect();
        for (frame, (_, end)) in frames.iter().zip(&expected) {
            let end = usize::try_from(*end).unwrap();
            let split_crlf = stream[..end].ends_with(b"\r\n") && chunk_ends.contains(&(end - 1));
            let expected_end = if split_crlf { end - 1 } else { end };
            prop_assert_eq!(frame.end, expected_end as u64);
        }
    }

    #[test]
    fn arbitrary_bytes_in_arbitrary_chunks_stay_within_the_limits(
        stream in prop::collection::vec(
            prop_oneof![
                4 => any::<u8>(),
                1 => prop::sample::select(&b"\r\n:"[..]),
            ],
            0..600,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        max_line in 0_usize..80,
        max_event in 0_usize..120,
    ) {
        let chunks = cut(&stream, &cuts);
        let mut parser = Parser::with_limits(max_line, max_event);
        let mut frames = Vec::new();
        let mut fed = 0_u64;
        let mut chunked_result = Ok(());
        for chunk in &chunks {
            let before = frames.len();
            chunked_result = parser.feed(chunk, &mut frames);
            let (line, data) = parser.held();
            prop_assert!(line <= max_line && data <= max_event);
            fed += chunk.len() as u64;
            if chunked_result.is_err() {
                break;
            }
            prop_assert_eq!(parser.consumed(), fed);
            for frame in &frames[before..] {
                prop_assert!(frame.end <= fed);
            }
        }
        prop_assert!(frames.windows(2).all(|pair| pair[0].end < pair[1].end));
        for frame in &frames {
            if let FrameKind::Event(event) = &frame.kind {
                prop_assert!(event.data.len() <= max_event);
            }
        }
        // The same frames, and the same error, whatever the chunks.
        let mut whole = Parser::with_limits(max_line, max_event);
        let mut whole_frames = Vec::new();
        let whole_result = whole.feed(&stream, &mut whole_frames);
        prop_assert_eq!(chunked_result, whole_result);
        prop_assert_eq!(kinds(&frames), kinds(&whole_frames));
    }
}
