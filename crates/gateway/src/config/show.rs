//! The effective configuration as `check` prints it: TOML-like, every default filled in, each
//! secret shown as its variable and whether it is set, never its value.

use std::fmt::Write;

use super::{Config, HedgingChoice, Model, Secret, policy};

pub(super) fn show(config: &Config) -> String {
    let mut out = String::new();
    let server = &config.server;
    let _ = writeln!(out, "# effective configuration of {}", config.source);
    let _ = writeln!(out, "[server]");
    let _ = writeln!(out, "listen = \"{}\"", server.listen);
    let _ = writeln!(
        out,
        "allow_unauthenticated = {}",
        server.allow_unauthenticated
    );
    let _ = writeln!(out, "max_body_bytes = {}", server.max_body_bytes);
    let _ = writeln!(
        out,
        "max_deadline = \"{}s\"",
        server.max_deadline.as_secs_f64()
    );
    let _ = writeln!(out, "caller_keys_env = {}", secrets(&server.caller_keys));
    let timeout = server.header_read_timeout.as_secs_f64();
    let _ = writeln!(out, "header_read_timeout = \"{timeout}s\"");
    let _ = writeln!(out, "max_header_bytes = {}", server.max_header_bytes);
    let _ = writeln!(out, "max_connections = {}", server.max_connections);
    let grace = server.drain_grace.as_secs_f64();
    let _ = writeln!(out, "drain_grace = \"{grace}s\"");
    let _ = writeln!(
        out,
        "\n[log]\nformat = \"{}\"\nspans = {}",
        config.log.format.name(),
        config.log.spans
    );
    if let Some(fleet) = &config.fleet {
        let _ = writeln!(out, "\n[fleet]");
        let _ = writeln!(
            out,
            "redis_url_env = \"{}\"  # {}",
            fleet.redis.var(),
            fleet.redis
        );
        let _ = writeln!(out, "prefix = {:?}", fleet.prefix);
        let _ = writeln!(out, "timeout = \"{}ms\"", fleet.timeout.as_millis());
        if let Some(replicas) = fleet.replicas {
            let _ = writeln!(out, "replicas = {replicas}");
        }
    }
    for (name, provider) in &config.providers {
        let _ = writeln!(out, "\n[providers.{name}]");
        let _ = writeln!(out, "format = \"{}\"", provider.format.name());
        let _ = writeln!(out, "base_url = \"{}\"", provider.base_url);
        let _ = writeln!(out, "keys_env = {}", secrets(&provider.keys));
    }
    for (format, provider) in &config.pass_through {
        let _ = writeln!(
            out,
            "\n# every model of the {format} format goes to `{provider}`, its name unchanged"
        );
    }
    for (name, model) in &config.models {
        model_policy(&mut out, name, model);
        for (rank, deployments) in model.ranks.iter().enumerate() {
            for deployment in deployments {
                let _ = writeln!(out, "\n[[models.\"{name}\".deployments]]");
                let _ = writeln!(out, "provider = \"{}\"", deployment.provider);
                let _ = writeln!(out, "model = \"{}\"", deployment.model);
                let _ = writeln!(out, "rank = {}", rank + 1);
                let _ = writeln!(out, "keys_env = {}", secrets(&deployment.keys));
                if let Some(rpm) = deployment.rpm {
                    let _ = writeln!(out, "rpm = {rpm}");
                }
                if let Some(tpm) = deployment.tpm {
                    let _ = writeln!(out, "tpm = {tpm}");
                }
                if let Some(concurrency) = deployment.concurrency {
                    let _ = writeln!(out, "concurrency = {concurrency}");
                }
            }
        }
    }
    out
}

/// `[models.NAME]`'s own keys and its cures.
fn model_policy(out: &mut String, name: &str, model: &Model) {
    let _ = writeln!(out, "\n[models.\"{name}\"]");
    let hedging = match model.hedging {
        HedgingChoice::Cold => "cold".to_owned(),
        HedgingChoice::Learned => "learned".to_owned(),
        HedgingChoice::Off => "off".to_owned(),
        HedgingChoice::After(delay) => format!("{}ms", delay.as_millis()),
    };
    let _ = writeln!(out, "hedging = \"{hedging}\"");
    if let Some(text) = &model.degraded {
        let _ = writeln!(out, "degraded = {text:?}");
    }
    if !model.cures.is_empty() {
        let _ = writeln!(out, "[models.\"{name}\".cures]");
        for (cure, target) in &model.cures {
            let _ = writeln!(out, "{} = \"{target}\"", policy::cure_name(*cure));
        }
    }
}

/// `["VAR", ...]  # VAR set, OTHER missing`.
fn secrets(secrets: &[Secret]) -> String {
    let names: Vec<String> = secrets.iter().map(|s| format!("\"{}\"", s.var())).collect();
    let states: Vec<String> = secrets
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s.var(),
                if s.value().is_some() {
                    "set"
                } else {
                    "MISSING"
                }
            )
        })
        .collect();
    if states.is_empty() {
        "[]".to_owned()
    } else {
        format!("[{}]  # {}", names.join(", "), states.join(", "))
    }
}
