//! The gateway's configuration: a TOML file, or the environment alone.
//!
//! A file holds `[server]`, `[providers.NAME]` and `[models.NAME]` with its
//! `[[models.NAME.deployments]]` (see `gateway.example.toml` beside the crate's manifest). Secrets
//! come from the environment only: the file names the variables (`keys_env`,
//! `caller_keys_env`), and a key written in the file is an error. Unknown keys are errors, and
//! every error names the file, the line and the key ([`ConfigError`]).
//!
//! The environment is read through an [`Env`] map, so that tests never touch the process's.

mod build;
mod environment;
mod error;
mod policy;
mod raw;
mod show;
mod values;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use environment::{ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, OPENAI_API_KEY, OPENAI_BASE_URL};
pub use environment::{STORMGUARD_UPSTREAM_KEY, STORMGUARD_UPSTREAM_URL, from_env};
pub use error::{ConfigError, ConfigErrors, ENVIRONMENT};
pub use stormguard::failover::Cure;
pub use values::BaseUrl;

use crate::format::Format;

/// The environment as the gateway reads it: variable names to values.
pub type Env = BTreeMap<String, String>;

/// The process's environment, as an [`Env`] (variables whose name or value is not UTF-8 are
/// left out).
pub fn process_env() -> Env {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect()
}

/// Where the gateway listens when the config does not say: loopback, port 4000.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4000);

/// Largest request body accepted by default: 10 MiB (a long prompt with images fits; an upload
/// meant to exhaust memory does not).
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// Longest deadline a caller may ask for by default: the library's server cap (600 s, as long as
/// the OpenAI and Anthropic SDKs wait).
pub const DEFAULT_MAX_DEADLINE: Duration = stormguard::deadline::DEFAULT_TIMEOUT;

/// Longest a caller may take to send a request's head by default: 10 s. A client sends its head
/// in one write; one that trickles it a byte at a time (slow-loris) is cut off.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest request head by default: 64 KiB (hyper answers a larger one 431). An SDK's head is
/// under 2 KiB.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;

/// Connections served at once by default: 1,024. A streamed answer holds its connection for
/// minutes, so this bounds the sockets and tasks callers can hold; more wait in the backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How long requests and streams in flight get to finish once the gateway drains (SIGTERM,
/// SIGINT), by default: 25 s.
///
/// Kubernetes sends SIGTERM, then SIGKILL when the pod's `terminationGracePeriodSeconds` has
/// passed, 30 s unless the pod says otherwise (kubernetes.io, "Pod Lifecycle", termination of
/// Pods). A grace of 30 s would end with SIGKILL at the very moment the gateway writes each
/// unfinished stream's in-band error: those streams would be cut silently, the outcome the
/// drain exists to prevent. 25 s leaves 5 s for those last writes and the exit; a deployment
/// that wants longer streams to finish raises both, the pod's period above `drain_grace` + 5 s.
/// `docker stop` waits 10 s by default before its SIGKILL (docs.docker.com, `docker container
/// stop`, `--timeout`): under it, set `drain_grace` below that, or its timeout above.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(25);

/// A secret read from the environment: the variable's name, and its value if it is set. Its
/// `Debug` and `Display` show the name and whether it is set, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    var: String,
    value: Option<String>,
}

impl Secret {
    /// The secret held by variable `var` of `env` (unset when missing or empty).
    pub fn from_env(var: &str, env: &Env) -> Self {
        let value = env.get(var).filter(|value| !value.is_empty()).cloned();
        Self {
            var: var.to_owned(),
            value,
        }
    }

    /// A secret given on the command line with `flag` (shown as the flag, never its value).
    pub fn from_flag(flag: &str, value: &str) -> Self {
        Self {
            var: flag.to_owned(),
            value: Some(value.to_owned()).filter(|value| !value.is_empty()),
        }
    }

    /// The variable's name (or the flag's, for a secret given on the command line).
    pub fn var(&self) -> &str {
        &self.var
    }

    /// The value, if the variable is set.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.value.is_some() {
            "set"
        } else {
            "missing"
        };
        let sigil = if self.var.starts_with('-') { "" } else { "$" };
        write!(f, "{sigil}{} ({state})", self.var)
    }
}

/// The whole configuration, validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it came from: a file's path, or [`ENVIRONMENT`].
    pub source: String,
    /// How the gateway listens and whom it serves.
    pub server: Server,
    /// The providers, by name.
    pub providers: BTreeMap<String, Provider>,
    /// The models callers name, by name.
    pub models: BTreeMap<String, Model>,
    /// Per format, the provider that takes any model not listed, its name passed through
    /// (the environment-only start).
    pub pass_through: BTreeMap<&'static str, String>,
    /// How the gateway logs.
    pub log: Log,
    /// The fleet the gateway shares quotas and cooldowns with, if any.
    pub fleet: Option<Fleet>,
}

/// `[log]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// Text lines for a terminal, or one JSON object a line for a log pipeline.
    pub format: LogFormat,
    /// Whether lines show the engine's spans (`stormguard.request`, `stormguard.attempt`) they
    /// were written in. Off by default: a line names its backend and attempt itself, and the
    /// spans' fields would be formatted on every request, logged or not, which costs about a
    /// seventh of what the gateway spends on a request that succeeds (docs/PERFORMANCE.md).
    pub spans: bool,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Its name in the config: `text` or `json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }

    /// The format named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// `[fleet]`: the Redis server through which replicas of the gateway share each deployment's
/// quota (its rpm and tpm) and cooldowns (a deployment one replica's breaker left is left by all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fleet {
    /// The Redis URL (`redis://host:port/db`): it may hold a password, so it is a secret.
    pub redis: Secret,
    /// How many replicas share the quota: each takes this share of it while Redis is away.
    pub replicas: Option<u32>,
    /// The prefix of the fleet's keys in Redis: replicas of one gateway share it, and one Redis
    /// can hold several fleets under different ones.
    pub prefix: String,
    /// How long a decision waits for Redis before it is made on the replica's own share.
    pub timeout: Duration,
}

