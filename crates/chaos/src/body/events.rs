//! [`EventEnds`]: where the events of an event stream end, in the bytes as they come.
//!
//! An event is a block of lines ended by a blank line ("Server-sent events", WHATWG HTML Living
//! Standard: lines end in CRLF, LF or CR, and a CRLF split between two chunks is one line end).
//! Only where blocks end matters here, not what they say: a keep-alive comment is a block too,
//! and blank lines between blocks end nothing.

/// Reads where events end, chunk after chunk.
#[derive(Debug, Default)]
pub(super) struct EventEnds {
    /// Inside a line that has bytes.
    mid_line: bool,
    /// Inside a block that has a line with bytes.
    in_event: bool,
    /// The last byte was a CR: an LF right after it ends no other line.
    after_cr: bool,
}

impl EventEnds {
    /// Reads `data` up to the end of the `wanted`-th event that ends in it (`wanted` >= 1):
    /// `Ok` with the offset right after that event (its CRLF whole when both bytes are here),
    /// or `Err` with how many events ended in the whole of `data`, fewer than `wanted`.
    pub(super) fn find(&mut self, data: &[u8], wanted: u32) -> Result<usize, u32> {
        let mut ended = 0;
        let mut at = 0;
        while let Some(&byte) = data.get(at) {
            at += 1;
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\r' | b'\n' => {
                    self.after_cr = byte == b'\r';
                    if self.mid_line {
                        self.mid_line = false;
                    } else if self.in_event {
                        self.in_event = false;
                        ended += 1;
                        if ended == wanted {
                            if self.after_cr && data.get(at) == Some(&b'\n') {
                                at += 1;
                                self.after_cr = false;
                            }
                            return Ok(at);
                        }
                    }
                }
                _ => {
                    self.after_cr = false;
                    self.mid_line = true;
                    self.in_event = true;
                }
            }
        }
        Err(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets where each event of `chunks` ends, counted over the whole stream.
    fn ends(chunks: &[&str]) -> Vec<usize> {
        let mut reader = EventEnds::default();
        let mut found = Vec::new();
        let mut base = 0;
        for chunk in chunks {
            let mut rest = chunk.as_bytes();
            let mut offset = base;
            while let Ok(end) = reader.find(rest, 1) {
                offset += end;
                found.push(offset);
                rest = &rest[end..];
            }
            base += chunk.len();
        }
        found
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ends_and_the_chunks() {
        assert_eq!(ends(&["data: a\n\ndata: b\n\n"]), [9, 18]);
        assert_eq!(ends(&["data: a\r\n\r\n"]), [11]);
        assert_eq!(ends(&["data: a\r\rdata: b\r\r"]), [9, 18]);
        // Split anywhere, a CRLF between two chunks included.
        assert_eq!(ends(&["data: a\r", "\n\r", "\ndata: b\n", "\n"]), [10, 20]);
        assert_eq!(ends(&["event: ping\ndata: {}\n", "\n"]), [22]);
        // Extra blank lines end nothing; a comment is a block.
        assert_eq!(ends(&["\n\ndata: a\n\n\n\n: keep-alive\n\n"]), [11, 27]);
        // A block never ended is no event.
        assert_eq!(ends(&["data: a\ndata: b\n"]), Vec::<usize>::new());
    }

    #[test]
    fn the_wanted_event_is_found_among_several_and_the_rest_are_counted() {
        let stream = b"data: 1\n\ndata: 2\n\ndata: 3\n\n";
        assert_eq!(EventEnds::default().find(stream, 2), Ok(18));
        assert_eq!(EventEnds::default().find(stream, 4), Err(3));
    }
}
