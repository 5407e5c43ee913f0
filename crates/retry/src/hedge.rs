//! Hedging: a second attempt of a request sent while its first still waits for its content, the
//! first of the two to produce content answering ([`Hedging`]). By default a stream is hedged
//! only while its backend is cold ([`Hedging::cold`]: nothing learned yet, a restart or a new
//! deployment), at the clocks' cold limit of time to first content; hedging at a learned
//! percentile or after a fixed delay is turned on with
//! [`ClientLayer::with_hedging`](crate::ClientLayer::with_hedging), and every hedge off with
//! [`ClientLayer::without_hedging`](crate::ClientLayer::without_hedging).
//!
//! "The Tail at Scale" (Dean and Barroso, CACM 2013) sends a hedged request once the first has
//! been outstanding longer than the 95th percentile of its kind: about 5% more requests for a
//! much shorter tail. For an LLM call the tail a user feels is the first token, so here the
//! delay runs from sending an attempt to its first content: a stream's first content event, a
//! whole answer's head. It is fixed, or the percentile of what the backend showed recently
//! (`stormguard_deadline::clocks`, time to first content), or, while nothing is learned, the
//! clocks' cold limit (`ColdClocks`: a stream's first content at 10 s plus its prefill; none
//! for a whole answer, whose head clock is sized by its request).
//!
//! A hedge is a retry sent early, and is bounded as one:
//!
//! 1. at most [`max_hedges`](Hedging::max_hedges) per request (default 1), and the request's
//!    attempts, hedges included, at most `max_attempts`;
//! 2. only while the first attempt waits (its answer's head, a stream's first content event),
//!    never for a body this layer cannot send again;
//! 3. only with time left: longer than the hedge's own delay, which is what answers have been
//!    taking;
//! 4. the retry budget grants it, as it would a retry: a spent budget sends no hedge, so a storm,
//!    which dries the budget up, turns hedging off by itself;
//! 5. it passes the guards of its backend like any attempt (the rate limit, the breaker, the
//!    throttle); refused, it is not sent and the first attempt goes on alone.
//!
//! Then two attempts are in flight. The first to produce content is the answer, and the other
//! is cancelled: dropped with its permits (the breaker frees its place and counts nothing, the
//! throttle forgets it: being the slower of two says nothing about whether the backend accepts),
//! its budget ticket and rate-limit slot spent (it was sent: it cost what it cost). The
//! attempt that was hedged, when it loses, teaches the time to first content what it waited, as
//! a lower bound: left out, the slow answers that hedges cut short would vanish from what is
//! learned, and the learned delay would shrink and hedge ever more. A losing hedge teaches
//! nothing (its wait is no bound on anything). One that fails while the other is still in
//! flight is out of the race, whatever its verdict: the other goes on, and is the request's only
//! attempt from then on, retried as the policy allows.

use std::time::Duration;

use stormguard_budget::{RetryBudget, Ticket};
use stormguard_deadline::clocks::{AttemptClocks, RequestShape};
use tokio::time::Instant;

/// The percentile of the backend's time to first content a learned hedge waits for: the 95th,
/// "The Tail at Scale"'s, where about one request in twenty is hedged.
pub const DEFAULT_HEDGE_PERCENTILE: f64 = 0.95;

/// Hedges per request: one, as Polly's and gRPC's hedging (gRFC A6) send by default beside the
/// first attempt.
pub const DEFAULT_MAX_HEDGES: u32 = 1;

/// When and how often a request is hedged: see the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use stormguard_retry::{ClientLayer, HedgeDelay, Hedging};
///
/// // At the 95th percentile of the backend's time to first content, once learned.
/// let layer = ClientLayer::default().with_hedging(Hedging::default());
/// assert_eq!(layer.hedging().map(Hedging::delay), Some(HedgeDelay::Learned(0.95)));
/// // After a fixed 2 s.
/// let fixed = Hedging::after(Duration::from_secs(2));
/// assert_eq!(fixed.max_hedges(), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hedging {
    delay: HedgeDelay,
    max_hedges: u32,
}

/// How long an attempt waits for its first content before a hedge goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HedgeDelay {
    /// This long after it was sent.
    Fixed(Duration),
    /// This percentile (0 to 1) of the backend's recent times to first content, learned by the
    /// layer's clocks; before they learned it, their cold limit; no hedge without clocks.
    Learned(f64),
    /// Only while the backend's clocks are cold: their cold limit of time to first content; no
    /// hedge once they learned it, nor without clocks.
    Cold,
}

impl Hedging {
    /// A hedge after a fixed `delay`.
    pub fn after(delay: Duration) -> Self {
        Self {
            delay: HedgeDelay::Fixed(delay),
            max_hedges: DEFAULT_MAX_HEDGES,
        }
    }

    /// A hedge at the `percentile` (0 to 1) of the backend's learned time to first content.
    pub fn at_percentile(percentile: f64) -> Self {
        Self {
            delay: HedgeDelay::Learned(percentile),
            max_hedges: DEFAULT_MAX_HEDGES,
        }
    }

    /// A hedge only while the backend's clocks have learned nothing (the default of a
    /// `ClientLayer`): at their cold limit of a stream's time to first content, sized by the
    /// request (`stormguard_deadline::clocks::ColdClocks`).
    pub fn cold() -> Self {
        Self {
            delay: HedgeDelay::Cold,
            max_hedges: DEFAULT_MAX_HEDGES,
        }
    }

    /// At most `hedges` hedges per request, one at a time (0: none).
    pub fn with_max_hedges(self, hedges: u32) -> Self {
        Self {
            max_hedges: hedges,
            ..self
        }
    }

