//! How the event streams a request hands back are continued when they are cut after content
//! (`stormguard_stream::continuation`): through this engine, under the retry budget, or through
//! what a router above gave ([`Route::with_continuer`](crate::Route::with_continuer)).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body::Body;
use stormguard_classify::BoxError;
use stormguard_classify::body::ResponseBody;
use stormguard_stream::{AnswerBody, Continuer, is_event_stream};

use crate::config::Config;

/// Makes the continuer of a stream the engine hands back, from the service that answered it.
/// A plain function, so that a request that never streams costs a pointer and nothing more.
pub(crate) type MakeContinuer<S, C, Bk> = fn(&S, &Arc<Config<C, Bk>>) -> Continuer;

/// How the streams of one request are continued.
pub(crate) enum Continue<S, C, Bk> {
    /// Through this engine, by the continuer made when a stream is handed back.
    Engine(MakeContinuer<S, C, Bk>),
    /// By what a router above gave.
    By(Continuer),
    /// Never: the layer does not continue, or the request is a continuation itself.
    Never,
}

impl<S, C, Bk> Continue<S, C, Bk> {
    /// The continuer, for a stream `service` answered under `config`.
    pub(crate) fn continuer(self, service: &S, config: &Arc<Config<C, Bk>>) -> Option<Continuer> {
        match self {
            Self::Engine(make) => Some(make(service, config)),
            Self::By(continuer) => Some(continuer),
            Self::Never => None,
        }
    }
}

/// The body of a continuation's answer, for the stream it continues: a success that is an event
/// stream, else `None` (the stream ends with its first interruption).
pub(crate) fn continued_body<RB>(response: Response<ResponseBody<RB>>) -> Option<AnswerBody>
where
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + Send,
{
    if !response.status().is_success() || !is_event_stream(response.headers()) {
        return None;
    }
    Some(Box::pin(response.into_body()))
}

/// A layer whose engine continues the event streams it hands back through itself, for the
/// formats it knows (the default): see
/// [`ClientLayer::without_continuation`](crate::ClientLayer::without_continuation).
#[derive(Clone, Copy, Debug, Default)]
pub struct Continuing;

/// A layer whose engine never continues a stream through itself: a stream cut after content ends
/// with its in-band error event and `StreamInterrupted` (a resume hook, or a router above that
/// gives the engine a continuer, may still continue it). Its service asks no more of the inner
/// service than any tower retry does.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotContinuing;
