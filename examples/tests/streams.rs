//! The mock streams like a provider (`"stream": true`), OpenAI's chunks and Anthropic's events,
//! goes on after an assistant prefill, fails streams as configured, and `stormguard::ClientLayer`
//! over a hyper client handles its two stream faults: an error before content is retried into a
//! clean stream, a cut after content is continued into one whole answer (or, with continuation
//! off, ends the body with the in-band error and `StreamInterrupted`).

#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::time::Duration;

use axum::body::{Body, Bytes};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::ClientLayer;
use stormguard::jitter::FullJitter;
use stormguard::stream::{InterruptCause, StreamInterrupted};
use stormguard_examples::mock::{self, Fault, MockConfig, Transcript};
use tower::{Layer, ServiceExt};

/// A streaming request for 6 tokens.
const STREAM: &str = r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":6,"stream":true}"#;

/// The same request to Anthropic's messages API.
const MESSAGES_STREAM: &str = r#"{"model":"claude-mock","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;

/// The text of a 6-token answer.
const ANSWER: &str = "This is the mock speaking. This";

/// Reads a body to its end or its first error: the text read, and the error.
async fn read_all<B>(body: B) -> (String, Option<B::Error>)
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut body = body;
    let mut read = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame {
            Ok(frame) => read.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Err(error) => return (String::from_utf8(read).unwrap(), Some(error)),
        }
    }
    (String::from_utf8(read).unwrap(), None)
}

/// Posts a streaming request with a plain reqwest client (no stormguard): the status, the text
/// read and whether the body failed.
async fn plain_stream(url: &str) -> (u16, String, bool) {
    let (status, _, text, failed) = plain_post(url, STREAM).await;
    (status, text, failed)
}

/// Posts `body` with a plain reqwest client: the status, the `x-mock-fault` header, the text read
/// and whether the body failed.
async fn plain_post(url: &str, body: &str) -> (u16, Option<String>, String, bool) {
    let mut response = reqwest::Client::new()
        .post(url)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let fault = response
        .headers()
        .get(mock::MOCK_FAULT)
        .map(|value| value.to_str().unwrap().to_owned());
    let status = response.status().as_u16();
    let mut text = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => text.extend_from_slice(&chunk),
            Ok(None) => return (status, fault, String::from_utf8(text).unwrap(), false),
            Err(_) => return (status, fault, String::from_utf8(text).unwrap(), true),
        }
    }
}

/// Posts the streaming request `body` through `ClientLayer::default()` (with retries a few
/// milliseconds apart) over a hyper-util client, as the axum gateway example does: the
/// response's status, the text read and the body's error.
async fn guarded_stream(
    url: &str,
    body: &'static str,
    continuation: bool,
) -> (
    u16,
    String,
    Option<Box<dyn std::error::Error + Send + Sync>>,
) {
    let hyper = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let layer = ClientLayer::default().with_backoff(FullJitter::new(
        Duration::from_millis(1),
        Duration::from_millis(10),
    ));
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = match continuation {
        true => layer.layer(hyper).oneshot(request).await,
        false => {
            layer
                .without_continuation()
                .layer(hyper)
                .oneshot(request)
                .await
        }
    };
    let response = response.unwrap();
    let status = response.status().as_u16();
    let (text, error) = read_all(response.into_body()).await;
    (status, text, error)
}

