//! What the engine logs, and how much: a bounded number of lines per second however many
//! requests fail.
//!
//! - each retry: WARN, with `retry_attempt`, `delay_ms` and `reason`: retries are bounded by the
//!   retry budget, so these lines are too;
//! - a request that failed after retrying: ERROR, once (its retries were drawn from the budget:
//!   bounded the same way);
//! - a request given up on without a retry (the budget is spent, the deadline is too close, the
//!   server's hint too long) and a request refused on this side (the throttle, the breaker, the
//!   rate limit): DEBUG for each, and one summary line per [`SUMMARY_EVERY`] with the counts by
//!   cause, at WARN (INFO when only a few). In an outage these are the requests that make up the
//!   traffic: per request they would drown the errors that matter.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard_classify::Reason;
use tokio::time::Instant;

use crate::GiveUpCause;

/// How often, at most, the counts of quiet events are summarized: 10 s.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Quiet events, counted by kind for the summary.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Quiet {
    GaveUp(GiveUpCause),
    Refused(Reason),
}

const KINDS: usize = 9;

impl Quiet {
    fn index(self) -> usize {
        match self {
            Self::GaveUp(GiveUpCause::AttemptsExhausted) => 0,
            Self::GaveUp(GiveUpCause::BudgetExhausted) => 1,
            Self::GaveUp(GiveUpCause::Deadline) => 2,
            Self::GaveUp(GiveUpCause::HandedOn) => 4,
            Self::GaveUp(_) => 3,
            Self::Refused(Reason::Throttled) => 5,
            Self::Refused(Reason::BreakerOpen | Reason::BulkheadFull) => 6,
            Self::Refused(Reason::RateLimitedLocally) => 7,
            Self::Refused(_) => 8,
        }
    }
}

const NAMES: [&str; KINDS] = [
    "gave_up_attempts_exhausted",
    "gave_up_budget_exhausted",
    "gave_up_deadline",
    "gave_up_other",
    "handed_on",
    "refused_throttled",
    "refused_breaker",
    "refused_rate_limit",
    "refused_other",
];

/// Each kind's `cause` label in the metrics (`stormguard.refusals`).
const CAUSES: [&str; KINDS] = [
    "attempts",
    "budget",
    "deadline",
    "hint",
    "handed_on",
    "throttle",
    "breaker",
    "rate_limit",
    "other",
];

impl Quiet {
    /// The event's `cause` label in the metrics.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn cause(self) -> &'static str {
        CAUSES[self.index()]
    }
}

static COUNTS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];

/// When the next summary is due (`None`: at the first quiet event, a period from then).
static NEXT: Mutex<Option<Instant>> = Mutex::new(None);

/// Counts a quiet event, logs it at DEBUG, and writes the summary when one is due.
pub(crate) fn quiet(event: Quiet, attempts: u32) {
    COUNTS[event.index()].fetch_add(1, Ordering::Relaxed);
    match event {
        Quiet::GaveUp(cause) => {
            tracing::debug!(
                attempts,
                cause = cause.as_str(),
                "giving up on a retryable failure"
            );
        }
        Quiet::Refused(reason) => {
            tracing::debug!(
                attempts,
                reason = reason.as_str(),
                "request refused locally"
            );
        }
    }
    summarize(Instant::now());
}

/// Writes the summary of the quiet events if one is due at `now`.
fn summarize(now: Instant) {
    {
        let mut next = NEXT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *next {
            Some(due) if now < due => return,
            None => {
                *next = Some(now + SUMMARY_EVERY);
                return;
            }
            Some(_) => *next = Some(now + SUMMARY_EVERY),
        }
    }
    let counts: [u64; KINDS] = std::array::from_fn(|i| COUNTS[i].swap(0, Ordering::Relaxed));
    let total: u64 = counts.iter().sum();
    let parts: Vec<String> = NAMES
        .iter()
        .zip(counts)
        .filter(|(_, count)| *count > 0)
        .map(|(name, count)| format!("{name}={count}"))
        .collect();
    let every_s = SUMMARY_EVERY.as_secs();
    if total >= 100 {
        tracing::warn!(
            total,
            "requests given up on or refused locally over the last {every_s} s: {}",
            parts.join(" ")
        );
    } else {
        tracing::info!(
            total,
            "requests given up on or refused locally over the last {every_s} s: {}",
            parts.join(" ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_give_up_and_refusal_has_a_kind_of_its_own_in_the_summary_and_the_metrics() {
        let quiet = [
            (Quiet::GaveUp(GiveUpCause::AttemptsExhausted), "attempts"),
            (Quiet::GaveUp(GiveUpCause::BudgetExhausted), "budget"),
            (Quiet::GaveUp(GiveUpCause::Deadline), "deadline"),
            (Quiet::GaveUp(GiveUpCause::HintTooLong), "hint"),
            (Quiet::GaveUp(GiveUpCause::HandedOn), "handed_on"),
            (Quiet::Refused(Reason::Throttled), "throttle"),
            (Quiet::Refused(Reason::BreakerOpen), "breaker"),
            (Quiet::Refused(Reason::RateLimitedLocally), "rate_limit"),
            (Quiet::Refused(Reason::Timeout), "other"),
        ];
        let mut seen = [false; KINDS];
        for (event, cause) in quiet {
            assert_eq!(event.cause(), cause, "{event:?}");
            seen[event.index()] = true;
        }
        assert!(seen.iter().all(|kind| *kind), "every kind reached once");
    }
}
