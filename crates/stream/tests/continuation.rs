//! Continuing a cut stream, read back as a caller reads it: the transcript of what the caller
//! saw, the continuation's request body, and the splice of its answer into the caller's stream,
//! for OpenAI Chat Completions and Anthropic Messages.

#![allow(clippy::unwrap_used)]

use std::ops::Range;

use proptest::prelude::*;
use serde_json::{Value, json};
use stormguard_classify::Reason;
use stormguard_stream::continuation::{
    Format, NotContinuable, Splice, Transcript, continuation_body, error_event, terminal_event,
};
use stormguard_stream::sse::{Event, EventKind, FrameKind, Parser, classify_event};

/// The events of a stream's bytes, as the caller's SSE reader sees them.
fn events(stream: &[u8]) -> Vec<Event> {
    let mut frames = Vec::new();
    Parser::new().feed(stream, &mut frames).unwrap();
    frames
        .into_iter()
        .filter_map(|frame| match frame.kind {
            FrameKind::Event(event) => Some(event),
            FrameKind::Comment => None,
        })
        .collect()
}

fn data(event: &Event) -> Value {
    serde_json::from_str(&event.data).unwrap()
}

/// A transcript of every event of `stream`.
fn transcript_of(format: Format, stream: &str) -> Transcript {
    let mut transcript = Transcript::new(format);
    for event in events(stream.as_bytes()) {
        transcript.read(&event);
    }
    transcript
}

/// What the splice hands the caller of the continuation `stream`.
fn spliced(splice: &mut Splice, stream: &str) -> String {
    let bytes: Vec<u8> = events(stream.as_bytes())
        .iter()
        .filter_map(|event| splice.event(event))
        .flatten()
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Tokens as a tokenizer splits "w0 w1 w2 ...": each with its leading space.
fn tokens(range: Range<usize>) -> Vec<String> {
    range.map(|at| format!(" w{at}")).collect()
}

/// The body of the request that continues `transcript`'s answer to `request`, as JSON.
fn continuation_json(transcript: &Transcript, request: &Value) -> Result<Value, NotContinuable> {
    let body = continuation_body(transcript, request.to_string().as_bytes())?;
    Ok(serde_json::from_slice(&body).unwrap())
}

/// One OpenAI Chat Completions stream's chunks.
struct Chat {
    id: &'static str,
    created: u64,
    model: &'static str,
    fingerprint: &'static str,
}

const FIRST_CHAT: Chat = Chat {
    id: "chatcmpl-first",
    created: 1_700_000_000,
    model: "gpt-4o-2024-08-06",
    fingerprint: "fp_first",
};

const SECOND_CHAT: Chat = Chat {
    id: "chatcmpl-second",
    created: 1_700_000_042,
    model: "gpt-4o-2024-11-20",
    fingerprint: "fp_second",
};

const DONE: &str = "data: [DONE]\n\n";

impl Chat {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        });
        // With `stream_options.include_usage`, every chunk but the last has `"usage": null`.
        chunk["usage"] = usage.unwrap_or(Value::Null);
        format!("data: {chunk}\n\n")
    }

    fn delta(&self, delta: Value, finish_reason: Value) -> String {
        let choice = json!({"index": 0, "delta": delta, "finish_reason": finish_reason});
        self.chunk(json!([choice]), None)
    }

    fn role(&self) -> String {
        self.delta(
            json!({"role": "assistant", "content": "", "refusal": null}),
            Value::Null,
        )
    }

    fn text(&self, text: &str) -> String {
        self.delta(json!({"content": text}), Value::Null)
    }

    fn finish(&self) -> String {
        self.delta(json!({}), json!("stop"))
    }

    fn usage(&self, prompt: u64, completion: u64) -> String {
        let usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        });
        self.chunk(json!([]), Some(usage))
    }

    /// The opening chunk and one chunk per token: a stream cut before its end.
    fn answer(&self, tokens: &[String]) -> String {
        let texts: String = tokens.iter().map(|token| self.text(token)).collect();
        self.role() + &texts
    }
}

