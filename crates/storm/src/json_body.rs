//! The JSON bodies of the provider's answers, worded as the providers the model follows word
//! theirs: one per status of [`crate::backend`]'s answers, two of them also the payload of a
//! stream's error event ([`crate::event_stream::ErrorForm`]).

/// The body of a 200 that is not streamed.
pub(crate) const OK_BODY: &[u8] =
    br#"{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"ok"}}]}"#;
/// The body of a 500 (and, in a stream, of OpenAI's error frame).
pub(crate) const ERROR_BODY: &[u8] =
    br#"{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}"#;
/// The body of a 529 (and, in a stream, of Anthropic's error event).
pub(crate) const OVERLOADED_BODY: &[u8] =
    br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
/// The body of a 503.
pub(crate) const UNAVAILABLE_BODY: &[u8] =
    br#"{"error":{"message":"The service is temporarily unavailable.","type":"service_unavailable"}}"#;
/// The body of a 429.
pub(crate) const RATE_LIMITED_BODY: &[u8] = br#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#;
