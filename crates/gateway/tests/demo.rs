//! `stormguard-gateway demo`: the gateway in front of its mock provider, which fails on purpose.
//! Whole answers come back after a retry, and streams cut by the flaky rank arrive whole, every
//! counted word once, in both formats.

#![allow(clippy::unwrap_used)]

mod kit;

use http::HeaderMap;
use serde_json::Value;
use stormguard_gateway::demo::{self, Demo, Injected, RETRY_AFTER_SECS, X_DEMO_FAULT};
use stormguard_gateway::serve::StartError;
use tokio::time::{Duration, Instant};

async fn start() -> Demo {
    demo::start("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// The numbers `1` to `n`, as the mock counts.
fn counted(n: u64) -> String {
    (1..=n).map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .map_or("", |value| value.to_str().unwrap())
}

/// The text of a streamed answer, and its events' data, in order.
fn streamed_text(body: &str) -> (String, Vec<Value>) {
    let data: Vec<Value> = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let text = data
        .iter()
        .filter_map(|event| {
            event["choices"][0]["delta"]["content"]
                .as_str()
                .or_else(|| event["delta"]["text"].as_str())
        })
        .collect();
    (text, data)
}

const ASK: &str = r#""messages":[{"role":"user","content":"Count for me"}]"#;

#[tokio::test(start_paused = true)]
async fn whole_answers_failed_by_the_flaky_rank_come_back_after_a_retry() {
    let demo = start().await;
    let body = format!(r#"{{"model":"demo",{ASK}}}"#);
    let mut attempts = Vec::new();
    let mut backends = Vec::new();
    let mut took = Vec::new();
    for _ in 0..4 {
        let sent = Instant::now();
        let (status, headers, text) =
            kit::post(demo.gateway.addr, "/v1/chat/completions", &body, &[]).await;
        took.push(sent.elapsed());
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], counted(12));
        backends.push(header(&headers, "x-stormguard-backend").to_owned());
        attempts.push(header(&headers, "x-stormguard-attempts").to_owned());
    }
    // The first retried on the flaky rank after a 500; the third moved to the backup at once
    // after a 429, and the flaky rank passed over while its Retry-After lasts.
    let (flaky, backup) = ("flaky-openai/mock", "backup-openai/mock");
    assert_eq!(attempts, ["2", "1", "2", "1"]);
    assert_eq!(backends, [flaky, flaky, backup, backup]);
    assert!(took[2] < Duration::from_secs(RETRY_AFTER_SECS), "{took:?}");
    tokio::time::advance(Duration::from_secs(RETRY_AFTER_SECS)).await;
    let (_, headers, _) = kit::post(demo.gateway.addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(header(&headers, "x-stormguard-backend"), flaky);
    assert_eq!(
        demo.injected(),
        Injected {
            server_errors: 1,
            rate_limits: 1,
            cuts: 0,
            continuations: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_by_the_flaky_rank_arrives_whole() {
    let demo = start().await;
    let body = format!(r#"{{"model":"demo","stream":true,{ASK}}}"#);
    for request in 0..2 {
        let (status, headers, text) =
            kit::post(demo.gateway.addr, "/v1/chat/completions", &body, &[]).await;
        assert_eq!(status, 200, "{text}");
        let (answer, data) = streamed_text(&text);
        assert_eq!(answer, counted(12), "request {request}: {text}");
        let finishes = data
            .iter()
            .filter(|event| event["choices"][0]["finish_reason"].is_string())
            .count();
        assert_eq!(finishes, 1, "{text}");
        assert_eq!(text.matches("data: [DONE]").count(), 1, "{text}");
        let fault = header(&headers, X_DEMO_FAULT);
        if request == 0 {
            assert_eq!(fault, "stream cut after word 4");
        } else {
            assert_eq!(fault, "", "only every third stream is cut");
        }
    }
    let injected = demo.injected();
    assert_eq!((injected.cuts, injected.continuations), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_anthropic_route_retries_a_529_and_continues_a_cut_stream() {
    let demo = start().await;
    let headers = [("anthropic-version", "2023-06-01")];
    let plain = format!(r#"{{"model":"demo-claude","max_tokens":7,{ASK}}}"#);
    let (status, answered, text) =
        kit::post(demo.gateway.addr, "/v1/messages", &plain, &headers).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&answered, "x-stormguard-attempts"), "2");
    let message: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(message["content"][0]["text"], counted(7));

    let streamed = format!(r#"{{"model":"demo-claude","max_tokens":10,"stream":true,{ASK}}}"#);
    let (status, answered, text) =
        kit::post(demo.gateway.addr, "/v1/messages", &streamed, &headers).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&answered, X_DEMO_FAULT), "stream cut after word 4");
    let (answer, data) = streamed_text(&text);
    assert_eq!(answer, counted(10), "{text}");
    let count = |kind: &str| data.iter().filter(|event| event["type"] == kind).count();
    assert_eq!(count("message_start"), 1, "{text}");
    assert_eq!(count("content_block_delta"), 10, "{text}");
    assert_eq!(count("message_stop"), 1, "{text}");
    assert_eq!(
        demo.injected(),
        Injected {
            server_errors: 1,
            rate_limits: 0,
            cuts: 1,
            continuations: 1
        }
    );
}

#[tokio::test]
async fn the_demo_listens_on_loopback_only_and_its_providers_refuse_hostile_bodies() {
    let refused = demo::start("0.0.0.0:0".parse().unwrap()).await.err();
    assert!(
        matches!(refused, Some(StartError::Listen(_))),
        "a demo without caller keys on every address: {:?}",
        refused.map(|error| error.to_string())
    );
    let demo = start().await;
    for (path, body) in [
        ("/v1/chat/completions", "not json"),
        ("/v1/messages", r#"{"messages":7}"#),
        ("/v1/chat/completions", "[1,2]"),
    ] {
        let (status, _, text) = kit::post(demo.flaky, path, body, &[]).await;
        assert_eq!(status, 400, "{path} {body}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        let kind = error["error"]["type"].as_str().unwrap();
        assert_eq!(kind, "invalid_request_error", "{text}");
    }
    let (status, _, _) = kit::post(demo.backup, "/v1/embeddings", "{}", &[]).await;
    assert_eq!(status, 404);
    // A hostile body is refused before the schedule: nothing was injected.
    assert_eq!(demo.injected(), Injected::default());
}
