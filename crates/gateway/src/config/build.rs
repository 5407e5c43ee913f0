//! From the file's text to a validated [`Config`]: TOML's errors and the gateway's own, each with
//! its line and key.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use toml::Spanned;

use super::error::{ConfigError, ConfigErrors, Errors};
use super::policy;
use super::raw::{self, ConcurrencyValue, DeploymentTable, ModelTable, ProviderTable, ServerTable};
use super::values::{BaseUrl, is_env_name, parse_duration};
use super::{Concurrency, Config, Deployment, Env, Model, Provider, Secret, Server};

/// Names of keys that would hold a secret in the file, refused with a pointer to `*_env`.
const SECRET_KEYS: [&str; 9] = [
    "api_key",
    "key",
    "keys",
    "token",
    "secret",
    "password",
    "master_key",
    "caller_keys",
    "api_keys",
];

pub(super) fn build(file: &str, source: &str, env: &Env) -> Result<Config, ConfigErrors> {
    let raw: raw::File =
        toml::from_str(source).map_err(|error| toml_error(file, source, &error))?;
    let mut errors = Errors::new(file, source);
    let server = server(raw.server.as_ref(), env, &mut errors);
    let providers = providers(&raw.providers, env, &mut errors);
    let models = models(&raw.models, &providers, &mut errors);
    if raw.models.is_empty() {
        errors.at(
            0,
            "models",
            "no [models.NAME]: the gateway would serve no model",
        );
    }
    let log = policy::log(raw.log.as_ref(), &mut errors);
    let fleet = policy::fleet(raw.fleet.as_ref(), env, &mut errors);
    errors.into_result(Config {
        source: file.to_owned(),
        server,
        providers,
        models,
        pass_through: BTreeMap::new(),
        log,
        fleet,
    })
}

/// TOML's error (syntax, an unknown key, a value of the wrong type) with its line and key. Values
/// quoted in its message are masked: the value may be a key pasted in the wrong place.
fn toml_error(file: &str, source: &str, error: &toml::de::Error) -> ConfigErrors {
    let offset = error.span().map_or(0, |span| span.start);
    let key = key_at(source, offset);
    let mut message = mask_quoted(error.message().trim());
    let last = key.rsplit('.').next().unwrap_or("");
    if message.starts_with("unknown field") && SECRET_KEYS.contains(&last) {
        message = format!(
            "secrets are read from the environment only: name the variable that holds it \
             (`keys_env = [\"OPENAI_API_KEY\"]`, `caller_keys_env = [...]`), never the key ({message})"
        );
    }
    let mut errors = Errors::new(file, source);
    errors.at(offset, &key, message);
    match errors.into_result(()) {
        Err(errors) => errors,
        Ok(()) => ConfigErrors(vec![ConfigError {
            file: file.to_owned(),
            line: 0,
            key,
            message: error.message().to_owned(),
        }]),
    }
}

/// The dotted key at byte `offset`: the key of its line (left of `=`), under the last table
/// header above it.
fn key_at(source: &str, offset: usize) -> String {
    let offset = offset.min(source.len());
    let start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = source[offset..]
        .find('\n')
        .map_or(source.len(), |i| offset + i);
    let line = source[start..end].trim();
    let header = |line: &str| {
        let line = line.trim();
        line.starts_with('[').then(|| {
            line.trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_owned()
        })
    };
    if let Some(table) = header(line) {
        return table;
    }
    let own = line.split('=').next().unwrap_or("").trim();
    let table = source[..start].lines().rev().find_map(header);
    match table {
        Some(table) if !own.is_empty() => format!("{table}.{own}"),
        Some(table) => table,
        None => own.to_owned(),
    }
}

/// `message` with whatever it quotes between `"` replaced by `…`.
fn mask_quoted(message: &str) -> String {
    let mut masked = String::with_capacity(message.len());
    for (i, part) in message.split('"').enumerate() {
        if i > 0 {
            masked.push('"');
        }
        masked.push_str(if i % 2 == 1 { "…" } else { part });
    }
    masked
}

