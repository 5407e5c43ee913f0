//! [`RetryTokens`]: gRPC's retry throttling, a token bucket per server (gRFC A6, "Throttling
//! Retry Attempts and Hedged RPCs").

use std::fmt;
use std::sync::Arc;

use crate::sync::{AtomicU64, Ordering};

/// Tokens are kept in thousandths: gRFC A6 allows `tokenRatio` three decimal places, so every
/// balance is an exact integer of thousandths and no rounding drifts over millions of calls.
const MILLI: u64 = 1000;

/// Largest `maxTokens` gRFC A6 allows.
pub const MAX_RETRY_TOKENS: u32 = 1000;

/// gRPC's retry throttling (gRFC A6, "Throttling Retry Attempts and Hedged RPCs"): a bucket of
/// `max_tokens` tokens, full at the start. Each failed attempt (one whose status the policy would
/// retry or that a hedge lets the others outlive, or one the server pushed back on) takes one
/// token; each success gives `token_ratio` back, never above `max_tokens`. Retries and hedges are
/// allowed only while more than half the tokens are left; the first attempt of a call always
/// goes. Shared (`Clone`, an `Arc` inside) by every client of one server, lock-free.
///
/// Unlike the [`RetryBudget`](crate::RetryBudget), which earns retries from recent successes in
/// a sliding window, the bucket has no time in it: a server that failed 6 of 10 calls in a row
/// stops every retry until enough successes have refilled it, however long that takes.
///
/// ```
/// use stormguard_budget::RetryTokens;
///
/// // gRFC A6's example: 10 tokens, 0.1 back per success.
/// let tokens = RetryTokens::new(10, 0.1);
/// assert!(tokens.allows());
/// for _ in 0..5 {
///     tokens.failed();
/// }
/// // 5 tokens left: not more than half, so no retry and no hedge.
/// assert!(!tokens.allows());
/// tokens.succeeded();
/// assert!(tokens.allows()); // 5.1 > 5
/// ```
#[derive(Clone)]
pub struct RetryTokens {
    inner: Arc<Bucket>,
}

struct Bucket {
    /// Thousandths of a token.
    balance: AtomicU64,
    max: u64,
    ratio: u64,
}

impl RetryTokens {
    /// A full bucket of `max_tokens` (at most [`MAX_RETRY_TOKENS`]; more is taken as that many),
    /// refilled by `token_ratio` per success, rounded to the thousandth (gRFC A6's
    /// precision; a negative or non-finite ratio refills nothing).
    pub fn new(max_tokens: u32, token_ratio: f64) -> Self {
        let max = u64::from(max_tokens.min(MAX_RETRY_TOKENS)) * MILLI;
        let ratio = if token_ratio.is_finite() && token_ratio > 0.0 {
            // At most max_tokens' worth is ever useful; the clamp keeps the cast in range.
            (token_ratio * MILLI as f64).min(max as f64).round() as u64
        } else {
            0
        };
        Self {
            inner: Arc::new(Bucket {
                balance: AtomicU64::new(max),
                max,
                ratio,
            }),
        }
    }

    /// Whether a retry or a hedge may go now: more than half of `max_tokens` are left.
    pub fn allows(&self) -> bool {
        self.inner.balance.load(Ordering::Relaxed) * 2 > self.inner.max
    }

    /// An attempt failed: one token less (never below zero).
    pub fn failed(&self) {
        let _ = self
            .inner
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |balance| {
                Some(balance.saturating_sub(MILLI))
            });
    }

    /// An attempt succeeded: `token_ratio` tokens more (never above `max_tokens`).
    pub fn succeeded(&self) {
        let (max, ratio) = (self.inner.max, self.inner.ratio);
        let _ = self
            .inner
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |balance| {
                Some(balance.saturating_add(ratio).min(max))
            });
    }

    /// The tokens left, to the thousandth.
    pub fn tokens(&self) -> f64 {
        self.inner.balance.load(Ordering::Relaxed) as f64 / MILLI as f64
    }

    /// The bucket's size.
    pub fn max_tokens(&self) -> u32 {
        // max is at most MAX_RETRY_TOKENS thousands.
        (self.inner.max / MILLI) as u32
    }

    /// Tokens given back per success, to the thousandth.
    pub fn token_ratio(&self) -> f64 {
        self.inner.ratio as f64 / MILLI as f64
    }
}

impl fmt::Debug for RetryTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryTokens")
            .field("tokens", &self.tokens())
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .finish()
    }
}

#[cfg(all(test, not(stormguard_loom)))]
mod tests {
    use super::*;

    #[test]
    fn retries_stop_at_half_and_successes_bring_them_back() {
        let tokens = RetryTokens::new(10, 0.5);
        for _ in 0..4 {
            tokens.failed();
        }
        assert!(tokens.allows(), "6 of 10 left");
        tokens.failed();
        assert_eq!(tokens.tokens(), 5.0);
        assert!(!tokens.allows(), "exactly half is not enough");
        tokens.succeeded();
        assert_eq!(tokens.tokens(), 5.5);
        assert!(tokens.allows());
    }

    #[test]
    fn the_bucket_stays_between_zero_and_its_size() {
        let tokens = RetryTokens::new(3, 0.25);
        for _ in 0..10 {
            tokens.failed();
        }
        assert_eq!(tokens.tokens(), 0.0);
        for _ in 0..100 {
            tokens.succeeded();
        }
        assert_eq!(tokens.tokens(), 3.0);
    }

    #[test]
    fn ratios_count_to_the_thousandth_and_sizes_are_capped() {
        let tokens = RetryTokens::new(5000, 0.0019);
        assert_eq!(tokens.max_tokens(), 1000);
        assert_eq!(tokens.token_ratio(), 0.002);
        // 0.29 is 0.28999.. in binary: still 290 thousandths.
        assert_eq!(RetryTokens::new(10, 0.29).token_ratio(), 0.29);
        for ratio in [f64::NAN, -1.0, f64::INFINITY] {
            let bucket = RetryTokens::new(10, ratio);
            bucket.failed();
            bucket.succeeded();
            assert!(bucket.tokens() <= 10.0);
        }
        assert_eq!(RetryTokens::new(10, f64::INFINITY).token_ratio(), 0.0);
        assert_eq!(RetryTokens::new(10, 1e300).token_ratio(), 10.0);
    }

    #[test]
    fn clones_share_one_bucket() {
        let tokens = RetryTokens::new(2, 0.1);
        let clone = tokens.clone();
        clone.failed();
        assert_eq!(tokens.tokens(), 1.0);
        assert!(!tokens.allows());
    }
}
