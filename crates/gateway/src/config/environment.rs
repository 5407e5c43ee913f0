//! The environment-only start: no config file, one provider (or two) named by the usual
//! variables, every model name passed through.
//!
//! | variables | provider | takes |
//! |---|---|---|
//! | `OPENAI_API_KEY` (`OPENAI_BASE_URL`, default `https://api.openai.com`) | `openai` | OpenAI's paths |
//! | `ANTHROPIC_API_KEY` (`ANTHROPIC_BASE_URL`, default `https://api.anthropic.com`) | `anthropic` | `/v1/messages` |
//! | `STORMGUARD_UPSTREAM_URL` (`STORMGUARD_UPSTREAM_KEY`, optional) | `upstream` | OpenAI's paths, in place of `openai` |
//!
//! `STORMGUARD_UPSTREAM_URL` is any OpenAI-compatible endpoint (vLLM, Ollama, another gateway);
//! when it is set, OpenAI's paths go there and `OPENAI_API_KEY` is not used.

use std::collections::BTreeMap;

use super::error::{ConfigError, ConfigErrors, ENVIRONMENT};
use super::values::BaseUrl;
use super::{Config, Env, Log, Provider, Secret, Server};
use crate::format::Format;

/// OpenAI's key.
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
/// OpenAI's address, as the OpenAI SDKs read it.
pub const OPENAI_BASE_URL: &str = "OPENAI_BASE_URL";
/// Anthropic's key.
pub const ANTHROPIC_API_KEY: &str = "ANTHROPIC_API_KEY";
/// Anthropic's address, as the Anthropic SDKs read it.
pub const ANTHROPIC_BASE_URL: &str = "ANTHROPIC_BASE_URL";
/// Any OpenAI-compatible endpoint.
pub const STORMGUARD_UPSTREAM_URL: &str = "STORMGUARD_UPSTREAM_URL";
/// Its key, if it needs one.
pub const STORMGUARD_UPSTREAM_KEY: &str = "STORMGUARD_UPSTREAM_KEY";

/// The configuration the environment alone gives, with every default.
pub fn from_env(env: &Env) -> Result<Config, ConfigErrors> {
    let mut providers = BTreeMap::new();
    let mut pass_through = BTreeMap::new();
    let mut errors = Vec::new();
    let mut add =
        |name: &str, format: Format, url: Result<BaseUrl, ConfigError>, key: Option<Secret>| {
            match url {
                Ok(base_url) => {
                    let keys = key.into_iter().collect();
                    providers.insert(
                        name.to_owned(),
                        Provider {
                            format,
                            base_url,
                            keys,
                        },
                    );
                    pass_through.insert(format.name(), name.to_owned());
                }
                Err(error) => errors.push(error),
            }
        };
    if let Some(url) = set(env, STORMGUARD_UPSTREAM_URL) {
        let key = set(env, STORMGUARD_UPSTREAM_KEY)
            .map(|_| Secret::from_env(STORMGUARD_UPSTREAM_KEY, env));
        add(
            "upstream",
            Format::OpenAi,
            base_url(STORMGUARD_UPSTREAM_URL, url),
            key,
        );
    } else if set(env, OPENAI_API_KEY).is_some() {
        let url = set(env, OPENAI_BASE_URL).unwrap_or(Format::OpenAi.default_base_url());
        add(
            "openai",
            Format::OpenAi,
            base_url(OPENAI_BASE_URL, url),
            Some(Secret::from_env(OPENAI_API_KEY, env)),
        );
    }
    if set(env, ANTHROPIC_API_KEY).is_some() {
        let url = set(env, ANTHROPIC_BASE_URL).unwrap_or(Format::Anthropic.default_base_url());
        let key = Secret::from_env(ANTHROPIC_API_KEY, env);
        add(
            "anthropic",
            Format::Anthropic,
            base_url(ANTHROPIC_BASE_URL, url),
            Some(key),
        );
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    if providers.is_empty() {
        return Err(ConfigErrors(vec![error(
            "(config)",
            format!(
                "no config file, and none of {OPENAI_API_KEY}, {ANTHROPIC_API_KEY} or \
                 {STORMGUARD_UPSTREAM_URL} is set: start with --config FILE or set one of them"
            ),
        )]));
    }
    Ok(Config {
        source: ENVIRONMENT.to_owned(),
        server: Server::default(),
        providers,
        models: BTreeMap::new(),
        pass_through,
        log: Log::default(),
        fleet: None,
    })
}

/// The value of `var`, when it is set and not empty.
fn set<'a>(env: &'a Env, var: &str) -> Option<&'a str> {
    env.get(var)
        .map(String::as_str)
        .filter(|value| !value.is_empty())
}

fn base_url(var: &str, url: &str) -> Result<BaseUrl, ConfigError> {
    BaseUrl::parse(url).map_err(|message| error(var, message))
}

fn error(key: &str, message: String) -> ConfigError {
    ConfigError {
        file: ENVIRONMENT.to_owned(),
        line: 0,
        key: key.to_owned(),
        message,
    }
}
