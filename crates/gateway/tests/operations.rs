//! `/v1/models`, `/healthz`, `/readyz`, `/metrics`, event streams relayed whole, and provider
//! keys never in the logs nor in an answer.

#![allow(clippy::unwrap_used)]

mod kit;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::Response;
use kit::{KEYS, Seen, echo, env, json, mock, post, two_providers};

#[tokio::test]
async fn models_lists_the_configured_names() {
    let openai = mock(echo()).await;
    let gateway = kit::gateway(&kit::config(
        &two_providers(&openai.url(), &openai.url()),
        &env(&KEYS),
    ))
    .await;
    let (status, body) = kit::get(gateway.addr, "/v1/models").await;
    assert_eq!(status, 200);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["claude", "gpt"]);
    assert_eq!(body["data"][0]["object"], "model");
    gateway.stop().await;
}

#[tokio::test]
async fn healthz_shows_each_deployment_and_readyz_needs_a_key_per_model() {
    let openai = mock(echo()).await;
    let text = two_providers(&openai.url(), &openai.url());
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let (status, body) = kit::get(gateway.addr, "/healthz").await;
    assert_eq!(status, 200);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "alive");
    let deployments = body["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 3);
    assert!(deployments.iter().all(|d| d["breaker"] == "closed"));
    assert_eq!(deployments[0]["deployment"], "anthropic/claude-upstream/1");
    assert_eq!(
        kit::get(gateway.addr, "/readyz").await,
        (200, r#"{"ready":true,"unavailable":[]}"#.to_owned())
    );
    gateway.stop().await;

    // Without Anthropic's key, `claude` has no deployment that can be called.
    let without_anthropic = env(&KEYS[..2]);
    let gateway = kit::gateway(&kit::config(&text, &without_anthropic)).await;
    let (status, body) = kit::get(gateway.addr, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (503, r#"{"ready":false,"unavailable":["claude"]}"#)
    );
    let (status, _, body) = post(gateway.addr, "/v1/messages", r#"{"model":"claude"}"#, &[]).await;
    assert_eq!(status, 503);
    assert!(body.contains(r#""type":"error""#));
    gateway.stop().await;
}

#[tokio::test]
async fn metrics_are_in_prometheus_text() {
    let openai = mock(echo()).await;
    let gateway = kit::gateway(&kit::config(
        &two_providers(&openai.url(), &openai.url()),
        &env(&KEYS),
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(
            post(
                gateway.addr,
                "/v1/chat/completions",
                r#"{"model":"gpt"}"#,
                &[]
            )
            .await
            .0,
            200
        );
    }
    let response = kit::client()
        .get(format!("http://{}/metrics", gateway.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    assert!(text.contains("stormguard_request_attempts"), "{text}");
    gateway.stop().await;
}

/// A body written by a channel, frame by frame.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(http_body::Frame::data(chunk))))
    }
}

/// The events of the mock's stream.
fn events() -> Vec<String> {
    let mut events: Vec<String> = (0..5)
        .map(|i| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"part{i} \"}}}}]}}\n\n"
            )
        })
        .collect();
    events.push("data: [DONE]\n\n".to_owned());
    events
}

/// A provider's event stream, written in pieces with pauses.
fn stream() -> kit::Script {
    Arc::new(|_: &Seen| {
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            for event in events() {
                let _ = sender.send(bytes::Bytes::from(event)).await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::new(ChannelBody(receiver)))
            .unwrap()
    })
}

#[tokio::test]
async fn event_streams_are_relayed_whole_and_in_pieces() {
    let openai = mock(stream()).await;
    let gateway = kit::gateway(&kit::config(
        &two_providers(&openai.url(), &openai.url()),
        &env(&KEYS),
    ))
    .await;
    let mut response = kit::client()
        .post(format!("http://{}/v1/chat/completions", gateway.addr))
        .body(r#"{"model":"gpt","stream":true,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut chunks = 0;
    let mut text = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        chunks += 1;
        text.extend_from_slice(&chunk);
    }
    assert_eq!(String::from_utf8(text).unwrap(), events().concat());
    // Relayed as it came, not gathered into one answer.
    assert!(chunks >= 3, "{chunks} chunks");
    gateway.stop().await;
}

#[tokio::test]
async fn a_stream_that_fails_before_its_first_content_is_retried_unseen() {
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = answered.clone();
    let flaky: kit::Script = Arc::new(move |seen: &Seen| {
        if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            // OpenAI's in-band error, after a 200, before any content.
            let error =
                "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from(error))
                .unwrap()
        } else {
            stream()(seen)
        }
    });
    let openai = mock(flaky).await;
    let config = kit::config(&two_providers(&openai.url(), &openai.url()), &env(&KEYS));
    let gateway = kit::gateway(&config).await;
    let body = r#"{"model":"gpt","stream":true,"messages":[]}"#;
    let (status, headers, text) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(text, events().concat());
    assert_eq!(headers["x-stormguard-attempts"], "2");
    assert_eq!(openai.seen().len(), 2);
    gateway.stop().await;
}

/// Logs written into memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// On tokio's paused clock: the engine's backoffs pass in no real time.
#[tokio::test(start_paused = true)]
async fn provider_keys_are_never_logged_nor_echoed() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // A provider that fails every time: the gateway retries, gives up and logs it.
    let failing = mock(Arc::new(|_: &Seen| {
        json(500, r#"{"error":{"message":"boom","type":"server_error"}}"#)
    }))
    .await;
    let text = two_providers(&failing.url(), &failing.url());
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let mut answers = String::new();
    let mut attempts = 0;
    for (path, model) in [
        ("/v1/chat/completions", "gpt"),
        ("/v1/messages", "claude"),
        ("/v1/chat/completions", "nope"),
    ] {
        let (status, headers, body) = post(
            gateway.addr,
            path,
            &format!(r#"{{"model":"{model}"}}"#),
            &[],
        )
        .await;
        assert_ne!(status, 200);
        if let Some(count) = headers.get("x-stormguard-attempts") {
            attempts += count.to_str().unwrap().parse::<usize>().unwrap();
        }
        answers.push_str(&format!("{headers:?}{body}"));
    }
    gateway.stop().await;
    // Every attempt the provider saw is counted in the answers' headers.
    assert!(failing.seen().len() >= 2);
    assert_eq!(failing.seen().len(), attempts);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("request failed after retrying"), "{logs}");
    assert!(logs.contains("retrying request"), "{logs}");
    for (_, key) in KEYS {
        assert!(!logs.contains(key), "a provider key in the logs");
        assert!(!answers.contains(key), "a provider key in an answer");
    }
}

/// The deployment `name`'s entry in `/healthz`.
async fn health_of(addr: std::net::SocketAddr, name: &str) -> serde_json::Value {
    let (_, body) = kit::get(addr, "/healthz").await;
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    body["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["deployment"] == name)
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn healthz_shows_each_keys_concurrency_limit_holding_a_stream_to_its_end() {
    // The key asked first (the balancer draws between the two) answers 429; the other answers a
    // stream held open until the test lets it end.
    let held: Arc<Mutex<Option<tokio::sync::mpsc::Sender<bytes::Bytes>>>> = Arc::default();
    let refused: Arc<Mutex<Option<String>>> = Arc::default();
    let (hold, refuse) = (held.clone(), refused.clone());
    let script: kit::Script = Arc::new(move |seen: &Seen| {
        let mut first = refuse.lock().unwrap();
        if first.is_none() {
            *first = seen.key().map(str::to_owned);
            return json(
                429,
                r#"{"error":{"message":"slow down","type":"rate_limit"}}"#,
            );
        }
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        *hold.lock().unwrap() = Some(sender);
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::new(ChannelBody(receiver)))
            .unwrap()
    });
    let openai = mock(script).await;
    let text = two_providers(&openai.url(), &openai.url())
        .replace(
            "model = \"gpt-upstream\"\n",
            "model = \"gpt-upstream\"\nconcurrency = \"adaptive\"\n",
        )
        .replace(
            "model = \"claude-upstream\"\n",
            "model = \"claude-upstream\"\nconcurrency = 4\n",
        );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    let limit = |d: &serde_json::Value| {
        let c = &d["concurrency"];
        (
            c["limit"].as_u64().unwrap(),
            c["in_flight"].as_u64().unwrap(),
        )
    };
    assert_eq!(
        limit(&health_of(gateway.addr, "openai/gpt-upstream/1").await),
        (20, 0)
    );
    assert_eq!(
        limit(&health_of(gateway.addr, "anthropic/claude-upstream/1").await),
        (4, 0)
    );

    let request = kit::client()
        .post(format!("http://{}/v1/chat/completions", gateway.addr))
        .body(r#"{"model":"gpt","stream":true,"messages":[]}"#)
        .send();
    let request = tokio::spawn(request);
    // The gateway answers once the stream's first content is in (until then it could retry).
    let sender = loop {
        if let Some(sender) = held.lock().unwrap().clone() {
            break sender;
        }
        tokio::task::yield_now().await;
    };
    sender
        .send(bytes::Bytes::from(events()[0].clone()))
        .await
        .unwrap();
    let mut response = request.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.chunk().await.unwrap().unwrap(),
        events()[0].as_bytes()
    );

    // The 429 shrank the refused key's limit by a tenth; the other holds its slot while the
    // stream runs, past the response head.
    let refused = refused.lock().unwrap().clone().unwrap();
    let (refused, answered) = if refused == KEYS[0].1 {
        ("openai/gpt-upstream/1", "openai/gpt-upstream/2")
    } else {
        ("openai/gpt-upstream/2", "openai/gpt-upstream/1")
    };
    let first = health_of(gateway.addr, refused).await;
    assert_eq!(limit(&first), (18, 0));
    assert_eq!(first["concurrency"]["shrunk"], 1);
    assert_eq!(
        (openai.with_key(KEYS[0].1), openai.with_key(KEYS[1].1)),
        (1, 1)
    );
    assert_eq!(limit(&health_of(gateway.addr, answered).await), (20, 1));

    for event in &events()[1..] {
        sender
            .send(bytes::Bytes::from(event.clone()))
            .await
            .unwrap();
    }
    drop(sender);
    held.lock().unwrap().take();
    while response.chunk().await.unwrap().is_some() {}
    // Freed at the stream's end; one attempt in flight of 20 is not a used limit: no growth.
    let second = health_of(gateway.addr, answered).await;
    assert_eq!(limit(&second), (20, 0));
    assert_eq!(second["concurrency"]["grown"], 0);
    gateway.stop().await;
}