fn server(table: Option<&ServerTable>, env: &Env, errors: &mut Errors<'_>) -> Server {
    let mut server = Server::default();
    let Some(table) = table else {
        return server;
    };
    if let Some(listen) = &table.listen {
        match listen.get_ref().parse() {
            Ok(addr) => server.listen = addr,
            Err(_) => errors.at(
                listen.span().start,
                "server.listen",
                "not an address such as \"127.0.0.1:4000\"",
            ),
        }
    }
    server.allow_unauthenticated = table.allow_unauthenticated.unwrap_or(false);
    let mut set = |value: Option<&Spanned<i64>>, key: &str, into: &mut usize| {
        if let Some(n) = positive(value, key, errors).flatten() {
            *into = n;
        }
    };
    set(
        table.max_body_bytes.as_ref(),
        "server.max_body_bytes",
        &mut server.max_body_bytes,
    );
    set(
        table.max_header_bytes.as_ref(),
        "server.max_header_bytes",
        &mut server.max_header_bytes,
    );
    set(
        table.max_connections.as_ref(),
        "server.max_connections",
        &mut server.max_connections,
    );
    if let Some(duration) = duration(table.max_deadline.as_ref(), "server.max_deadline", errors) {
        server.max_deadline = duration;
    }
    let timeout = duration(
        table.header_read_timeout.as_ref(),
        "server.header_read_timeout",
        errors,
    );
    if let Some(timeout) = timeout {
        server.header_read_timeout = timeout;
    }
    if let Some(grace) = duration(table.drain_grace.as_ref(), "server.drain_grace", errors) {
        server.drain_grace = grace;
    }
    server.caller_keys = secrets(
        &table.caller_keys_env,
        "server.caller_keys_env",
        env,
        errors,
    );
    server
}

