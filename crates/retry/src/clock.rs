//! The attempt's clocks (`stormguard_deadline::clocks`): when an attempt in flight is abandoned,
//! what a stream of it may wait for, and what each healthy answer teaches the backend's clocks.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use stormguard_classify::{Classify, Failure, Outcome, Reason};
use stormguard_deadline::clocks::AttemptClocks;
use stormguard_jitter::Backoff;
use stormguard_stream::StreamPolicy;
use tokio::time::Instant;

use crate::attempt::Due;
use crate::ledger::Ledger;

/// An attempt abandoned by its clock: no response head came within what the backend's healthy
/// answers showed (see `stormguard_deadline::clocks`). A retryable timeout the backend did not
/// accept; the request goes on (a retry, or the next backend under a failover).
pub struct AttemptTimedOut {
    after: Duration,
    failure: Failure,
}

impl AttemptTimedOut {
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            failure: Failure::new(attempt_timeout()),
        }
    }

    /// How long the attempt waited.
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Debug for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptTimedOut")
            .field("after", &self.after)
            .finish()
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no response head after {:?}", self.after)
    }
}

impl StdError for AttemptTimedOut {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.failure)
    }
}

/// What a fired clock is: a retryable timeout, not accepted.
pub(crate) fn attempt_timeout() -> Outcome {
    Outcome::retryable(Reason::Timeout).with_accepted(false)
}

impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// When the attempt in flight is abandoned for want of its head, worked out once per
    /// attempt, the first time it waits (an answer that comes at once never reads the body).
    pub(crate) fn head_clock(&mut self) -> Option<Instant> {
        match self.attempt.head_by {
            Due::At(at) => return Some(at),
            Due::Never => return None,
            Due::Unset => {}
        }
        let at = match &self.config.clocks {
            Some(clocks) => {
                // Sent in this same poll, if no deadline timed it already.
                let started = *self.attempt.started.get_or_insert_with(Instant::now);
                let shape = self.origin.shape(&clocks.settings().whole);
                clocks
                    .head(shape)
                    .and_then(|wait| started.checked_add(wait))
            }
            None => None,
        };
        self.attempt.head_by = at.map_or(Due::Never, Due::At);
        at
    }

    /// Whether a request whose attempt's clock fired can go on without it: its other attempt in
    /// flight (a hedge's race), another attempt here (the request can be sent again, has
    /// attempts left, and the budget a retry), or, under a failover, another backend (the budget
    /// a move). Else abandoning the attempt would only end the request early, when the attempt
    /// may still answer. The budget is asked, not drawn on: the retry or the move draws on it
    /// itself.
    pub(crate) fn may_go_on(&self) -> bool {
        if self.racing() {
            return true;
        }
        let config = &self.config;
        let here = self.origin.is_replay() && self.sent < config.policy.max_attempts;
        if !(config.hand_off || here) {
            return false;
        }
        let budget = &config.policy.budget;
        match budget.try_withdraw() {
            Some(withdrawal) => {
                budget.refund(withdrawal);
                true
            }
            None => false,
        }
    }

    /// The head of a healthy answer the attempt waited for came: its backend's head clock
    /// learns how long it took.
    pub(crate) fn learn_head(&self, streaming: bool) {
        if let (Some(clocks), Some(took)) = (&self.config.clocks, self.attempt.in_flight()) {
            clocks.record_head(streaming, took);
        }
    }

    /// The stream guard's policy for this attempt's stream: the layer's, with the backend's
    /// learned first-content clock, and its gap clock where it is tighter than the progress
    /// limit.
    pub(crate) fn stream_policy(&self, policy: StreamPolicy) -> StreamPolicy {
        let Some(clocks) = &self.config.clocks else {
            return policy;
        };
        let first_content = clocks.first_content().or(policy.first_content());
        let progress = match (clocks.gap(), policy.progress()) {
            (Some(gap), Some(limit)) => Some(gap.min(limit)),
            (gap, limit) => gap.or(limit),
        };
        policy
            .with_first_content(first_content)
            .with_progress(progress)
    }

    /// The backend's clocks, for what a stream teaches them.
    pub(crate) fn clocks(&self) -> Option<&AttemptClocks> {
        self.config.clocks.as_ref()
    }
}
