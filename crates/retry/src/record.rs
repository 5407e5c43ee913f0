//! The seam between the engine's observation ([`Watch`](crate::observe::Watch)) and its metrics:
//! one trait, [`Recorder`], with two implementations, [`NoRecorder`] (records nothing, a
//! zero-sized type whose calls compile away) and, with the `metrics` feature, `MetricsRecorder`
//! (counters, gauges and histograms through the `metrics` facade, see
//! [`metrics`](crate::metrics)). The feature picks one, here and nowhere else:
//! [`EngineRecorder`].

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{Outcome, Reason};
use stormguard_rate_limit::RateLimit;
use tokio::time::Instant;

use crate::admission::Guards;

#[cfg(feature = "metrics")]
mod labels;
#[cfg(feature = "metrics")]
mod meter;

/// The recorder the engine uses: `MetricsRecorder` with the `metrics` feature.
#[cfg(feature = "metrics")]
pub(crate) type EngineRecorder = meter::MetricsRecorder;
/// The recorder the engine uses: [`NoRecorder`] without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
pub(crate) type EngineRecorder = NoRecorder;

/// What records one request's figures, for its [`Watch`](crate::observe::Watch). The watch
/// calls it at each step, beside its spans and logs; what a step records is the implementation's.
pub(crate) trait Recorder {
    /// Whether it records anything: the watch skips the work of labels no one reads.
    const RECORDS: bool;
    /// What it keeps of one attempt in flight (when it was sent).
    type Attempt: Default;
    /// What it hands to a body's reader or a stream's guard to record their end with (the
    /// provider's label).
    type Label;

    /// The recorder of a request to the backend named `name`, with head `head`.
    fn new(name: Option<&Arc<str>>, head: &Parts) -> Self;
    /// The request's body was read whole (to be sent again if need be): `body`.
    fn request_read(&mut self, body: &[u8]);
    /// The label of the request's figures, for what records after the response is handed back.
    fn label(&self) -> Self::Label;
    /// An attempt (`hedge`: a hedge) is sent.
    fn sending(&mut self, attempt: &mut Self::Attempt, hedge: bool);
    /// The attempt in flight ended with `outcome` (`status`: its answer's, if any).
    fn answered(&self, attempt: &mut Self::Attempt, outcome: &Outcome, status: Option<StatusCode>);
    /// A hedge's `event` (`won`, `cancelled`, `failed`, `budget`, `refused`).
    fn hedge(&self, event: &'static str);
    /// A retry for `reason` is decided (counted when it is sent).
    fn retrying(&mut self, reason: Reason);
    /// The request was given up on or an attempt refused on this side, for `cause`.
    fn refused(&self, cause: &'static str);
    /// The request ended with `outcome` (`error`: its failure's reason) after `attempts`
    /// (`streamed`: its answer is an event stream whose guard tells how it ends).
    fn finished(&self, attempts: u32, outcome: &'static str, error: Option<Reason>, streamed: bool);
    /// The guards' state after an attempt was admitted, refused or answered.
    fn health(&self, guards: &Guards);
    /// The rate limit `limit` gave an attempt a slot that starts at `start`.
    fn slot_reserved(&self, start: Instant, limit: &RateLimit);
    /// An attempt's event stream failed before its first content.
    fn stream_failed(&self);
    /// An attempt's event stream delivered its first content.
    fn first_chunk(&self);
    /// What is told the wait between two content events of a stream, if anything is.
    fn chunk_gaps(&self) -> Option<ChunkGaps>;
    /// A whole answer handed back (not a stream), `body`, said it used `counts`.
    fn answer_used(label: Self::Label, counts: TokenCounts, body: &[u8]);
    /// A stream handed back ended with `outcome`, having said it used `usage` (`continuation`:
    /// the stream of a request that continues another) and named `model`.
    fn stream_ended(
        label: Self::Label,
        outcome: &Outcome,
        usage: Option<TokenCounts>,
        continuation: bool,
        model: Option<&str>,
    );
}

/// Told the wait between two content events of a stream, as they come.
pub(crate) type ChunkGaps = Box<dyn FnMut(Duration) + Send + Sync>;

/// Records nothing: the engine's recorder without the `metrics` feature. Zero-sized, its calls
/// are empty and inlined away.
#[cfg_attr(feature = "metrics", allow(dead_code))]
pub(crate) struct NoRecorder;

impl Recorder for NoRecorder {
    const RECORDS: bool = false;
    type Attempt = ();
    type Label = Self;

    #[inline]
    fn new(_: Option<&Arc<str>>, _: &Parts) -> Self {
        Self
    }

    #[inline]
    fn request_read(&mut self, _: &[u8]) {}

    #[inline]
    fn label(&self) -> Self {
        Self
    }

    #[inline]
    fn sending(&mut self, _: &mut (), _: bool) {}

    #[inline]
    fn answered(&self, _: &mut (), _: &Outcome, _: Option<StatusCode>) {}

    #[inline]
    fn hedge(&self, _: &'static str) {}

    #[inline]
    fn retrying(&mut self, _: Reason) {}

    #[inline]
    fn refused(&self, _: &'static str) {}

    #[inline]
    fn finished(&self, _: u32, _: &'static str, _: Option<Reason>, _: bool) {}

    #[inline]
    fn health(&self, _: &Guards) {}

    #[inline]
    fn slot_reserved(&self, _: Instant, _: &RateLimit) {}

    #[inline]
    fn stream_failed(&self) {}

    #[inline]
    fn first_chunk(&self) {}

    #[inline]
    fn chunk_gaps(&self) -> Option<ChunkGaps> {
        None
    }

    #[inline]
    fn answer_used(_: Self, _: TokenCounts, _: &[u8]) {}

    #[inline]
    fn stream_ended(_: Self, _: &Outcome, _: Option<TokenCounts>, _: bool, _: Option<&str>) {}
}
