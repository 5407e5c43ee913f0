//! [`Parser`]: the incremental parser of an event stream, after the WHATWG HTML Living Standard,
//! "Server-sent events", sections "Parsing an event stream" and "Interpreting an event stream".

use std::mem;

use stormguard_numbers::decimal::parse_decimal;

use super::error::SseError;

/// Default longest line (8 MiB, line end not counted) a [`Parser`] holds before it fails with
/// [`SseError::LineTooLong`].
///
/// The text chunks of LLM streams are a few hundred bytes to a few KiB per line. The longest
/// legitimate lines carry images in base64 in one `data` line: the partial and final images of
/// OpenAI's Responses API (`partial_image_b64`, and the whole response again in
/// `response.completed`) and Gemini's `inlineData` parts, a few MiB for a high-resolution PNG.
/// 8 MiB leaves them room, while a stream that never ends its line costs at most that much before
/// it fails. A client that only streams text can set a much lower limit with
/// [`Parser::with_limits`].
pub const DEFAULT_MAX_LINE: usize = 8 * 1024 * 1024;

/// Default largest event (8 MiB of data, its `data` lines joined by `\n`, as decoded) a
/// [`Parser`] holds before it fails with [`SseError::EventTooLarge`]. The same reasoning as
/// [`DEFAULT_MAX_LINE`]: one image in one event fits; an event that never ends does not grow
/// without bound.
pub const DEFAULT_MAX_EVENT: usize = 8 * 1024 * 1024;

/// The UTF-8 byte order mark, skipped once at the very start of a stream.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// The event type of an event that had no `event` field.
pub(crate) const MESSAGE: &str = "message";

/// A line buffer grown past this many bytes (by one long line) is released after its line, so a
/// single large event does not pin its memory for the rest of the stream.
const KEEP_LINE_CAPACITY: usize = 64 * 1024;

/// One dispatched event: what a browser's `EventSource` hands its listeners as a `MessageEvent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event type: the last `event` field of the event, or `message` when it had none (or an
    /// empty one).
    pub event_type: String,
    /// The event's `data` lines, joined by `\n` (no `\n` at the end). May be empty: an event with
    /// one empty `data` line is dispatched, one with no `data` line is not.
    pub data: String,
    /// The stream's last event ID when the event was dispatched (`lastEventId` in the standard):
    /// set by the last valid `id` field of this event *or of an earlier one* (the standard does
    /// not reset it between events), `None` until the stream sends one. A client that reconnects
    /// sends it as `Last-Event-ID`.
    pub id: Option<String>,
    /// The stream's reconnection time in milliseconds when the event was dispatched: the last
    /// valid `retry` field of this event or of an earlier one (it is a setting of the stream in
    /// the standard), `None` until the stream sends one.
    pub retry: Option<u64>,
}

/// What a [`Frame`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// An event, ended by its blank line.
    Event(Event),
    /// A comment line (`:` first). Servers send them to keep idle connections open: they are a
    /// sign of life, never content. Their text is not kept.
    Comment,
}

/// One unit a [`Parser`] yields: an event or a comment, and where in the stream it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The event or comment.
    pub kind: FrameKind,
    /// The offset in the stream (counting from its first byte, byte order mark included) just
    /// after the line end that completed the frame: the blank line's for an event, the comment
    /// line's own for a comment. The stream's first `end` bytes hold the frame and everything
    /// before it.
    ///
    /// A CR line end completes its line at once, so that a stream whose lines end in CR alone is
    /// not held back until its next byte. When that CR is the last byte read so far, `end` is
    /// just after it; if the next chunk starts with LF, that LF belongs to the same line end
    /// (CRLF) but to no frame.
    pub end: u64,
    /// Where the stream can be cut after this frame without cutting an event: its first
    /// `boundary` bytes hold whole events and comments, and a reader handed them, then other
    /// events, reads those events as they are. It is `end`, except for a comment inside an event
    /// (after its `data` or `event` field, before its blank line), where it is the start of that
    /// event: cut at the comment's end, the event's first lines would join whatever follows.
    pub boundary: u64,
}

