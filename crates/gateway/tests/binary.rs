//! The binary itself: started from the environment alone, it serves, and its logs never hold
//! the provider's key.

#![allow(clippy::unwrap_used)]

mod kit;

use std::io::{BufRead, BufReader};
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
    assert!(logs.contains("listening on loopback only"), "{logs}");
    assert!(!logs.contains(key), "the provider's key in the logs");
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
    loop {
        let line = read.recv_timeout(Duration::from_secs(10)).unwrap();
        logs.push(line.clone());
        if line.contains("stormguard-gateway listening") {
            return (child, read, logs);
        }
    }
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