/// A duration written with its unit, if given and valid (else its error recorded).
fn duration(
    value: Option<&Spanned<String>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Duration> {
    let value = value?;
    parse_duration(value.get_ref())
        .map_err(|message| errors.at(value.span().start, key, message))
        .ok()
}

/// The secrets named by `vars`, each a valid variable name (else an error at its line).
fn secrets(vars: &[Spanned<String>], key: &str, env: &Env, errors: &mut Errors<'_>) -> Vec<Secret> {
    vars.iter()
        .filter_map(|var| {
            if is_env_name(var.get_ref()) {
                Some(Secret::from_env(var.get_ref(), env))
            } else {
                errors.at(
                    var.span().start,
                    key,
                    "not the name of an environment variable: secrets are read from the \
                     environment only (name the variable that holds the key, never the key)",
                );
                None
            }
        })
        .collect()
}

fn providers(
    tables: &BTreeMap<Spanned<String>, ProviderTable>,
    env: &Env,
    errors: &mut Errors<'_>,
) -> BTreeMap<String, Provider> {
    let mut providers = BTreeMap::new();
    for (name, table) in tables {
        let key = format!("providers.{}", name.get_ref());
        let base_url = match &table.base_url {
            None => BaseUrl::parse(table.format.default_base_url()),
            Some(url) => BaseUrl::parse(url.get_ref()).inspect_err(|message| {
                errors.at(
                    url.span().start,
                    &format!("{key}.base_url"),
                    message.clone(),
                );
            }),
        };
        let keys = secrets(&table.keys_env, &format!("{key}.keys_env"), env, errors);
        if let Ok(base_url) = base_url {
            let provider = Provider {
                format: table.format,
                base_url,
                keys,
            };
            providers.insert(name.get_ref().clone(), provider);
        }
    }
    providers
}

fn models(
    tables: &BTreeMap<Spanned<String>, ModelTable>,
    providers: &BTreeMap<String, Provider>,
    errors: &mut Errors<'_>,
) -> BTreeMap<String, Model> {
    let mut models = BTreeMap::new();
    for (name, table) in tables {
        let key = format!("models.{}.deployments", name.get_ref());
        if table.deployments.get_ref().is_empty() {
            errors.at(
                table.deployments.span().start,
                &key,
                "a model needs at least one deployment",
            );
            continue;
        }
        let mut ranked: BTreeMap<u32, Vec<Deployment>> = BTreeMap::new();
        let mut formats = BTreeSet::new();
        for table in table.deployments.get_ref() {
            if let Some((rank, deployment)) =
                deployment(name.get_ref(), table, providers, &key, errors)
            {
                formats.extend(providers.get(&deployment.provider).map(|p| p.format.name()));
                ranked.entry(rank).or_default().push(deployment);
            }
        }
        if formats.len() > 1 {
            let message = "every deployment of a model speaks one format (openai or anthropic): \
                           the gateway does not translate";
            errors.at(name.span().start, &key, message);
        }
        let mut model = Model {
            ranks: ranked.into_values().collect(),
            ..Model::default()
        };
        policy::model(name.get_ref(), table, &mut model, errors);
        models.insert(name.get_ref().clone(), model);
    }
    models
}

/// One deployment and its rank, or `None` with its errors recorded.
fn deployment(
    model: &str,
    table: &DeploymentTable,
    providers: &BTreeMap<String, Provider>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<(u32, Deployment)> {
    let at = table.provider.span().start;
    let Some(provider) = providers.get(table.provider.get_ref()) else {
        let message = format!("no provider `{}` in [providers]", table.provider.get_ref());
        errors.at(at, &format!("{key}.provider"), message);
        return None;
    };
    let rank = positive(table.rank.as_ref(), &format!("{key}.rank"), errors)?.unwrap_or(1);
    let rpm = positive(table.rpm.as_ref(), &format!("{key}.rpm"), errors)?;
    let tpm = positive(table.tpm.as_ref(), &format!("{key}.tpm"), errors)?;
    let concurrency = concurrency(
        table.concurrency.as_ref(),
        &format!("{key}.concurrency"),
        errors,
    )?;
    let keys = match &table.keys_env {
        None => provider.keys.clone(),
        Some(vars) => deployment_keys(vars, provider, &format!("{key}.keys_env"), errors)?,
    };
    let deployment = Deployment {
        provider: table.provider.get_ref().clone(),
        model: table.model.clone().unwrap_or_else(|| model.to_owned()),
        keys,
        rpm,
        tpm,
        concurrency,
    };
    Some((rank, deployment))
}

/// A deployment's `concurrency`, if given (`Some(None)` when not); `None` with its error
/// recorded when it is neither `"adaptive"` nor a positive whole number.
fn concurrency(
    value: Option<&Spanned<ConcurrencyValue>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Option<Concurrency>> {
    let Some(value) = value else {
        return Some(None);
    };
    let parsed = match value.get_ref() {
        ConcurrencyValue::Word(word) if word == "adaptive" => Some(Concurrency::Adaptive),
        ConcurrencyValue::Fixed(n) => u32::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .map(Concurrency::Fixed),
        ConcurrencyValue::Word(_) => None,
    };
    if parsed.is_none() {
        let message = "must be \"adaptive\" or a positive whole number (a fixed limit)";
        errors.at(value.span().start, key, message);
    }
    parsed.map(Some)
}

/// A positive number that fits a `T`, if given (`Some(None)` when not); `None` with its error
/// recorded when it is not one.
fn positive<T: TryFrom<i64>>(
    value: Option<&Spanned<i64>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Option<T>> {
    let Some(value) = value else {
        return Some(None);
    };
    match T::try_from(*value.get_ref()) {
        Ok(n) if *value.get_ref() > 0 => Some(Some(n)),
        _ => {
            errors.at(value.span().start, key, "must be a positive whole number");
            None
        }
    }
}

/// The keys a deployment names: each must be one of its provider's.
fn deployment_keys(
    vars: &[Spanned<String>],
    provider: &Provider,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Vec<Secret>> {
    let mut keys = Vec::new();
    for var in vars {
        match provider
            .keys
            .iter()
            .find(|secret| secret.var() == var.get_ref())
        {
            Some(secret) => keys.push(secret.clone()),
            None if !is_env_name(var.get_ref()) => {
                errors.at(var.span().start, key, "not the name of an environment variable: secrets are read from the environment only");
                return None;
            }
            None => {
                errors.at(
                    var.span().start,
                    key,
                    format!("`{}` is not among its provider's keys_env", var.get_ref()),
                );
                return None;
            }
        }
    }
    Some(keys)
}
