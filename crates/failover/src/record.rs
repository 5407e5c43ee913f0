//! The seam between the failover and its metrics: one trait, [`Recorder`], with two
//! implementations, [`NoRecorder`] (records nothing; its calls compile away) and, with the
//! `metrics` feature, `MetricsRecorder` (counters through the `metrics` facade, under the
//! engine's names, [`stormguard_retry::metrics`]). The feature picks one, here and nowhere else:
//! [`FailoverRecorder`].

use std::sync::Arc;

use stormguard_classify::Reason;

/// The recorder the failover uses: `MetricsRecorder` with the `metrics` feature.
#[cfg(feature = "metrics")]
pub(crate) type FailoverRecorder = metrics_recorder::MetricsRecorder;
/// The recorder the failover uses: [`NoRecorder`] without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
pub(crate) type FailoverRecorder = NoRecorder;

/// What counts the failover's own events (the engines of its backends count theirs).
pub(crate) trait Recorder {
    /// A hedge's `event` on the backend named `backend` (`stormguard.hedges`).
    fn hedged(backend: &Arc<str>, event: &'static str);
    /// A request moved from backend `from` to `to` for `reason` (`stormguard.failovers`).
    fn moved(from: &Arc<str>, to: &str, reason: Reason);
}

/// Records nothing: the failover's recorder without the `metrics` feature.
#[cfg_attr(feature = "metrics", allow(dead_code))]
pub(crate) struct NoRecorder;

impl Recorder for NoRecorder {
    #[inline]
    fn hedged(_: &Arc<str>, _: &'static str) {}

    #[inline]
    fn moved(_: &Arc<str>, _: &str, _: Reason) {}
}

#[cfg(feature = "metrics")]
mod metrics_recorder {
    //! [`MetricsRecorder`]: the failover's counters through the `metrics` facade.

    use std::sync::Arc;

    use metrics::{SharedString, counter};
    use stormguard_classify::Reason;
    use stormguard_retry::metrics::{FAILOVERS, HEDGES, PROVIDER};

    use super::Recorder;

    /// Counts the failover's events through the `metrics` facade.
    pub(crate) struct MetricsRecorder;

    impl Recorder for MetricsRecorder {
        fn hedged(backend: &Arc<str>, event: &'static str) {
            counter!(
                HEDGES,
                PROVIDER => SharedString::from(Arc::clone(backend)),
                "outcome" => event
            )
            .increment(1);
        }

        fn moved(from: &Arc<str>, to: &str, reason: Reason) {
            counter!(
                FAILOVERS,
                "from" => SharedString::from(Arc::clone(from)),
                "to" => to.to_owned(),
                "reason" => reason.as_str()
            )
            .increment(1);
        }
    }
}
