//! The deadline the engine sizes from an LLM request body, on tokio's paused clock.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::SizeHint;
use http_body_util::Full;
use stormguard_classify::headers::{X_REQUEST_TIMEOUT_MS, X_SHOULD_RETRY};
use stormguard_classify::{Reason, chain};
use stormguard_deadline::{Deadline, DeadlineExceeded, LlmDeadline};
use stormguard_retry::ClientLayer;
use stormguard_test_kit::ScriptedBody;
use support::{Chunked, Log, instant, scripted, status};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// The engine with the default LLM deadline estimate and no throttle.
fn estimating() -> ClientLayer {
    ClientLayer::default()
        .without_throttle()
        .with_llm_deadline(LlmDeadline::default())
}

/// A chat completion request with `body`.
fn llm_request<B>(body: B) -> Request<B> {
    Request::post("http://llm.test/v1/chat/completions")
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// A chat body with a prompt of `prompt_chars` characters and a limit of `max_tokens`.
fn chat(prompt_chars: usize, max_tokens: u64) -> String {
    format!(
        r#"{{"model":"m","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(prompt_chars)
    )
}

/// What each attempt was told: its `x-request-timeout-ms`, and the body it received.
fn told(log: &Log) -> Vec<(u64, Bytes)> {
    log.all()
        .into_iter()
        .map(|seen| {
            let timeout = seen.header(X_REQUEST_TIMEOUT_MS.as_str()).unwrap();
            (timeout.parse().unwrap(), seen.body)
        })
        .collect()
}

/// Sends `request`, asserts it fails because its deadline passed, and returns how long that took.
async fn expires_after<S, B>(client: S, request: Request<B>) -> Duration
where
    S: Service<Request<B>, Error = stormguard_retry::Error, Response: std::fmt::Debug>,
{
    let start = Instant::now();
    let error = client.oneshot(request).await.unwrap_err();
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert!(chain(&error).any(|link| link.is::<DeadlineExceeded>()));
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn llm_deadline_grows_with_prompt_and_output_size() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = estimating().layer(backend);

    // 4,000 output tokens, 20,000-character prompt (5,001 tokens with the role):
    // 10 s + 5.001 s + 112 s = 127.001 s, minus the 50 ms margin.
    let long = chat(20_000, 4000);
    client
        .clone()
        .oneshot(llm_request(Full::from(long.clone())))
        .await
        .unwrap();
    // 50 output tokens, 20 characters (6 tokens): 10 s + 6 ms + 1.4 s.
    let short = chat(20, 50);
    client
        .oneshot(llm_request(Full::from(short.clone())))
        .await
        .unwrap();

    assert_eq!(
        told(&log),
        [(126_951, Bytes::from(long)), (11_356, Bytes::from(short))]
    );
}

#[tokio::test(start_paused = true)]
async fn llm_deadline_is_enforced_at_the_estimate() {
    let estimate = LlmDeadline {
        base: Duration::from_secs(1),
        per_prompt_token: Duration::ZERO,
        per_output_token: Duration::from_millis(10),
        max: Duration::from_secs(60),
    };
    let log = Log::default();
    let backend = scripted(&log, Duration::from_secs(30), |_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .without_throttle()
        .with_llm_deadline(estimate)
        .layer(backend);

    // 1 s + 100 output tokens at 10 ms.
    let request = llm_request(Full::from(r#"{"max_tokens": 100}"#));
    assert_eq!(
        expires_after(client.clone(), request).await,
        Duration::from_secs(2)
    );

    // A tighter deadline already on the request still wins.
    let mut request = llm_request(Full::from(r#"{"max_tokens": 100}"#));
    Deadline::after(Duration::from_millis(700)).apply_to(&mut request);
    assert_eq!(
        expires_after(client, request).await,
        Duration::from_millis(700)
    );
    assert_eq!(log.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn bodies_too_big_to_read_get_the_maximum_and_arrive_intact() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = estimating().with_max_replay_body(1000).layer(backend);
    let body = chat(2000, 50);

    client
        .oneshot(llm_request(Full::from(body.clone())))
        .await
        .unwrap();

    // 600 s, minus the 50 ms margin.
    assert_eq!(told(&log), [(599_950, Bytes::from(body))]);
}

#[tokio::test(start_paused = true)]
async fn streamed_bodies_are_estimated_within_the_cap_and_get_the_maximum_past_it() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = estimating().with_max_replay_body(1000).layer(backend);

    // Of unknown length, and longer than the cap once read: sent once, whole, with the maximum.
    let long = chat(2000, 50);
    let chunks = long.as_bytes().chunks(700).map(Bytes::copy_from_slice);
    client
        .clone()
        .oneshot(llm_request(Chunked::new(chunks)))
        .await
        .unwrap();
    // Of unknown length, and within the cap: read whole and estimated, 10 s + 4 prompt tokens
    // ("user" and 10 characters) + 50 output tokens at 28 ms.
    let short = chat(10, 50);
    client
        .oneshot(llm_request(Chunked::new([Bytes::from(short.clone())])))
        .await
        .unwrap();

    assert_eq!(
        told(&log),
        [(599_950, Bytes::from(long)), (11_354, Bytes::from(short))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_that_breaks_the_limit_after_announcing_less_is_sent_once_whole_with_the_maximum() {
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let client = estimating().with_max_replay_body(1000).layer(backend);
    let mut announced = SizeHint::new();
    announced.set_upper(10);
    let body = Chunked::new([Bytes::from(vec![b'x'; 5000])]).announcing(announced);

    let response = client.oneshot(llm_request(body)).await.unwrap();

    // Sent once, every byte, with the maximum deadline; not retried here, so not marked.
    assert_eq!(response.status(), 503);
    assert!(!response.headers().contains_key(X_SHOULD_RETRY));
    assert_eq!(told(&log), [(599_950, Bytes::from(vec![b'x'; 5000]))]);
}

#[tokio::test(start_paused = true)]
async fn an_estimate_tighter_than_the_callers_deadline_is_enforced_whenever_the_body_arrives() {
    let estimate = LlmDeadline {
        base: Duration::from_secs(1),
        per_prompt_token: Duration::ZERO,
        per_output_token: Duration::from_millis(10),
        max: Duration::from_secs(600),
    };
    let backend = scripted(&Log::default(), Duration::from_secs(30), |_, _| {
        Ok(status(200))
    });
    let client = ClientLayer::default()
        .without_throttle()
        .with_llm_deadline(estimate)
        .layer(backend);
    // 1 s + 100 output tokens at 10 ms = 2 s, tighter than the caller's 60 s.
    let body = || Chunked::new([Bytes::from_static(br#"{"max_tokens": 100}"#)]);
    let late_body = || {
        Chunked::from(
            ScriptedBody::new()
                .yield_once()
                .data(Bytes::from_static(br#"{"max_tokens": 100}"#)),
        )
    };
    let due_in_a_minute = |body| {
        let mut request = llm_request(body);
        Deadline::after(Duration::from_secs(60)).apply_to(&mut request);
        request
    };

    // No deadline of the caller's, the body arriving late: the estimate holds.
    let request = llm_request(late_body());
    assert_eq!(
        expires_after(client.clone(), request).await,
        Duration::from_secs(2)
    );
    // The caller's looser deadline, the body there at once: the estimate holds.
    let request = due_in_a_minute(body());
    assert_eq!(
        expires_after(client.clone(), request).await,
        Duration::from_secs(2)
    );
    // The caller's looser deadline, the body arriving late: the estimate must still hold.
    let request = due_in_a_minute(late_body());
    assert_eq!(expires_after(client, request).await, Duration::from_secs(2));
}