/// An incremental Server-Sent Events parser: it is handed a stream's bytes in chunks of any
/// size, split anywhere (inside a UTF-8 sequence, between the CR and the LF of a line end), and
/// yields each [`Frame`] as soon as its last line has ended.
///
/// [`next_frame`](Parser::next_frame) takes the bytes of a chunk from the front of a slice until
/// it completes a frame, and leaves the rest of the chunk in the slice for the next call; a
/// chunk is read once, whatever its size and however long its lines. A line that spans chunks is
/// copied into the parser, and decoded once it ends. [`feed`](Parser::feed) reads a whole chunk
/// into a `Vec` of frames.
///
/// Memory: the parser holds at most [`max_line`](Parser::max_line) bytes of an unfinished line,
/// [`max_event`](Parser::max_event) bytes of an unfinished event's data, and the current event
/// type and last event ID (each decoded from one line). Its buffers never grow past the limits;
/// a stream that would make them is an [`SseError`], returned again on every later call.
///
/// ```
/// use stormguard_stream::sse::{FrameKind, Parser};
///
/// let mut parser = Parser::new();
/// let mut frames = Vec::new();
/// // One event in three chunks: the second ends inside the `é` and between CR and LF.
/// for chunk in [&b"event: greeting\r\ndata: caf"[..], b"\xC3", b"\xA9\r", b"\n\r\n"] {
///     parser.feed(chunk, &mut frames)?;
/// }
/// let [frame] = &frames[..] else { panic!("one frame") };
/// let FrameKind::Event(event) = &frame.kind else { panic!("an event") };
/// assert_eq!(event.event_type, "greeting");
/// assert_eq!(event.data, "café");
/// assert_eq!(frame.end, 32);
/// assert_eq!(parser.consumed(), 32);
/// # Ok::<(), stormguard_stream::sse::SseError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Parser {
    max_line: usize,
    max_event: usize,
    /// The start of a line that spans chunks, its line end not included.
    line: Vec<u8>,
    /// While the stream's first bytes may still be a BOM: how many of its bytes were read.
    bom: Option<usize>,
    /// The last byte read was a CR that ended a line: an LF right after it ends no other line.
    after_cr: bool,
    /// The event type buffer.
    event_type: String,
    /// The data buffer, its lines joined by `\n`.
    data: String,
    /// Whether the event had a `data` field: an event with none is not dispatched, while one
    /// with a single empty `data` line is (the standard's data buffer would hold `\n`).
    has_data: bool,
    last_event_id: Option<String>,
    retry: Option<u64>,
    consumed: u64,
    /// Where the stream was last between events: the [`Frame::boundary`] of the next frame
    /// unless the stream gets there.
    boundary: u64,
    /// The limit the stream broke, if it did: the parser takes no more input.
    error: Option<SseError>,
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new()
    }
}

impl Parser {
    /// A parser at the start of a stream, with the limits [`DEFAULT_MAX_LINE`] and
    /// [`DEFAULT_MAX_EVENT`].
    pub fn new() -> Self {
        Parser::with_limits(DEFAULT_MAX_LINE, DEFAULT_MAX_EVENT)
    }

    /// A parser at the start of a stream that fails with [`SseError::LineTooLong`] on a line
    /// longer than `max_line` bytes and with [`SseError::EventTooLarge`] on an event with more
    /// than `max_event` bytes of data.
    pub fn with_limits(max_line: usize, max_event: usize) -> Self {
        Parser {
            max_line,
            max_event,
            line: Vec::new(),
            bom: Some(0),
            after_cr: false,
            event_type: String::new(),
            data: String::new(),
            has_data: false,
            last_event_id: None,
            retry: None,
            consumed: 0,
            boundary: 0,
            error: None,
        }
    }

    /// The longest line, in bytes, the parser accepts.
    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// The most data, in bytes, one event may carry.
    pub fn max_event(&self) -> usize {
        self.max_event
    }

