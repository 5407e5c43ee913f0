//! [`RetryLayer`]: the retry engine's configuration, applied to a service.

use std::fmt;
use std::sync::Arc;

use stormguard_budget::RetryBudget;
use stormguard_classify::{Classify, LlmClassifier};
use stormguard_jitter::{Backoff, FullJitter, HintPolicy};
use tower_layer::Layer;

use crate::Retry;

/// Default number of attempts per request, the first one included: 3, the per-request limit of
/// the Google SRE book ("Handling Overload": "implement a per-request retry budget of up to three
/// attempts"). Every layer that retries multiplies the attempts of the layers above it, so this
/// stays small; the shared [`RetryBudget`] bounds the total.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// Default largest request body the engine buffers to replay: 1 MiB. Chat-completion requests
/// with long prompts fit (a 128k-token context is about 0.5 MB of text); uploads and streams
/// bigger than this are sent once, untouched, and never retried.
pub const DEFAULT_MAX_REPLAY_BODY: usize = 1024 * 1024;

/// What every [`Retry`] made by one layer shares.
///
/// Aligned to 128 bytes so that, inside its `Arc`, it does not share a cache line (nor the
/// adjacent one that x86 prefetches with it) with the reference counts: every request clones and
/// drops the `Arc`, and threads sharing one layer would otherwise evict each other's copy of the
/// configuration they read on every request.
#[derive(Clone)]
#[repr(align(128))]
pub(crate) struct Config<C, Bk> {
    pub(crate) classifier: C,
    pub(crate) budget: RetryBudget,
    pub(crate) backoff: Bk,
    pub(crate) max_attempts: u32,
    pub(crate) hint_policy: HintPolicy,
    /// Whether `hint_policy` was set by the user; if not, it follows the classifier's
    /// `max_hint`.
    pub(crate) hint_policy_set: bool,
    pub(crate) max_replay_body: usize,
}

/// Applies the retry engine to a service (see the [crate docs](crate)).
///
/// Defaults:
/// * classifier [`LlmClassifier`]: HTTP status, gRPC status, transport errors and the JSON
///   error bodies of LLM APIs;
/// * budget [`RetryBudget::default()`], one per layer (clones of the layer share it; hand in one
///   budget with [`budget`](Self::budget) to share it further);
/// * backoff [`FullJitter::default()`]: `U(0, min(8 s, 500 ms × 2^n))`. The base and cap are the
///   official OpenAI SDKs' (0.5 s .. 8 s); the AWS SDKs use 1 s .. 20 s, but a 20 s pause is as
///   long as many LLM deadlines, and with three attempts the cap is seldom reached anyway;
/// * [`DEFAULT_MAX_ATTEMPTS`] (3) attempts;
/// * hint policy [`HintPolicy::default()`] with the classifier's
///   [`max_hint`](Classify::max_hint) as its maximum (60 s for every stormguard classifier):
///   honour server hints up to it, give up on longer ones;
/// * request bodies up to [`DEFAULT_MAX_REPLAY_BODY`] (1 MiB) are replayed.
///
/// Each builder method changes one thing. The layer is a cheap `Clone` (its configuration sits
/// in an `Arc`).
pub struct RetryLayer<C = LlmClassifier, Bk = FullJitter> {
    config: Arc<Config<C, Bk>>,
}

impl RetryLayer {
    /// A layer with the defaults listed on [`RetryLayer`].
    pub fn new() -> Self {
        Self::default()
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self {
            config: Arc::new(Config {
                classifier: LlmClassifier::default(),
                budget: RetryBudget::default(),
                backoff: FullJitter::default(),
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                hint_policy: HintPolicy::default().with_max(LlmClassifier::default().max_hint()),
                hint_policy_set: false,
                max_replay_body: DEFAULT_MAX_REPLAY_BODY,
            }),
        }
    }
}

