//! [`BudgetConfig`]: the settings a [`RetryBudget`](crate::RetryBudget) is built from.

use std::time::Duration;

use crate::budget::{DEFAULT_MIN_PER_SEC, DEFAULT_RATIO, DEFAULT_TTL};

/// The settings of a [`RetryBudget`](crate::RetryBudget): the window it counts over, the
/// retries it grants for free, and the retries each success earns.
///
/// The default is [`DEFAULT_TTL`] (10 s), [`DEFAULT_MIN_PER_SEC`] (1) and [`DEFAULT_RATIO`]
/// (0.1). Out-of-range values are clamped when the budget is built, never rejected: the window
/// into 10 ms ..= 1 h, the ratio into 0 ..= 1000 (NaN counts as 0).
///
/// ```
/// use std::time::Duration;
/// use stormguard_budget::{BudgetConfig, RetryBudget};
///
/// // A strict ratio: no free retries, one retry per five successes.
/// let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.2));
/// assert_eq!(budget.ttl(), Duration::from_secs(10));
/// assert_eq!((budget.min_per_sec(), budget.ratio()), (0, 0.2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetConfig {
    ttl: Duration,
    min_per_sec: u32,
    ratio: f32,
}

impl BudgetConfig {
    /// Count deposits and withdrawals over the last `ttl`.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Grant `min_per_sec` retries per second that need no deposits (0: a strict ratio).
    #[must_use]
    pub fn with_min_per_sec(mut self, min_per_sec: u32) -> Self {
        self.min_per_sec = min_per_sec;
        self
    }

    /// Grant `ratio` retries per successful response (0.1 = one retry per ten successes).
    #[must_use]
    pub fn with_ratio(mut self, ratio: f32) -> Self {
        self.ratio = ratio;
        self
    }

    /// The window, as set (the budget clamps it).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Retries per second granted without deposits.
    pub fn min_per_sec(&self) -> u32 {
        self.min_per_sec
    }

    /// Retries per success, as set (the budget clamps it).
    pub fn ratio(&self) -> f32 {
        self.ratio
    }
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_TTL,
            min_per_sec: DEFAULT_MIN_PER_SEC,
            ratio: DEFAULT_RATIO,
        }
    }
}
