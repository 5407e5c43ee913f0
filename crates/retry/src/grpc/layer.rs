//! [`ServiceConfigLayer`]: the engine, configured per call by a [`ServiceConfig`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use stormguard_budget::RetryTokens;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, Classify, GrpcCodes, ListedCodesClassifier};
use stormguard_jitter::GrpcBackoff;
use tower_layer::Layer;
use tower_service::Service;

use super::config::{CallPolicy, MethodConfig, ServiceConfig};
use crate::body::ReplayBody;
use crate::config::Config;
use crate::continuing::Continue;
use crate::error::Error;
use crate::future::ResponseFuture;
use crate::hedge::Hedging;
use crate::layer::ClientLayer;

/// One engine's configuration, as a service config makes it for a method.
type MethodEngine = Arc<Config<ListedCodesClassifier, GrpcBackoff>>;

/// The engine ([`ClientLayer`]) for gRPC clients configured by a gRFC A6 service config: each
/// call goes through the one engine with the settings of its method config
/// ([`ServiceConfig::method_config`], picked from the request's path):
///
/// | service config | what the engine does |
/// |---|---|
/// | `retryPolicy.maxAttempts` | most attempts per call, the first included |
/// | `retryPolicy.initialBackoff`, `maxBackoff`, `backoffMultiplier` | the delays between attempts: [`GrpcBackoff`] |
/// | `retryPolicy.retryableStatusCodes` | the only codes retried: [`ListedCodesClassifier`] |
/// | `hedgingPolicy.maxAttempts`, `hedgingDelay` | hedges after `hedgingDelay` ([`Hedging::after`]), at most `maxAttempts - 1` |
/// | `hedgingPolicy.nonFatalStatusCodes` | a failed attempt with one of them lets the call go on (the next attempt at once), any other status ends it |
/// | `timeout` | the call's deadline across all attempts, sent as `grpc-timeout` |
/// | `waitForReady` | kept, not applied (see [`MethodConfig::wait_for_ready`]) |
/// | `retryThrottling` | gRPC's token bucket, [`RetryTokens`], asked before each retry and hedge, beside the retry budget |
///
/// What the engine does to every call besides: each retry or hedge carries
/// `grpc-previous-rpc-attempts` (the attempts sent before it); server pushback
/// (`grpc-retry-pushback-ms`) sets the delay of the retry of a listed code, and a negative or
/// unparseable one ends the call (no retry, no further hedge); a call the engine gave up on is
/// answered with `grpc-retry-pushback-ms: -1`, so that a gRPC client above does not retry it
/// again. A call whose method has no config, or whose config has no policy, is sent once.
///
/// The rest comes from the [`ClientLayer`] it is built on ([`with_client`](Self::with_client);
/// by default `ClientLayer::default().without_clocks()`): the retry budget (asked after the
/// tokens: a storm dries both up), the adaptive throttle, a breaker or rate limit if added, the
/// hint policy's maximum (a pushback above it, 60 s by default, ends the call), the deadline of
/// calls whose method config has no `timeout`, the name, logs and metrics.
///
/// Where the engine's hedging differs from gRFC A6's: at most two attempts are in flight at
/// once (the engine's race has two lanes), so while both run no third is sent at
/// `2 × hedgingDelay`: a `maxAttempts` above 2 sends its further attempts only once one of the
/// two has ended with a non-fatal status. An attempt that fails with a fatal status while the
/// other is in flight leaves the race to the other, where A6 ends the call at once. Both keep
/// every attempt within `maxAttempts` and the hedges within the tokens and the budget.
///
/// ```
/// use stormguard_retry::grpc::{ServiceConfig, ServiceConfigLayer};
///
/// let config: ServiceConfig = r#"{"methodConfig": [{
///     "name": [{"service": "grpc.health.v1.Health"}],
///     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
/// }]}"#.parse()?;
/// let layer = ServiceConfigLayer::new(config);
/// // `tower::ServiceBuilder::new().layer(layer).service(channel)` around a tonic `Channel`,
/// // then `HealthClient::new(...)` over it.
/// assert_eq!(layer.service_config().method_configs().len(), 1);
/// # Ok::<(), stormguard_retry::grpc::ServiceConfigError>(())
/// ```
#[derive(Clone)]
pub struct ServiceConfigLayer {
    engines: Arc<Engines>,
}

/// The engine of each method config, and of the calls none applies to.
struct Engines {
    config: ServiceConfig,
    /// One per `methodConfig` entry, in order.
    by_entry: Vec<MethodEngine>,
    /// For calls no entry applies to: sent once.
    unconfigured: MethodEngine,
    tokens: Option<RetryTokens>,
}

impl ServiceConfigLayer {
    /// The engine configured by `config`, on `ClientLayer::default().without_clocks()` (the
    /// learned per-attempt clocks are for LLM answers; a gRPC call's only clock is its
    /// `timeout`).
    pub fn new(config: ServiceConfig) -> Self {
        Self::build(config, &ClientLayer::default().without_clocks())
    }