/// The text of a caller's OpenAI chunks.
fn chat_text(events: &[Event]) -> String {
    events
        .iter()
        .filter(|event| event.data != "[DONE]")
        .filter_map(|event| {
            data(event)["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// One Anthropic Messages event.
fn sse(event_type: &str, data: Value) -> String {
    format!("event: {event_type}\ndata: {data}\n\n")
}

fn message_start(id: &str, input_tokens: u64) -> String {
    let message = json!({
        "id": id, "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    });
    sse(
        "message_start",
        json!({"type": "message_start", "message": message}),
    )
}

fn block_start(index: u64, block: Value) -> String {
    let start = json!({"type": "content_block_start", "index": index, "content_block": block});
    sse("content_block_start", start)
}

fn text_start(index: u64) -> String {
    block_start(index, json!({"type": "text", "text": ""}))
}

fn block_delta(index: u64, delta: Value) -> String {
    let event = json!({"type": "content_block_delta", "index": index, "delta": delta});
    sse("content_block_delta", event)
}

fn text_delta(index: u64, text: &str) -> String {
    block_delta(index, json!({"type": "text_delta", "text": text}))
}

fn block_stop(index: u64) -> String {
    sse(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

fn message_delta(output_tokens: u64) -> String {
    let delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
        "usage": {"output_tokens": output_tokens},
    });
    sse("message_delta", delta)
}

const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
const MESSAGE_STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// A message's opening, a text block at `index` and its deltas: a stream cut inside the block.
fn messages_answer(id: &str, index: u64, tokens: &[String]) -> String {
    let deltas: String = tokens
        .iter()
        .map(|token| text_delta(index, token))
        .collect();
    message_start(id, 12) + &text_start(index) + PING + &deltas
}

/// The text of a caller's Anthropic events.
fn messages_text(events: &[Event]) -> String {
    events
        .iter()
        .filter(|event| event.event_type == "content_block_delta")
        .filter_map(|event| data(event)["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// The indices of the caller's events of one type.
fn indices(events: &[Event], event_type: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|event| event.event_type == event_type)
        .map(|event| data(event)["index"].as_u64().unwrap())
        .collect()
}

fn of_type<'a>(events: &'a [Event], event_type: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|event| event.event_type == event_type)
        .collect()
}

fn chat_request(max_tokens: u64) -> Value {
    json!({
        "model": "gpt-4o",
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": "Count."},
            {"role": "user", "content": "Count to 60."},
        ],
    })
}

fn messages_request(max_tokens: u64, messages: Value) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "stream": true,
        "max_tokens": max_tokens,
        "system": "Count.",
        "messages": messages,
    })
}

fn user_asks() -> Value {
    json!([{"role": "user", "content": "Count to 60."}])
}

#[test]
fn openai_cut_after_40_of_60_tokens_is_continued_with_the_other_20() {
    let all = tokens(0..60);
    let first = FIRST_CHAT.answer(&all[..40]);
    let transcript = transcript_of(Format::OpenAiChat, &first);
    assert_eq!(transcript.text(), all[..40].concat());
    assert_eq!(
        (transcript.content_events(), transcript.output_tokens()),
        (40, 40)
    );
    assert!(!transcript.finished() && !transcript.terminal_seen());
    assert_eq!(transcript.continuable(), Ok(()));

    let body = continuation_json(&transcript, &chat_request(100)).unwrap();
    let mut expected = chat_request(60);
    expected["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": all[..40].concat()}));
    assert_eq!(body, expected);

    let second =
        SECOND_CHAT.answer(&all[40..]) + &SECOND_CHAT.finish() + &SECOND_CHAT.usage(50, 20) + DONE;
    let mut splice = Splice::new(&transcript);
    let caller = events((first + &spliced(&mut splice, &second)).as_bytes());
    assert_eq!(chat_text(&caller), all.concat());
    assert_eq!(
        (
            splice.content_events(),
            splice.terminal_seen(),
            splice.error()
        ),
        (20, true, None)
    );

    let (done, chunks) = caller.split_last().unwrap();
    assert_eq!(done.data, "[DONE]");
    let chunks: Vec<Value> = chunks.iter().map(data).collect();
    assert!(
        chunks
            .iter()
            .all(|chunk| chunk["id"] == "chatcmpl-first" && chunk["created"] == 1_700_000_000)
    );
    // Each chunk names the model that wrote it: the first 40 tokens the original's, the rest the
    // continuation's.
    let models: Vec<&str> = chunks.iter().filter_map(|c| c["model"].as_str()).collect();
    assert_eq!(models.first(), Some(&"gpt-4o-2024-08-06"));
    assert_eq!(models.last(), Some(&"gpt-4o-2024-11-20"));
    // One opening chunk, one finish, all for choice 0; the fingerprint says which backend.
    let roles = chunks
        .iter()
        .filter(|chunk| chunk["choices"][0]["delta"]["role"] == "assistant");
    assert_eq!(roles.count(), 1);
    let finishes = chunks
        .iter()
        .filter(|chunk| chunk["choices"][0]["finish_reason"] == "stop");
    assert_eq!(finishes.count(), 1);
    assert_eq!(chunks[41]["system_fingerprint"], "fp_second");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage,
        &json!({"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                "stormguard": {"continued": true}})
    );
}

#[test]
fn openai_usage_is_summed_with_the_usage_the_original_reported() {
    let all = tokens(0..60);
    // A server that reports usage as it goes: its count, not the chunks, says what was delivered.
    let first = FIRST_CHAT.answer(&all[..40]) + &FIRST_CHAT.usage(10, 38);
    let transcript = transcript_of(Format::OpenAiChat, &first);
    assert_eq!(transcript.output_tokens(), 38);
    assert_eq!(
        continuation_json(&transcript, &chat_request(100)).unwrap()["max_tokens"],
        62
    );

    let second = SECOND_CHAT.answer(&all[40..]) + &SECOND_CHAT.usage(50, 20) + DONE;
    let out = events(spliced(&mut Splice::new(&transcript), &second).as_bytes());
    let usage = &data(&out[out.len() - 2])["usage"];
    assert_eq!(
        usage,
        &json!({"prompt_tokens": 60, "completion_tokens": 58, "total_tokens": 118,
                "stormguard": {"continued": true}})
    );
}

#[test]
fn openai_prefill_keeps_its_whitespace_and_reduces_both_limits() {
    let first = FIRST_CHAT.answer(&["Hello".into(), " world".into(), ".\n\n".into()]);
    let transcript = transcript_of(Format::OpenAiChat, &first);
    let mut request = chat_request(100);
    request["max_completion_tokens"] = json!(50);
    let body = continuation_json(&transcript, &request).unwrap();
    assert_eq!(body["messages"][2]["content"], "Hello world.\n\n");
    assert_eq!(
        (&body["max_tokens"], &body["max_completion_tokens"]),
        (&json!(97), &json!(47))
    );

    let out = spliced(&mut Splice::new(&transcript), &SECOND_CHAT.text("Next"));
    assert_eq!(chat_text(&events(out.as_bytes())), "Next");
}

#[test]
fn anthropic_cut_after_40_of_60_tokens_is_continued_in_the_open_block() {
    let all = tokens(0..60);
    let first = messages_answer("msg_first", 0, &all[..40]);
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    assert_eq!(transcript.text(), all[..40].concat());
    assert_eq!(
        (transcript.content_events(), transcript.output_tokens()),
        (40, 40)
    );
    assert_eq!(transcript.continuable(), Ok(()));

    let body = continuation_json(&transcript, &messages_request(100, user_asks())).unwrap();
    let messages = json!([
        {"role": "user", "content": "Count to 60."},
        {"role": "assistant", "content": all[..40].concat()},
    ]);
    assert_eq!(body, messages_request(60, messages));

    let deltas: String = all[40..].iter().map(|token| text_delta(0, token)).collect();
    let second = message_start("msg_second", 52)
        + &text_start(0)
        + PING
        + &deltas
        + &block_stop(0)
        + &message_delta(20)
        + MESSAGE_STOP;
    let mut splice = Splice::new(&transcript);
    let caller = events((first + &spliced(&mut splice, &second)).as_bytes());
    assert_eq!(messages_text(&caller), all.concat());
    assert_eq!(
        (
            splice.content_events(),
            splice.terminal_seen(),
            splice.error()
        ),
        (20, true, None)
    );

    let starts = of_type(&caller, "message_start");
    assert_eq!(starts.len(), 1);
    assert_eq!(data(starts[0])["message"]["id"], "msg_first");
    assert_eq!(indices(&caller, "content_block_start"), [0]);
    assert!(
        indices(&caller, "content_block_delta")
            .iter()
            .all(|&index| index == 0)
    );
    assert_eq!(indices(&caller, "content_block_stop"), [0]);
    assert_eq!(of_type(&caller, "ping").len(), 2);
    assert_eq!(caller.last().unwrap().event_type, "message_stop");
    assert_eq!(of_type(&caller, "message_stop").len(), 1);
    let delta = data(of_type(&caller, "message_delta")[0]);
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(
        delta["usage"],
        json!({"output_tokens": 60, "input_tokens": 64, "stormguard": {"continued": true}})
    );
}

#[test]
fn anthropic_blocks_after_a_closed_one_are_numbered_after_it() {
    let first = messages_answer("msg_first", 0, &tokens(0..3)) + &block_stop(0);
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    let second = message_start("msg_second", 20)
        + &text_start(0)
        + &text_delta(0, " w3")
        + &block_stop(0)
        + &text_start(1)
        + &text_delta(1, " w4")
        + &block_stop(1)
        + &message_delta(2)
        + MESSAGE_STOP;
    let caller = events((first + &spliced(&mut Splice::new(&transcript), &second)).as_bytes());
    assert_eq!(messages_text(&caller), tokens(0..5).concat());
    assert_eq!(indices(&caller, "content_block_start"), [0, 1, 2]);
    assert_eq!(indices(&caller, "content_block_delta"), [0, 0, 0, 1, 2]);
    assert_eq!(indices(&caller, "content_block_stop"), [0, 1, 2]);
    let usage = &data(of_type(&caller, "message_delta")[0])["usage"];
    assert_eq!(
        (&usage["output_tokens"], &usage["input_tokens"]),
        (&json!(5), &json!(32))
    );
}

#[test]
fn anthropic_later_blocks_follow_the_open_block_they_continue() {
    // The original's second block was open when the stream was cut.
    let first = message_start("msg_first", 12)
        + &text_start(0)
        + &text_delta(0, " w0")
        + &block_stop(0)
        + &text_start(1)
        + &text_delta(1, " w1");
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    let second = message_start("msg_second", 20)
        + &text_start(0)
        + &text_delta(0, " w2")
        + &block_stop(0)
        + &text_start(1)
        + &text_delta(1, " w3")
        + &block_stop(1)
        + MESSAGE_STOP;
    let caller = events((first + &spliced(&mut Splice::new(&transcript), &second)).as_bytes());
    assert_eq!(messages_text(&caller), tokens(0..4).concat());
    assert_eq!(indices(&caller, "content_block_start"), [0, 1, 2]);
    assert_eq!(indices(&caller, "content_block_delta"), [0, 1, 1, 2]);
    assert_eq!(indices(&caller, "content_block_stop"), [0, 1, 2]);
}

#[test]
fn anthropic_open_block_is_closed_when_the_continuation_starts_another_kind() {
    let first = messages_answer("msg_first", 0, &tokens(0..2));
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    let tool = json!({"type": "tool_use", "id": "toolu_1", "name": "count", "input": {}});
    let second = message_start("msg_second", 20)
        + &block_start(0, tool)
        + &block_delta(0, json!({"type": "input_json_delta", "partial_json": "{}"}))
        + &block_stop(0);
    let caller = events((first + &spliced(&mut Splice::new(&transcript), &second)).as_bytes());
    assert_eq!(indices(&caller, "content_block_start"), [0, 1]);
    assert_eq!(indices(&caller, "content_block_stop"), [0, 1]);
    // The original's block is closed before the tool's opens.
    let order: Vec<&str> = caller[caller.len() - 4..]
        .iter()
        .map(|event| event.event_type.as_str())
        .collect();
    assert_eq!(
        order,
        [
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop"
        ]
    );
}

#[test]
fn anthropic_prefill_loses_its_trailing_whitespace_and_the_caller_sees_it_once() {
    let first = messages_answer(
        "msg_first",
        0,
        &["Hello".into(), " world".into(), ".\n\n".into()],
    );
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    let body = continuation_json(&transcript, &messages_request(100, user_asks())).unwrap();
    assert_eq!(body["messages"][1]["content"], "Hello world.");
    assert_eq!(body["max_tokens"], 97);

    // The model goes on from "Hello world." and writes the paragraph break again, whole or in
    // two deltas; the caller has seen it.
    for deltas in [&["\n\nNext", " line."][..], &["\n", "\nNext", " line."]] {
        let deltas: String = deltas.iter().map(|text| text_delta(0, text)).collect();
        let second = message_start("msg_second", 20) + &text_start(0) + &deltas + &block_stop(0);
        let mut splice = Splice::new(&transcript);
        let caller = events((first.clone() + &spliced(&mut splice, &second)).as_bytes());
        assert_eq!(messages_text(&caller), "Hello world.\n\nNext line.");
        assert_eq!(splice.content_events(), 2);
    }
}

#[test]
fn an_assistant_prefill_in_the_request_is_extended() {
    let first = messages_answer("msg_first", 0, &tokens(0..2));
    let transcript = transcript_of(Format::AnthropicMessages, &first);
    let as_string = json!([
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "Counting:"},
    ]);
    let body = continuation_json(&transcript, &messages_request(100, as_string)).unwrap();
    assert_eq!(body["messages"].as_array().unwrap().len(), 2);
    assert_eq!(body["messages"][1]["content"], "Counting: w0 w1");

    let as_parts = json!([
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": [{"type": "text", "text": "Counting:"}]},
    ]);
    let body = continuation_json(&transcript, &messages_request(100, as_parts)).unwrap();
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"type": "text", "text": "Counting: w0 w1"}])
    );
}

