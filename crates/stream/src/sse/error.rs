//! [`SseError`]: why a [`Parser`](super::Parser) stopped reading a stream.

use std::fmt;

/// A stream broke one of the [`Parser`](super::Parser)'s memory limits. The parser holds no more
/// of the stream than the limit, and refuses all further input with the same error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SseError {
    /// A line grew longer than `limit` bytes (its line end not counted) before it ended.
    LineTooLong {
        /// The parser's line limit, in bytes.
        limit: usize,
    },
    /// An event's data grew past `limit` bytes (its `data` lines joined by `\n`, as decoded)
    /// before the blank line that ends it.
    EventTooLarge {
        /// The parser's event limit, in bytes.
        limit: usize,
    },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::LineTooLong { limit } => {
                write!(f, "event stream line longer than {limit} bytes")
            }
            SseError::EventTooLarge { limit } => {
                write!(f, "event stream event with more than {limit} bytes of data")
            }
        }
    }
}

impl std::error::Error for SseError {}
