//! [`continuation_body`]: the request that asks for the rest of an answer.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{Format, NotContinuable, Transcript, split_trailing_whitespace, string};

/// The request members that limit the output tokens: both formats' `max_tokens`, and OpenAI's
/// newer `max_completion_tokens`.
const OUTPUT_LIMITS: [&str; 2] = ["max_tokens", "max_completion_tokens"];

/// The body of the request that continues the answer `transcript` read, from the original
/// request's JSON body.
///
/// - The text received is appended as an assistant message at the end of `messages`
///   (`{"role": "assistant", "content": text}`); if the last message already is an assistant
///   message (the caller's own prefill), the text is appended to its content instead, so that
///   the model goes on from where the caller's stream stopped.
/// - Anthropic rejects a final assistant message that ends in whitespace: that whitespace is
///   trimmed from the prefill (the [`Splice`](super::Splice) drops it again from the
///   continuation's first text, the caller has seen it).
/// - `max_tokens` and `max_completion_tokens`, where given, are reduced by
///   [`output_tokens`](Transcript::output_tokens): the answer as a whole stays within the
///   caller's limit.
/// - Every other member stays as it was (`model`, `stream`, `stream_options`, `system`, ...).
///
/// # Errors
/// What [`Transcript::continuable`] says; [`BadRequestBody`](NotContinuable::BadRequestBody)
/// when `original` is not a JSON object with a non-empty `messages` array;
/// [`SeveralChoices`](NotContinuable::SeveralChoices) for a request with `n` > 1;
/// [`TooLong`](NotContinuable::TooLong) when the delivered tokens leave nothing of a limit.
pub fn continuation_body(
    transcript: &Transcript,
    original: &[u8],
) -> Result<Bytes, NotContinuable> {
    transcript.continuable()?;
    let Ok(Value::Object(mut body)) = serde_json::from_slice(original) else {
        return Err(NotContinuable::BadRequestBody);
    };
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(NotContinuable::SeveralChoices);
    }
    reduce_limits(&mut body, transcript.output_tokens())?;
    let Some(messages) = body
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .filter(|messages| !messages.is_empty())
    else {
        return Err(NotContinuable::BadRequestBody);
    };
    let trim = transcript.format() == Format::AnthropicMessages;
    append_prefill(messages, transcript.text(), trim)?;
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|_| NotContinuable::BadRequestBody)
}

/// Takes what was delivered off each output limit; a limit used up leaves nothing to ask for.
fn reduce_limits(body: &mut Map<String, Value>, delivered: u64) -> Result<(), NotContinuable> {
    for key in OUTPUT_LIMITS {
        let Some(limit) = body.get(key).and_then(Value::as_u64) else {
            continue;
        };
        let left = limit.saturating_sub(delivered);
        if left == 0 {
            return Err(NotContinuable::TooLong);
        }
        body.insert(key.to_owned(), left.into());
    }
    Ok(())
}

/// Appends `text` to the last message if it is the assistant's, or as a new assistant message;
/// with `trim`, the prefill then loses the whitespace it ends with.
fn append_prefill(messages: &mut Vec<Value>, text: &str, trim: bool) -> Result<(), NotContinuable> {
    let prefill = prefill_text(messages).ok_or(NotContinuable::BadRequestBody)?;
    prefill.push_str(text);
    if trim {
        let kept = split_trailing_whitespace(prefill).0.len();
        prefill.truncate(kept);
    }
    Ok(())
}

/// The text a prefill extends: the last message's if it is the assistant's (its string content,
/// or the last text part of its content array, or a text part added to it), else a new assistant
/// message's. `None` for an assistant message whose content is neither.
fn prefill_text(messages: &mut Vec<Value>) -> Option<&mut String> {
    let assistant_last = matches!(
        messages.last(),
        Some(Value::Object(last)) if string(last, "role") == Some("assistant")
    );
    if !assistant_last {
        messages.push(json!({"role": "assistant", "content": ""}));
    }
    let content = messages
        .last_mut()?
        .as_object_mut()?
        .entry("content")
        .or_insert(Value::Null);
    if content.is_null() {
        *content = Value::String(String::new());
    }
    match content {
        Value::String(text) => Some(text),
        Value::Array(parts) => {
            let is_text = |part: &Value| part.get("type").and_then(Value::as_str) == Some("text");
            if !parts.last().is_some_and(is_text) {
                parts.push(json!({"type": "text", "text": ""}));
            }
            match parts.last_mut()?.get_mut("text")? {
                Value::String(text) => Some(text),
                _ => None,
            }
        }
        _ => None,
    }
}