#[tokio::test]
async fn a_streaming_request_gets_the_role_one_chunk_per_token_and_done() {
    let server = mock::spawn(MockConfig::healthy()).await.unwrap();
    let response = reqwest::Client::new()
        .post(server.url())
        .body(STREAM)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    let stats = server.stats.snapshot();
    server.shutdown().await;

    // The role chunk first, `[DONE]` last, every event a `data:` line and a blank line.
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("data: {"), "{text}");
    let role: serde_json::Value = serde_json::from_str(&first["data: ".len()..]).unwrap();
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(role["model"], "mock-1");
    assert_eq!(
        role["choices"][0]["delta"],
        serde_json::json!({ "role": "assistant", "content": "" })
    );
    assert!(text.ends_with("\n\ndata: [DONE]\n\n"), "{text}");
    // 1 role + 6 content + 1 finish + [DONE].
    assert_eq!(text.matches("\n\n").count(), 9, "{text}");

    let read = Transcript::parse(&text);
    assert_eq!(read.role.as_deref(), Some("assistant"));
    assert_eq!(read.content.len(), 6);
    assert_eq!(read.text(), ANSWER);
    assert_eq!(read.finish_reason.as_deref(), Some("stop"));
    assert!(read.done);
    assert_eq!(read.errors, 0);

    assert_eq!(stats.attempts, 1);
    assert_eq!(stats.status(200), 1);
    assert_eq!(stats.streams, 1);
    assert_eq!(stats.content_chunks, 6);
    assert_eq!((stats.stream_errors, stats.streams_cut), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_stream_takes_the_base_latency_then_the_per_token_latency_per_chunk() {
    let server = mock::spawn(MockConfig {
        base_latency: Duration::from_secs(2),
        latency_per_token: Duration::from_secs(1),
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    let mut response = reqwest::Client::new()
        .post(server.url())
        .body(STREAM)
        .send()
        .await
        .unwrap();
    // On tokio's paused clock: the head after the base latency, then each content chunk one
    // token later than the one before.
    assert_eq!(started.elapsed().as_secs(), 2);
    let mut content_at = Vec::new();
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        let chunk = String::from_utf8(chunk.to_vec()).unwrap();
        let content = Transcript::parse(&chunk).content.len();
        content_at.extend(std::iter::repeat_n(started.elapsed().as_secs(), content));
        text.push_str(&chunk);
    }
    server.shutdown().await;
    assert_eq!(content_at, [3, 4, 5, 6, 7, 8]);
    assert_eq!(started.elapsed().as_secs(), 8);
    assert_eq!(Transcript::parse(&text).text(), ANSWER);
}

#[tokio::test]
async fn the_stream_faults_fail_a_plain_clients_stream_after_its_200() {
    // An error frame after the role chunk, and no content.
    let erring = mock::spawn(MockConfig::outage(Fault::ErrorBeforeContent))
        .await
        .unwrap();
    let (status, text, failed) = plain_stream(&erring.url()).await;
    let stats = erring.stats.snapshot();
    erring.shutdown().await;
    assert_eq!(status, 200);
    assert!(!failed);
    let read = Transcript::parse(&text);
    assert_eq!(read.role.as_deref(), Some("assistant"));
    assert!(read.content.is_empty() && !read.done, "{text}");
    assert_eq!(read.errors, 1);
    assert!(
        text.ends_with("\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n"),
        "{text}"
    );
    assert_eq!((stats.streams, stats.stream_errors), (1, 1));
    assert_eq!(stats.content_chunks, 0);

    // Half the content (3 of 6 chunks), then the connection fails.
    let cutting = mock::spawn(MockConfig::outage(Fault::CutMidStream))
        .await
        .unwrap();
    let (status, text, failed) = plain_stream(&cutting.url()).await;
    let stats = cutting.stats.snapshot();
    cutting.shutdown().await;
    assert_eq!(status, 200);
    assert!(failed, "{text}");
    let read = Transcript::parse(&text);
    assert_eq!(read.text(), "This is the");
    assert!(!read.done && read.finish_reason.is_none(), "{text}");
    assert_eq!((stats.streams, stats.streams_cut), (1, 1));
    assert_eq!(stats.content_chunks, 3);
}

#[tokio::test]
async fn stream_faults_are_drawn_at_the_error_rate_and_spare_plain_requests() {
    let server = mock::spawn(MockConfig {
        error_rate: 0.25,
        faults: vec![(Fault::ErrorBeforeContent, 1), (Fault::CutMidStream, 1)],
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let mut failed = 0;
    for _ in 0..200 {
        let (status, text, cut) = plain_stream(&server.url()).await;
        assert_eq!(status, 200);
        if cut || Transcript::parse(&text).errors > 0 {
            failed += 1;
        }
    }
    // Plain requests never get a stream fault: these only have stream faults to draw.
    let plain = r#"{"model":"mock-1","messages":[],"max_tokens":6}"#;
    let client = reqwest::Client::new();
    for _ in 0..20 {
        let response = client.post(server.url()).body(plain).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["object"], "chat.completion");
    }
    let stats = server.stats.snapshot();
    server.shutdown().await;

    assert_eq!(stats.attempts, 220);
    assert_eq!(stats.status(200), 220);
    assert_eq!(stats.streams, 200);
    assert_eq!(stats.stream_errors + stats.streams_cut, failed);
    // Seeded draws: 25% of 200 is 50, give or take sampling noise, of both kinds.
    assert!((30..=70).contains(&failed), "{stats:?}");
    assert!(
        stats.stream_errors > 0 && stats.streams_cut > 0,
        "{stats:?}"
    );
}

#[tokio::test]
async fn an_error_before_content_is_retried_and_the_caller_gets_a_clean_stream() {
    let server = mock::spawn(MockConfig {
        first_faults: vec![Fault::ErrorBeforeContent],
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let (status, text, error) = guarded_stream(&server.url(), STREAM, true).await;
    let stats = server.stats.snapshot();
    server.shutdown().await;

    assert_eq!(status, 200);
    assert!(error.is_none(), "{error:?}");
    // The second answer, whole from its first byte, and nothing of the first.
    assert!(!text.contains("error"), "{text}");
    let read = Transcript::parse(&text);
    assert_eq!(read.role.as_deref(), Some("assistant"));
    assert_eq!(read.text(), ANSWER);
    assert!(read.done && read.errors == 0);
    assert_eq!(text.matches("\"role\"").count(), 1, "{text}");

    assert_eq!(stats.attempts, 2);
    assert_eq!(stats.by_attempt_header.get(&0), Some(&1));
    assert_eq!(stats.by_attempt_header.get(&1), Some(&1));
    assert_eq!((stats.streams, stats.stream_errors), (2, 1));
    assert_eq!(stats.content_chunks, 6);
}

#[tokio::test]
async fn a_stream_cut_after_content_ends_the_callers_body_with_stream_interrupted() {
    let server = mock::spawn(MockConfig {
        first_faults: vec![Fault::CutMidStream],
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    // Continuation off: the stream cannot be completed, and ends with the in-band error.
    let (status, text, error) = guarded_stream(&server.url(), STREAM, false).await;
    let stats = server.stats.snapshot();
    server.shutdown().await;

    assert_eq!(status, 200);
    // What came before the cut reached the caller; the stream was not restarted, and it ends
    // with the error event an SDK raises on.
    let (text, event) = text.split_at(text.find("data: {\"error\"").unwrap());
    assert!(event.contains("stream_interrupted"), "{event}");
    let read = Transcript::parse(text);
    assert_eq!(read.text(), "This is the");
    assert!(!read.done);
    let error = error.expect("the body ends with an error");
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert_eq!(interrupted.events(), 3);
    assert_eq!(interrupted.bytes(), text.len() as u64);
    assert!(
        matches!(interrupted.cause(), InterruptCause::Reset(_)),
        "{interrupted:?}"
    );

    assert_eq!(stats.attempts, 1);
    assert_eq!((stats.streams, stats.streams_cut), (1, 1));
    assert_eq!(stats.content_chunks, 3);
}

/// The events of an Anthropic stream: each one's `event:` name and its data, parsed.
fn named_events(text: &str) -> Vec<(String, serde_json::Value)> {
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let (name, data) = event.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap().to_owned();
            let data = data.strip_prefix("data: ").unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn a_messages_stream_sends_anthropics_events_in_order_one_delta_per_token() {
    let server = mock::spawn(MockConfig::healthy()).await.unwrap();
    let (status, fault, text, failed) = plain_post(&server.messages_url(), MESSAGES_STREAM).await;
    let stats = server.stats.snapshot();
    server.shutdown().await;

    assert_eq!((status, fault, failed), (200, None, false));
    let events = named_events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 6]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected, "{text}");
    // Each event's data says its type too, as Anthropic's do.
    assert!(
        events
            .iter()
            .all(|(name, data)| data["type"] == name.as_str())
    );
    let start = &events[0].1["message"];
    assert_eq!(
        (start["role"].as_str(), start["model"].as_str()),
        (Some("assistant"), Some("claude-mock"))
    );
    assert_eq!(start["usage"]["input_tokens"], 2);
    assert_eq!(
        events[1].1["content_block"],
        serde_json::json!({"type": "text", "text": ""})
    );
    assert_eq!(
        events[3].1["delta"],
        serde_json::json!({"type": "text_delta", "text": "This"})
    );
    let (_, delta) = &events[10];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 6);

    let read = Transcript::parse(&text);
    assert_eq!(read.role.as_deref(), Some("assistant"));
    assert_eq!(read.text(), ANSWER);
    assert_eq!(read.finish_reason.as_deref(), Some("end_turn"));
    assert!(read.done && read.errors == 0);
    assert_eq!(
        (stats.streams, stats.content_chunks, stats.prefilled),
        (1, 6, 0)
    );
}

#[tokio::test]
async fn the_stream_faults_fail_a_messages_stream_with_anthropics_error_event_or_a_cut() {
    let erring = mock::spawn(MockConfig::outage(Fault::ErrorBeforeContent))
        .await
        .unwrap();
    let (status, fault, text, failed) = plain_post(&erring.messages_url(), MESSAGES_STREAM).await;
    erring.shutdown().await;
    assert_eq!((status, failed), (200, false));
    assert_eq!(fault.as_deref(), Some("error_before_content"));
    let events = named_events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["message_start", "content_block_start", "ping", "error"]
    );
    assert_eq!(events[3].1["error"]["type"], "overloaded_error");
    let read = Transcript::parse(&text);
    assert!(
        read.content.is_empty() && !read.done && read.errors == 1,
        "{text}"
    );

    // Half the content (3 of 6 deltas), then the connection fails: no `message_stop`.
    let cutting = mock::spawn(MockConfig::outage(Fault::CutMidStream))
        .await
        .unwrap();
    let (status, fault, text, failed) = plain_post(&cutting.messages_url(), MESSAGES_STREAM).await;
    let stats = cutting.stats.snapshot();
    cutting.shutdown().await;
    assert_eq!((status, failed), (200, true));
    assert_eq!(fault.as_deref(), Some("cut_mid_stream"));
    let read = Transcript::parse(&text);
    assert_eq!(read.text(), "This is the");
    assert!(!read.done && read.finish_reason.is_none(), "{text}");
    assert_eq!((stats.streams_cut, stats.content_chunks), (1, 3));
}

#[tokio::test]
async fn a_prefilled_stream_goes_on_after_the_prefills_words_in_both_apis() {
    let server = mock::spawn(MockConfig::healthy()).await.unwrap();
    let chat = r#"{"model":"mock-1","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"Say hello"},{"role":"assistant","content":"This is the"}]}"#;
    let (_, _, text, _) = plain_post(&server.url(), chat).await;
    let read = Transcript::parse(&text);
    assert_eq!(read.content, [" mock", " speaking.", " This"]);
    assert_eq!(format!("This is the{}", read.text()), ANSWER);
    assert!(read.done);

    // Seven words: the sentence once and two more; Anthropic's content parts count the same.
    let messages = r#"{"model":"claude-mock","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"Say hello"},{"role":"assistant","content":[{"type":"text","text":"This is the mock speaking. This is"}]}]}"#;
    let (_, _, text, _) = plain_post(&server.messages_url(), messages).await;
    let read = Transcript::parse(&text);
    assert_eq!(read.content, [" the", " mock"]);
    let events = named_events(&text);
    let (_, delta) = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap();
    assert_eq!(delta["usage"]["output_tokens"], 2);

    // An assistant turn the user answered is history: the answer starts from its first word.
    let history = r#"{"model":"mock-1","max_tokens":2,"stream":true,"messages":[{"role":"assistant","content":"This is"},{"role":"user","content":"again"}]}"#;
    let (_, _, text, _) = plain_post(&server.url(), history).await;
    assert_eq!(Transcript::parse(&text).text(), "This is");
    let stats = server.stats.snapshot();
    server.shutdown().await;
    assert_eq!(
        (stats.streams, stats.prefilled, stats.content_chunks),
        (3, 2, 7)
    );
}

#[tokio::test]
async fn a_stream_cut_after_content_is_continued_and_the_caller_reads_every_word_once() {
    for (api, body) in [("chat", STREAM), ("messages", MESSAGES_STREAM)] {
        let server = mock::spawn(MockConfig {
            first_faults: vec![Fault::CutMidStream],
            ..MockConfig::healthy()
        })
        .await
        .unwrap();
        let url = match api {
            "chat" => server.url(),
            _ => server.messages_url(),
        };
        let (status, text, error) = guarded_stream(&url, body, true).await;
        let stats = server.stats.snapshot();
        server.shutdown().await;

        assert_eq!(status, 200, "{api}");
        assert!(error.is_none(), "{api}: {error:?}");
        // Three words before the cut, three from the continuation, each once, in order, and one
        // opening and one terminal event: one answer.
        let read = Transcript::parse(&text);
        assert_eq!(read.text(), ANSWER, "{api}: {text}");
        assert_eq!(read.content.len(), 6, "{api}: {text}");
        assert!(read.done && read.errors == 0, "{api}: {text}");
        let (opening, terminal) = match api {
            "chat" => ("\"role\"", "data: [DONE]"),
            _ => ("event: message_start", "event: message_stop"),
        };
        assert_eq!(text.matches(opening).count(), 1, "{api}: {text}");
        assert_eq!(text.matches(terminal).count(), 1, "{api}: {text}");
        // The cut stream and its continuation, which went on after the prefill's three words.
        assert_eq!(stats.attempts, 2, "{api}");
        assert_eq!((stats.streams_cut, stats.prefilled), (1, 1), "{api}");
        assert_eq!(stats.content_chunks, 6, "{api}");
    }
}

#[tokio::test]
async fn numbered_words_say_their_place_across_a_continuation() {
    let server = mock::spawn(MockConfig {
        first_faults: vec![Fault::CutMidStream],
        numbered: true,
        ..MockConfig::healthy()
    })
    .await
    .unwrap();
    let (status, text, error) = guarded_stream(&server.url(), STREAM, true).await;
    server.shutdown().await;
    assert_eq!(status, 200);
    assert!(error.is_none(), "{error:?}");
    // w0 to w2 before the cut, w3 to w5 from the continuation.
    let read = Transcript::parse(&text);
    assert_eq!(read.text(), "w0 w1 w2 w3 w4 w5", "{text}");
    assert_eq!(mock::word_numbers(&read.text()), Some((0..6).collect()));
}
