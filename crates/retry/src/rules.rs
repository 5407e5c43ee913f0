//! [`RetryRules`]: the decision every stormguard retry loop makes about a retryable failure.

use std::time::Duration;

use stormguard_budget::{RetryBudget, Withdrawal};
use stormguard_classify::Outcome;
use stormguard_deadline::Deadline;
use stormguard_jitter::{HintDecision, HintPolicy};
use tokio::time::Instant;

use crate::GiveUpCause;

/// The rules for retrying a retryable failure, in one place for every retry loop of stormguard
/// (this crate's tower engine and `stormguard-reqwest`'s middleware). See the crate docs for why
/// they run in this order.
#[derive(Clone, Copy, Debug)]
pub struct RetryRules<'a> {
    /// Most attempts per request, the first included.
    pub max_attempts: u32,
    /// How a server hint becomes the delay, and the longest one honoured.
    pub hint_policy: &'a HintPolicy,
    /// Asked for every retry, last.
    pub budget: &'a RetryBudget,
}

/// A retry the rules allow: when to send it, and the budget's receipt for it. A caller that ends
/// up not sending it (it was dropped during the delay, the service failed first) gives the receipt
/// back with [`RetryBudget::refund`]; sending the retry spends it.
#[derive(Debug)]
pub struct Granted {
    /// How long to wait before the retry.
    pub delay: Duration,
    /// The budget's receipt for the retry.
    pub withdrawal: Withdrawal,
}

impl RetryRules<'_> {
    /// After `attempts` attempts, the last of which took `last_attempt` and ended in the retryable
    /// `outcome`: the delay before the next attempt (with the budget's receipt), or why there is
    /// none. `scheduled` is the
    /// backoff's next delay, used when the server gave no hint.
    ///
    /// Checks, cheapest first and the one with a side effect last: attempts left; the hint (one
    /// above the policy's maximum ends the request); the deadline (the retry must start after its
    /// delay and still have as long as the last attempt took); the budget (a withdrawal). Each
    /// retry and each give-up is logged at WARN with the attempt number and the reason.
    pub fn decide(
        &self,
        outcome: &Outcome,
        attempts: u32,
        scheduled: Duration,
        deadline: Option<Deadline>,
        last_attempt: Duration,
    ) -> Result<Granted, GiveUpCause> {
        let verdict = (|| {
            if attempts >= self.max_attempts {
                return Err(GiveUpCause::AttemptsExhausted);
            }
            let delay = match outcome.retry_after() {
                None => scheduled,
                Some(hint) => match self.hint_policy.apply(hint) {
                    HintDecision::RetryAfter(delay) => delay,
                    HintDecision::TooLong { .. } => return Err(GiveUpCause::HintTooLong),
                },
            };
            if let Some(deadline) = deadline {
                let finish = Instant::now()
                    .checked_add(delay)
                    .and_then(|start| start.checked_add(last_attempt));
                if finish.is_none_or(|finish| finish >= deadline.instant()) {
                    return Err(GiveUpCause::Deadline);
                }
            }
            let Some(withdrawal) = self.budget.try_withdraw() else {
                tracing::warn!(
                    attempts,
                    reason = outcome.reason().as_str(),
                    "retry budget exhausted: not retrying"
                );
                return Err(GiveUpCause::BudgetExhausted);
            };
            Ok(Granted { delay, withdrawal })
        })();
        let reason = outcome.reason().as_str();
        match &verdict {
            Ok(granted) => tracing::warn!(
                retry_attempt = attempts,
                delay_ms = u64::try_from(granted.delay.as_millis()).unwrap_or(u64::MAX),
                reason,
                "retrying request"
            ),
            Err(cause) => tracing::warn!(
                attempts,
                reason,
                cause = cause.as_str(),
                "giving up on a retryable failure"
            ),
        }
        verdict
    }
}
