//! [`Config`]: what every service a [`ClientLayer`](crate::ClientLayer) makes shares.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stormguard_breaker::Fallback;
use stormguard_deadline::client::TimeoutSource;
use stormguard_deadline::clocks::AttemptClocks;
use stormguard_stream::{MakeResume, StreamPolicy};

use crate::admission::Guards;
use crate::hedge::Hedging;
use crate::policy::RetryPolicy;

/// Where a request's deadline comes from, shared by every service a layer makes.
pub(crate) type SharedTimeout = Arc<dyn TimeoutSource + Send + Sync>;

/// What every [`ClientService`](crate::ClientService) made by one layer shares.
#[derive(Clone)]
pub(crate) struct Config<C, Bk> {
    pub(crate) classifier: C,
    /// Whether and when a failure is retried.
    pub(crate) policy: RetryPolicy<Bk>,
    /// What admits each attempt, in order.
    pub(crate) guards: Guards,
    pub(crate) max_replay_body: usize,
    pub(crate) fallback: Option<Fallback>,
    pub(crate) timeout: Option<SharedTimeout>,
    pub(crate) margin: Duration,
    pub(crate) propagation: bool,
    pub(crate) streams: Option<StreamPolicy>,
    pub(crate) resume: Option<Arc<dyn MakeResume>>,
    pub(crate) name: Option<Arc<str>>,
    /// Each attempt's own clocks, learned from this backend's answers.
    pub(crate) clocks: Option<AttemptClocks>,
    /// Whether this layer's backend was found to reject an assistant prefill.
    pub(crate) prefill: Arc<Prefill>,
    /// When a request waiting for its content is hedged; none: never.
    pub(crate) hedging: Option<Hedging>,
}

/// Whether a backend was found to reject an assistant prefill (it answered a continuation with
/// 400): then it is not asked to continue again. One per layer.
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

impl<C, Bk> Config<C, Bk> {
    /// The same configuration with another classifier and backoff (and so, maybe, other types).
    pub(crate) fn retyped<C2, Bk2>(self, classifier: C2, backoff: Bk2) -> Config<C2, Bk2> {
        Config {
            classifier,
            policy: self.policy.with_backoff(backoff),
            guards: self.guards,
            max_replay_body: self.max_replay_body,
            fallback: self.fallback,
            timeout: self.timeout,
            margin: self.margin,
            propagation: self.propagation,
            streams: self.streams,
            resume: self.resume,
            name: self.name,
            clocks: self.clocks,
            prefill: self.prefill,
            hedging: self.hedging,
        }
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for Config<C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("name", &self.name)
            .field("classifier", &self.classifier)
            .field("budget", &self.policy.budget)
            .field("backoff", &self.policy.backoff)
            .field("hint_policy", &self.policy.hint_policy)
            .field("max_attempts", &self.policy.max_attempts)
            .field("max_replay_body", &self.max_replay_body)
            .field("guards", &self.guards)
            .field("fallback", &self.fallback.is_some())
            .field("timeout", &self.timeout.is_some())
            .field("margin", &self.margin)
            .field("propagation", &self.propagation)
            .field("clocks", &self.clocks)
            .field("hedging", &self.hedging)
            .finish()
    }
}
