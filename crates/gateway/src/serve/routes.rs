//! The route of each model: a [`Failover`] over its ranks of deployments, one backend per
//! deployment and key, each with the adapter that sends it to its provider with its key.

use std::collections::BTreeMap;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use stormguard::ClientLayer;
use stormguard::failover::{Adapter, Backend, Failover};
use stormguard::rate_limit::{RateLimit, RateLimitConfig};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use super::upstream::Connection;
use crate::config::{Config, Deployment, Provider, Secret};
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
        let mut routes = Self::default();
        for (name, model) in &config.models {
            let ranks = model
                .ranks
                .iter()
                .map(|rank| rank_backends(config, rank))
                .collect::<Result<Vec<_>, _>>()?;
            let format = config.model_format(model).unwrap_or(Format::OpenAi);
            routes
                .models
                .insert(name.clone(), route(format, ranks, config, connection));
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
            };
            let rank = backends(config, &deployment, false)?;
            routes
                .pass_through
                .push(route(provider.format, vec![rank], config, connection));
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

/// The backends of one rank: every key of each of its deployments.
fn rank_backends(config: &Config, rank: &[Deployment]) -> Result<Vec<Backend>, String> {
    let mut backends_of_rank = Vec::new();
    for deployment in rank {
        backends_of_rank.extend(backends(config, deployment, true)?);
    }
    Ok(backends_of_rank)
}

/// A route over `ranks` (ranks left empty by missing keys dropped).
fn route(
    format: Format,
    ranks: Vec<Vec<Backend>>,
    config: &Config,
    connection: &Connection,
) -> Route {
    let ranks: Vec<Vec<Backend>> = ranks.into_iter().filter(|rank| !rank.is_empty()).collect();
    let backends = ranks.iter().flatten().cloned().collect();
    let upstream = (!ranks.is_empty()).then(|| {
        let layer = ClientLayer::default()
            .with_max_replay_body(config.server.max_body_bytes)
            .with_timeout(config.server.max_deadline);
        // A key that answers 429 hands the request to the model's next key at once.
        let failover = ranks.into_iter().fold(
            Failover::new(layer).with_hand_off_429(),
            |failover, rank| failover.with_rank(rank),
        );
        BoxCloneSyncService::new(
            failover
                .layer(connection.clone())
                .map_response(|response| response.map(Body::new)),
        )
    });
    Route {
        format,
        upstream,
        backends,
    }
}

/// One backend per key of `deployment` that is set (one without a key when its provider has
/// none), named `provider/model/N` (N: the key's place in the provider's `keys_env`).
fn backends(
    config: &Config,
    deployment: &Deployment,
    rewrite_model: bool,
) -> Result<Vec<Backend>, String> {
    let Some(provider) = config.providers.get(&deployment.provider) else {
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
        return Ok(vec![backend(&base, adapter, deployment)]);
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
        backends.push(backend(&name, adapter, deployment));
    }
    Ok(backends)
}

fn backend(name: &str, adapter: Adapter, deployment: &Deployment) -> Backend {
    let backend = Backend::new(name).with_adapter(adapter);
    if deployment.rpm.is_none() && deployment.tpm.is_none() {
        return backend;
    }
    let config = RateLimitConfig::default()
        .with_requests_per_minute(deployment.rpm)
        .with_tokens_per_minute(deployment.tpm);
    backend.with_rate_limit(RateLimit::new(config))
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
        if !prefix.is_empty() {
            prefix_path(&mut head.uri, &prefix);
        }
    }))
}

/// Puts `prefix` before `uri`'s path.
fn prefix_path(uri: &mut Uri, prefix: &str) {
    let mut parts = uri.clone().into_parts();
    let path = parts.path_and_query.as_ref().map_or("/", |p| p.as_str());
    if let Ok(joined) = format!("{prefix}{path}").parse() {
        parts.path_and_query = Some(joined);
        if let Ok(prefixed) = Uri::from_parts(parts) {
            *uri = prefixed;
        }
    }
}
