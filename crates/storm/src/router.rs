//! The network between the clients and two providers: a tower `Service` that sends each request
//! to the provider its URI names.
//!
//! Every pipeline sends its requests to the primary ([`PRIMARY_AUTHORITY`]); a failover
//! rewrites a request for the secondary with the secondary's origin ([`SECONDARY_ORIGIN`]), as it
//! would for another provider's API. The router reads the authority and hands the request to that
//! provider's model: requests for [`SECONDARY_AUTHORITY`] to the secondary, every other one to
//! the primary.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use crate::backend::{Backend, ProviderBody, ResponseFuture};

/// Authority of the primary provider, to which every pipeline sends its requests first.
pub const PRIMARY_AUTHORITY: &str = "llm.invalid";

/// Authority of the secondary provider.
pub const SECONDARY_AUTHORITY: &str = "secondary.invalid";

/// Origin (scheme and authority) of the secondary provider, as a failover's adapter is given it.
pub const SECONDARY_ORIGIN: &str = "http://secondary.invalid";

/// Two providers behind one service: requests whose authority is [`SECONDARY_AUTHORITY`] go to
/// the secondary, all others to the primary. Clones share the providers.
#[derive(Clone)]
pub struct Router {
    primary: Backend,
    secondary: Backend,
}

impl Router {
    /// A router to `primary` and `secondary`.
    pub fn new(primary: Backend, secondary: Backend) -> Router {
        Router { primary, secondary }
    }

    /// The primary provider.
    pub fn primary(&self) -> &Backend {
        &self.primary
    }

    /// The secondary provider.
    pub fn secondary(&self) -> &Backend {
        &self.secondary
    }

    /// Whether `request` is for the secondary.
    pub fn is_for_secondary<B>(request: &Request<B>) -> bool {
        request
            .uri()
            .authority()
            .is_some_and(|authority| authority.as_str() == SECONDARY_AUTHORITY)
    }
}

impl<B> Service<Request<B>> for Router
where
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<ProviderBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Always ready: so are both providers.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if Self::is_for_secondary(&request) {
            self.secondary.call(request)
        } else {
            self.primary.call(request)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenario::{Scenario, ScenarioKind};
    use http::Uri;
    use tokio::time::Instant;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn requests_go_to_the_provider_their_authority_names() {
        let scenario = Scenario::builtin(ScenarioKind::Failover).with_qps(100.0);
        let epoch = Instant::now();
        let primary = Backend::new(&scenario, epoch);
        let secondary = Backend::new(&scenario.secondary().unwrap(), epoch);
        let router = Router::new(primary.clone(), secondary.clone());
        let to = |uri: &'static str| {
            let mut request = Request::new(http_body_util::Full::new(Bytes::new()));
            *request.uri_mut() = Uri::from_static(uri);
            request
        };
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
}
