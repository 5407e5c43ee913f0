//! The network between the clients and the providers: a tower `Service` that sends each request
//! to the provider its URI names.
//!
//! Every pipeline sends its requests to the primary ([`PRIMARY_AUTHORITY`]); a failover
//! rewrites a request for the secondary with the secondary's origin ([`SECONDARY_ORIGIN`]), as it
//! would for another provider's API. The router reads the authority and hands the request to that
//! provider's model: requests for [`SECONDARY_AUTHORITY`] to the secondary, every other one to
//! the primary. In a balance scenario the providers are its deployments, each at the authority of
//! its name ([`deployment_authority`]), the first of them also taking every request for an
//! authority no deployment has (the primary's).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use crate::backend::{Backend, ProviderBody, ResponseFuture};

/// Authority of the primary provider, to which every pipeline sends its requests first.
pub(crate) const PRIMARY_AUTHORITY: &str = "llm.invalid";

/// Authority of the secondary provider.
pub(crate) const SECONDARY_AUTHORITY: &str = "secondary.invalid";

/// Origin (scheme and authority) of the secondary provider, as a failover's adapter is given it.
pub(crate) const SECONDARY_ORIGIN: &str = "http://secondary.invalid";

/// The authority of the deployment named `name` (`east.invalid`).
pub(crate) fn deployment_authority(name: &str) -> String {
    format!("{name}.invalid")
}

/// The origin (scheme and authority) of the deployment named `name`, as a client that sends it
/// requests is given it (`http://east.invalid`).
pub(crate) fn deployment_origin(name: &str) -> http::Uri {
    let origin = format!("http://{}", deployment_authority(name));
    origin
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static(SECONDARY_ORIGIN))
}

/// Providers behind one service, each at its authority: a request goes to the one its authority
/// names, or to the first when none does. Clones share the providers.
#[derive(Clone)]
pub(crate) struct Router {
    providers: Arc<[(String, Backend)]>,
}

impl Router {
    /// A router to `primary` and `secondary` ([`SECONDARY_AUTHORITY`]).
    pub(crate) fn new(primary: Backend, secondary: Backend) -> Router {
        Router::of(vec![
            (PRIMARY_AUTHORITY.to_owned(), primary),
            (SECONDARY_AUTHORITY.to_owned(), secondary),
        ])
    }

    /// A router to `providers`, each at its authority; the first takes every other request.
    pub(crate) fn of(providers: Vec<(String, Backend)>) -> Router {
        Router {
            providers: providers.into(),
        }
    }

    /// A router to a balance scenario's deployments, each `(name, provider)` at its name's
    /// authority ([`deployment_authority`]); the first takes every other request.
    pub(crate) fn deployments(deployments: Vec<(&str, Backend)>) -> Router {
        Router::of(
            deployments
                .into_iter()
                .map(|(name, backend)| (deployment_authority(name), backend))
                .collect(),
        )
    }

    /// The primary provider (the first).
    pub(crate) fn primary(&self) -> &Backend {
        &self.providers[0].1
    }

    /// The provider `request`'s authority names, or the first.
    fn provider_for<B>(&self, request: &Request<B>) -> &Backend {
        let authority = request.uri().authority().map(|a| a.as_str());
        self.providers
            .iter()
            .find(|(at, _)| Some(at.as_str()) == authority)
            .map_or_else(|| self.primary(), |(_, backend)| backend)
    }
}

impl<B> Service<Request<B>> for Router
where
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<ProviderBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Always ready: so are the providers.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut provider = self.provider_for(&request).clone();
        provider.call(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenarios;
    use http::Uri;
    use tokio::time::Instant;
    use tower::ServiceExt;

    fn to(uri: &'static str) -> Request<http_body_util::Full<Bytes>> {
        let mut request = Request::new(http_body_util::Full::new(Bytes::new()));
        *request.uri_mut() = Uri::from_static(uri);
        request
    }

    #[tokio::test(start_paused = true)]
    async fn requests_go_to_the_provider_their_authority_names() {
        let scenario = scenarios::FAILOVER.scenario().with_qps(100.0);
        let epoch = Instant::now();
        let primary = Backend::new(&scenario, epoch);
        let secondary = Backend::new(&scenario.secondary().unwrap(), epoch);
        let router = Router::new(primary.clone(), secondary.clone());
        for uri in [
            "http://llm.invalid/v1/chat/completions",
            "http://secondary.invalid/v1/chat/completions",
            "http://secondary.invalid:8080/v1/chat/completions",
            "/v1/chat/completions",
        ] {
            let response = router.clone().oneshot(to(uri)).await.unwrap();
            assert_eq!(response.status(), 200, "{uri}");
        }
        assert_eq!(primary.model().stats().attempts, 3);
        assert_eq!(secondary.model().stats().attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn each_deployment_takes_the_requests_for_its_name_and_the_first_the_others() {
        let scenario = scenarios::BALANCE.scenario().with_qps(100.0);
        let epoch = Instant::now();
        let deployments: Vec<(&str, Backend)> = scenario
            .deployments
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    d.name,
                    Backend::new(&scenario.deployment(i).unwrap(), epoch),
                )
            })
            .collect();
        let router = Router::deployments(deployments.clone());
        assert_eq!(deployment_origin("west"), "http://west.invalid/");
        for uri in [
            "http://east.invalid/v1/chat/completions",
            "http://west.invalid/v1/chat/completions",
            "http://eu.invalid/v1/chat/completions",
            "http://llm.invalid/v1/chat/completions",
        ] {
            router.clone().oneshot(to(uri)).await.unwrap();
        }
        let attempts: Vec<u64> = deployments
            .iter()
            .map(|(_, backend)| backend.model().stats().attempts)
            .collect();
        assert_eq!(attempts, [2, 1, 1]);
    }
}
