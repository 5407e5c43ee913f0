//! The tests' kit: mock providers on loopback that record what reached them, and a gateway
//! started from a config text and an environment map.

#![allow(dead_code, clippy::unwrap_used)]

pub mod provider;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use http::{HeaderMap, Response, StatusCode};
use stormguard_gateway::config::{Config, Env};
use stormguard_gateway::serve::{self, Running};

/// What reached a mock provider.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: String,
    pub model: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The key it carried: the bearer token, else `x-api-key`.
    pub fn key(&self) -> Option<&str> {
        self.header("authorization")
            .and_then(|value| value.strip_prefix("Bearer "))
            .or_else(|| self.header("x-api-key"))
    }
}

/// How a mock answers what it saw.
pub type Script = Arc<dyn Fn(&Seen) -> Response<Body> + Send + Sync>;

/// A mock provider.
pub struct Mock {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Mock {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests seen with `key`.
    pub fn with_key(&self, key: &str) -> usize {
        self.seen()
            .iter()
            .filter(|seen| seen.key() == Some(key))
            .count()
    }
}

/// An answer with `status` and a JSON `body`.
pub fn json(status: u16, body: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// A mock that answers every request 200 with its model and the key it got's place.
pub fn echo() -> Script {
    Arc::new(|seen: &Seen| {
        json(
            200,
            &format!(r#"{{"id":"x","model":"{}","choices":[]}}"#, seen.model),
        )
    })
}

/// Starts a mock provider answering with `script`.
pub async fn mock(script: Script) -> Mock {
    slow_mock(script, Duration::ZERO).await
}

/// Starts a mock provider answering with `script` after `delay`.
pub async fn slow_mock(script: Script, delay: Duration) -> Mock {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .fallback(record)
        .with_state((script, seen.clone(), delay));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Mock { addr, seen }
}

type MockState = (Script, Arc<Mutex<Vec<Seen>>>, Duration);

async fn record(
    State((script, seen, delay)): State<MockState>,
    request: Request,
) -> Response<Body> {
    let (head, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let body = String::from_utf8_lossy(&body).into_owned();
    let model = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value.get("model")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    let this = Seen {
        path: head.uri.path().to_owned(),
        headers: head.headers,
        body,
        model,
    };
    seen.lock().unwrap().push(this.clone());
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    script(&this)
}

/// An environment map.
pub fn env(vars: &[(&str, &str)]) -> Env {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The config of `text` (a file named `gateway.toml`), on an ephemeral loopback port unless it
/// says otherwise.
pub fn config(text: &str, env: &Env) -> Config {
    let mut config = Config::parse("gateway.toml", text, env).unwrap();
    if !text.contains("listen") {
        config.server.listen = "127.0.0.1:0".parse().unwrap();
    }
    config
}

/// A gateway serving `config`.
pub async fn gateway(config: &Config) -> Running {
    serve::start(config).await.unwrap()
}

/// A plain HTTP client.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// POSTs `body` to `path` of the gateway at `addr`, with `headers`: status, headers, body.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, HeaderMap, String) {
    let mut request = client()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

/// GETs `path`: status and body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The two-provider, three-key config over the mocks at `openai` and `anthropic`.
pub fn two_providers(openai: &str, anthropic: &str) -> String {
    format!(
        r#"
[providers.openai]
format = "openai"
base_url = "{openai}"
keys_env = ["OPENAI_KEY_1", "OPENAI_KEY_2"]

[providers.anthropic]
format = "anthropic"
base_url = "{anthropic}"
keys_env = ["ANTHROPIC_KEY"]

[[models.gpt.deployments]]
provider = "openai"
model = "gpt-upstream"

[[models.claude.deployments]]
provider = "anthropic"
model = "claude-upstream"
"#
    )
}

/// The keys of [`two_providers`].
pub const KEYS: [(&str, &str); 3] = [
    ("OPENAI_KEY_1", "sk-openai-one-7f3a"),
    ("OPENAI_KEY_2", "sk-openai-two-9c1b"),
    ("ANTHROPIC_KEY", "sk-ant-three-4d2e"),
];
