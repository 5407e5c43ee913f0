//! # stormguard-gateway
//!
//! stormguard's layers as a ready LLM gateway: one binary in front of OpenAI, Anthropic and any
//! OpenAI-compatible server (vLLM, Ollama, another gateway), configured by one TOML file or by
//! the environment alone. Callers keep their SDKs and point `base_url` at it; every request gets
//! one deadline and one retry budget across its retries and its failover, an adaptive throttle
//! and a breaker per deployment, and a stream guard that never restarts a stream that already
//! delivered tokens.
//!
//! It is made only of stormguard's public API: [`ServerLayer`](stormguard::ServerLayer) outside,
//! and per model a [`Failover`](stormguard::failover::Failover) built on
//! [`ClientLayer::default()`](stormguard::ClientLayer), one
//! [`Backend`](stormguard::failover::Backend) per deployment and key, each rank of the config a
//! [`with_rank`](stormguard::failover::Failover::with_rank).
//!
//! ## Quick start
//!
//! ```text
//! OPENAI_API_KEY=sk-... cargo run --release -p stormguard-gateway
//! curl http://127.0.0.1:4000/v1/chat/completions -H 'content-type: application/json' \
//!      -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}'
//! ```
//!
//! Without a file it starts from the environment ([`config::from_env`]): `OPENAI_API_KEY`
//! (`OPENAI_BASE_URL`), `ANTHROPIC_API_KEY` (`ANTHROPIC_BASE_URL`), or `STORMGUARD_UPSTREAM_URL`
//! (`STORMGUARD_UPSTREAM_KEY`), every model name passed through. With a file
//! (`stormguard-gateway --config gateway.toml`; the crate's `gateway.example.toml` documents
//! every key), models are routed to ranks of deployments across providers and keys.
//! `stormguard-gateway check gateway.toml` validates a file and prints the effective config
//! (each secret as its variable, set or missing), exit 0, or each error as
//! `FILE:LINE: key: message`, exit 1.
//!
//! The same as a library, for a program that builds the config itself:
//!
//! ```
//! use stormguard_gateway::config::{Config, Env};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let env: Env = [("OPENAI_API_KEY".to_owned(), "sk-...".to_owned())].into();
//! let file = r#"
//! [providers.openai]
//! format = "openai"
//! keys_env = ["OPENAI_API_KEY"]
//!
//! [[models.fast.deployments]]
//! provider = "openai"
//! model = "gpt-4o-mini"
//! "#;
//! let config = Config::parse("gateway.toml", file, &env)?;
//! assert_eq!(config.models["fast"].ranks[0][0].model, "gpt-4o-mini");
//! let running = stormguard_gateway::serve::start(&config).await?;
//! println!("listening on {}", running.addr);
//! # running.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! In the SDKs, turn their own retries off (`max_retries=0`): the gateway retries, and what it
//! gives up on carries `x-should-retry: false`.
//!
//! ## What it serves
//!
//! * `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses`
//!   (OpenAI's format) and `POST /v1/messages` (Anthropic's), passed through untranslated, event
//!   streams relayed as they come. The body's `model` picks the route; a model the gateway does
//!   not serve is a 404, a model of the other format a 400, a body over `max_body_bytes` a 413,
//!   each in the caller's format. Each answer says which deployment answered
//!   (`x-stormguard-backend`) and after how many attempts, on every deployment
//!   ([`X_STORMGUARD_ATTEMPTS`](serve::X_STORMGUARD_ATTEMPTS)).
//! * `GET /v1/models`: the configured model names (OpenAI's list format).
//! * `GET /healthz` (alive; each deployment's breaker), `GET /readyz` (200 when every model has
//!   a deployment whose key is set, else 503), `GET /metrics` (the library's metrics in
//!   Prometheus' text format). These three need no caller key.
//!
//! ## Secure by default
//!
//! * Callers' bearer keys (`Authorization: Bearer` or `x-api-key`) come from the variables
//!   `[server] caller_keys_env` names, compared in constant time; a 401 otherwise. Without any,
//!   the gateway listens on loopback only: a non-loopback address without keys is refused at
//!   start (exit 2) unless `allow_unauthenticated = true`.
//! * A key its provider refuses (401, 403) is set aside at its first refusal: that request goes
//!   on to the model's next key or deployment, no request is sent with the key again, and
//!   `/healthz` shows it (`"set_aside": true`); a model left with no other key is not ready.
//! * Provider keys come from the environment only (a key in the file is an error), are never
//!   logged, echoed, or sent to another provider; the caller's credentials, hop-by-hop headers
//!   and `x-stormguard-*` are stripped from what reaches a provider; upstream addresses come from
//!   the config only.
//!
//! ## Bounded
//!
//! * Request bodies are capped (`max_body_bytes`, 10 MiB: a 413 in the caller's format), heads
//!   too (`max_header_bytes`, 64 KiB: a 431), and the time a caller may take to send its head
//!   (`header_read_timeout`, 10 s: a slow-loris client holds no task for long, and a kept-alive
//!   connection that sends no next request within it is closed); at most `max_connections`
//!   (1,024) connections are served at once.
//! * Callers' deadline headers are capped by `max_deadline` (600 s).
//!
//! ## Performance
//!
//! `benches/gateway/run.sh` measures it against a bare hyper pass-through and LiteLLM's proxy on
//! one machine (saturation, added latency, time to first token, memory, start, size); its figures,
//! and what the success path pays for, are in the repository's `docs/PERFORMANCE.md`.
//!
//! ## Not yet
//!
//! This is the first part of the gateway. Not there yet:
//!
//! * SIGHUP reloading the config, SIGTERM draining streams in flight (the binary ends at once on a
//!   signal), and the `demo` subcommand;
//! * logs as JSON, `--redis` for a fleet, cures, hedging and degraded answers in the config;
//! * a key that answers 429 with a short Retry-After (or none) is retried on itself first, as the
//!   engine's policy allows, and only moved from when every attempt was answered 429: when its
//!   own adaptive throttle drops one of those retries, the request ends with a 503 ("throttled
//!   locally") instead of going to the next key. A Retry-After longer than a request waits for
//!   (over 60 s) moves it at once. This is the failover's rule, to be changed there;
//! * `/v1/models` in the environment-only start lists no model (every name is passed through).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod config;
pub mod format;
pub mod serve;
