#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::Response;

use stormguard_classify::Verdict;

use super::*;
use crate::sse::{Frame, FrameKind, Parser, event, message};

use EventKind::{Content, Control, Done};

/// The kinds of the events of a whole stream, read in chunks of 7 bytes.
fn kinds_of(stream: &str) -> Vec<EventKind> {
    frames_of(stream)
        .into_iter()
        .filter_map(|frame| match frame.kind {
            FrameKind::Event(event) => Some(classify_event(&event)),
            FrameKind::Comment => None,
        })
        .collect()
}

fn frames_of(stream: &str) -> Vec<Frame> {
    let mut parser = Parser::new();
    let mut frames = Vec::new();
    for chunk in stream.as_bytes().chunks(7) {
        parser.feed(chunk, &mut frames).unwrap();
    }
    frames
}

fn error_of(event: &Event) -> Outcome {
    match classify_event(event) {
        EventKind::Error(outcome) => outcome,
        other => panic!("{event:?} is {other:?}, not an error"),
    }
}

/// What the crate's classifier says of `body` in a response with `status`.
fn http_outcome(status: u16, body: &str) -> Outcome {
    let (parts, ()) = Response::builder()
        .status(status)
        .body(())
        .unwrap()
        .into_parts();
    LlmClassifier::default().classify_http(&parts, body.as_bytes())
}

const OPENAI_CHAT: &str = r#"data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" there"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}

data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}

data: [DONE]

"#;

#[test]
fn an_openai_chat_stream() {
    assert_eq!(
        kinds_of(OPENAI_CHAT),
        [Control, Content, Content, Control, Control, Done]
    );
}

#[test]
fn openai_chunks_with_tool_calls_refusals_reasoning_or_legacy_text_are_content() {
    for delta in [
        r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
        r#"{"refusal":"I can't help with that."}"#,
        r#"{"role":"assistant","content":null,"function_call":{"name":"f","arguments":""}}"#,
        r#"{"reasoning_content":"Let me think"}"#,
        r#"{"reasoning":"Let me think"}"#,
        r#"{"audio":{"id":"audio_1","transcript":"Hi"}}"#,
    ] {
        let chunk = format!(
            r#"{{"object":"chat.completion.chunk","choices":[{{"index":0,"delta":{delta}}}]}}"#
        );
        assert_eq!(classify_event(&message(&chunk)), Content, "{delta}");
    }
    for delta in [
        r#"{"role":"assistant"}"#,
        r#"{"role":"assistant","content":"","refusal":null,"tool_calls":null}"#,
        r#"{"content":null}"#,
        r#"{"tool_calls":[]}"#,
        r#"{}"#,
    ] {
        let chunk = format!(
            r#"{{"object":"chat.completion.chunk","choices":[{{"index":0,"delta":{delta}}}]}}"#
        );
        assert_eq!(classify_event(&message(&chunk)), Control, "{delta}");
    }
    // Content in any choice (n > 1).
    let second =
        r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"B"}}]}"#;
    assert_eq!(classify_event(&message(second)), Content);
    // Legacy Completions.
    let text = r#"{"id":"cmpl-1","object":"text_completion","choices":[{"text":"Hello","index":0,"logprobs":null,"finish_reason":null}]}"#;
    assert_eq!(classify_event(&message(text)), Content);
    let empty = r#"{"id":"cmpl-1","object":"text_completion","choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"stop"}]}"#;
    assert_eq!(classify_event(&message(empty)), Control);
    // Azure's first chunk: prompt filter results, no choices.
    let azure = r#"{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}"#;
    assert_eq!(classify_event(&message(azure)), Control);
}

#[test]
fn the_done_sentinel_ends_the_stream() {
    assert_eq!(classify_event(&message("[DONE]")), Done);
    assert_eq!(classify_event(&message(" [DONE] ")), Done);
    assert_eq!(classify_event(&message("[done]")), Content);
}