#[test]
fn tool_calls_and_other_content_are_not_text() {
    let tool_call = FIRST_CHAT.delta(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "count", "arguments": ""}}]}),
        Value::Null,
    );
    let chat = transcript_of(
        Format::OpenAiChat,
        &(FIRST_CHAT.answer(&tokens(0..3)) + &tool_call),
    );
    let opened = messages_answer("msg_first", 0, &tokens(0..3)) + &block_stop(0);
    let tool = json!({"type": "tool_use", "id": "toolu_1", "name": "count", "input": {}});
    let input_json = json!({"type": "input_json_delta", "partial_json": "{\"to\""});
    let thinking = json!({"type": "thinking_delta", "thinking": "Let me count."});
    let anthropic = [
        opened.clone() + &block_start(1, tool),
        opened.clone() + &block_delta(1, input_json),
        message_start("msg_first", 12) + &block_delta(0, thinking),
    ];
    let transcripts = anthropic
        .iter()
        .map(|stream| transcript_of(Format::AnthropicMessages, stream))
        .chain([chat]);
    for transcript in transcripts {
        assert_eq!(transcript.continuable(), Err(NotContinuable::NotText));
        assert_eq!(
            continuation_json(&transcript, &messages_request(100, user_asks())),
            Err(NotContinuable::NotText)
        );
    }
}

