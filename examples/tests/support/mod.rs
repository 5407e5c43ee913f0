//! A real Redis for the fleet tests: the server at `REDIS_URL` when it is set (`.ci/run` starts
//! one), else a `redis-server` of our own on a free loopback port, stopped when dropped.
//!
//! Without either, the tests say so and pass, unless `STORMGUARD_REQUIRE_REDIS` is set (as
//! `.ci/run` sets it): then a missing Redis fails them.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A Redis to test against.
pub struct Redis {
    pub url: String,
    /// The server we started, if we did.
    server: Option<Server>,
}

/// A `redis-server` process of our own.
pub struct Server {
    pub port: u16,
    child: Child,
}

impl Redis {
    /// The Redis of `REDIS_URL`, or one of our own; `None` (the test is skipped) if there is
    /// neither and none is required.
    pub fn find() -> Option<Self> {
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Some(Self { url, server: None });
        }
        let server = Server::start().or_else(missing)?;
        Some(Self {
            url: server.url(),
            server: Some(server),
        })
    }
}

impl Server {
    /// A `redis-server` on a free loopback port (`None` if there is no `redis-server` or it
    /// cannot be started).
    pub fn start() -> Option<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .ok()?
            .port();
        Self::start_on(port)
    }

    /// A `redis-server` on `port`, started again after a stop.
    pub fn start_on(port: u16) -> Option<Self> {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(binary)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let server = Self { port, child };
        let ready = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > ready {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops (`STOP`) or resumes (`CONT`) the server: a Redis that hangs, then answers again.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Kills the server at once, as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// No Redis: fail if one is required, else skip.
pub fn missing<T>() -> Option<T> {
    assert!(
        std::env::var_os("STORMGUARD_REQUIRE_REDIS").is_none(),
        "STORMGUARD_REQUIRE_REDIS is set but there is no Redis: set REDIS_URL or put \
         redis-server on the PATH"
    );
    eprintln!("skipped: no Redis (set REDIS_URL, or install redis-server)");
    None
}

/// A key prefix no other run shares.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!("stormguard:test:{name}:{}:{nanos}", std::process::id())
}

/// How far `admitted` is from `allowance`, as a share of it.
pub fn off_by(admitted: u64, allowance: f64) -> f64 {
    (admitted as f64 - allowance).abs() / allowance
}

/// A loopback provider answering 200 until `dies` is set, then 503; it counts its requests.
pub async fn dying_provider(dies: Arc<AtomicBool>) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let router = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        let dead = dies.load(Ordering::SeqCst);
        async move {
            match dead {
                true => (http::StatusCode::SERVICE_UNAVAILABLE, "{}"),
                false => (http::StatusCode::OK, r#"{"choices":[]}"#),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, hits)
}
