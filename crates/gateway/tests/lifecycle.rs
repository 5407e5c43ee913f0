//! Drain and reload: a reload under load loses no request and moves only new ones, a broken
//! config is refused and the old one kept; a drain lets streams finish within the grace, ends the
//! others with their in-band error event and answers a request still waiting 503.

#![allow(clippy::unwrap_used)]

mod kit;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use kit::{Seen, echo, env, json, mock, post, slow_mock};
use stormguard::stream::continuation::{self, error_event};
use stormguard_gateway::serve::{ReloadError, Running};

/// The routes of the reload test: `gpt` on provider `a`; `fresh` (when `fresh` is true) and, once
/// moved, `gpt` on provider `b`.
fn routes(a: &str, b: &str, moved: bool) -> String {
    let gpt = if moved { "b" } else { "a" };
    let fresh = if moved {
        "[[models.fresh.deployments]]\nprovider = \"b\"\nmodel = \"fresh-up\"\n"
    } else {
        ""
    };
    format!(
        r#"
[providers.a]
format = "openai"
base_url = "{a}"

[providers.b]
format = "openai"
base_url = "{b}"

[[models.gpt.deployments]]
provider = "{gpt}"
model = "gpt-up"

{fresh}"#
    )
}

/// One caller's request: whether it was sent after the reload returned, whether its answer came
/// after, its status and the deployment that answered.
struct Sent {
    after: bool,
    answered_after: bool,
    status: u16,
    backend: String,
}

