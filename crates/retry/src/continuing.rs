//! The engine's continuation of an event stream cut after content
//! (`stormguard_stream::continuation`): a continuation request goes through the engine itself,
//! under the retry budget, and its answer's body is spliced into the caller's stream by the
//! stream guard.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, Classify};
use stormguard_jitter::Backoff;
use stormguard_stream::{AnswerBody, AnswerFuture, Continuer, is_event_stream};
use tower_service::Service;

use crate::body::ReplayBody;
use crate::layer::Config;
use crate::service::ClientService;

/// Makes the continuer of a stream the engine hands back, from the service that answered it.
/// A plain function, so that a request that never streams costs a pointer and nothing more.
pub(crate) type MakeContinuer<S, C, Bk> = fn(&S, &Arc<Config<C, Bk>>) -> Continuer;

/// How the streams of one request are continued: through this engine (made when a stream is
/// handed back), or by what a layer above gave (a failover, which sends a continuation to its
/// next backend).
pub(crate) enum ContinueBy<S, C, Bk> {
    Engine(MakeContinuer<S, C, Bk>),
    Given(Continuer),
}

impl<S, C, Bk> ContinueBy<S, C, Bk> {
    /// The continuer, for a stream `service` answered under `config`.
    pub(crate) fn continuer(self, service: &S, config: &Arc<Config<C, Bk>>) -> Continuer {
        match self {
            Self::Engine(make) => make(service, config),
            Self::Given(continuer) => continuer,
        }
    }

    /// Whether a layer above continues the streams (and so chooses where to send them).
    pub(crate) fn is_given(&self) -> bool {
        matches!(self, Self::Given(_))
    }
}

/// Whether a backend was found to reject an assistant prefill (it answered a continuation
/// with 400): then it is not asked to continue again. One per layer; a failover gives each
/// backend its own.
#[derive(Debug, Default)]
pub(crate) struct Prefill {
    rejected: AtomicBool,
}

impl Prefill {
    pub(crate) fn rejected(&self) -> bool {
        self.rejected.load(Ordering::Relaxed)
    }

    pub(crate) fn reject(&self) {
        self.rejected.store(true, Ordering::Relaxed);
    }
}

/// A continuer that sends each continuation request through the engine over a clone of
/// `service`: a withdrawal from the retry budget first (a spent budget continues nothing), and
/// the answer's body if it is an event stream. A 400 teaches the layer that its backend takes
/// no prefill; the caller is told the original interruption, never the 400.
pub(crate) fn make_continuer<S, B, RB, C, Bk>(service: &S, config: &Arc<Config<C, Bk>>) -> Continuer
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: ReplayBody + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
    C: Classify + Send + Sync + 'static,
    Bk: Backoff + Send + Sync + 'static,
    Bk::Schedule: Send + 'static,
{
    let service = service.clone();
    let config = Arc::clone(config);
    Box::new(move |request: Request<Bytes>| -> AnswerFuture {
        let Some(withdrawal) = config.policy.budget.try_withdraw() else {
            return Box::pin(std::future::ready(None));
        };
        let mut client = ClientService::from_config(service.clone(), Arc::clone(&config));
        let prefill = Arc::clone(&config.prefill);
        Box::pin(async move {
            // Spent once sent, like a retry's.
            let _withdrawal = withdrawal;
            poll_fn(|cx| client.poll_ready(cx)).await.ok()?;
            let response = client.call(request.map(B::from_bytes)).await.ok()?;
            if response.status() == StatusCode::BAD_REQUEST {
                prefill.reject();
                return None;
            }
            continuing_stream(response)
        })
    })
}

/// The body of a continuation's answer, for the stream it continues: a success that is an event
/// stream, else `None` (the stream ends with its first interruption). What every continuer,
/// the engine's and a failover's, makes of the answer it got.
pub fn continuing_stream<RB>(response: Response<ResponseBody<RB>>) -> Option<AnswerBody>
where
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
{
    if !response.status().is_success() || !is_event_stream(response.headers()) {
        return None;
    }
    Some(Box::pin(response.into_body()))
}
