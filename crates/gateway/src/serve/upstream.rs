//! The connection to providers: one hyper client (HTTPS with rustls on `ring` under the `https`
//! feature, plain HTTP otherwise) under every route's failover, counting the attempts each
//! request makes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormguard::classify::BoxError;
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;

/// Connections to a provider kept open while idle: a burst opens what it needs, and all but
/// these are closed after it, so that memory follows the load.
const IDLE_CONNECTIONS: usize = 64;

/// What a route's failover sends its attempts through.
pub(crate) type Connection =
    BoxCloneSyncService<Request<Full<Bytes>>, Response<hyper::body::Incoming>, BoxError>;

/// In a request's extensions: the attempts sent for it so far, on any deployment (the engine
/// copies a request's extensions to each of its attempts).
#[derive(Clone, Debug, Default)]
pub(crate) struct AttemptCount(Arc<AtomicU32>);

impl AttemptCount {
    pub(crate) fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts an attempt of the request it is in.
fn count<B>(request: Request<B>) -> Request<B> {
    if let Some(count) = request.extensions().get::<AttemptCount>() {
        count.0.fetch_add(1, Ordering::Relaxed);
    }
    request
}

/// The client every route shares.
pub(crate) fn connection() -> Result<Connection, String> {
    let connector = connector()?;
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_CONNECTIONS)
        .build(connector);
    Ok(BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_request(count)
            .map_err(BoxError::from)
            .service(client),
    ))
}

/// HTTPS with rustls on `ring` (the project builds no aws-lc) and webpki's roots. rustls 0.23.48
/// deprecates `ring::default_provider` because `ring` has no post-quantum key exchange; it is
/// still the provider chosen here, until rustls offers one without aws-lc.
#[cfg(feature = "https")]
#[allow(deprecated)]
fn connector()
-> Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, String>
{
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|error| format!("TLS: {error}"))?;
    Ok(builder.https_or_http().enable_http1().build())
}

#[cfg(not(feature = "https"))]
fn connector() -> Result<hyper_util::client::legacy::connect::HttpConnector, String> {
    Ok(hyper_util::client::legacy::connect::HttpConnector::new())
}
