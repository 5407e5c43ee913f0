//! The file as TOML holds it, before validation: every key known (an unknown one is an error),
//! and the spans of the values validated later, for their lines.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use crate::format::Format;

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    #[serde(default)]
    pub(crate) server: Option<ServerTable>,
    #[serde(default)]
    pub(crate) providers: BTreeMap<Spanned<String>, ProviderTable>,
    #[serde(default)]
    pub(crate) models: BTreeMap<Spanned<String>, ModelTable>,
    pub(crate) log: Option<LogTable>,
    pub(crate) fleet: Option<FleetTable>,
}

/// `[log]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogTable {
    pub(crate) format: Option<Spanned<String>>,
    pub(crate) spans: Option<bool>,
}

/// `[fleet]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FleetTable {
    pub(crate) redis_url_env: Spanned<String>,
    pub(crate) replicas: Option<Spanned<i64>>,
    pub(crate) prefix: Option<String>,
    pub(crate) timeout: Option<Spanned<String>>,
}

/// `[server]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerTable {
    pub(crate) listen: Option<Spanned<String>>,
    pub(crate) allow_unauthenticated: Option<bool>,
    pub(crate) max_body_bytes: Option<Spanned<i64>>,
    pub(crate) max_deadline: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) caller_keys_env: Vec<Spanned<String>>,
    pub(crate) header_read_timeout: Option<Spanned<String>>,
    pub(crate) max_header_bytes: Option<Spanned<i64>>,
    pub(crate) max_connections: Option<Spanned<i64>>,
    pub(crate) drain_grace: Option<Spanned<String>>,
}

/// `[providers.NAME]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderTable {
    pub(crate) format: Format,
    pub(crate) base_url: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) keys_env: Vec<Spanned<String>>,
}

/// `[models.NAME]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelTable {
    pub(crate) deployments: Spanned<Vec<DeploymentTable>>,
    pub(crate) hedging: Option<Spanned<String>>,
    pub(crate) degraded: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) cures: BTreeMap<Spanned<String>, Spanned<String>>,
}

/// `[[models.NAME.deployments]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeploymentTable {
    pub(crate) provider: Spanned<String>,
    pub(crate) model: Option<String>,
    pub(crate) rank: Option<Spanned<i64>>,
    pub(crate) keys_env: Option<Vec<Spanned<String>>>,
    pub(crate) rpm: Option<Spanned<i64>>,
    pub(crate) tpm: Option<Spanned<i64>>,
    pub(crate) concurrency: Option<Spanned<ConcurrencyValue>>,
}

/// A deployment's `concurrency`: `"adaptive"` (a word) or a fixed limit (a number).
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum ConcurrencyValue {
    Fixed(i64),
    Word(String),
}
