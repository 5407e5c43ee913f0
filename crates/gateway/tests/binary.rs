//! The binary itself: started from the environment alone, it serves, and its logs never hold
//! the provider's key; `demo` prints curl lines that work against the address it bound.

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
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_stormguard-gateway"))
            .args(["--listen", "127.0.0.1:0"])
            .env_clear()
            .env("OPENAI_API_KEY", key)
            .env("OPENAI_BASE_URL", format!("{}/v1", provider.url()))
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
    let addr = loop {
        let line = read.recv_timeout(Duration::from_secs(10)).unwrap();
        logs.push(line.clone());
        if let Some(at) = line
            .split("addr=")
            .nth(1)
            .filter(|_| line.contains("stormguard-gateway listening"))
        {
            break at.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
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
    logs.extend(read.try_iter());
    let logs = logs.join("\n");
    assert!(logs.contains("retrying request"), "{logs}");
    assert!(logs.contains("listening on loopback only"), "{logs}");
    assert!(!logs.contains(key), "the provider's key in the logs");
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