async fn caller(
    addr: std::net::SocketAddr,
    reloaded: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> Vec<Sent> {
    let mut sent = Vec::new();
    for _ in 0..12 {
        let after = reloaded.load(Ordering::SeqCst);
        let (status, headers, _) =
            post(addr, "/v1/chat/completions", r#"{"model":"gpt"}"#, &[]).await;
        let backend = headers
            .get("x-stormguard-backend")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let answered_after = reloaded.load(Ordering::SeqCst);
        sent.push(Sent {
            after,
            answered_after,
            status,
            backend,
        });
        done.fetch_add(1, Ordering::SeqCst);
    }
    sent
}

/// Waits (on the paused clock) until `done` reaches `count`.
async fn until(done: &AtomicUsize, count: usize) {
    while done.load(Ordering::SeqCst) < count {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A file with an error and a config that cannot be served (its caller key is not set): both
/// refused, the file's error with its file, line and key.
fn assert_broken_configs_refused(gateway: &Running, a: &str, b: &str) {
    let path = std::env::temp_dir().join(format!("stormguard-reload-{}.toml", std::process::id()));
    let broken = routes(a, b, false).replace("model = \"gpt-up\"", "modle = 1");
    std::fs::write(&path, broken).unwrap();
    let refused = gateway.reload_file(&path, &env(&[])).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    let ReloadError::Config(errors) = &refused else {
        panic!("{refused}")
    };
    assert_eq!(
        errors.to_string().trim_end(),
        format!(
            "{}:12: models.gpt.deployments.modle: unknown field `modle`, expected one of \
             `provider`, `model`, `rank`, `keys_env`, `rpm`, `tpm`, `concurrency`",
            path.display()
        )
    );
    let keyless = format!(
        "[server]\ncaller_keys_env = [\"UNSET_KEY\"]\n{}",
        routes(a, b, false)
    );
    let refused = gateway
        .reload(&kit::config(&keyless, &env(&[])))
        .unwrap_err();
    assert!(matches!(refused, ReloadError::Refused(_)), "{refused}");
}

/// The status of a request for `model`.
async fn status_of(addr: std::net::SocketAddr, model: &str) -> u16 {
    let body = format!(r#"{{"model":"{model}"}}"#);
    post(addr, "/v1/chat/completions", &body, &[]).await.0
}

#[tokio::test(start_paused = true)]
async fn a_reload_under_load_loses_no_request_and_a_broken_one_is_refused() {
    // Provider `a` answers after 100 ms: requests are in flight on it when the reload comes.
    let a = slow_mock(echo(), Duration::from_millis(100)).await;
    let b = mock(echo()).await;
    let gateway = kit::gateway(&kit::config(&routes(&a.url(), &b.url(), false), &env(&[]))).await;
    assert_eq!(status_of(gateway.addr, "fresh").await, 404);
    let reloaded = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(caller(gateway.addr, reloaded.clone(), done.clone())))
        .collect();
    until(&done, 30).await;
    let moved = kit::config(&routes(&a.url(), &b.url(), true), &env(&[]));
    gateway.reload(&moved).unwrap();
    reloaded.store(true, Ordering::SeqCst);
    assert_eq!(status_of(gateway.addr, "fresh").await, 200);
    until(&done, 60).await;
    assert_broken_configs_refused(&gateway, &a.url(), &b.url());
    let mut sent = Vec::new();
    for caller in callers {
        sent.extend(caller.await.unwrap());
    }
    assert_eq!(sent.len(), 96);
    assert!(sent.iter().all(|sent| sent.status == 200), "a request lost");
    // Every request sent after the reload went to `b`, the broken configs notwithstanding.
    let later: Vec<&Sent> = sent.iter().filter(|sent| sent.after).collect();
    assert!(later.len() >= 30, "{} after the reload", later.len());
    assert!(
        later.iter().all(|sent| sent.backend == "b/gpt-up"),
        "{:?}",
        later.iter().map(|s| &s.backend).collect::<Vec<_>>()
    );
    // Those in flight on `a` when it came were answered by `a`, as they started.
    let kept = sent
        .iter()
        .filter(|sent| !sent.after && sent.answered_after && sent.backend == "a/gpt-up")
        .count();
    assert!(kept >= 1, "no request in flight across the reload");
    assert!(
        sent.iter()
            .filter(|sent| sent.backend == "a/gpt-up")
            .count()
            >= 30
    );
    assert_eq!(status_of(gateway.addr, "fresh").await, 200);
    gateway.stop().await;
}

/// A body written from a channel, a frame at a time.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(http_body::Frame::data(chunk))))
    }
}

/// The events of a stream of `tokens` content events in `format`'s API.
fn events(anthropic: bool, tokens: usize) -> Vec<String> {
    let mut events = Vec::new();
    if anthropic {
        events.push("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n".to_owned());
    }
    for i in 0..tokens {
        events.push(if anthropic {
            format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"t{i} \"}}}}\n\n")
        } else {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n")
        });
    }
    events.push(if anthropic {
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned()
    } else {
        "data: [DONE]\n\n".to_owned()
    });
    events
}

/// A provider streaming one event a second: 3 content events for a model named `*short`, 20
/// otherwise.
fn slow_stream() -> kit::Script {
    Arc::new(|seen: &Seen| {
        let anthropic = seen.path == "/v1/messages";
        let tokens = if seen.model.ends_with("short") { 3 } else { 20 };
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for event in events(anthropic, tokens) {
                if sender.send(Bytes::from(event)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::new(ChannelBody(receiver)))
            .unwrap()
    })
}

/// The drain test's config: streams on `streams` (both formats), `held` on `slow`.
fn drain_config(streams: &str, slow: &str) -> String {
    let mut text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
drain_grace = "5s"

[providers.openai]
format = "openai"
base_url = "{streams}"

[providers.anthropic]
format = "anthropic"
base_url = "{streams}"

[providers.slow]
format = "openai"
base_url = "{slow}"

[[models.held.deployments]]
provider = "slow"
model = "held"
"#
    );
    for (model, provider) in [
        ("gpt-short", "openai"),
        ("gpt-long", "openai"),
        ("claude-short", "anthropic"),
        ("claude-long", "anthropic"),
    ] {
        text.push_str(&format!(
            "\n[[models.{model}.deployments]]\nprovider = \"{provider}\"\nmodel = \"{model}\"\n"
        ));
    }
    text
}

/// Sends a streamed request for `model` and reads its whole answer; `first` is told when its
/// first bytes came.
async fn stream_of(
    addr: std::net::SocketAddr,
    model: &str,
    first: tokio::sync::mpsc::Sender<()>,
) -> (u16, String) {
    let path = if model.starts_with("claude") {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    };
    let mut response = kit::client()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"model":"{model}","stream":true,"max_tokens":100,"messages":[]}}"#
        ))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let mut text = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        if text.is_empty() {
            let _ = first.send(()).await;
        }
        text.extend_from_slice(&chunk);
    }
    (status, String::from_utf8(text).unwrap())
}