/// The prefix of a fleet's keys in Redis unless `[fleet] prefix` says otherwise.
pub const DEFAULT_FLEET_PREFIX: &str = "stormguard-gateway";

/// `[server]`.
#[derive(Clone, Debug)]
pub struct Server {
    /// The listen address.
    pub listen: SocketAddr,
    /// Whether a non-loopback address may serve without caller keys.
    pub allow_unauthenticated: bool,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Longest deadline a caller may ask for.
    pub max_deadline: Duration,
    /// Callers' bearer keys.
    pub caller_keys: Vec<Secret>,
    /// Longest a caller may take to send a request's head.
    pub header_read_timeout: Duration,
    /// Largest request head, in bytes.
    pub max_header_bytes: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long requests and streams in flight get to finish when the gateway drains.
    pub drain_grace: Duration,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN,
            allow_unauthenticated: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_deadline: DEFAULT_MAX_DEADLINE,
            caller_keys: Vec::new(),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            drain_grace: DEFAULT_DRAIN_GRACE,
        }
    }
}

/// `[providers.NAME]`.
#[derive(Clone, Debug)]
pub struct Provider {
    /// Its API format.
    pub format: Format,
    /// Its address.
    pub base_url: BaseUrl,
    /// Its keys (none: it is called without one, as a local vLLM or Ollama is).
    pub keys: Vec<Secret>,
}

/// `[models.NAME]`: the ranks of deployments that serve a model, and how they are used.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Ranks in the order they are tried; within one, deployments share the traffic.
    pub ranks: Vec<Vec<Deployment>>,
    /// When a second deployment is asked while the first has not answered.
    pub hedging: HedgingChoice,
    /// Failures sent straight to a deployment that cures them: the failure, and the deployment
    /// (`provider/model`, one of this model's).
    pub cures: Vec<(Cure, String)>,
    /// The text answered (as the model's answer, marked `x-stormguard-degraded: true`) when no
    /// deployment can answer; without it, the caller gets the error.
    pub degraded: Option<String>,
}

/// `hedging` of a model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum HedgingChoice {
    /// Only while a deployment's clocks have learned nothing: at their cold limit of a stream's
    /// time to first content (10 s plus the prompt's prefill; 60 s when reasoning is asked). The
    /// library's default: a deployment that accepts and never answers is left for the next one
    /// from the first request.
    #[default]
    Cold,
    /// At the 95th percentile of the deployment's learned time to first content (cold until
    /// learned).
    Learned,
    /// After this long.
    After(Duration),
    /// Never.
    Off,
}

/// One `[[models.NAME.deployments]]`.
#[derive(Clone, Debug)]
pub struct Deployment {
    /// The provider's name.
    pub provider: String,
    /// The model's name at the provider.
    pub model: String,
    /// The keys it uses (each one its own backend), a subset of the provider's.
    pub keys: Vec<Secret>,
    /// Requests per minute, per key.
    pub rpm: Option<u32>,
    /// Tokens per minute, per key.
    pub tpm: Option<u32>,
    /// A limit on the attempts in flight, per key, if any.
    pub concurrency: Option<Concurrency>,
}

/// A deployment's `concurrency`: a limit on each of its keys' attempts in flight, a streamed
/// answer counted until its last byte (`stormguard::concurrency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concurrency {
    /// `"adaptive"`: learned from the provider's overload answers, from the library's defaults
    /// (20 to start, doubling with each window of healthy answers until the first overload).
    Adaptive,
    /// A number: that many, never adapted (a bulkhead).
    Fixed(u32),
}

impl Concurrency {
    /// A new limit of this kind, with nothing in flight.
    pub fn limit(self) -> stormguard::concurrency::ConcurrencyLimit {
        use stormguard::concurrency::{ConcurrencyConfig, ConcurrencyLimit};
        match self {
            Self::Adaptive => ConcurrencyLimit::default(),
            Self::Fixed(n) => ConcurrencyLimit::new(ConcurrencyConfig::fixed(n)),
        }
    }
}

impl std::fmt::Display for Concurrency {
    /// As the config writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Adaptive => f.write_str("\"adaptive\""),
            Self::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl Deployment {
    /// Its name in the config's cures and in logs: `provider/model`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

impl Config {
    /// Reads and validates the file at `path`, with secrets from `env`.
    pub fn load(path: &Path, env: &Env) -> Result<Self, ConfigErrors> {
        let file = path.display().to_string();
        let source = std::fs::read_to_string(path).map_err(|error| {
            ConfigErrors(vec![ConfigError {
                file: file.clone(),
                line: 0,
                key: "(file)".to_owned(),
                message: format!("cannot read: {error}"),
            }])
        })?;
        Self::parse(&file, &source, env)
    }

    /// Validates `source`, the text of `file`, with secrets from `env`.
    pub fn parse(file: &str, source: &str, env: &Env) -> Result<Self, ConfigErrors> {
        build::build(file, source, env)
    }

    /// The effective configuration, secrets shown as their variables (set or missing).
    pub fn show(&self) -> String {
        show::show(self)
    }

    /// The format a model is served in, if the gateway serves it.
    pub fn model_format(&self, model: &Model) -> Option<Format> {
        let deployment = model.ranks.first()?.first()?;
        Some(self.providers.get(&deployment.provider)?.format)
    }
}