#[test]
fn several_choices_cannot_be_continued() {
    let second_choice = FIRST_CHAT.chunk(
        json!([{"index": 1, "delta": {"content": " other"}, "finish_reason": null}]),
        None,
    );
    let stream = FIRST_CHAT.answer(&tokens(0..3)) + &second_choice;
    let transcript = transcript_of(Format::OpenAiChat, &stream);
    assert_eq!(
        transcript.continuable(),
        Err(NotContinuable::SeveralChoices)
    );
    // A request for two choices, cut before the second showed.
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..3)));
    let mut request = chat_request(100);
    request["n"] = json!(2);
    assert_eq!(
        continuation_json(&transcript, &request),
        Err(NotContinuable::SeveralChoices)
    );
}

#[test]
fn a_stream_without_text_has_nothing_to_continue() {
    let cases = [
        (Format::OpenAiChat, FIRST_CHAT.role()),
        (Format::OpenAiChat, FIRST_CHAT.answer(&["\n".into()])),
        (
            Format::AnthropicMessages,
            message_start("msg_first", 12) + &text_start(0) + PING,
        ),
    ];
    for (format, stream) in cases {
        let transcript = transcript_of(format, &stream);
        assert_eq!(transcript.continuable(), Err(NotContinuable::Nothing));
    }
}