/// A stream the drain ended: whole events of the provider's, then exactly the in-band error
/// event that counts them.
fn assert_ended(text: &str, anthropic: bool) {
    let all = events(anthropic, 20);
    let kept = (1..all.len())
        .rev()
        .find(|n| text.starts_with(&all[..*n].concat()))
        .unwrap();
    let prefix = all[..kept].concat();
    assert!(
        kept >= 3 && kept < all.len() - 1,
        "{kept} events before the end"
    );
    let content = if anthropic { kept - 1 } else { kept } as u64;
    let format = if anthropic {
        continuation::Format::AnthropicMessages
    } else {
        continuation::Format::OpenAiChat
    };
    let frame = error_event(format, "shutdown", content, prefix.len() as u64);
    assert_eq!(&text[prefix.len()..], std::str::from_utf8(&frame).unwrap());
    let data = text[prefix.len()..]
        .split("data: ")
        .nth(1)
        .unwrap()
        .trim_end();
    let error: serde_json::Value = serde_json::from_str(data).unwrap();
    if anthropic {
        assert!(text[prefix.len()..].starts_with("event: error\n"));
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "api_error");
    } else {
        assert_eq!(error["error"]["type"], "stream_interrupted");
    }
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("(shutdown)"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_drain_ends_what_the_grace_did_not_see_finish_in_band() {
    let streams = mock(slow_stream()).await;
    let slow = slow_mock(echo(), Duration::from_secs(100)).await;
    let config = kit::config(&drain_config(&streams.url(), &slow.url()), &env(&[]));
    let gateway = kit::gateway(&config).await;
    let addr = gateway.addr;
    let (first, mut firsts) = tokio::sync::mpsc::channel(4);
    let models = ["gpt-short", "gpt-long", "claude-short", "claude-long"];
    let readers: Vec<_> = models
        .iter()
        .map(|model| tokio::spawn(stream_of(addr, model, first.clone())))
        .collect();
    let held = tokio::spawn(post(
        addr,
        "/v1/chat/completions",
        r#"{"model":"held"}"#,
        &[],
    ));
    for _ in models {
        firsts.recv().await.unwrap();
    }
    while slow.seen().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let began = tokio::time::Instant::now();
    let drain = tokio::spawn(gateway.drain());
    tokio::time::sleep(Duration::from_millis(10)).await;
    // New connections are refused at once.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let drained = drain.await.unwrap();
    let took = began.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(
        (
            drained.in_flight,
            drained.finished,
            drained.ended,
            drained.cut
        ),
        (5, 2, 3, 0),
        "{drained:?}"
    );
    let mut answers = Vec::new();
    for reader in readers {
        answers.push(reader.await.unwrap());
    }
    assert_eq!(answers[0], (200, events(false, 3).concat()));
    assert_eq!(answers[2], (200, events(true, 3).concat()));
    assert_eq!(answers[1].0, 200);
    assert_ended(&answers[1].1, false);
    assert_eq!(answers[3].0, 200);
    assert_ended(&answers[3].1, true);
    let (status, headers, body) = held.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["x-should-retry"], "true");
    assert_eq!(headers["retry-after"], "1");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down")
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_with_nothing_in_flight_returns_at_once() {
    let provider = mock(Arc::new(|_: &Seen| json(200, r#"{"id":"x","choices":[]}"#))).await;
    let gateway = kit::gateway(&kit::config(
        &routes(&provider.url(), &provider.url(), false),
        &env(&[]),
    ))
    .await;
    // A kept-alive connection, idle: closed by the drain, not waited for.
    let client = kit::client();
    let url = format!("http://{}/v1/chat/completions", gateway.addr);
    let answer = client
        .post(&url)
        .body(r#"{"model":"gpt"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let began = tokio::time::Instant::now();
    let drained = gateway.drain().await;
    assert!(
        began.elapsed() < Duration::from_millis(100),
        "{:?}",
        began.elapsed()
    );
    assert_eq!((drained.in_flight, drained.ended, drained.cut), (0, 0, 0));
}
