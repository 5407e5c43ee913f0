//! The binary itself: started from the environment alone, it serves, and its logs never hold
//! the provider's key.

#![allow(clippy::unwrap_used)]

mod kit;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kit::{Seen, json, mock, post};

/// The gateway's process, ended when the test ends, passed or failed.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_from_the_environment_and_never_logs_the_key() {
    let key = "sk-binary-secret-8a8a";
    // A provider that fails once, so that the gateway logs a retry, then answers.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = calls.clone();
    let provider = mock(std::sync::Arc::new(move |_: &Seen| {
        if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            json(500, r#"{"error":{"message":"boom","type":"server_error"}}"#)
        } else {
            json(200, r#"{"id":"ok","choices":[]}"#)
        }
    }))
    .await;
    let provider_url = format!("{}/v1", provider.url());
    let vars = [("OPENAI_API_KEY", key), ("OPENAI_BASE_URL", &provider_url)];
    let (child, read, mut logs) = spawn(&["--listen", "127.0.0.1:0"], &vars);
    let addr = listening(&logs);
    let (status, headers, body) = post(
        addr,
        "/v1/chat/completions",
        r#"{"model":"any-model"}"#,
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-stormguard-attempts"], "2");
    assert_eq!(provider.seen()[1].key(), Some(key));
    assert_eq!(provider.seen()[1].model, "any-model");
    drop(child);
    logs.extend(read.iter());
    let logs = logs.join("\n");
    assert!(logs.contains("retrying request"), "{logs}");
    // Without `[log] spans`, the retry's line names its backend itself and shows no span.
    let retry = logs.lines().find(|line| line.contains("retrying request"));
    let retry = retry.unwrap();
    assert!(retry.contains("backend="), "{retry}");
    assert!(!retry.contains("stormguard.attempt"), "{retry}");
    assert!(logs.contains("listening on loopback only"), "{logs}");
    assert!(!logs.contains(key), "the provider's key in the logs");
}

/// Sends `signal` (`HUP`, `TERM`) to the process `pid`.
fn kill(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Reads log lines until one contains `wanted`; every line read is kept in `logs`.
fn read_until(read: &mpsc::Receiver<String>, logs: &mut Vec<String>, wanted: &str) -> String {
    loop {
        let line = read.recv_timeout(Duration::from_secs(10)).unwrap();
        logs.push(line.clone());
        if line.contains(wanted) {
            return line;
        }
    }
}

/// The config of the signals test: `gpt` on `provider`'s mock, a drain of 300 ms.
fn signalled_config(provider: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndrain_grace = \"300ms\"\n\n\
         [providers.mock]\nformat = \"openai\"\nbase_url = \"{provider}\"\n\n\
         [[models.gpt.deployments]]\nprovider = \"mock\"\nmodel = \"gpt-up\"\n"
    )
}

/// Starts the binary with `args` and only the variables `vars`: the process, its stderr's lines
/// still to come, and those read until it said where it listens.
fn spawn(args: &[&str], vars: &[(&str, &str)]) -> (Child, mpsc::Receiver<String>, Vec<String>) {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_stormguard-gateway"))
            .args(args)
            .env_clear()
            .envs(vars.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (lines, read) = mpsc::channel();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut logs = Vec::new();
    read_until(&read, &mut logs, "stormguard-gateway listening");
    (child, read, logs)
}

/// The address the gateway said it listens on, in text or JSON logs.
fn listening(logs: &[String]) -> std::net::SocketAddr {
    let line = logs.last().unwrap();
    let at = line.split("addr").nth(1).unwrap();
    let at = at.trim_start_matches(['=', '"', ':']);
    let end = at
        .find(|c: char| c == '"' || c.is_whitespace())
        .unwrap_or(at.len());
    at[..end].parse().unwrap()
}

#[tokio::test]
async fn logs_as_json_are_one_object_a_line_and_failures_are_summed_up() {
    // A provider that is not there: every call fails (its connections refused).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let args = ["--listen", "127.0.0.1:0", "--log-format", "json"];
    let (child, read, mut logs) = spawn(&args, &[("STORMGUARD_UPSTREAM_URL", &url)]);
    let addr = listening(&logs);
    // Fifty failed calls: the first is logged at WARN, the others only counted for the summary.
    for _ in 0..50 {
        let (status, _, _) = post(addr, "/v1/chat/completions", r#"{"model":"m"}"#, &[]).await;
        assert!(matches!(status, 502 | 503), "{status}");
    }
    drop(child);
    logs.extend(read.iter());
    for line in &logs {
        let object: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            object["level"].is_string() && object["fields"].is_object(),
            "{line}"
        );
    }
    let failed = logs
        .iter()
        .filter(|line| line.contains("upstream call failed"))
        .count();
    assert_eq!(failed, 1, "{logs:?}");
}

/// The binary serving the file at `path`: the process, its log lines (those read so far in the
/// `Vec`) and its address.
fn started(
    path: &std::path::Path,
) -> (
    Child,
    mpsc::Receiver<String>,
    Vec<String>,
    std::net::SocketAddr,
) {
    let (child, read, logs) = spawn(&["--config", path.to_str().unwrap()], &[]);
    let addr = listening(&logs);
    (child, read, logs, addr)
}

/// Waits (10 s at most) for the process to exit: its exit code.
fn exit_code(child: &mut Child) -> Option<i32> {
    let mut waited = Duration::ZERO;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status.code();
        }
        assert!(waited < Duration::from_secs(10), "still running");
        std::thread::sleep(Duration::from_millis(20));
        waited += Duration::from_millis(20);
    }
}

