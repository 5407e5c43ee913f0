//! The tables beside the routes: `[log]`, `[fleet]`, and what a model does beyond its ranks
//! (`hedging`, `degraded`, `[models.NAME.cures]`).

use toml::Spanned;

use super::error::Errors;
use super::raw::{FleetTable, LogTable, ModelTable};
use super::values::{is_env_name, parse_duration};
use super::{Cure, DEFAULT_FLEET_PREFIX, Env, Fleet, HedgingChoice, Log, LogFormat, Model, Secret};

/// `[log]`, its defaults filled in.
pub(super) fn log(table: Option<&LogTable>, errors: &mut Errors<'_>) -> Log {
    let mut log = Log {
        spans: table.and_then(|table| table.spans).unwrap_or(false),
        ..Log::default()
    };
    if let Some(format) = table.and_then(|table| table.format.as_ref()) {
        match LogFormat::parse(format.get_ref()) {
            Some(parsed) => log.format = parsed,
            None => errors.at(
                format.span().start,
                "log.format",
                "must be \"text\" or \"json\"",
            ),
        }
    }
    log
}

/// `[fleet]`, if the file has one.
pub(super) fn fleet(
    table: Option<&FleetTable>,
    env: &Env,
    errors: &mut Errors<'_>,
) -> Option<Fleet> {
    let table = table?;
    let var = &table.redis_url_env;
    if !is_env_name(var.get_ref()) {
        errors.at(
            var.span().start,
            "fleet.redis_url_env",
            "not the name of an environment variable: the Redis URL may hold a password, so it \
             is read from the environment only",
        );
        return None;
    }
    let replicas = match &table.replicas {
        None => None,
        Some(n) => match u32::try_from(*n.get_ref()) {
            Ok(n) if n > 0 => Some(n),
            _ => {
                let message = "must be a positive whole number";
                errors.at(n.span().start, "fleet.replicas", message);
                return None;
            }
        },
    };
    let mut timeout = stormguard::rate_limit::Fleet::DEFAULT_TIMEOUT;
    if let Some(text) = &table.timeout {
        match parse_duration(text.get_ref()) {
            Ok(parsed) => timeout = parsed,
            Err(message) => errors.at(text.span().start, "fleet.timeout", message),
        }
    }
    Some(Fleet {
        redis: Secret::from_env(var.get_ref(), env),
        timeout,
        replicas,
        prefix: table
            .prefix
            .clone()
            .unwrap_or_else(|| DEFAULT_FLEET_PREFIX.to_owned()),
    })
}

/// Fills in `model`'s `hedging`, `degraded` and `cures` from its table.
pub(super) fn model(name: &str, table: &ModelTable, model: &mut Model, errors: &mut Errors<'_>) {
    let key = format!("models.{name}");
    if let Some(hedging) = &table.hedging {
        match hedging_choice(hedging.get_ref()) {
            Ok(choice) => model.hedging = choice,
            Err(message) => errors.at(hedging.span().start, &format!("{key}.hedging"), message),
        }
    }
    if let Some(text) = &table.degraded {
        if text.get_ref().trim().is_empty() {
            let message = "an empty degraded answer: leave the key out to answer with the error";
            errors.at(text.span().start, &format!("{key}.degraded"), message);
        } else {
            model.degraded = Some(text.get_ref().clone());
        }
    }
    for (failure, target) in &table.cures {
        let at = format!("{key}.cures.{}", failure.get_ref());
        let Some(cure) = cure(failure.get_ref()) else {
            let message = "not a failure with a cure: context_too_long, content_filtered or \
                           quota_exhausted";
            errors.at(failure.span().start, &at, message);
            continue;
        };
        if !serves(model, target) {
            let message = format!(
                "`{}` is not one of this model's deployments (write it as \"provider/model\")",
                target.get_ref()
            );
            errors.at(target.span().start, &at, message);
            continue;
        }
        model.cures.push((cure, target.get_ref().clone()));
    }
}

/// `"cold"`, `"learned"`, `"off"`, or a duration.
fn hedging_choice(text: &str) -> Result<HedgingChoice, String> {
    match text {
        "cold" => Ok(HedgingChoice::Cold),
        "learned" => Ok(HedgingChoice::Learned),
        "off" => Ok(HedgingChoice::Off),
        other => parse_duration(other)
            .map(HedgingChoice::After)
            .map_err(|_| {
                format!(
                    "`{other}` is not \"cold\", \"learned\", \"off\" or a duration such as \"5s\""
                )
            }),
    }
}

/// The failures a model's `cures` may name, by their names in the config.
const CURES: [(&str, Cure); 3] = [
    ("context_too_long", Cure::ContextTooLong),
    ("content_filtered", Cure::ContentFiltered),
    ("quota_exhausted", Cure::QuotaExhausted),
];

/// The cure named `name` in the config.
pub(super) fn cure(name: &str) -> Option<Cure> {
    CURES
        .iter()
        .find_map(|(known, cure)| (*known == name).then_some(*cure))
}

/// The config's name of `cure`.
pub(super) fn cure_name(cure: Cure) -> &'static str {
    CURES
        .iter()
        .find_map(|(name, known)| (*known == cure).then_some(*name))
        .unwrap_or("unknown")
}

/// Whether `target` (`provider/model`) names one of `model`'s deployments.
fn serves(model: &Model, target: &Spanned<String>) -> bool {
    model
        .ranks
        .iter()
        .flatten()
        .any(|deployment| deployment.name() == *target.get_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn hedging_is_named_or_a_duration() {
        assert_eq!(hedging_choice("cold"), Ok(HedgingChoice::Cold));
        assert_eq!(hedging_choice("off"), Ok(HedgingChoice::Off));
        assert_eq!(
            hedging_choice("2500ms"),
            Ok(HedgingChoice::After(Duration::from_millis(2500)))
        );
        assert!(hedging_choice("sometimes").is_err());
        assert!(hedging_choice("0s").is_err());
    }

    #[test]
    fn cures_round_trip_their_names() {
        for name in ["context_too_long", "content_filtered", "quota_exhausted"] {
            assert_eq!(cure(name).map(cure_name), Some(name));
        }
        assert_eq!(cure("rate_limited"), None);
    }
}