#[test]
fn a_limit_the_delivered_tokens_used_up_leaves_nothing_to_ask_for() {
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..40)));
    assert_eq!(
        continuation_json(&transcript, &chat_request(40)),
        Err(NotContinuable::TooLong)
    );
    let mut request = chat_request(41);
    request["max_completion_tokens"] = json!(30);
    assert_eq!(
        continuation_json(&transcript, &request),
        Err(NotContinuable::TooLong)
    );
}

#[test]
fn a_body_that_is_not_a_chat_request_is_refused() {
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..3)));
    let assistant_number = r#"{"messages":[{"role":"assistant","content":7}]}"#;
    for body in [
        "not json",
        "[1, 2]",
        r#"{"model":"m"}"#,
        r#"{"messages":[]}"#,
        assistant_number,
    ] {
        assert_eq!(
            continuation_body(&transcript, body.as_bytes()),
            Err(NotContinuable::BadRequestBody),
            "{body}"
        );
    }
}

#[test]
fn a_finished_answer_is_ended_not_continued() {
    let chat = FIRST_CHAT.answer(&tokens(0..3)) + &FIRST_CHAT.finish();
    let messages =
        messages_answer("msg_first", 0, &tokens(0..3)) + &block_stop(0) + &message_delta(3);
    for (format, stream) in [
        (Format::OpenAiChat, chat),
        (Format::AnthropicMessages, messages),
    ] {
        let transcript = transcript_of(format, &stream);
        assert!(transcript.finished() && !transcript.terminal_seen());
        assert_eq!(transcript.continuable(), Err(NotContinuable::Finished));
        let [end] = &events(&terminal_event(format))[..] else {
            panic!("one terminal event");
        };
        assert_eq!(classify_event(end), EventKind::Done);
        let mut ended = transcript.clone();
        ended.read(end);
        assert!(ended.terminal_seen());
    }
    assert_eq!(terminal_event(Format::OpenAiChat), DONE);
    assert_eq!(terminal_event(Format::AnthropicMessages), MESSAGE_STOP);
}