const ANTHROPIC: &str = r#"event: message_start
data: {"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 15}}

event: message_stop
data: {"type": "message_stop"}

"#;

#[test]
fn an_anthropic_stream() {
    let expected = [
        Control, Control, Control, Content, Content, Control, Control, Done,
    ];
    assert_eq!(kinds_of(ANTHROPIC), expected);
    // The same stream through a proxy that drops the `event:` lines: the data's `type` decides.
    let without_names: String = ANTHROPIC
        .lines()
        .filter(|line| !line.starts_with("event:"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(kinds_of(&without_names), expected);
    // Tool input and thinking stream as deltas too.
    for delta in [
        r#"{"type": "input_json_delta", "partial_json": "{\"location\": \"San Fra"}"#,
        r#"{"type": "thinking_delta", "thinking": "Let me solve this"}"#,
    ] {
        let data = format!(r#"{{"type": "content_block_delta", "index": 0, "delta": {delta}}}"#);
        assert_eq!(
            classify_event(&event("content_block_delta", &data)),
            Content
        );
    }
}

#[test]
fn the_first_content_event_of_a_stream_ends_at_a_known_byte() {
    let frames = frames_of(ANTHROPIC);
    let first = frames
        .iter()
        .find(|frame| match &frame.kind {
            FrameKind::Event(event) => classify_event(event) == Content,
            FrameKind::Comment => false,
        })
        .unwrap();
    let end = usize::try_from(first.end).unwrap();
    assert!(ANTHROPIC[..end].ends_with("\"text\": \"Hello\"}}\n\n"));
}

/// Anthropic's documented error types ("Errors"), each with the status it comes under and what
/// it means for a retry.
const ANTHROPIC_ERRORS: [(u16, &str, Verdict, Reason); 9] = [
    (
        400,
        "invalid_request_error",
        Verdict::Fatal,
        Reason::BadRequest,
    ),
    (
        401,
        "authentication_error",
        Verdict::Fatal,
        Reason::Unauthorized,
    ),
    (403, "permission_error", Verdict::Fatal, Reason::Forbidden),
    (404, "not_found_error", Verdict::Fatal, Reason::NotFound),
    (
        413,
        "request_too_large",
        Verdict::Fatal,
        Reason::PayloadTooLarge,
    ),
    (
        429,
        "rate_limit_error",
        Verdict::Retryable,
        Reason::RateLimited,
    ),
    (500, "api_error", Verdict::Retryable, Reason::ServerError),
    (504, "timeout_error", Verdict::Retryable, Reason::Timeout),
    (
        529,
        "overloaded_error",
        Verdict::Retryable,
        Reason::Overloaded,
    ),
];

/// An error event of `error_type` is classified as documented, and like the same body under
/// its documented `status`.
fn assert_like_the_same_error_body(
    status: u16,
    error_type: &str,
    verdict: Verdict,
    reason: Reason,
) {
    let body = format!(
        r#"{{"type":"error","error":{{"type":"{error_type}","message":"..."}},"request_id":"req_1"}}"#
    );
    let outcome = error_of(&event("error", &body));
    assert_eq!(outcome.verdict(), verdict, "{error_type}");
    assert_eq!(outcome.reason(), reason, "{error_type}");
    assert_eq!(
        outcome.is_accepted(),
        verdict == Verdict::Fatal,
        "{error_type}"
    );
    assert_eq!(outcome, http_outcome(status, &body), "{error_type}");
}

#[test]
fn an_anthropic_error_event_is_classified_like_the_same_error_body() {
    let overloaded =
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#;
    let outcome = error_of(&event("error", overloaded));
    assert!(outcome.is_retryable());
    assert!(!outcome.is_accepted());
    assert_eq!(outcome.reason(), Reason::Overloaded);
    assert_eq!(outcome, http_outcome(529, overloaded));
    // Without the `event:` line, after a `200` whose stream started normally.
    let stream = format!(
        "event: message_start\ndata: {{\"type\": \"message_start\", \"message\": {{}}}}\n\n\
         event: ping\ndata: {{\"type\": \"ping\"}}\n\n: keep-alive\n\ndata: {overloaded}\n\n"
    );
    assert_eq!(
        kinds_of(&stream),
        [Control, Control, EventKind::Error(outcome)]
    );

    // Each documented error type, as the same body under its documented status.
    for (status, error_type, verdict, reason) in ANTHROPIC_ERRORS {
        assert_like_the_same_error_body(status, error_type, verdict, reason);
    }
    // The message names a generic fatal answer, as for a response.
    let too_long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
    assert_eq!(
        error_of(&event("error", too_long)),
        Outcome::fatal(Reason::ContextTooLong)
    );
    let spend_limit = r#"{"type":"error","error":{"type":"rate_limit_error","message":"...","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
    assert_eq!(
        error_of(&event("error", spend_limit)),
        Outcome::fatal(Reason::QuotaExhausted)
    );
}

#[test]
fn an_openai_error_frame_is_classified_like_the_same_error_body() {
    for (status, body, expected) in [
        (
            500,
            r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            Outcome::retryable(Reason::ServerError),
        ),
        (
            429,
            r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
            Outcome::retryable(Reason::RateLimited),
        ),
        (
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
            Outcome::fatal(Reason::QuotaExhausted),
        ),
        (
            400,
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            Outcome::fatal(Reason::ContextTooLong),
        ),
        (
            400,
            r#"{"error":{"message":"Invalid value for 'temperature'.","type":"invalid_request_error","param":"temperature","code":null}}"#,
            Outcome::fatal(Reason::BadRequest),
        ),
    ] {
        assert_eq!(error_of(&message(body)), expected, "{body}");
        assert_eq!(http_outcome(status, body), expected, "{body}");
    }
    // After the stream started: the error comes after a role-only chunk.
    let stream = format!(
        "{}\n\ndata: {{\"error\":{{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}}}\n\n",
        OPENAI_CHAT.split("\n\n").next().unwrap()
    );
    assert_eq!(
        kinds_of(&stream),
        [
            Control,
            EventKind::Error(Outcome::retryable(Reason::ServerError))
        ]
    );
    // An `error` that is null is no error.
    let null = r#"{"error":null,"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#;
    assert_eq!(classify_event(&message(null)), Content);
}

#[test]
fn gemini_chunks_and_errors() {
    let text = r#"{"candidates": [{"content": {"parts": [{"text": "Hello"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"totalTokenCount": 4},"modelVersion": "gemini-2.5-flash"}"#;
    assert_eq!(classify_event(&message(text)), Content);
    let call = r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f","args": {}}}],"role": "model"}}]}"#;
    assert_eq!(classify_event(&message(call)), Content);
    let last = r#"{"candidates": [{"content": {"parts": [{"text": ""}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 2,"totalTokenCount": 6}}"#;
    assert_eq!(classify_event(&message(last)), Control);
    let no_content = r#"{"candidates": [{"finishReason": "SAFETY","index": 0}]}"#;
    assert_eq!(classify_event(&message(no_content)), Control);

    let unavailable = r#"{"error": {"code": 503,"message": "The model is overloaded. Please try again later.","status": "UNAVAILABLE"}}"#;
    assert_eq!(
        error_of(&message(unavailable)),
        Outcome::retryable(Reason::Unavailable)
    );
    assert_eq!(
        error_of(&message(unavailable)),
        http_outcome(503, unavailable)
    );
    // A per-minute quota with its `RetryInfo`: retryable after the delay; a daily one: fatal.
    let per_minute = r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34s"}]}}"#;
    let outcome = error_of(&message(per_minute));
    assert_eq!(
        outcome,
        Outcome::retryable(Reason::RateLimited).with_retry_after(Some(Duration::from_secs(34)))
    );
    assert_eq!(outcome, http_outcome(429, per_minute));
    let daily = per_minute.replace("PerMinute", "PerDay");
    assert_eq!(
        error_of(&message(&daily)),
        Outcome::fatal(Reason::QuotaExhausted)
    );
}

#[test]
fn an_openai_responses_stream() {
    let names = [
        ("response.created", Control),
        ("response.in_progress", Control),
        ("response.output_item.added", Control),
        ("response.content_part.added", Control),
        ("response.output_text.delta", Content),
        ("response.output_text.done", Control),
        ("response.content_part.done", Control),
        ("response.output_item.done", Control),
        ("response.function_call_arguments.delta", Content),
        ("response.refusal.delta", Content),
        ("response.image_generation_call.partial_image", Content),
        ("response.completed", Done),
        ("response.incomplete", Done),
    ];
    for (name, expected) in names {
        let data = format!(r#"{{"type":"{name}","sequence_number":1}}"#);
        assert_eq!(classify_event(&event(name, &data)), expected, "{name}");
        assert_eq!(classify_event(&message(&data)), expected, "{name} as data");
    }
    let failed = r#"{"type":"response.failed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}"#;
    assert_eq!(
        error_of(&event("response.failed", failed)),
        Outcome::retryable(Reason::ServerError)
    );
    let invalid = failed.replace("server_error", "invalid_prompt");
    assert_eq!(
        error_of(&event("response.failed", &invalid)),
        Outcome::fatal(Reason::BadRequest)
    );
    let error = r#"{"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached","param":null,"sequence_number":2}"#;
    assert_eq!(
        error_of(&event("error", error)),
        Outcome::retryable(Reason::RateLimited)
    );
}

#[test]
fn an_error_of_no_known_kind_is_retryable_and_not_accepted() {
    assert!(UNRECOGNIZED_ERROR.is_retryable());
    assert!(!UNRECOGNIZED_ERROR.is_accepted());
    assert_eq!(UNRECOGNIZED_ERROR.reason(), Reason::ServerError);
    for data in [
        "",
        "oops",
        "{",
        "{}",
        r#"{"type":"error","error":{"type":"brand_new_error","message":"?"}}"#,
        r#"{"type":"error","error":{"type":"brand_new_error","message":"prompt is too long"}}"#,
        "[1, 2]",
    ] {
        assert_eq!(
            classify_event(&event("error", data)),
            EventKind::Error(UNRECOGNIZED_ERROR),
            "{data:?}"
        );
    }
    let string = r#"{"error":"something broke"}"#;
    assert_eq!(error_of(&message(string)), UNRECOGNIZED_ERROR);
    let failed = r#"{"type":"response.failed","response":{"status":"failed","error":null}}"#;
    assert_eq!(error_of(&message(failed)), UNRECOGNIZED_ERROR);
}

#[test]
fn events_of_unknown_shape_are_content_and_empty_ones_control() {
    for (event_type, data) in [
        ("message", "hello"),
        ("message", "42"),
        ("message", r#"{"foo":1}"#),
        ("message", r#"{"type":"completion","completion":" Hi"}"#),
        ("message", "[1,2]"),
        ("message", "{not json"),
        ("update", "{}"),
        ("message", r#"{"choices":"x"}"#),
    ] {
        assert_eq!(
            classify_event(&event(event_type, data)),
            Content,
            "{event_type} {data}"
        );
    }
    assert_eq!(classify_event(&message("")), Control);
    assert_eq!(classify_event(&message(" \n ")), Control);
    assert_eq!(classify_event(&event("ping", "")), Control);
    assert_eq!(classify_event(&event("ping", "{}")), Control);
}