    /// How many bytes of the stream the parser has read: every [`Frame::end`] so far is at most
    /// this. Bytes past the last frame's end belong to a frame not finished yet.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The stream's last event ID (from its last valid `id` field), including one sent in an
    /// event that was not dispatched. `None` until the stream sends one.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The stream's reconnection time in milliseconds (from its last valid `retry` field),
    /// including one sent in an event that was not dispatched (servers often send `retry` alone).
    /// `None` until the stream sends one.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Reads bytes from the front of `input` until a frame is complete and returns it, leaving
    /// the bytes after it in `input`; or reads all of `input` and returns `None` when no frame
    /// ended in it (the parser keeps what it needs of an unfinished line or event).
    ///
    /// Call it until it returns `None`, then again with the next chunk. How far `input` moved is
    /// how many bytes of the chunk the frame took, for a caller who cuts the chunk at an event
    /// boundary.
    ///
    /// # Errors
    /// [`SseError::LineTooLong`] or [`SseError::EventTooLarge`] when the stream breaks a limit;
    /// the parser then refuses any further input with the same error.
    pub fn next_frame(&mut self, input: &mut &[u8]) -> Result<Option<Frame>, SseError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let frame = self.read(input);
        if let Err(error) = frame {
            self.error = Some(error);
            // Nothing is read any more: release what was held.
            self.line = Vec::new();
            self.data = String::new();
            self.event_type = String::new();
        }
        frame
    }

    /// Reads all of `chunk`, appending the frames that complete in it to `frames`.
    ///
    /// Every frame of the chunk is held in `frames` at once; a caller that only wants the first
    /// event of interest can stop early with [`next_frame`](Parser::next_frame).
    ///
    /// # Errors
    /// As [`next_frame`](Parser::next_frame); the frames completed before the error are in
    /// `frames`.
    pub fn feed(&mut self, chunk: &[u8], frames: &mut Vec<Frame>) -> Result<(), SseError> {
        let mut input = chunk;
        while let Some(frame) = self.next_frame(&mut input)? {
            frames.push(frame);
        }
        Ok(())
    }

    /// [`next_frame`](Parser::next_frame) before its error handling.
    fn read(&mut self, input: &mut &[u8]) -> Result<Option<Frame>, SseError> {
        loop {
            let Some(&first) = input.first() else {
                return Ok(None);
            };
            if mem::take(&mut self.after_cr) && first == b'\n' {
                self.advance(input, 1);
                continue;
            }
            if let Some(read) = self.bom {
                self.read_bom(input, read)?;
                continue;
            }
            let Some(at) = input
                .iter()
                .position(|&byte| byte == b'\n' || byte == b'\r')
            else {
                self.extend_line(input)?;
                self.advance(input, input.len());
                return Ok(None);
            };
            let line_end = if input[at..].starts_with(b"\r\n") {
                2
            } else {
                1
            };
            self.after_cr = input[at] == b'\r' && line_end == 1;
            let kind = if self.line.is_empty() {
                if at > self.max_line {
                    return Err(SseError::LineTooLong {
                        limit: self.max_line,
                    });
                }
                self.interpret(&input[..at])?
            } else {
                self.extend_line(&input[..at])?;
                let line = mem::take(&mut self.line);
                let kind = self.interpret(&line);
                self.reuse_line(line);
                kind?
            };
            self.advance(input, at + line_end);
            if !self.in_event() {
                self.boundary = self.consumed;
            }
            if let Some(kind) = kind {
                let (end, boundary) = (self.consumed, self.boundary);
                return Ok(Some(Frame {
                    kind,
                    end,
                    boundary,
                }));
            }
        }
    }

    /// Reads one byte at the start of the stream, where it may belong to a byte order mark
    /// (the standard decodes the stream with "UTF-8 decode", which drops one leading BOM).
    fn read_bom(&mut self, input: &mut &[u8], read: usize) -> Result<(), SseError> {
        if input.first() == BOM.get(read) {
            self.advance(input, 1);
            self.bom = Some(read + 1).filter(|&read| read < BOM.len());
            Ok(())
        } else {
            self.bom = None;
            // Not a BOM after all: the bytes taken for one start the first line.
            self.extend_line(&BOM[..read])
        }
    }

    fn advance(&mut self, input: &mut &[u8], count: usize) {
        *input = &input[count..];
        self.consumed += count as u64;
    }

    /// Appends the part of a line that spans chunks, within the line limit.
    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        let needed = self.line.len() + bytes.len();
        if needed > self.max_line {
            return Err(SseError::LineTooLong {
                limit: self.max_line,
            });
        }
        if let Some(capacity) = capacity_within(self.line.capacity(), needed, self.max_line) {
            self.line.reserve_exact(capacity - self.line.len());
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Puts the line buffer back for the next line that spans chunks, empty, unless one long
    /// line made it large.
    fn reuse_line(&mut self, mut line: Vec<u8>) {
        if line.capacity() <= KEEP_LINE_CAPACITY {
            line.clear();
            self.line = line;
        }
    }

    /// Interprets one line (its line end removed): a blank line dispatches the event, a comment
    /// is a frame of its own, a field updates the buffers.
    fn interpret(&mut self, line: &[u8]) -> Result<Option<FrameKind>, SseError> {
        let Some(&first) = line.first() else {
            return Ok(self.dispatch());
        };
        if first == b':' {
            return Ok(Some(FrameKind::Comment));
        }
        let (name, value) = match line.iter().position(|&byte| byte == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        // Field names are ASCII: comparing bytes is comparing the decoded names.
        match name {
            b"event" => {
                self.event_type.clear();
                self.event_type.push_str(&String::from_utf8_lossy(value));
            }
            b"data" => self.append_data(value)?,
            b"id" if !value.contains(&0) => {
                self.last_event_id = Some(String::from_utf8_lossy(value).into_owned());
            }
            // ASCII digits only; a number larger than a `u64` is ignored like any other invalid
            // value.
            b"retry" => {
                if let Ok(millis) = parse_decimal(value) {
                    self.retry = Some(millis);
                }
            }
            _ => {}
        }
        Ok(None)
    }

    /// Appends a `data` line to the data buffer, within the event limit.
    fn append_data(&mut self, value: &[u8]) -> Result<(), SseError> {
        let too_large = SseError::EventTooLarge {
            limit: self.max_event,
        };
        let separator = usize::from(self.has_data);
        // Decoding never shrinks a line (U+FFFD takes 3 bytes, and replaces at most 3): a line
        // too large as bytes is refused before it is decoded.
        if self.data.len() + separator + value.len() > self.max_event {
            return Err(too_large);
        }
        let value = String::from_utf8_lossy(value);
        let needed = self.data.len() + separator + value.len();
        if needed > self.max_event {
            return Err(too_large);
        }
        if let Some(capacity) = capacity_within(self.data.capacity(), needed, self.max_event) {
            self.data.reserve_exact(capacity - self.data.len());
        }
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(&value);
        self.has_data = true;
        Ok(())
    }

    /// Whether an event is under way: a `data` or `event` field was read since the last blank
    /// line. (`id` and `retry` are settings of the stream, which hold whatever follows them.)
    fn in_event(&self) -> bool {
        self.has_data || !self.event_type.is_empty()
    }

    /// The blank line: the event, if it had data; the buffers start again empty either way. The
    /// last event ID and the reconnection time are kept (they belong to the stream).
    fn dispatch(&mut self) -> Option<FrameKind> {
        if !mem::take(&mut self.has_data) {
            self.event_type.clear();
            return None;
        }
        let event_type = if self.event_type.is_empty() {
            MESSAGE.to_owned()
        } else {
            mem::take(&mut self.event_type)
        };
        Some(FrameKind::Event(Event {
            event_type,
            data: mem::take(&mut self.data),
            id: self.last_event_id.clone(),
            retry: self.retry,
        }))
    }

    /// The bytes held for an unfinished line and an unfinished event's data (tests check the
    /// limits against it).
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        (self.line.capacity(), self.data.capacity())
    }
}

/// The capacity to give a buffer of `capacity` bytes that must hold `needed` (`None` if it
/// already can): double it, as `Vec` does, but never past `limit` (`needed` is within it). So a
/// buffer at its limit holds no more than the limit, and a long line fed in many small chunks is
/// still copied in amortised linear time.
fn capacity_within(capacity: usize, needed: usize, limit: usize) -> Option<usize> {
    (needed > capacity).then(|| capacity.saturating_mul(2).clamp(needed, limit.max(needed)))
}

#[cfg(test)]
mod tests;