    /// How long an attempt waits before it is hedged.
    pub fn delay(&self) -> HedgeDelay {
        self.delay
    }

    /// Most hedges per request.
    pub fn max_hedges(&self) -> u32 {
        self.max_hedges
    }
}

impl Default for Hedging {
    /// At the [`DEFAULT_HEDGE_PERCENTILE`], [`DEFAULT_MAX_HEDGES`] per request.
    fn default() -> Self {
        Self::at_percentile(DEFAULT_HEDGE_PERCENTILE)
    }
}

/// Why a request is not hedged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoHedge {
    /// Its hedges are spent, or the time left is too short: nothing to say.
    Spent,
    /// The retry budget refused it.
    Budget,
}

impl Hedging {
    /// How long an attempt of a request shaped `shape` waits before it is hedged, given its
    /// backend's `clocks`: `None` without clocks (unless fixed), and for a cold delay once learned
    /// or a whole answer while cold.
    pub(crate) fn delay_for(
        &self,
        clocks: Option<&AttemptClocks>,
        shape: RequestShape,
    ) -> Option<Duration> {
        match self.delay {
            HedgeDelay::Fixed(delay) => Some(delay),
            HedgeDelay::Learned(percentile) => {
                let clocks = clocks?;
                (clocks.to_first_content(shape.streaming, percentile))
                    .or_else(|| clocks.cold_first_content(shape))
            }
            HedgeDelay::Cold => clocks?.cold_first_content(shape),
        }
    }

    /// Whether a request that sent `hedges` hedges so far, whose attempt waited `waited`, with
    /// `deadline`, sends a hedge now: the budget's ticket for it, or why not.
    pub(crate) fn grant(
        &self,
        hedges: u32,
        waited: Duration,
        deadline: Option<Instant>,
        budget: &RetryBudget,
    ) -> Result<Ticket, NoHedge> {
        if hedges >= self.max_hedges {
            return Err(NoHedge::Spent);
        }
        let time_left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        if time_left.is_some_and(|left| left <= waited) {
            return Err(NoHedge::Spent);
        }
        budget.ticket().ok_or(NoHedge::Budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard_budget::BudgetConfig;

    const SECOND: Duration = Duration::from_secs(1);

    /// Ten tickets, then none (a floor of 1 a second over 10 s).
    fn ten() -> RetryBudget {
        RetryBudget::new(BudgetConfig::default().with_ratio(0.0))
    }

    #[tokio::test(start_paused = true)]
    async fn one_hedge_per_request() {
        let hedging = Hedging::default();
        let budget = ten();
        assert!(hedging.grant(0, SECOND, None, &budget).is_ok());
        assert_eq!(
            hedging.grant(1, SECOND, None, &budget).err(),
            Some(NoHedge::Spent)
        );
        let two = hedging.with_max_hedges(2);
        assert!(two.grant(1, SECOND, None, &budget).is_ok());
        let none = hedging.with_max_hedges(0);
        assert_eq!(
            none.grant(0, SECOND, None, &budget).err(),
            Some(NoHedge::Spent)
        );
    }

    /// The hedge draws on the retry budget like a retry; a spent budget sends none, and a
    /// ticket never sent goes back.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_draws_on_the_retry_budget_and_a_spent_one_sends_none() {
        let hedging = Hedging::after(SECOND);
        let budget = ten();
        let tickets: Vec<_> = (0..10)
            .filter_map(|_| hedging.grant(0, SECOND, None, &budget).ok())
            .collect();
        assert_eq!(tickets.len(), 10);
        assert_eq!(
            hedging.grant(0, SECOND, None, &budget).err(),
            Some(NoHedge::Budget)
        );
        drop(tickets);
        assert!(hedging.grant(0, SECOND, None, &budget).is_ok());
    }

    /// 1 s waited: a hedge needs more than 1 s left.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_needs_more_time_left_than_its_attempt_waited() {
        let hedging = Hedging::default();
        let budget = ten();
        let at = |left: Duration| Some(Instant::now() + left);
        let granted = hedging.grant(0, SECOND, at(SECOND * 2), &budget);
        assert!(granted.is_ok());
        assert_eq!(
            hedging.grant(0, SECOND, at(SECOND), &budget).err(),
            Some(NoHedge::Spent)
        );
        // Only the hedge granted drew on the budget.
        assert_eq!(budget.snapshot().withdrawals, 1);
    }

    #[test]
    fn a_fixed_delay_needs_no_clocks_and_the_others_follow_what_they_learned() {
        let stream = RequestShape::new(true, SECOND);
        let whole = RequestShape::new(false, SECOND);
        let fixed = Hedging::after(SECOND);
        assert_eq!(fixed.delay_for(None, whole), Some(SECOND));
        assert_eq!(Hedging::default().delay_for(None, stream), None);
        assert_eq!(Hedging::cold().delay_for(None, stream), None);
        // Cold: a stream at the cold limit, a whole answer never.
        let clocks = AttemptClocks::default();
        for hedging in [Hedging::default(), Hedging::cold()] {
            assert_eq!(hedging.delay_for(Some(&clocks), stream), Some(SECOND * 10));
            assert_eq!(hedging.delay_for(Some(&clocks), whole), None);
        }
        // Learned: the percentile, and no cold hedge any more.
        for _ in 0..20 {
            clocks.record_to_first_content(true, SECOND * 2);
        }
        let learned = Hedging::default().delay_for(Some(&clocks), stream);
        assert_eq!(learned, Some(SECOND * 2));
        assert_eq!(Hedging::cold().delay_for(Some(&clocks), stream), None);
    }
}
