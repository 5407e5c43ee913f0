//! The route of each model: a [`Failover`] over its ranks of deployments, one backend per
//! deployment and key, each with the adapter that sends it to its provider with its key.

use std::collections::BTreeMap;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use stormguard::ClientLayer;
use stormguard::classify::Classify;
use stormguard::failover::{Adapter, Backend, Cooldowns, Failover};
use stormguard::jitter::Backoff;
use stormguard::rate_limit::{Fleet, RateLimit, RateLimitConfig};
use stormguard::retry::Hedging;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use super::degraded::degraded;
use super::upstream::Connection;
use crate::config::{Config, Deployment, HedgingChoice, Model, Provider, Secret};
use crate::format::Format;

/// Anthropic's API version sent when the caller sends none.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// A route's client: its failover over the shared connection.
pub(crate) type Upstream =
    BoxCloneSyncService<Request<Full<Bytes>>, Response<Body>, stormguard::Error>;

/// How one model is served.
#[derive(Clone)]
pub(crate) struct Route {
    /// The format its providers speak.
    pub(crate) format: Format,
    /// Its failover, or `None` when no deployment has its key set.
    pub(crate) upstream: Option<Upstream>,
    /// Its backends (clones sharing their breakers and whether they are set aside), for
    /// `/healthz` and `/readyz`.
    pub(crate) backends: Vec<Backend>,
}

/// Every model's route, and per format the route of models not listed (environment-only start).
#[derive(Clone, Default)]
pub(crate) struct Routes {
    pub(crate) models: BTreeMap<String, Route>,
    pub(crate) pass_through: Vec<Route>,
}

impl Routes {
    /// The routes of `config`, over `connection`.
    pub(crate) fn build(config: &Config, connection: &Connection) -> Result<Self, String> {
        let fleet = fleet(config)?;
        let build = Build {
            config,
            connection,
            fleet: fleet.as_ref(),
        };
        let mut routes = Self::default();
        for (name, model) in &config.models {
            let ranks = model
                .ranks
                .iter()
                .map(|rank| rank_backends(&build, rank))
                .collect::<Result<Vec<_>, _>>()?;
            let format = config.model_format(model).unwrap_or(Format::OpenAi);
            let route = build.route(format, ranks, Some((name, model)));
            routes.models.insert(name.clone(), route);
        }
        for provider_name in config.pass_through.values() {
            let Some(provider) = config.providers.get(provider_name) else {
                continue;
            };
            let deployment = Deployment {
                provider: provider_name.clone(),
                model: String::new(),
                keys: provider.keys.clone(),
                rpm: None,
                tpm: None,
                concurrency: None,
            };
            let rank = backends(&build, &deployment, false)?;
            let route = build.route(provider.format, vec![rank], None);
            routes.pass_through.push(route);
        }
        Ok(routes)
    }

    /// The route for `model` called in `format`: its own, else the pass-through of `format`.
    pub(crate) fn find(&self, model: &str, format: Format) -> Option<&Route> {
        self.models.get(model).or_else(|| {
            self.pass_through
                .iter()
                .find(|route| route.format == format)
        })
    }
}

/// The fleet of the config's `[fleet]`, if any (nothing connects yet: the first decision does).
fn fleet(config: &Config) -> Result<Option<Fleet>, String> {
    let Some(settings) = &config.fleet else {
        return Ok(None);
    };
    let url = settings
        .redis
        .value()
        .ok_or_else(|| format!("the fleet's Redis URL {} is not set", settings.redis))?;
    let fleet = Fleet::new(url).map_err(|error| error.to_string())?;
    Ok(Some(
        fleet
            .with_prefix(&settings.prefix)
            .with_timeout(settings.timeout)
            .with_replicas(settings.replicas),
    ))
}

/// What every route is built from.
struct Build<'a> {
    config: &'a Config,
    connection: &'a Connection,
    fleet: Option<&'a Fleet>,
}

impl Build<'_> {
    /// A route over `ranks` (ranks left empty by missing keys dropped), as `model` says if it is
    /// a configured one.
    fn route(
        &self,
        format: Format,
        ranks: Vec<Vec<Backend>>,
        model: Option<(&String, &Model)>,
    ) -> Route {
        let ranks: Vec<Vec<Backend>> = ranks.into_iter().filter(|rank| !rank.is_empty()).collect();
        let backends: Vec<Backend> = ranks.iter().flatten().cloned().collect();
        let upstream = (!ranks.is_empty()).then(|| {
            let layer = ClientLayer::default()
                .with_max_replay_body(self.config.server.max_body_bytes)
                .with_timeout(self.config.server.max_deadline);
            // A key that answers 429 hands the request to the model's next key at once.
            let mut failover = ranks.into_iter().fold(
                Failover::new(layer).with_hand_off_429(),
                |failover, rank| failover.with_rank(rank),
            );
            if let Some(fleet) = self.fleet {
                failover = failover.with_cooldowns(Cooldowns::fleet(fleet.clone()));
            }
            if let Some((name, model)) = model {
                failover = policy(failover, format, name, model, &backends);
            }
            BoxCloneSyncService::new(
                failover
                    .layer(self.connection.clone())
                    .map_response(|response| response.map(Body::new)),
            )
        });
        Route {
            format,
            upstream,
            backends,
        }
    }
}

