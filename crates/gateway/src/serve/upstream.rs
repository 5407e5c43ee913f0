//! The connection to providers: a pooled hyper client (HTTPS with rustls on `ring` under the
//! `https` feature, plain HTTP otherwise) under every route's failover, counting the attempts
//! each request makes. Served on workers, each worker thread has a client of its own; elsewhere
//! the routes share one.

use std::cell::OnceCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use stormguard::classify::BoxError;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

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

/// What every route sends its attempts through: the client of the thread a request is served
/// on ([`PerWorker`]).
pub(crate) fn connection() -> Result<Connection, String> {
    let shared = client()?;
    Ok(BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_request(count)
            .map_err(BoxError::from)
            .service(PerWorker { shared }),
    ))
}

/// A pooled client to the providers.
fn client() -> Result<Client<Connector, Full<Bytes>>, String> {
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_CONNECTIONS)
        .build(connector()?))
}

#[cfg(feature = "https")]
type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;
#[cfg(not(feature = "https"))]
type Connector = hyper_util::client::legacy::connect::HttpConnector;

thread_local! {
    /// A worker's own client: its connections to the providers are served on its runtime.
    static WORKER_CLIENT: OnceCell<Option<Client<Connector, Full<Bytes>>>> = const { OnceCell::new() };
}

/// The client of the thread a request is served on: a worker's own ([`super::workers`]), so
/// that the request and its provider connection wake each other on one thread; elsewhere the
/// one shared client.
#[derive(Clone)]
struct PerWorker {
    shared: Client<Connector, Full<Bytes>>,
}

impl Service<Request<Full<Bytes>>> for PerWorker {
    type Response = Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A legacy client is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        if !super::workers::on_worker() {
            return self.shared.request(request);
        }
        // A worker whose client could not be built sends through the shared one.
        WORKER_CLIENT.with(|own| {
            own.get_or_init(|| client().ok())
                .as_ref()
                .unwrap_or(&self.shared)
                .request(request)
        })
    }
}

/// HTTPS with rustls on `ring` (the project builds no aws-lc) and webpki's roots. rustls 0.23.48
/// deprecates `ring::default_provider` because `ring` has no post-quantum key exchange; it is
/// still the provider chosen here, until rustls offers one without aws-lc.
#[cfg(feature = "https")]
#[allow(deprecated)]
fn connector() -> Result<Connector, String> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|error| format!("TLS: {error}"))?;
    Ok(builder.https_or_http().enable_http1().build())
}

#[cfg(not(feature = "https"))]
fn connector() -> Result<Connector, String> {
    Ok(hyper_util::client::legacy::connect::HttpConnector::new())
}