#[test]
fn an_error_before_the_continuation_s_content_is_dropped_and_reported() {
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..3)));
    let mut splice = Splice::new(&transcript);
    let rate_limited = r#"data: {"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}

"#;
    let second = SECOND_CHAT.role() + rate_limited + &SECOND_CHAT.text(" w3") + DONE;
    assert_eq!(spliced(&mut splice, &second), "");
    assert_eq!(
        splice.error().map(|outcome| outcome.reason()),
        Some(Reason::RateLimited)
    );
    assert_eq!(
        (splice.content_events(), splice.terminal_seen()),
        (0, false)
    );

    let transcript = transcript_of(
        Format::AnthropicMessages,
        &messages_answer("msg_first", 0, &tokens(0..3)),
    );
    let mut splice = Splice::new(&transcript);
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let second = message_start("msg_second", 20) + &sse("error", overloaded);
    assert_eq!(spliced(&mut splice, &second), "");
    let outcome = splice.error().unwrap();
    assert!(outcome.is_retryable());
    assert_eq!(outcome.reason(), Reason::Overloaded);
}

#[test]
fn an_error_after_the_continuation_s_content_ends_what_is_passed() {
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..3)));
    let mut splice = Splice::new(&transcript);
    let overloaded = r#"data: {"error":{"message":"Overloaded","type":"server_error","code":null}}

"#;
    let second = SECOND_CHAT.role()
        + &SECOND_CHAT.text(" w3")
        + overloaded
        + &SECOND_CHAT.text(" w4")
        + DONE;
    let out = events(spliced(&mut splice, &second).as_bytes());
    assert_eq!(chat_text(&out), " w3");
    assert_eq!(out.len(), 1);
    assert!(splice.error().is_some());
    assert_eq!(
        (splice.content_events(), splice.terminal_seen()),
        (1, false)
    );
}

#[test]
fn nothing_passes_after_the_terminal_event() {
    let transcript = transcript_of(Format::OpenAiChat, &FIRST_CHAT.answer(&tokens(0..3)));
    let mut splice = Splice::new(&transcript);
    let second = SECOND_CHAT.text(" w3") + DONE + &SECOND_CHAT.text(" w4") + DONE;
    assert_eq!(spliced(&mut splice, &second).matches("data: ").count(), 2);
}

#[test]
fn unknown_events_pass_through_unchanged() {
    let cases = [
        (Format::OpenAiChat, "data: not json\n\n"),
        (
            Format::OpenAiChat,
            "event: custom\ndata: line one\ndata: line two\n\n",
        ),
        (
            Format::AnthropicMessages,
            "event: custom\ndata: {\"type\": \"custom\", \"n\": 1}\n\n",
        ),
        (
            Format::AnthropicMessages,
            "event: content_block_delta\ndata: {\"index\": \n\n",
        ),
        (Format::AnthropicMessages, PING),
    ];
    for (format, event) in cases {
        let transcript = transcript_of(format, "");
        assert_eq!(spliced(&mut Splice::new(&transcript), event), event);
    }
}

