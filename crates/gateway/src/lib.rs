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
//! With no key, in front of embedded mock providers that fail on purpose ([`demo`]): it prints
//! the `curl` commands to try, and the headers to look at.
//!
//! ```text
//! cargo run --release -p stormguard-gateway -- demo
//! ```
//!
//! In front of OpenAI:
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
//! `serve::start` serves the connections on the runtime it is called from; the binary serves
//! them on one thread a core (`serve::start_on` with `serve::Workers::per_core()`), each thread
//! with its own pool of provider connections.
//!
//! In the SDKs, point `base_url` at the gateway (OpenAI's SDKs: `http://127.0.0.1:4000/v1`,
//! Anthropic's: `http://127.0.0.1:4000`) and turn their own retries off (`max_retries=0`): the
//! gateway retries, and what it gives up on carries `x-should-retry: false`.
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
//! * A key (or deployment) that answers 429 hands the request at once to another of its rank
//!   not tried yet, else to the next rank
//!   ([`with_hand_off_429`](stormguard::failover::Failover::with_hand_off_429), on in every
//!   route): 2 attempts, the second answering. The key that answered 429 is passed over while it
//!   cools for its `Retry-After` (1 s without one). With no other key free, its hint is waited
//!   out and it is retried, as a single key is; and when nothing else answered, the caller gets
//!   the provider's 429 with its `Retry-After` and `x-should-retry: false`, never a 503 of the
//!   key's own throttle or breaker refusing the retry.
//! * `GET /v1/models`: the configured model names (OpenAI's list format).
//! * `GET /healthz` (alive; each deployment's breaker, and its concurrency limit's state when it
//!   has one: `limit`, `in_flight`, `shrunk`, `grown`), `GET /readyz` (200 when every model has
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
//! ## Drain and reload
//!
//! * SIGTERM or SIGINT drains ([`Running::drain`](serve::Running::drain)): the listener closes
//!   at once (new connections are refused, so the load balancer sends them to another replica),
//!   idle kept-alive connections close, and requests and streams in flight get `drain_grace`
//!   (25 s, under Kubernetes' default `terminationGracePeriodSeconds` of 30 s by the 5 s the last
//!   writes need; see [`DEFAULT_DRAIN_GRACE`](config::DEFAULT_DRAIN_GRACE)). When it ends, each
//!   stream still open hands on the whole events it has and ends with one in-band error event in
//!   its provider's format (the library's
//!   [`error_event`](stormguard::stream::continuation::error_event), cause `shutdown`: OpenAI's
//!   `data: {"error":{.., "type":"stream_interrupted"}}`, Anthropic's `event: error` with an
//!   `api_error`), so SDKs raise rather than return half an answer as whole; a stream that
//!   already sent its terminal event ends as it is. A request still waiting for its provider is
//!   answered 503 in the caller's format with `x-should-retry: true` and `Retry-After: 1`. Those
//!   answers get 1 s to be written, then the process exits 0. The drain's start and end are
//!   logged, with how many requests were in flight, finished and were ended. A second SIGTERM
//!   or SIGINT ends the drain at once (exit 1).
//! * SIGHUP reloads the file given with `--config`
//!   ([`Running::reload`](serve::Running::reload), [`Running::reload_file`](serve::Running::reload_file)
//!   in a library), read with the process's environment: a valid config serves every request
//!   that arrives after it (routes, caller keys, limits), while the requests in flight finish
//!   on the one they started with; a config with errors, or one that cannot be served (a caller
//!   key not set, no caller key left on a non-loopback address), is refused and logged (each
//!   error as `FILE:LINE: key: message`), the one in use kept. `listen` and `max_connections`
//!   need a restart: a reload that changes them keeps the old ones and says so. A reload builds
//!   every deployment anew (breakers closed, throttles and rate-limit windows fresh, a key set
//!   aside tried again: replacing a refused key is one reason to reload). Started from the
//!   environment alone, SIGHUP is logged and changes nothing: a process cannot see its
//!   environment change.
//!
//! ## A model's policy
//!
//! Beside its deployments, a model's table may say (see `gateway.example.toml`):
//!
//! * `hedging`: when a second deployment is asked while the first has produced nothing:
//!   `"cold"` (the default, [`Hedging::cold`](stormguard::retry::Hedging::cold): only until a
//!   deployment's times are learned, at 10 s plus the prompt's prefill for a stream's first
//!   token, 60 s when reasoning is asked), `"learned"` (the 95th percentile of its learned time
//!   to first content), a duration (`"3s"`), or `"off"`. One hedge per request, drawn from the
//!   retry budget.
//! * `degraded`: a text answered as the model's answer when no deployment can answer, in the
//!   caller's format and shape (a chat completion, a completion, an Anthropic message; an event
//!   stream when the caller asked for one), marked `x-stormguard-degraded: true`. An embedding or
//!   a Responses API call cannot be a canned text: those get a 503 in the caller's format with
//!   `Retry-After`. Without it, the caller gets the error.
//! * `[models.NAME.cures]`: `context_too_long`, `content_filtered` or `quota_exhausted` sent
//!   straight to one of the model's deployments (`"provider/model"`), passing over the ranks
//!   between; without a cure such a failure is the caller's, never retried.
//!
//! ## Logs and fleets
//!
//! * Logs go to stderr as text, or as one JSON object a line with `[log] format = "json"` (or
//!   `--log-format json`). A failed call is logged at WARN the first time, then counted by
//!   reason and summed up in one WARN line every 10 s at most (each one at DEBUG): a storm of
//!   failures is a line every ten seconds, not thousands a second.
//! * `[fleet]` (or `--redis URL`) makes the replicas of one gateway share a Redis: each
//!   deployment's quota (its `rpm` and `tpm`, per key) is the fleet's, each replica pacing to
//!   its share of it while Redis is away, and a deployment one replica's breaker left is left by
//!   every replica within a decision ([`Cooldowns::fleet`](stormguard::failover::Cooldowns)).
//!   The URL may hold a password, so a file names its variable (`redis_url_env`); `prefix`
//!   (default `stormguard-gateway`) keeps fleets apart in one Redis, `timeout` (5 ms) bounds the
//!   wait for it.
//!
//! ## Performance
//!
//! `benches/gateway/run.sh` measures it against a bare hyper pass-through and LiteLLM's proxy on
//! one machine (saturation, added latency, time to first token, memory, start, size); its figures,
//! and what the success path pays for, are in the repository's `docs/PERFORMANCE.md`.
//!
//! ## Not yet
//!
//! Not there yet:
//!
//! * the throughput the benchmark asks for: at least 0.7 times a bare proxy's saturation (see
//!   `docs/PERFORMANCE.md` for what is measured and what the success path pays for);
//! * `/v1/models` in the environment-only start lists no model (every name is passed through).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod config;
pub mod demo;
pub mod format;
pub mod serve;
