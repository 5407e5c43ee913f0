//! [`NotContinuable`]: why an interrupted answer cannot be continued by a prefill.

use std::fmt;

/// Why a stream cannot be continued: the engine then ends it with an
/// [`error_event`](super::error_event) instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotContinuable {
    /// The answer delivered content other than text (a tool call, tool input JSON, thinking, a
    /// refusal, audio or an image): a prefill is text, and cannot carry it.
    NotText,
    /// The request asked for several choices (`n` > 1), or a chunk was for a choice other than
    /// the first: a prefill continues one answer.
    SeveralChoices,
    /// The original request body is not a JSON object with a non-empty `messages` array (or its
    /// last assistant message has content a prefill cannot extend).
    BadRequestBody,
    /// No text was received yet (or only whitespace): there is nothing to continue from.
    Nothing,
    /// The delivered tokens used up the request's `max_tokens`, or the text is longer than
    /// [`Transcript::MAX_TEXT`](super::Transcript::MAX_TEXT).
    TooLong,
    /// The answer said it was complete (a `finish_reason`, a `stop_reason`, the terminal event):
    /// a continuation would add to a finished answer. End the stream with
    /// [`terminal_event`](super::terminal_event) if its terminal event was lost.
    Finished,
}

impl NotContinuable {
    /// A short snake_case name, for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            NotContinuable::NotText => "not_text",
            NotContinuable::SeveralChoices => "several_choices",
            NotContinuable::BadRequestBody => "bad_request_body",
            NotContinuable::Nothing => "nothing",
            NotContinuable::TooLong => "too_long",
            NotContinuable::Finished => "finished",
        }
    }
}

impl fmt::Display for NotContinuable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotContinuable::NotText => "the answer has content other than text",
            NotContinuable::SeveralChoices => "the request asked for several choices",
            NotContinuable::BadRequestBody => "the request body is not a JSON object with messages",
            NotContinuable::Nothing => "no text was received to continue from",
            NotContinuable::TooLong => "the answer used up its max_tokens or is too long",
            NotContinuable::Finished => "the answer said it was complete",
        })
    }
}

impl std::error::Error for NotContinuable {}
