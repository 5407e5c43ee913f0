//! A model's degraded answer (`degraded = "..."` in its table): when no deployment can answer, the
//! caller gets the configured text as the model's answer, in its own format and shape (a whole
//! answer or an event stream, as it asked), marked `x-stormguard-degraded: true` by the library.
//!
//! Only a generation can be degraded this way: chat completions, completions and Anthropic's
//! messages. An embedding or a response of OpenAI's Responses API made of a canned text would be
//! wrong rather than degraded, so those get a 503 in the caller's format, with the library's hint
//! of when to come back.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Value, json};
use stormguard::classify::Outcome;
use stormguard::failover::Degraded;

use super::refusal::Refusal;
use crate::format::{CHAT_COMPLETIONS, COMPLETIONS, Format};

/// Whether the caller asked for an event stream (`"stream": true` in its body), put in the
/// request's extensions by the relay for the degraded answer to read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsksStream(pub(crate) bool);

/// The degraded answer of model `model`, served in `format`: `text`.
pub(crate) fn degraded(format: Format, model: &str, text: &str) -> Degraded {
    let (model, text) = (model.to_owned(), text.to_owned());
    Degraded::new(move |head, why| {
        let stream = head.extensions.get::<AsksStream>().is_some_and(|a| a.0);
        match (format, head.uri.path()) {
            (Format::Anthropic, _) if stream => events(anthropic_events(&model, &text)),
            (Format::Anthropic, _) => whole(&anthropic_message(&model, &text)),
            (Format::OpenAi, CHAT_COMPLETIONS | COMPLETIONS) => {
                let chat = head.uri.path() == CHAT_COMPLETIONS;
                match stream {
                    true => events(openai_events(chat, &model, &text)),
                    false => whole(&openai_answer(chat, &model, &text)),
                }
            }
            (Format::OpenAi, _) => unavailable(why, format),
        }
    })
}

/// A JSON answer.
fn whole(body: &Value) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body.to_string()));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An event stream of `events` (`(name, data)`; no name: a data-only event).
fn events(events: Vec<(Option<&str>, String)>) -> Response<Bytes> {
    let mut body = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            body.push_str("event: ");
            body.push_str(name);
            body.push('\n');
        }
        body.push_str("data: ");
        body.push_str(&data);
        body.push_str("\n\n");
    }
    let mut response = Response::new(Bytes::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

fn openai_answer(chat: bool, model: &str, text: &str) -> Value {
    let choice = match chat {
        true => json!({"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": text}}),
        false => json!({"index": 0, "finish_reason": "stop", "text": text}),
    };
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    json!({"id": "degraded", "object": object, "created": 0, "model": model,
           "choices": [choice]})
}

fn openai_events(chat: bool, model: &str, text: &str) -> Vec<(Option<&'static str>, String)> {
    let chunk = |content: Option<&str>, finish: Option<&str>| {
        let choice = match (chat, content) {
            (true, Some(text)) => json!({"index": 0, "finish_reason": finish,
                                         "delta": {"role": "assistant", "content": text}}),
            (true, None) => json!({"index": 0, "finish_reason": finish, "delta": {}}),
            (false, text) => json!({"index": 0, "finish_reason": finish,
                                    "text": text.unwrap_or("")}),
        };
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        json!({"id": "degraded", "object": object, "created": 0, "model": model,
               "choices": [choice]})
        .to_string()
    };
    vec![
        (None, chunk(Some(text), None)),
        (None, chunk(None, Some("stop"))),
        (None, "[DONE]".to_owned()),
    ]
}

fn anthropic_message(model: &str, text: &str) -> Value {
    json!({"id": "degraded", "type": "message", "role": "assistant", "model": model,
           "content": [{"type": "text", "text": text}],
           "stop_reason": "end_turn", "stop_sequence": null,
           "usage": {"input_tokens": 0, "output_tokens": 0}})
}

fn anthropic_events(model: &str, text: &str) -> Vec<(Option<&'static str>, String)> {
    let mut start = anthropic_message(model, text);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    vec![
        (
            Some("message_start"),
            json!({"type": "message_start", "message": start}).to_string(),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}})
            .to_string(),
        ),
        (
            Some("content_block_delta"),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": text}})
            .to_string(),
        ),
        (
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}).to_string(),
        ),
        (
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                   "stop_sequence": null}, "usage": {"output_tokens": 0}})
            .to_string(),
        ),
        (
            Some("message_stop"),
            json!({"type": "message_stop"}).to_string(),
        ),
    ]
}

/// What a request no canned text can answer gets: a 503 in the caller's format, with the hint.
fn unavailable(why: &Outcome, format: Format) -> Response<Bytes> {
    let refusal = Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "api_error",
        message: format!("no deployment could answer: {}", why.reason()),
    };
    let mut response = whole(&refusal.body(format));
    *response.status_mut() = refusal.status;
    let secs = why.retry_after().map_or(1, |wait| wait.as_secs().max(1));
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    response
}