    /// The same service config on `client`'s settings (its budget, throttle, breaker, rate
    /// limit, hint policy, clocks, deadline for calls without a `timeout`, name): everything but
    /// its classifier, backoff, attempts and hedging, which each method config sets. Retry
    /// tokens the client already has are used instead of a bucket of the config's own (share one
    /// bucket per server, as gRFC A6 asks, when several channels call it).
    pub fn with_client<C, Bk, K>(self, client: &ClientLayer<C, Bk, K>) -> Self
    where
        C: Clone,
        Bk: Clone,
    {
        Self::build(self.engines.config.clone(), client)
    }

    fn build<C: Clone, Bk: Clone, K>(
        config: ServiceConfig,
        client: &ClientLayer<C, Bk, K>,
    ) -> Self {
        let base = client.shared_config();
        let tokens = base.policy.tokens.clone().or_else(|| {
            config.retry_throttling().map(|throttling| {
                RetryTokens::new(throttling.max_tokens(), throttling.token_ratio())
            })
        });
        let by_entry = (config.method_configs().iter())
            .map(|method| engine(base, Some(method), tokens.as_ref()))
            .collect();
        let unconfigured = engine(base, None, tokens.as_ref());
        Self {
            engines: Arc::new(Engines {
                config,
                by_entry,
                unconfigured,
                tokens,
            }),
        }
    }

    /// The service config.
    pub fn service_config(&self) -> &ServiceConfig {
        &self.engines.config
    }

    /// The retry tokens of `retryThrottling` (or of the client), if any: shared by every
    /// service this layer builds (for their [`tokens`](RetryTokens::tokens)).
    pub fn retry_tokens(&self) -> Option<&RetryTokens> {
        self.engines.tokens.as_ref()
    }
}

/// The engine's configuration for calls `method` applies to (`None`: none does).
fn engine<C: Clone, Bk: Clone>(
    base: &Config<C, Bk>,
    method: Option<&MethodConfig>,
    tokens: Option<&RetryTokens>,
) -> MethodEngine {
    let (codes, backoff, attempts, hedging) = match method.and_then(MethodConfig::policy) {
        Some(CallPolicy::Retry(retry)) => (
            retry.retryable_status_codes(),
            GrpcBackoff::new(
                retry.initial_backoff(),
                retry.max_backoff(),
                retry.backoff_multiplier(),
            ),
            retry.max_attempts(),
            None,
        ),
        Some(CallPolicy::Hedging(hedging)) => (
            hedging.non_fatal_status_codes(),
            // gRFC A6: after a non-fatal status, the next hedge goes at once.
            GrpcBackoff::new(Default::default(), Default::default(), 1.0),
            hedging.max_attempts(),
            Some(
                Hedging::after(hedging.hedging_delay())
                    .with_max_hedges(hedging.max_attempts().saturating_sub(1)),
            ),
        ),
        None => (
            GrpcCodes::empty(),
            GrpcBackoff::new(Default::default(), Default::default(), 1.0),
            1,
            None,
        ),
    };
    let mut config = base
        .clone()
        .retyped(ListedCodesClassifier::new(codes), backoff);
    config.policy.max_attempts = attempts;
    config.policy.tokens = tokens.cloned();
    config.hedging = hedging;
    if let Some(timeout) = method.and_then(MethodConfig::timeout) {
        config.timeout = Some(Arc::new(timeout));
    }
    Arc::new(config)
}

impl<S> Layer<S> for ServiceConfigLayer {
    type Service = ServiceConfigService<S>;

    fn layer(&self, inner: S) -> ServiceConfigService<S> {
        ServiceConfigService {
            inner,
            engines: Arc::clone(&self.engines),
        }
    }
}

impl fmt::Debug for ServiceConfigLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceConfigLayer")
            .field("config", &self.engines.config)
            .field("tokens", &self.engines.tokens)
            .finish()
    }
}

/// The engine around a gRPC service (a tonic `Channel`), each call with its method's settings:
/// made by [`ServiceConfigLayer`].
#[derive(Clone)]
pub struct ServiceConfigService<S> {
    inner: S,
    engines: Arc<Engines>,
}

impl<S> ServiceConfigService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for ServiceConfigService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = Error;
    type Future = ResponseFuture<S, B, RB, ListedCodesClassifier, GrpcBackoff>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx).map_err(|error| {
            let error: BoxError = error.into();
            let classifier = &self.engines.unconfigured.classifier;
            Error::failed(classifier.classify_error(&*error), error, 0)
        })
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let engines = &self.engines;
        let config = (engines.config.method_index(request.uri().path()))
            .and_then(|index| engines.by_entry.get(index))
            .unwrap_or(&engines.unconfigured);
        // The readied service goes with the call; its clone stays for the next.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::new(ready, Arc::clone(config), request, Continue::Never, None)
    }
}

impl<S: fmt::Debug> fmt::Debug for ServiceConfigService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceConfigService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
