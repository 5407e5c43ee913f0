//! [`classify_event`]: what an event of an LLM provider's stream means for a retry.

use serde_json::Value;
use stormguard_classify::{LlmClassifier, Outcome, Reason};

use super::parser::Event;

/// The outcome of an error event whose data names no error kind stormguard knows (or is not
/// JSON at all): retryable, not accepted, reason [`Reason::ServerError`], like a `500`. The
/// provider failed the request after its `200` without saying why; a replay before any content
/// is clean, and the retry budget bounds how often it happens.
pub const UNRECOGNIZED_ERROR: Outcome = Outcome::retryable(Reason::ServerError);

/// What one event of a stream means to a caller waiting for the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Output the user sees (text, a tool call, a refusal, reasoning shown as it streams): once
    /// one has reached the caller, the request must not be replayed silently.
    Content,
    /// Protocol, bookkeeping and keep-alive: a sign of life, neither content nor an error
    /// (Anthropic's `ping`, `message_start`, `content_block_stop`, `message_delta`; OpenAI's
    /// first chunk that only names the `role`, or a last one with only a `finish_reason`; an event
    /// with no data).
    Control,
    /// The provider's end-of-stream marker: OpenAI's `data: [DONE]`, Anthropic's
    /// `message_stop`, the Responses API's `response.completed` and `response.incomplete`. No
    /// content, and no more events expected; a stream that ends here before any content
    /// finished successfully with an empty answer.
    Done,
    /// The provider failed the request after its `200`, classified like the same error in the
    /// body of a non-2xx response (see [`LlmClassifier`]):
    /// `overloaded_error` is retryable [`Reason::Overloaded`], `rate_limit_error` retryable
    /// [`Reason::RateLimited`], `invalid_request_error` fatal [`Reason::BadRequest`] ...; an
    /// error of no known kind is [`UNRECOGNIZED_ERROR`].
    Error(Outcome),
}

/// Classifies one event of an LLM provider's stream.
///
/// The event's type decides first (and, when it is `message` or a name not listed here, the
/// `"type"` string of its JSON data):
///
/// - `error` is an [`EventKind::Error`], classified from its data: Anthropic's
///   `{"type": "error", "error": {"type": "overloaded_error", ...}}`, or the Responses API's
///   `{"type": "error", "code": ..., "message": ...}`;
/// - `ping` is [`Control`](EventKind::Control);
/// - Anthropic's Messages stream ("Streaming Messages"): `message_start`,
///   `content_block_start`, `content_block_stop` and `message_delta` are `Control`,
///   `content_block_delta` (text, tool input, thinking) is `Content`, `message_stop` is `Done`;
/// - OpenAI's Responses API ("Streaming events", all named `response.*`): the `*.delta` events
///   and `*.partial_image` are `Content`; `response.completed` and `response.incomplete` are
///   `Done`; `response.failed` is an `Error`, classified from its `response.error`; the other
///   `response.*` events (`created`, `in_progress`, `*.added`, `*.done`, tool-call progress)
///   are `Control`: they announce or repeat output that the deltas deliver.
///
/// Otherwise the data decides:
///
/// - `[DONE]`, OpenAI's sentinel, is [`Done`](EventKind::Done); empty data is `Control`;
/// - a JSON object with a (non-null) top-level `error` is an `Error`: OpenAI's
///   `{"error": {"message", "type", "code"}}` frame, or Gemini's `google.rpc.Status`;
/// - OpenAI's Chat Completions chunks (a `choices` array) are `Content` when a choice's `delta`
///   has a non-empty `content`, `refusal`, `reasoning_content` or `reasoning` string, non-empty
///   `tool_calls`, a `function_call` or `audio`, or when a legacy Completions choice has a
///   non-empty `text`; else `Control` (the first chunk with only `"role": "assistant"`, empty
///   content, a `finish_reason` alone, a usage chunk with no choices);
/// - Gemini's chunks (a `candidates` array) are `Content` when a part of a candidate's `content`
///   has a non-empty `text`, a `functionCall` or `inlineData`; else `Control`;
/// - anything else is [`Content`](EventKind::Content): the stream of a provider this function
///   does not know must reach its caller, not wait for a content event that never comes.
///
/// Reading content as control only delays handing the stream over (nothing has reached the
/// caller yet, so a retry stays clean); the opposite would give up a clean retry. Where the
/// formats leave a doubt, the rules lean to `Control`, but only for event names documented as
/// part of a provider's stream.
///
/// ```
/// use stormguard_classify::Reason;
/// use stormguard_stream::sse::{Event, EventKind, classify_event};
///
/// let event = |event_type: &str, data: &str| Event {
///     event_type: event_type.to_owned(),
///     data: data.to_owned(),
///     id: None,
///     retry: None,
/// };
/// let first = r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
/// assert_eq!(classify_event(&event("message", first)), EventKind::Control);
/// let text = r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
/// assert_eq!(classify_event(&event("message", text)), EventKind::Content);
/// assert_eq!(classify_event(&event("message", "[DONE]")), EventKind::Done);
///
/// let error = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
/// let EventKind::Error(outcome) = classify_event(&event("message", error)) else {
///     panic!("an error");
/// };
/// assert!(outcome.is_retryable() && !outcome.is_accepted());
/// assert_eq!(outcome.reason(), Reason::RateLimited);
/// ```
pub fn classify_event(event: &Event) -> EventKind {
    let data = event.data.trim_ascii();
    if let Some(kind) = by_name(&event.event_type, data) {
        return kind;
    }
    if data == "[DONE]" {
        return EventKind::Done;
    }
    if data.is_empty() {
        return EventKind::Control;
    }
    let json = json_of(data);
    let Some(object) = json.as_ref().and_then(Value::as_object) else {
        return EventKind::Content;
    };
    let named = object.get("type").and_then(Value::as_str);
    if let Some(kind) = named.and_then(|name| by_name(name, data)) {
        return kind;
    }
    if object.get("error").is_some_and(|error| !error.is_null()) {
        return EventKind::Error(error_outcome(json.as_ref()));
    }
    if let Some(choices) = object.get("choices").and_then(Value::as_array) {
        return content_if(choices.iter().any(openai_choice_has_content));
    }
    if let Some(candidates) = object.get("candidates").and_then(Value::as_array) {
        return content_if(candidates.iter().any(gemini_candidate_has_content));
    }
    EventKind::Content
}

