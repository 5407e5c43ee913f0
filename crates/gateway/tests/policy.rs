//! What a model's table says beyond its ranks, through the gateway: a degraded answer when no
//! deployment can answer (in the caller's format and shape), cures that send a failure straight
//! to the deployment that cures it, and hedging fixed or off.

#![allow(clippy::unwrap_used)]

mod kit;

use std::sync::Arc;
use std::time::Duration;

use kit::{Seen, env, json, mock, post, slow_mock};
use tokio::time::Instant;

const BUSY: &str = "The assistant is busy; please try again in a minute.";

/// A config with one model `m` over deployments of provider `p` (openai at `openai`) or `a`
/// (anthropic at `anthropic`), `model_keys` added to the model's table.
fn config(openai: &str, anthropic: &str, deployments: &str, model_keys: &str) -> String {
    format!(
        r#"
[providers.p]
format = "openai"
base_url = "{openai}"

[providers.a]
format = "anthropic"
base_url = "{anthropic}"

[models.m]
{model_keys}
{deployments}
"#
    )
}

fn deployment(provider: &str, model: &str, rank: u32) -> String {
    format!(
        "[[models.m.deployments]]\nprovider = \"{provider}\"\nmodel = \"{model}\"\nrank = {rank}\n"
    )
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_comes_in_the_callers_format_and_shape() {
    let down = mock(Arc::new(|_: &Seen| {
        json(503, r#"{"error":{"message":"down"}}"#)
    }))
    .await;
    let degraded = format!("degraded = {BUSY:?}");
    let openai = config(
        &down.url(),
        &down.url(),
        &deployment("p", "x", 1),
        &degraded,
    );
    let gateway = kit::gateway(&kit::config(&openai, &env(&[]))).await;
    let chat = r#"{"model":"m","messages":[]}"#;
    let (status, headers, body) = post(gateway.addr, "/v1/chat/completions", chat, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-stormguard-degraded"], "true");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], BUSY);
    assert_eq!(answer["model"], "m");
    // Asked as a stream, it is one: a chunk with the text, a finish, then [DONE].
    let streamed = r#"{"model":"m","stream":true,"messages":[]}"#;
    let (status, headers, body) = post(gateway.addr, "/v1/chat/completions", streamed, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.len(), 3, "{body}");
    let first: serde_json::Value = serde_json::from_str(data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["content"], BUSY);
    assert_eq!(data[2], "[DONE]");
    // An embedding cannot be a canned text: a 503 in OpenAI's format, with when to come back.
    let embed = r#"{"model":"m","input":"hi"}"#;
    let (status, headers, body) = post(gateway.addr, "/v1/embeddings", embed, &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(headers.contains_key("retry-after"));
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["type"], "api_error");
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_anthropic_caller_gets_anthropics_events() {
    let down = mock(Arc::new(|_: &Seen| json(529, r#"{"type":"error"}"#))).await;
    let degraded = format!("degraded = {BUSY:?}");
    let text = config(
        &down.url(),
        &down.url(),
        &deployment("a", "c", 1),
        &degraded,
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&[]))).await;
    let streamed = r#"{"model":"m","stream":true,"max_tokens":10,"messages":[]}"#;
    let (status, _, body) = post(gateway.addr, "/v1/messages", streamed, &[]).await;
    assert_eq!(status, 200, "{body}");
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        events,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(body.contains(&format!("\"text\":{BUSY:?}")), "{body}");
    let whole = r#"{"model":"m","max_tokens":10,"messages":[]}"#;
    let (status, _, body) = post(gateway.addr, "/v1/messages", whole, &[]).await;
    assert_eq!(status, 200);
    let message: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(message["content"][0]["text"], BUSY);
    gateway.stop().await;
}

/// A provider whose `small` model refuses prompts as too long; every other model answers.
fn small_context() -> kit::Script {
    Arc::new(|seen: &Seen| match seen.model.as_str() {
        "small" => json(
            400,
            r#"{"error":{"message":"maximum context length exceeded","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        model => json(200, &format!(r#"{{"model":"{model}","choices":[]}}"#)),
    })
}

#[tokio::test]
async fn a_cure_sends_a_prompt_too_long_straight_to_the_larger_model() {
    let provider = mock(small_context()).await;
    let url = provider.url();
    let ranks = [("small", 1), ("backup", 2), ("large", 3)]
        .map(|(model, rank)| deployment("p", model, rank))
        .concat();
    let cured = config(
        &url,
        &url,
        &ranks,
        "[models.m.cures]\ncontext_too_long = \"p/large\"",
    );
    let gateway = kit::gateway(&kit::config(&cured, &env(&[]))).await;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"a long prompt"}]}"#;
    let (status, headers, answer) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-stormguard-backend"], "p/large");
    assert_eq!(headers["x-stormguard-attempts"], "2");
    let models: Vec<String> = provider.seen().into_iter().map(|s| s.model).collect();
    assert_eq!(models, ["small", "large"], "rank 2 is passed over");
    gateway.stop().await;
    // Without the cure, the refusal is the caller's: a prompt too long is not retried.
    let provider = mock(small_context()).await;
    let url = provider.url();
    let plain = config(&url, &url, &ranks, "");
    let gateway = kit::gateway(&kit::config(&plain, &env(&[]))).await;
    let (status, _, _) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(status, 400);
    assert_eq!(provider.seen().len(), 1);
    gateway.stop().await;
}

/// The time to an answer from a model over a primary that takes 120 s and a backup that answers
/// at once, with `hedging`: the backend that answered and when.
async fn hedged(hedging: &str, primary_delay: Duration) -> (String, Duration) {
    let primary = slow_mock(kit::echo(), primary_delay).await;
    let backup = mock(kit::echo()).await;
    let providers = format!(
        "[providers.p]\nformat = \"openai\"\nbase_url = \"{}\"\n\n[providers.b]\nformat = \"openai\"\nbase_url = \"{}\"\n\n",
        primary.url(),
        backup.url()
    );
    let ranks = format!(
        "[models.m]\nhedging = \"{hedging}\"\n\n{}{}",
        "[[models.m.deployments]]\nprovider = \"p\"\nmodel = \"x\"\n",
        "[[models.m.deployments]]\nprovider = \"b\"\nmodel = \"x\"\nrank = 2\n"
    );
    let gateway = kit::gateway(&kit::config(&(providers + &ranks), &env(&[]))).await;
    let started = Instant::now();
    let body = r#"{"model":"m","messages":[]}"#;
    let (status, headers, answer) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    gateway.stop().await;
    let backend = headers["x-stormguard-backend"].to_str().unwrap().to_owned();
    (backend, took)
}

#[tokio::test(start_paused = true)]
async fn hedging_after_a_fixed_delay_or_never() {
    // Hedged at 2 s: the backup answers then, the primary's 120 s are not waited for.
    let (backend, took) = hedged("2s", Duration::from_secs(120)).await;
    assert_eq!(backend, "b/x");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    // Off: a primary that takes 5 s is waited for, and the backup never asked.
    let (backend, took) = hedged("off", Duration::from_secs(5)).await;
    assert_eq!(backend, "p/x");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_millis(5500),
        "{took:?}"
    );
}

/// Sends `n` chat completions of `gpt` at once to `addr`; each must be answered 200.
async fn batch(addr: std::net::SocketAddr, n: usize) {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let body = r#"{"model":"gpt","messages":[]}"#;
                post(addr, "/v1/chat/completions", body, &[]).await.0
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_whose_provider_says_its_quota_is_spent_is_passed_over_until_it_resets() {
    // Key 1's provider says its requests are spent for 30 s (OpenAI's headers); key 2's has room.
    let script: kit::Script = Arc::new(|seen: &Seen| {
        let mut answer = json(200, r#"{"choices":[]}"#);
        if seen.key() == Some(kit::KEYS[0].1) {
            let headers = answer.headers_mut();
            headers.insert("x-ratelimit-limit-requests", "100".parse().unwrap());
            headers.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
            headers.insert("x-ratelimit-reset-requests", "30s".parse().unwrap());
        }
        answer
    });
    let provider = slow_mock(script, Duration::from_millis(100)).await;
    let url = provider.url();
    let text = kit::two_providers(&url, &url);
    let gateway = kit::gateway(&kit::config(&text, &env(&kit::KEYS))).await;
    // Ten at once: the two keys share them, and key 1 answers that it is spent.
    batch(gateway.addr, 10).await;
    let spent = provider.with_key(kit::KEYS[0].1);
    assert!(spent >= 1, "key 1 takes its share while nothing is known");
    // Twenty more: none to key 1 while its quota is spent.
    batch(gateway.addr, 10).await;
    batch(gateway.addr, 10).await;
    assert_eq!(provider.with_key(kit::KEYS[0].1), spent);
    assert_eq!(provider.with_key(kit::KEYS[1].1), 30 - spent);
    // Once it reset, it takes its share again.
    tokio::time::advance(Duration::from_secs(31)).await;
    batch(gateway.addr, 10).await;
    assert!(provider.with_key(kit::KEYS[0].1) > spent);
    gateway.stop().await;
}