impl<C: Classify, Bk: Backoff> RetryLayer<C, Bk> {
    fn into_config(self) -> Config<C, Bk> {
        Arc::unwrap_or_clone(self.config)
    }

    fn with_config(config: Config<C, Bk>) -> Self {
        Self {
            config: Arc::new(config),
        }
    }

    /// Classify outcomes with `classifier` instead. Unless a [`hint_policy`](Self::hint_policy)
    /// was set, the longest server hint followed becomes the classifier's
    /// [`max_hint`](Classify::max_hint).
    pub fn classifier<C2: Classify>(self, classifier: C2) -> RetryLayer<C2, Bk> {
        let config = self.into_config();
        let hint_policy = if config.hint_policy_set {
            config.hint_policy
        } else {
            HintPolicy::default().with_max(classifier.max_hint())
        };
        RetryLayer::with_config(Config {
            classifier,
            budget: config.budget,
            backoff: config.backoff,
            max_attempts: config.max_attempts,
            hint_policy,
            hint_policy_set: config.hint_policy_set,
            max_replay_body: config.max_replay_body,
        })
    }

    /// Draw retries from `budget` (and deposit successes into it). Pass clones of one budget to
    /// every layer that talks to the same backend so that they share it.
    pub fn budget(self, budget: RetryBudget) -> Self {
        Self::with_config(Config {
            budget,
            ..self.into_config()
        })
    }

    /// Wait between attempts as `backoff` schedules.
    pub fn backoff<Bk2: Backoff>(self, backoff: Bk2) -> RetryLayer<C, Bk2> {
        let config = self.into_config();
        RetryLayer::with_config(Config {
            classifier: config.classifier,
            budget: config.budget,
            backoff,
            max_attempts: config.max_attempts,
            hint_policy: config.hint_policy,
            hint_policy_set: config.hint_policy_set,
            max_replay_body: config.max_replay_body,
        })
    }

    /// Send each request at most `attempts` times, the first included (0 counts as 1: no retry).
    pub fn max_attempts(self, attempts: u32) -> Self {
        Self::with_config(Config {
            max_attempts: attempts.max(1),
            ..self.into_config()
        })
    }

    /// Turn server hints (`retry-after` and friends) into delays with `policy`; a hint above
    /// [`policy.max()`](HintPolicy::max) is not retried. An explicit policy wins over the
    /// classifier's [`max_hint`](Classify::max_hint), which sets the maximum otherwise.
    pub fn hint_policy(self, policy: HintPolicy) -> Self {
        Self::with_config(Config {
            hint_policy: policy,
            hint_policy_set: true,
            ..self.into_config()
        })
    }

    /// Buffer and replay request bodies of up to `bytes` bytes; bigger ones are sent once.
    pub fn max_replay_body(self, bytes: usize) -> Self {
        Self::with_config(Config {
            max_replay_body: bytes,
            ..self.into_config()
        })
    }

    /// The budget this layer draws from (for [`snapshot`](RetryBudget::snapshot)s).
    pub fn retry_budget(&self) -> &RetryBudget {
        &self.config.budget
    }
}

impl<C, Bk> Clone for RetryLayer<C, Bk> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, C, Bk> Layer<S> for RetryLayer<C, Bk> {
    type Service = Retry<S, C, Bk>;

    fn layer(&self, inner: S) -> Retry<S, C, Bk> {
        Retry::from_config(inner, Arc::clone(&self.config))
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for RetryLayer<C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<C: fmt::Debug, Bk: fmt::Debug> fmt::Debug for Config<C, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryConfig")
            .field("classifier", &self.classifier)
            .field("budget", &self.budget)
            .field("backoff", &self.backoff)
            .field("max_attempts", &self.max_attempts)
            .field("hint_policy", &self.hint_policy)
            .field("hint_policy_set", &self.hint_policy_set)
            .field("max_replay_body", &self.max_replay_body)
            .finish()
    }
}
