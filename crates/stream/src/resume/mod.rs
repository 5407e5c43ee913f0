//! The resume hook: what a guarded stream does when it stops before its answer is complete.
//!
//! A [`GuardedStream`](crate::GuardedStream) given a hook
//! ([`with_resume`](crate::GuardedStream::with_resume)) is handed on in whole events, and
//! tells its hook each event the caller was shown ([`Resume::shown`]). When it stops (it was
//! interrupted after content, or it ended without a terminal event), it asks the hook what
//! follows ([`Resume::resume`]):
//!
//! - the answer is complete: the stream ends cleanly, after the terminal event it lost, if any;
//! - a continuation was sent: its answer is read, each frame spliced ([`Resume::splice`]) into
//!   what the caller is handed, and each event of it handed on is shown to the hook in turn. A
//!   continuation's error event never reaches the caller, nor does anything after its terminal
//!   event; a continuation that stops (its error event, a failure, an end without a terminal
//!   event) is one more stop, and the hook is asked again;
//! - it cannot be completed: the stream ends with the hook's in-band error event, if its format
//!   has one ([`Resume::error_event`]), then
//!   [`StreamInterrupted`](crate::StreamInterrupted), which names the *first* interruption
//!   (never a continuation's own failure). So does a continuation whose answer could not be had:
//!   whoever sent it retried it already.
//!
//! Two hooks are ready: [`Continuations`](crate::continuation::Continuations), for OpenAI Chat
//! Completions and Anthropic Messages (a prefill, a splice), which the retry engine gives every
//! stream in those formats; and [`ResumeFn`], a closure given what was received. A hook set on
//! the engine (`ClientLayer::with_stream_resume`, any [`MakeResume`], a `ResumeFn` among them)
//! takes the built-in one's place on every stream.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use stormguard_stream::sse::Event;
//! use stormguard_stream::{
//!     AnswerBody, InterruptCause, Opening, Resume, Resumption, StreamPolicy, open,
//! };
//!
//! /// Resumes a stream that ended without its terminal event, once, with an answer at hand.
//! struct Rest(Option<&'static str>);
//!
//! impl Resume for Rest {
//!     fn shown(&mut self, _event: &Event) {}
//!
//!     fn content_events(&self) -> u64 {
//!         0
//!     }
//!
//!     fn resume(&mut self, cause: &InterruptCause, _bytes: u64) -> Resumption {
//!         let (InterruptCause::Unfinished, Some(rest)) = (cause, self.0.take()) else {
//!             return Resumption::Interrupted;
//!         };
//!         let body: AnswerBody = Box::pin(Full::new(Bytes::from(rest)).map_err(Into::into));
//!         Resumption::Continuation(Box::pin(async move { Some(body) }))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let hello = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";
//! let world = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\n\n\
//!     data: [DONE]\n\n";
//! let body = Full::new(Bytes::from_static(hello.as_bytes()));
//! let Opening::Open(stream) = open(body, StreamPolicy::default()).await else {
//!     panic!("content opens the stream");
//! };
//! // The continuation's frames are handed on as they came (`splice`'s default).
//! let stream = stream.with_resume(Box::new(Rest(Some(world))));
//! let read = stream.collect().await.map(|whole| whole.to_bytes());
//! assert_eq!(read.ok(), Some(Bytes::from(format!("{hello}{world}"))));
//! # }
//! ```

mod resume_fn;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http_body::Body;
use stormguard_classify::BoxError;

use crate::interrupted::InterruptCause;
use crate::sse::{Event, FrameKind};

pub use self::resume_fn::{Received, ResumeFn};

/// The body of a continuation's answer: an event stream.
pub type AnswerBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send + 'static>>;

/// The future of a continuation's answer: its body, or `None` when it could not be had (refused,
/// failed, not an event stream).
pub type AnswerFuture = Pin<Box<dyn Future<Output = Option<AnswerBody>> + Send + 'static>>;

/// The continuer: what sends a continuation request and returns the future of its answer. The
/// retry engine makes one that sends through itself, under the retry budget; a failover, one that
/// sends to its next backend.
pub type Continuer = Box<dyn FnMut(http::Request<Bytes>) -> AnswerFuture + Send>;

/// A stream's resume hook: learns what the caller was shown, and says what follows when the
/// stream stops before its answer is complete (see the [module docs](self)).
///
/// The stream calls it from its reader's task, one call at a time.
pub trait Resume: Send {
    /// One whole event the caller was shown, in order: the stream's own, up to an error event,
    /// then those of each continuation the splice handed on, as the continuation sent them.
    fn shown(&mut self, event: &Event);

    /// Content events the caller was shown, what [`StreamInterrupted`](crate::StreamInterrupted)
    /// says was delivered if the stream cannot be completed.
    fn content_events(&self) -> u64;

    /// The stream, or the continuation being read, stopped for `cause`
    /// ([`Unfinished`](InterruptCause::Unfinished): it ended without a terminal event), `bytes`
    /// having been handed on: what follows. A hook for a format without a terminal event answers
    /// `Unfinished` with [`Complete`](Resumption::Complete).
    fn resume(&mut self, cause: &InterruptCause, bytes: u64) -> Resumption;

    /// One frame of a continuation's answer (`raw`: its bytes as they came, from the end of the
    /// frame before it): the bytes to hand the caller, or `None` to drop it. Never called with an
    /// error event. By default, the frame as it came.
    fn splice(&mut self, frame: &FrameKind, raw: Bytes) -> Option<Bytes> {
        let _ = frame;
        Some(raw)
    }

    /// The in-band error event that ends a stream that cannot be completed, before
    /// [`StreamInterrupted`](crate::StreamInterrupted) (`cause`: the first interruption; `bytes`:
    /// handed on), so that a client that reads the stream's events sees the failure. By default,
    /// none.
    fn error_event(&self, cause: &InterruptCause, bytes: u64) -> Option<Bytes> {
        let _ = (cause, bytes);
        None
    }
}

/// What follows a stream's stop, as its [`Resume`] hook says.
pub enum Resumption {
    /// A continuation was sent: the stream goes on with its answer.
    Continuation(AnswerFuture),
    /// The answer is complete: the stream ends cleanly, after these bytes (a terminal event it
    /// lost), if any.
    Complete(Option<Bytes>),
    /// The answer cannot be completed: the stream ends with the hook's
    /// [`error_event`](Resume::error_event), then [`StreamInterrupted`](crate::StreamInterrupted).
    Interrupted,
}

impl std::fmt::Debug for Resumption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Continuation(_) => f.write_str("Continuation"),
            Self::Complete(end) => f.debug_tuple("Complete").field(end).finish(),
            Self::Interrupted => f.write_str("Interrupted"),
        }
    }
}

/// Makes the [`Resume`] hook of each stream a layer hands back (the retry engine's
/// `ClientLayer::with_stream_resume`), as tower-http's `MakeClassifier` makes a classifier per
/// request.
pub trait MakeResume: Send + Sync {
    /// The hook of the stream that answers the request `head` + `body` (its head carries the
    /// deadline), or `None` to leave it without one.
    fn make_resume(&self, head: &http::request::Parts, body: &Bytes) -> Option<Box<dyn Resume>>;
}