/// `failover` with `model`'s hedging, cures and degraded answer.
fn policy<C: Classify, Bk: Backoff, K>(
    failover: Failover<C, Bk, K>,
    format: Format,
    name: &str,
    model: &Model,
    backends: &[Backend],
) -> Failover<C, Bk, K> {
    let mut failover = match model.hedging {
        HedgingChoice::Cold => failover.with_hedging(Hedging::cold()),
        HedgingChoice::Learned => failover.with_hedging(Hedging::default()),
        HedgingChoice::After(delay) => failover.with_hedging(Hedging::after(delay)),
        HedgingChoice::Off => failover.without_hedging(),
    };
    for (cure, deployment) in &model.cures {
        // The deployment's first backend whose key is set: `provider/model` or `provider/model/N`.
        let prefix = format!("{deployment}/");
        let target = backends
            .iter()
            .map(Backend::name)
            .find(|backend| *backend == deployment || backend.starts_with(&prefix));
        if let Some(target) = target {
            failover = failover.with_cure(*cure, target);
        }
    }
    if let Some(text) = &model.degraded {
        failover = failover.with_degraded(degraded(format, name, text));
    }
    failover
}

/// The backends of one rank: every key of each of its deployments.
fn rank_backends(build: &Build<'_>, rank: &[Deployment]) -> Result<Vec<Backend>, String> {
    let mut backends_of_rank = Vec::new();
    for deployment in rank {
        backends_of_rank.extend(backends(build, deployment, true)?);
    }
    Ok(backends_of_rank)
}

/// One backend per key of `deployment` that is set (one without a key when its provider has
/// none), named `provider/model/N` (N: the key's place in the provider's `keys_env`).
fn backends(
    build: &Build<'_>,
    deployment: &Deployment,
    rewrite_model: bool,
) -> Result<Vec<Backend>, String> {
    let Some(provider) = build.config.providers.get(&deployment.provider) else {
        return Ok(Vec::new());
    };
    let base = if rewrite_model {
        format!("{}/{}", deployment.provider, deployment.model)
    } else {
        deployment.provider.clone()
    };
    if provider.keys.is_empty() {
        let adapter = adapter(
            provider,
            None,
            rewrite_model.then_some(deployment.model.as_str()),
        )?;
        return Ok(vec![backend(&base, adapter, deployment, build.fleet)]);
    }
    let mut backends = Vec::new();
    for key in &deployment.keys {
        let place = provider
            .keys
            .iter()
            .position(|k| k.var() == key.var())
            .map_or(0, |i| i + 1);
        let name = format!("{base}/{place}");
        if key.value().is_none() {
            tracing::warn!(backend = %name, key = %key, "left out: its key is not set");
            continue;
        }
        let adapter = adapter(
            provider,
            Some(key),
            rewrite_model.then_some(deployment.model.as_str()),
        )?;
        backends.push(backend(&name, adapter, deployment, build.fleet));
    }
    Ok(backends)
}

/// Backend `name`, paced to its deployment's quota: the `rpm` and `tpm` configured, else those
/// its provider states (`x-ratelimit-*` headers) and those its 429s show, learned per key
/// (shared by the fleet's replicas if there is one: the fleet's keys are the backends' names,
/// the same in every replica of one config); its attempts in flight under the deployment's
/// `concurrency`, one limit per key (a replica's own, not the fleet's).
fn backend(
    name: &str,
    adapter: Adapter,
    deployment: &Deployment,
    fleet: Option<&Fleet>,
) -> Backend {
    let mut config = RateLimitConfig::default()
        .with_requests_per_minute(deployment.rpm)
        .with_tokens_per_minute(deployment.tpm);
    if let Some(fleet) = fleet {
        // Each backend's quota under keys of its own: `PREFIX:rate-limit:BACKEND`.
        let prefix = format!("{}:rate-limit:{name}", fleet.prefix());
        config = config.with_fleet(fleet.clone().with_prefix(&prefix));
    }
    let backend = Backend::new(name)
        .with_adapter(adapter)
        .with_rate_limit(RateLimit::new(config));
    match deployment.concurrency {
        Some(concurrency) => backend.with_concurrency(concurrency.limit()),
        None => backend,
    }
}

/// The adapter that sends a request to `provider` with `key`, asking for `model`.
fn adapter(
    provider: &Provider,
    key: Option<&Secret>,
    model: Option<&str>,
) -> Result<Adapter, String> {
    let mut adapter = Adapter::new().with_origin(provider.base_url.origin.clone());
    if let Some(model) = model {
        adapter = adapter.with_model(model);
    }
    if let Some((var, value)) = key.and_then(|key| Some((key.var(), key.value()?))) {
        let (name, value) = match provider.format {
            Format::OpenAi => (http::header::AUTHORIZATION, format!("Bearer {value}")),
            Format::Anthropic => (HeaderName::from_static("x-api-key"), value.to_owned()),
        };
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| format!("${var} holds characters a header cannot carry"))?;
        value.set_sensitive(true);
        adapter = adapter.with_header(name, value);
    }
    let prefix = provider.base_url.prefix.clone();
    let anthropic = provider.format == Format::Anthropic;
    Ok(adapter.with_head(move |head| {
        if anthropic && !head.headers.contains_key("anthropic-version") {
            head.headers.insert(
                "anthropic-version",
                HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION),
            );
        }
        prefix_path(&mut head.uri, &prefix);
    }))
}

/// Puts `prefix` before `uri`'s path.
fn prefix_path(uri: &mut Uri, prefix: &str) {
    if prefix.is_empty() {
        return;
    }
    let mut parts = uri.clone().into_parts();
    let path = parts.path_and_query.as_ref().map_or("/", |p| p.as_str());
    if let Ok(joined) = format!("{prefix}{path}").parse() {
        parts.path_and_query = Some(joined);
        if let Ok(prefixed) = Uri::from_parts(parts) {
            *uri = prefixed;
        }
    }
}