/// A body written from a channel, a frame at a time.
struct Events(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Events {
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

/// A provider streaming 50 content events, one each 100 ms.
fn streaming() -> kit::Script {
    std::sync::Arc::new(|_: &Seen| {
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for i in 0..50 {
                let event = format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
                );
                if sender.send(bytes::Bytes::from(event)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::new(Events(receiver)))
            .unwrap()
    })
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_ends_a_stream_in_band_and_a_second_one_ends_the_drain() {
    let provider = mock(streaming()).await;
    for (grace, twice) in [("300ms", false), ("60s", true)] {
        let path = std::env::temp_dir().join(format!(
            "stormguard-stream-{}-{twice}.toml",
            std::process::id()
        ));
        let config = signalled_config(&provider.url()).replace("300ms", grace);
        std::fs::write(&path, config).unwrap();
        let (mut child, read, mut logs, addr) = started(&path);
        std::fs::remove_file(&path).unwrap();
        let mut response = kit::client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .body(r#"{"model":"gpt","stream":true,"messages":[]}"#)
            .send()
            .await
            .unwrap();
        let mut text = response.chunk().await.unwrap().unwrap().to_vec();
        kill("TERM", child.0.id());
        if twice {
            read_until(&read, &mut logs, "SIGTERM: draining");
            kill("TERM", child.0.id());
            assert_eq!(exit_code(&mut child), Some(1));
            read_until(&read, &mut logs, "a second signal");
            continue;
        }
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("data: {\"error\":"), "{text}");
        assert!(last.contains("\"type\":\"stream_interrupted\""), "{last}");
        assert!(last.contains("(shutdown)"), "{last}");
        assert_eq!(exit_code(&mut child), Some(0));
        let drained = read_until(&read, &mut logs, "drained");
        assert!(drained.contains("finished=0 ended=1 cut=0"), "{drained}");
    }
}

#[cfg(unix)]
#[tokio::test]
async fn the_binary_reloads_on_sighup_and_drains_on_sigterm() {
    let answer = |name: &'static str| {
        std::sync::Arc::new(move |_: &Seen| json(200, &format!(r#"{{"id":"{name}"}}"#)))
    };
    let (first, second) = (mock(answer("first")).await, mock(answer("second")).await);
    let path = std::env::temp_dir().join(format!("stormguard-signals-{}.toml", std::process::id()));
    std::fs::write(&path, signalled_config(&first.url())).unwrap();
    let (mut child, read, mut logs, addr) = started(&path);
    let pid = child.0.id();
    let gpt = r#"{"model":"gpt"}"#;
    let path_v1 = "/v1/chat/completions";
    assert_eq!(post(addr, path_v1, gpt, &[]).await.2, r#"{"id":"first"}"#);
    std::fs::write(&path, signalled_config(&second.url())).unwrap();
    kill("HUP", pid);
    read_until(&read, &mut logs, "config reloaded");
    assert_eq!(post(addr, path_v1, gpt, &[]).await.2, r#"{"id":"second"}"#);
    std::fs::write(&path, "[server]\nlisten = 4000\n").unwrap();
    kill("HUP", pid);
    read_until(&read, &mut logs, "reload refused");
    let error = read_until(&read, &mut logs, "server.listen");
    std::fs::remove_file(&path).unwrap();
    assert!(
        error.starts_with(&format!("{}:2: server.listen: ", path.display())),
        "{error}"
    );
    // The old config still serves.
    assert_eq!(post(addr, path_v1, gpt, &[]).await.2, r#"{"id":"second"}"#);
    kill("TERM", pid);
    assert_eq!(exit_code(&mut child), Some(0));
    logs.extend(read.try_iter());
    let logs = logs.join("\n");
    assert!(logs.contains("SIGTERM: draining"), "{logs}");
    assert!(logs.contains("drained"), "{logs}");
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}

#[tokio::test]
async fn the_demo_prints_curl_lines_naming_the_address_it_listens_on() {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_stormguard-gateway"))
            .args(["demo", "--listen", "127.0.0.1:0"])
            .env_clear()
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (lines, read) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut curls = Vec::new();
    while curls.len() < 3 {
        let line = read.recv_timeout(Duration::from_secs(10)).unwrap();
        if line.trim_start().starts_with("curl ") {
            curls.push(line);
        }
    }
    // The address it bound (port 0 asked for), the same in every line.
    let url = curls[0]
        .split_whitespace()
        .find(|word| word.starts_with("http://127.0.0.1:"))
        .unwrap();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(addr.port(), 0);
    for curl in &curls {
        assert!(curl.contains(&format!("http://{addr}/v1/")), "{curl}");
    }
    // The first line's request, as a reader pasting it sends it: failed once, then answered.
    let (status, headers, body) = post(
        addr,
        "/v1/chat/completions",
        r#"{"model":"demo","messages":[{"role":"user","content":"Count for me"}]}"#,
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-stormguard-attempts"], "2");
    assert!(
        body.contains(r#""content":"1 2 3 4 5 6 7 8 9 10 11 12""#),
        "{body}"
    );
}