/// The kind an event name decides on its own, or `None` for a name it does not know. Only the
/// error events read their data (the events with content are not parsed here, whatever their
/// size).
fn by_name(name: &str, data: &str) -> Option<EventKind> {
    let kind = match name {
        // Anthropic's and the Responses API's error events.
        "error" => EventKind::Error(error_outcome(json_of(data).as_ref())),
        // Anthropic's keep-alive and message lifecycle.
        "ping"
        | "message_start"
        | "content_block_start"
        | "content_block_stop"
        | "message_delta" => EventKind::Control,
        "content_block_delta" => EventKind::Content,
        "message_stop" | "response.completed" | "response.incomplete" => EventKind::Done,
        // The Responses API's failure carries a response whose `error` says why.
        "response.failed" => {
            let json = json_of(data);
            EventKind::Error(error_outcome(
                json.as_ref().and_then(|json| json.get("response")),
            ))
        }
        responses if responses.starts_with("response.") => {
            content_if(responses.ends_with(".delta") || responses.ends_with(".partial_image"))
        }
        _ => return None,
    };
    Some(kind)
}

/// The data as JSON, if it is a JSON object or array.
fn json_of(data: &str) -> Option<Value> {
    match data.as_bytes().first() {
        Some(b'{' | b'[') => serde_json::from_str(data).ok(),
        _ => None,
    }
}

/// The outcome of an error event's JSON: the rules for provider error bodies
/// ([`LlmClassifier::classify_without_status`]), with [`UNRECOGNIZED_ERROR`] when it names no kind
/// they know.
fn error_outcome(json: Option<&Value>) -> Outcome {
    json.map_or(UNRECOGNIZED_ERROR, |json| {
        LlmClassifier::new().classify_without_status(json, UNRECOGNIZED_ERROR)
    })
}

const fn content_if(content: bool) -> EventKind {
    if content {
        EventKind::Content
    } else {
        EventKind::Control
    }
}

/// A non-empty string.
fn is_text(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|text| !text.is_empty())
}

/// Present and neither `null` nor empty.
pub(crate) fn is_given(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(Value::Object(fields)) => !fields.is_empty(),
        Some(Value::String(text)) => !text.is_empty(),
        Some(_) => true,
    }
}

/// Does a choice of an OpenAI Chat Completions (or legacy Completions) chunk carry output?
fn openai_choice_has_content(choice: &Value) -> bool {
    let Some(delta) = choice.get("delta") else {
        return is_text(choice.get("text"));
    };
    ["content", "refusal", "reasoning_content", "reasoning"]
        .iter()
        .any(|key| is_text(delta.get(key)))
        || ["tool_calls", "function_call", "audio"]
            .iter()
            .any(|key| is_given(delta.get(key)))
}

/// Does a candidate of a Gemini chunk carry output?
fn gemini_candidate_has_content(candidate: &Value) -> bool {
    let parts = candidate
        .get("content")
        .and_then(|content| content.get("parts"))
        .and_then(Value::as_array);
    parts.is_some_and(|parts| {
        parts.iter().any(|part| {
            is_text(part.get("text"))
                || is_given(part.get("functionCall"))
                || is_given(part.get("inlineData"))
        })
    })
}

#[cfg(test)]
mod tests;
