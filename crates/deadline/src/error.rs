//! The error raised when a deadline passes.

use std::fmt;

/// The request's [`Deadline`](crate::Deadline) passed before a response arrived (or had already
/// passed when the request was about to be sent, in which case it was not sent).
///
/// Retrying cannot help: the deadline spans every attempt. A retry engine treats this error as
/// final.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadlineExceeded {
    _private: (),
}

impl DeadlineExceeded {
    /// The error.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}
