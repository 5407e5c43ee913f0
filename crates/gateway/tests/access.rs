//! Callers' keys, the listen addresses a gateway without keys may use, the body cap and the
//! deadline cap.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use kit::{KEYS, echo, env, mock, post, slow_mock, two_providers};
use stormguard_gateway::config::Config;
use stormguard_gateway::serve::{self, StartError};

const CALLER_KEY: &str = "sk-caller-a1b2c3";

fn with_server(server: &str, providers: &str) -> String {
    format!("[server]\n{server}\n{providers}")
}

#[tokio::test]
async fn callers_without_a_key_get_a_401_in_their_format() {
    let openai = mock(echo()).await;
    let anthropic = mock(echo()).await;
    let text = with_server(
        "listen = \"127.0.0.1:0\"\ncaller_keys_env = [\"CALLERS\"]",
        &two_providers(&openai.url(), &anthropic.url()),
    );
    let mut vars = KEYS.to_vec();
    vars.push(("CALLERS", CALLER_KEY));
    let gateway = kit::gateway(&kit::config(&text, &env(&vars))).await;

    let (status, _, body) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"gpt"}"#,
        &[],
    )
    .await;
    assert_eq!(status, 401);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "authentication_error");

    let wrong = [("x-api-key", "sk-caller-a1b2c4")];
    let (status, _, body) = post(
        gateway.addr,
        "/v1/messages",
        r#"{"model":"claude"}"#,
        &wrong,
    )
    .await;
    assert_eq!(status, 401);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    let (status, _) = kit::get(gateway.addr, "/v1/models").await;
    assert_eq!(status, 401);
    assert_eq!(openai.seen().len() + anthropic.seen().len(), 0);

    let bearer = format!("Bearer {CALLER_KEY}");
    let (status, _, _) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"gpt"}"#,
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = post(
        gateway.addr,
        "/v1/messages",
        r#"{"model":"claude"}"#,
        &[("x-api-key", CALLER_KEY)],
    )
    .await;
    assert_eq!(status, 200);
    // The caller's key reached no provider.
    let seen = format!("{:?}{:?}", openai.seen(), anthropic.seen());
    assert!(!seen.contains(CALLER_KEY));
    // Health and readiness need no key.
    assert_eq!(kit::get(gateway.addr, "/healthz").await.0, 200);
    gateway.stop().await;
}

#[tokio::test]
async fn without_caller_keys_only_loopback_is_served() {
    let openai = mock(echo()).await;
    let providers = two_providers(&openai.url(), &openai.url());
    let open = kit::config(
        &with_server("listen = \"0.0.0.0:0\"", &providers),
        &env(&KEYS),
    );
    match serve::start(&open).await {
        Err(StartError::Listen(refused)) => assert!(refused.to_string().contains("0.0.0.0:0")),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a public address without caller keys was served"),
    }
    let allowed = with_server(
        "listen = \"0.0.0.0:0\"\nallow_unauthenticated = true",
        &providers,
    );
    let gateway = serve::start(&kit::config(&allowed, &env(&KEYS)))
        .await
        .unwrap();
    assert!(gateway.addr.ip().is_unspecified());
    gateway.stop().await;
    let loopback = kit::gateway(&kit::config(&providers, &env(&KEYS))).await;
    assert!(loopback.addr.ip().is_loopback());
    loopback.stop().await;
}

#[tokio::test]
async fn a_caller_key_variable_that_is_not_set_refuses_the_start() {
    let providers = two_providers("http://127.0.0.1:9", "http://127.0.0.1:9");
    let text = with_server("caller_keys_env = [\"CALLERS\"]", &providers);
    let config = Config::parse("gateway.toml", &text, &env(&KEYS)).unwrap();
    match serve::start(&config).await {
        Err(StartError::MissingCallerKey(var)) => assert_eq!(var, "CALLERS"),
        _ => panic!("started without its caller key"),
    }
}

#[test]
fn the_binary_refuses_a_public_address_without_keys_with_exit_2() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stormguard-gateway"))
        .args(["--listen", "0.0.0.0:0"])
        .env_clear()
        .env("STORMGUARD_UPSTREAM_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without caller keys"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_body_over_the_cap_is_a_413_in_the_callers_format() {
    let openai = mock(echo()).await;
    let text = with_server(
        "max_body_bytes = 1024",
        &two_providers(&openai.url(), &openai.url()),
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let big = format!(r#"{{"model":"gpt","pad":"{}"}}"#, "x".repeat(2000));
    let (status, _, body) = post(gateway.addr, "/v1/chat/completions", &big, &[]).await;
    assert_eq!(status, 413);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes")
    );
    let (status, _, body) = post(gateway.addr, "/v1/messages", &big, &[]).await;
    assert_eq!(status, 413);
    assert!(body.starts_with(r#"{"error":{"#) || body.contains(r#""type":"error""#));
    let (status, _, _) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"gpt"}"#,
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(openai.seen().len(), 1);
    gateway.stop().await;
}

#[tokio::test]
async fn a_chunked_body_over_the_cap_is_a_413_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let openai = mock(echo()).await;
    let text = with_server(
        "max_body_bytes = 1024",
        &two_providers(&openai.url(), &openai.url()),
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let mut connection = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    connection.write_all(head.as_bytes()).await.unwrap();
    // No length announced: 3 chunks of 600 bytes, over the cap after the second.
    for _ in 0..3 {
        let chunk = format!("258\r\n{}\r\n", "x".repeat(600));
        if connection.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = connection.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    let _ = connection.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("1024 bytes"));
    assert_eq!(openai.seen().len(), 0);
    gateway.stop().await;
}

/// On tokio's paused clock: the provider's 3 s and the cap's 300 ms pass in no real time.
#[tokio::test(start_paused = true)]
async fn a_callers_deadline_is_capped_by_max_deadline() {
    let slow = slow_mock(echo(), Duration::from_secs(3)).await;
    let text = with_server(
        "max_deadline = \"300ms\"",
        &two_providers(&slow.url(), &slow.url()),
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let started = tokio::time::Instant::now();
    let asks_a_minute = [("x-request-timeout-ms", "60000")];
    let (status, headers, body) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"gpt"}"#,
        &asks_a_minute,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 504);
    assert_eq!(headers["x-should-retry"], "false");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = "the gateway gave up on the providers: deadline exceeded";
    assert_eq!(body["error"]["message"], message);
    // The cap, not the minute asked for nor the provider's 3 s, ended it.
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(400),
        "{took:?}"
    );
    assert_eq!(slow.seen().len(), 1);
    // In Anthropic's format on its path.
    let path = "/v1/messages";
    let (status, _, body) = post(gateway.addr, path, r#"{"model":"claude"}"#, &asks_a_minute).await;
    assert_eq!(status, 504);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "api_error");
    gateway.stop().await;
}