#[test]
fn error_events_read_as_each_provider_s_error() {
    let [openai] = &events(&error_event(Format::OpenAiChat, "reset", 12, 3456))[..] else {
        panic!("one event");
    };
    assert_eq!(openai.event_type, "message");
    let error = &data(openai)["error"];
    assert_eq!(
        (&error["type"], &error["code"], &error["param"]),
        (
            &json!("stream_interrupted"),
            &json!("stream_interrupted"),
            &Value::Null
        )
    );
    let message = error["message"].as_str().unwrap();
    for said in ["interrupted", "reset", "12 content events", "3456 bytes"] {
        assert!(message.contains(said), "{message}");
    }
    assert!(matches!(classify_event(openai), EventKind::Error(_)));

    let [anthropic] = &events(&error_event(Format::AnthropicMessages, "idle", 3, 90))[..] else {
        panic!("one event");
    };
    assert_eq!(anthropic.event_type, "error");
    let data = data(anthropic);
    assert_eq!(
        (&data["type"], &data["error"]["type"]),
        (&json!("error"), &json!("api_error"))
    );
    let message = data["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("idle") && message.contains("3 content events"),
        "{message}"
    );
    assert!(matches!(classify_event(anthropic), EventKind::Error(_)));
}

#[test]
fn the_format_is_read_from_the_request_path() {
    let format = |uri: &str| {
        let (head, ()) = http::Request::post(uri).body(()).unwrap().into_parts();
        Format::of_request(&head)
    };
    assert_eq!(
        format("https://api.openai.com/v1/chat/completions"),
        Some(Format::OpenAiChat)
    );
    assert_eq!(
        format("/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"),
        Some(Format::OpenAiChat)
    );
    assert_eq!(
        format("https://api.anthropic.com/v1/messages"),
        Some(Format::AnthropicMessages)
    );
    assert_eq!(
        format("/v1/messages?beta=true"),
        Some(Format::AnthropicMessages)
    );
    for other in [
        "/v1/completions",
        "/v1/responses",
        "/v1/messages/count_tokens",
        "/",
    ] {
        assert_eq!(format(other), None, "{other}");
    }
    assert_eq!(Format::OpenAiChat.as_str(), "openai_chat");
    assert_eq!(Format::AnthropicMessages.as_str(), "anthropic_messages");
}

/// Names and members the formats use, so that random events reach deep into the readers.
const NAMES: [&str; 14] = [
    "message",
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "text",
    "text_delta",
    "input_json_delta",
    "assistant",
    "[DONE]",
];
const KEYS: [&str; 16] = [
    "type",
    "index",
    "delta",
    "content",
    "content_block",
    "text",
    "choices",
    "usage",
    "message",
    "finish_reason",
    "stop_reason",
    "output_tokens",
    "input_tokens",
    "id",
    "role",
    "error",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        "[ a-z\n]{0,6}".prop_map(Value::from),
        prop::sample::select(NAMES.to_vec()).prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..6).prop_map(
                |members| Value::Object(
                    members
                        .into_iter()
                        .map(|(key, value)| (key.to_owned(), value))
                        .collect()
                )
            ),
        ]
    })
}

fn any_event() -> impl Strategy<Value = Event> {
    let event_type = prop_oneof![
        prop::sample::select(NAMES.to_vec()).prop_map(str::to_owned),
        ".*"
    ];
    let data = prop_oneof![json_value().prop_map(|json| json.to_string()), ".*"];
    (event_type, data).prop_map(|(event_type, data)| Event {
        event_type,
        data,
        id: None,
        retry: None,
    })
}

proptest! {
    #[test]
    fn transcripts_and_splices_never_panic(
        original in prop::collection::vec(any_event(), 0..12),
        continuation in prop::collection::vec(any_event(), 0..12),
        body in prop_oneof![json_value().prop_map(|json| json.to_string()), ".*"],
    ) {
        for format in [Format::OpenAiChat, Format::AnthropicMessages] {
            let mut transcript = Transcript::new(format);
            for event in &original {
                transcript.read(event);
            }
            let _ = continuation_body(&transcript, body.as_bytes());
            let mut splice = Splice::new(&transcript);
            for event in &continuation {
                if let Some(bytes) = splice.event(event) {
                    prop_assert!(!bytes.is_empty());
                }
            }
        }
    }
}
