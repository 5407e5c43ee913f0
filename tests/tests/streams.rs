//! Streamed answers (`text/event-stream`) through the engine, from real axum SSE servers on
//! loopback, read by hyper and reqwest clients: retried before their first content event, never
//! after it, and ended with `StreamInterrupted` when they break.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http_body_util::BodyExt;
use stormguard::stream::{AnswerBody, AnswerFuture, InterruptCause, ResumeFn, StreamInterrupted};
use stormguard_tests::{
    ANTHROPIC_OVERLOADED, ANTHROPIC_START, OPENAI_DONE, OPENAI_ROLE, Sse, StreamingProvider,
    chat_post, fast_client_layer, hyper_client, openai_chunk, outage_budget, send,
};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";

/// Reads a body to its end or its first error: the bytes read, and the error.
async fn read_all<B>(mut body: B) -> (String, Option<B::Error>)
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => read.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Err(error) => return (String::from_utf8(read).unwrap(), Some(error)),
        }
    }
    (String::from_utf8(read).unwrap(), None)
}

fn answer(words: &[&'static str]) -> Vec<Sse> {
    let mut script = vec![send(OPENAI_ROLE)];
    script.extend(words.iter().map(|word| send(openai_chunk(word))));
    script.push(send(OPENAI_DONE));
    script
}

#[tokio::test]
async fn an_error_event_before_content_is_retried_and_the_caller_sees_a_clean_stream() {
    // Anthropic's way: 200, the opening events, then `event: error` overloaded.
    let overloaded = vec![send(ANTHROPIC_START), send(ANTHROPIC_OVERLOADED)];
    let provider = StreamingProvider::spawn(vec![overloaded, answer(&["Hel", "lo"])]).await;
    let client = fast_client_layer(outage_budget()).layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (text, error) = read_all(response.into_body()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(provider.hits(), 2);
    // The caller's stream is the second answer, whole from its first byte, and nothing of the
    // first.
    assert!(text.starts_with(OPENAI_ROLE), "{text}");
    assert!(!text.contains("overloaded"), "{text}");
    assert!(
        text.contains("\"Hel\"") && text.ends_with(OPENAI_DONE),
        "{text}"
    );
}

#[tokio::test]
async fn a_stream_cut_after_three_content_events_is_never_restarted() {
    let mut cut = answer(&["one ", "two ", "three "]);
    cut.pop();
    // Delivered, then the connection fails.
    cut.extend([Sse::Wait(Duration::from_millis(50)), Sse::Cut]);
    let provider = StreamingProvider::spawn(vec![cut, answer(&["again"])]).await;
    // This provider answers a prefill from the start again: no continuation (see
    // `incidents.rs` for a stream continued), the in-band error event and the typed error.
    let client = fast_client_layer(outage_budget())
        .without_continuation()
        .layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    let (text, error) = read_all(response.into_body()).await;
    assert_eq!(provider.hits(), 1);
    assert!(text.contains("three") && !text.contains("again"), "{text}");
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert_eq!(interrupted.events(), 3);
    let (delivered, event) = text.split_at(text.find("data: {\"error\"").unwrap());
    assert!(event.contains("stream_interrupted"), "{event}");
    assert_eq!(interrupted.bytes(), delivered.len() as u64);
    assert!(
        matches!(interrupted.cause(), InterruptCause::Reset(_)),
        "{interrupted:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_after_two_events_ends_at_the_idle_timeout() {
    let mut stalled = answer(&["one ", "two "]);
    stalled.pop();
    stalled.push(Sse::Stall);
    let provider = StreamingProvider::spawn(vec![stalled]).await;
    let policy =
        stormguard::stream::StreamPolicy::default().with_idle(Some(Duration::from_secs(30)));
    let client = fast_client_layer(outage_budget())
        .with_stream_policy(policy)
        .without_continuation()
        .layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let (text, error) = read_all(response.into_body()).await;
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert_eq!(interrupted.events(), 2);
    assert!(text.contains("two"), "{text}");
    assert!(
        matches!(interrupted.cause(), InterruptCause::Idle(idle) if *idle == Duration::from_secs(30))
    );
    // On the paused clock: 30 s after the last event, not a moment later.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    assert_eq!(provider.hits(), 1);
}

#[tokio::test]
async fn a_reqwest_client_gets_the_same_guard() {
    let overloaded = vec![
        send(OPENAI_ROLE),
        send(
            "data: {\"error\":{\"message\":\"The server is overloaded\",\"type\":\"server_error\",\"code\":null}}\n\n",
        ),
    ];
    let mut cut = answer(&["a", "b", "c"]);
    cut.pop();
    cut.extend([Sse::Wait(Duration::from_millis(50)), Sse::Cut]);
    let provider = StreamingProvider::spawn(vec![overloaded, cut]).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(stormguard::reqwest::StormguardMiddleware::new(
            fast_client_layer(outage_budget()),
        ))
        .build();
    let mut response = client
        .post(provider.url(PATH))
        .body(stormguard_tests::CHAT_REQUEST)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = Vec::new();
    let error = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => text.extend_from_slice(&chunk),
            Ok(None) => panic!("the stream ended cleanly"),
            Err(error) => break error,
        }
    };
    // The error event before content was retried (2 attempts); the cut after 3 events was not.
    assert_eq!(provider.hits(), 2);
    let text = String::from_utf8(text).unwrap();
    assert!(
        !text.contains("overloaded") && text.contains("\"c\""),
        "{text}"
    );
    let interrupted = stormguard::classify::chain(&error)
        .find_map(|link| link.downcast_ref::<StreamInterrupted>())
        .unwrap();
    assert_eq!(interrupted.events(), 3);
}

#[tokio::test]
async fn a_resumed_stream_continues_after_what_was_delivered_with_nothing_twice() {
    let mut cut = answer(&["one ", "two "]);
    cut.pop();
    cut.extend([Sse::Wait(Duration::from_millis(50)), Sse::Cut]);
    let provider = StreamingProvider::spawn(vec![cut, answer(&["three ", "four"])]).await;
    let layer = fast_client_layer(outage_budget());
    // The continuation goes through the same policy and budget.
    let continuation = layer.clone().layer(hyper_client());
    let resume = ResumeFn::new(move |received, head, body| {
        // The partial answer, from the content events' deltas, as an assistant prefix.
        let prefix: String = received
            .content()
            .iter()
            .filter_map(|data| {
                let chunk: serde_json::Value = serde_json::from_str(data).ok()?;
                Some(chunk["choices"][0]["delta"]["content"].as_str()?.to_owned())
            })
            .collect();
        let mut request: serde_json::Value = serde_json::from_slice(body).ok()?;
        request["messages"]
            .as_array_mut()?
            .push(serde_json::json!({"role": "assistant", "content": prefix}));
        let mut head = head.clone();
        // Another request: its own idempotency key, its own length.
        head.headers.remove("idempotency-key");
        head.headers.remove(http::header::CONTENT_LENGTH);
        let body = bytes::Bytes::from(serde_json::to_vec(&request).ok()?);
        let request = http::Request::from_parts(head, http_body_util::Full::new(body));
        let client = continuation.clone();
        Some(Box::pin(async move {
            let response = client.oneshot(request).await.ok()?;
            let body: AnswerBody = Box::pin(response.into_body());
            Some(body)
        }) as AnswerFuture)
    });
    let client = layer.with_stream_resume(resume).layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    let (text, error) = read_all(response.into_body()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(provider.hits(), 2);
    for word in ["one", "two", "three", "four"] {
        assert_eq!(
            text.matches(&format!("\"{word}")).count(),
            1,
            "{word} in {text}"
        );
    }
    assert!(text.ends_with(OPENAI_DONE), "{text}");
    // The continuation asked for the rest of "one two ".
    let second = provider.bodies().pop().unwrap();
    assert!(
        second.contains(r#"{"content":"one two ","role":"assistant"}"#),
        "{second}"
    );
}

#[tokio::test]
async fn the_breaker_counts_a_stream_cut_after_content_as_a_failure() {
    let mut cut = answer(&["one "]);
    cut.pop();
    cut.extend([Sse::Wait(Duration::from_millis(50)), Sse::Cut]);
    let provider = StreamingProvider::spawn(vec![cut]).await;
    let breaker = stormguard::breaker::CircuitBreaker::new(
        stormguard::breaker::BreakerConfig::default().with_consecutive_failures(Some(1)),
    );
    let client = fast_client_layer(outage_budget())
        .with_breaker(breaker.clone())
        .layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    // Handed back: the breaker has not heard how the attempt ends.
    assert_eq!(breaker.state(), stormguard::breaker::State::Closed);
    let (_, error) = read_all(response.into_body()).await;
    assert!(error.is_some());
    // The aborted stream is a health failure: with one failure enough, the breaker opens.
    assert_eq!(breaker.state(), stormguard::breaker::State::Open);
}
