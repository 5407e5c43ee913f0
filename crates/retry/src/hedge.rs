//! Hedging: a second attempt of a request sent while its first still waits for its content, the
//! first of the two to produce content answering ([`Hedging`], off unless turned on with
//! [`ClientLayer::with_hedging`](crate::ClientLayer::with_hedging)).
//!
//! "The Tail at Scale" (Dean and Barroso, CACM 2013) sends a hedged request once the first has
//! been outstanding longer than the 95th percentile of its kind: about 5% more requests for a
//! much shorter tail. For an LLM call the tail a user feels is the first token, so here the
//! delay runs from sending an attempt to its first content: a stream's first content event, a
//! whole answer's head. It is fixed, or the percentile of what the backend showed recently
//! (`stormguard_deadline::clocks`, time to first content; no hedge until enough is learned).
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
//! its budget withdrawal and rate-limit slot spent (it was sent: it cost what it cost). The
//! attempt that was hedged, when it loses, teaches the time to first content what it waited, as
//! a lower bound: left out, the slow answers that hedges cut short would vanish from what is
//! learned, and the learned delay would shrink and hedge ever more. A losing hedge teaches
//! nothing (its wait is no bound on anything). One that fails while the other is still in
//! flight is out of the race, whatever its verdict: the other goes on, and is the request's only
//! attempt from then on, retried as the policy allows.

use std::time::Duration;

use http_body::Body;
use stormguard_budget::{RetryBudget, Withdrawal};
use stormguard_classify::{Classify, Reason};
use stormguard_deadline::clocks::AttemptClocks;
use stormguard_jitter::Backoff;
use tokio::time::Instant;

use crate::attempt::{Attempt, Due};
use crate::future::State;
use crate::ledger::Ledger;
use crate::policy::Grant;

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
    /// layer's clocks; no hedge before they learned it, nor without clocks.
    Learned(f64),
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

/// A request whose attempt waited past its hedge delay, as the engine's policy is asked about it.
pub(crate) struct Waiting {
    /// Hedges sent so far.
    pub(crate) hedges: u32,
    /// Attempts sent so far, hedges included.
    pub(crate) sent: u32,
    pub(crate) max_attempts: u32,
    /// How long the attempt waited before this hedge.
    pub(crate) waited: Duration,
    pub(crate) deadline: Option<Instant>,
}

/// Why a request is not hedged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoHedge {
    /// Its hedges or its attempts are spent, or the time left is too short: nothing to say.
    Spent,
    /// The retry budget refused it.
    Budget,
}

impl Hedging {
    /// How long an attempt of a request waits before it is hedged (`streaming`: the request asks
    /// for an event stream), given its backend's `clocks`: `None` for a learned delay with no
    /// clocks or too little learned.
    pub fn delay_for(&self, clocks: Option<&AttemptClocks>, streaming: bool) -> Option<Duration> {
        match self.delay {
            HedgeDelay::Fixed(delay) => Some(delay),
            HedgeDelay::Learned(percentile) => clocks?.to_first_content(streaming, percentile),
        }
    }

    /// Whether a request that sent `hedges` hedges so far, whose attempt waited `waited`, with
    /// `deadline`, sends a hedge now: the withdrawal from `budget` for it (given back with
    /// [`RetryBudget::refund`] if it is not sent), or why not. The checks of the
    /// [module docs](self) but for the attempts, which are the engine's to count.
    pub fn try_hedge(
        &self,
        hedges: u32,
        waited: Duration,
        deadline: Option<Instant>,
        budget: &RetryBudget,
    ) -> Result<Withdrawal, NoHedge> {
        if hedges >= self.max_hedges {
            return Err(NoHedge::Spent);
        }
        let time_left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        if time_left.is_some_and(|left| left <= waited) {
            return Err(NoHedge::Spent);
        }
        budget.try_withdraw().ok_or(NoHedge::Budget)
    }

    /// Whether the request `waiting` sends a hedge now: the budget's grant for it, or why not.
    pub(crate) fn decide(&self, waiting: &Waiting, budget: &RetryBudget) -> Result<Grant, NoHedge> {
        if waiting.sent >= waiting.max_attempts {
            return Err(NoHedge::Spent);
        }
        let withdrawal =
            self.try_hedge(waiting.hedges, waiting.waited, waiting.deadline, budget)?;
        Ok(Grant::new(budget.clone(), withdrawal))
    }
}

/// A request's hedges as its ledger keeps them: when one is due, whether it goes, and which of
/// two attempts in flight is the one the path steps.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// When the attempt the path steps is hedged if it has produced no content by then, worked
    /// out once per attempt, the first time it waits; never without hedging, with another
    /// attempt out, once the request's hedges are spent, or for a request this layer cannot send
    /// again.
    pub(crate) fn hedge_clock(&mut self) -> Option<Instant> {
        match self.attempt.hedge_by {
            Due::At(at) => return Some(at),
            Due::Never => return None,
            Due::Unset => {}
        }
        let at = self.hedge_delay().and_then(|delay| {
            // Sent in this same poll, if no deadline timed it already.
            let started = *self.attempt.started.get_or_insert_with(Instant::now);
            started.checked_add(delay)
        });
        self.attempt.hedge_by = at.map_or(Due::Never, Due::At);
        at
    }

    /// How long the attempt the path steps waits before it is hedged, if it is.
    fn hedge_delay(&mut self) -> Option<Duration> {
        let hedging = self.config.hedging?;
        if self.aside.is_some() || self.hedges >= hedging.max_hedges() || !self.origin.is_replay() {
            return None;
        }
        let clocks = self.config.clocks.as_ref();
        let streaming =
            clocks.is_some_and(|clocks| (self.origin.shape(&clocks.settings().whole)).streaming);
        hedging.delay_for(clocks, streaming)
    }

    /// The attempt the path steps waited past its hedge delay: whether a hedge goes (its
    /// attempt set aside with the budget's grant, for its lane to send). Asked once per attempt.
    pub(crate) fn hedge(&mut self) -> bool {
        self.attempt.hedge_by = Due::Never;
        let Some(hedging) = self.config.hedging else {
            return false;
        };
        let waiting = Waiting {
            hedges: self.hedges,
            sent: self.sent,
            max_attempts: self.config.policy.max_attempts,
            waited: self.attempt.in_flight().unwrap_or_default(),
            deadline: self.deadline.map(|deadline| deadline.instant()),
        };
        match hedging.decide(&waiting, &self.config.policy.budget) {
            Ok(grant) => {
                self.hedges = self.hedges.saturating_add(1);
                self.aside = Some(Box::new(Attempt::hedge(grant)));
                true
            }
            Err(NoHedge::Budget) => {
                self.watch.hedge_refused(&self.attempt.watch, None);
                false
            }
            Err(NoHedge::Spent) => false,
        }
    }

    /// Whether another attempt of the request is in flight beside the one the path steps: then
    /// a failure of this one only takes it out of the race.
    pub(crate) fn racing(&self) -> bool {
        self.aside.as_ref().is_some_and(|other| other.sent)
    }

    /// Puts the attempt set aside in the ledger's place, and the one there aside.
    pub(crate) fn switch(&mut self) {
        if let Some(other) = &mut self.aside {
            std::mem::swap(&mut self.attempt, other);
        }
    }

    /// The attempt the path steps is out of the request (it failed while the other was in
    /// flight, or it is a hedge not sent): the other is the request's only attempt from now on.
    pub(crate) fn withdraw(&mut self) {
        let Some(other) = self.aside.take() else {
            return;
        };
        let out = std::mem::replace(&mut self.attempt, *other);
        if out.hedge && out.sent {
            self.watch.hedge_failed();
        }
    }

    /// The attempt set aside lost the race (the one the path steps answered first): it is
    /// cancelled. If it is the attempt that was hedged, what it waited teaches the clocks' time
    /// to first content as a lower bound (it waited past the hedge's delay, and would have
    /// taken longer still); a hedge's own wait is no such bound, and teaches nothing. A hedge
    /// not sent yet is dropped, its grant and slot given back.
    #[inline]
    pub(crate) fn cancel_aside(&mut self) {
        let Some(mut loser) = self.aside.take() else {
            return;
        };
        if !loser.sent {
            return;
        }
        self.watch.hedge_raced(!loser.hedge);
        if !loser.hedge
            && let (Some(clocks), Some(waited)) = (&self.config.clocks, loser.in_flight())
        {
            let streaming = self.origin.shape(&clocks.settings().whole).streaming;
            clocks.record_to_first_content(streaming, waited);
        }
        self.lose(&mut loser);
    }

    /// The request lost a race to another of its requests (a failover's hedge on another
    /// backend answered first): each of its attempts in flight is cancelled as a loser. (The
    /// failover teaches the wait of the hop it hedged to that hop's backend.)
    pub(crate) fn lose_all(&mut self) {
        let mut attempt = std::mem::take(&mut self.attempt);
        self.lose(&mut attempt);
        if let Some(mut other) = self.aside.take() {
            self.lose(&mut other);
        }
    }

    /// `attempt` lost a race: if it is in flight, it is cancelled (its span says so) and its
    /// permits are settled as a loser's.
    fn lose(&mut self, attempt: &mut Attempt) {
        if self.watch.cancelled(&mut attempt.watch) {
            attempt.permits.lost();
        }
    }

    /// A hedge not sent: a guard refused it (`reason`), or the deadline came first. The
    /// request's attempt goes on alone.
    pub(crate) fn hedge_not_sent<F, B, RB: Body>(&mut self, reason: Reason) -> State<F, B, RB, C> {
        self.watch.hedge_refused(&self.attempt.watch, Some(reason));
        State::Withdrawn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn waiting(hedges: u32, sent: u32) -> Waiting {
        Waiting {
            hedges,
            sent,
            max_attempts: 3,
            waited: SECOND,
            deadline: None,
        }
    }

    /// Ten withdrawals, then none (a floor of 1 a second over 10 s, no ratio).
    fn ten() -> RetryBudget {
        RetryBudget::new(Duration::from_secs(10), 1, 0.0)
    }

    #[tokio::test(start_paused = true)]
    async fn one_hedge_per_request_within_its_attempts() {
        let hedging = Hedging::default();
        let budget = ten();
        assert!(hedging.decide(&waiting(0, 1), &budget).is_ok());
        assert_eq!(
            hedging.decide(&waiting(1, 2), &budget).err(),
            Some(NoHedge::Spent)
        );
        // Two retries spent the attempts already.
        assert_eq!(
            hedging.decide(&waiting(0, 3), &budget).err(),
            Some(NoHedge::Spent)
        );
        let two = hedging.with_max_hedges(2);
        assert!(two.decide(&waiting(1, 2), &budget).is_ok());
        let none = hedging.with_max_hedges(0);
        assert_eq!(
            none.decide(&waiting(0, 1), &budget).err(),
            Some(NoHedge::Spent)
        );
    }

    /// The hedge draws on the retry budget like a retry; a spent budget sends none, and a
    /// grant never sent goes back.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_draws_on_the_retry_budget_and_a_spent_one_sends_none() {
        let hedging = Hedging::after(SECOND);
        let budget = ten();
        let grants: Vec<_> = (0..10)
            .filter_map(|_| hedging.decide(&waiting(0, 1), &budget).ok())
            .collect();
        assert_eq!(grants.len(), 10);
        assert_eq!(
            hedging.decide(&waiting(0, 1), &budget).err(),
            Some(NoHedge::Budget)
        );
        drop(grants);
        assert!(hedging.decide(&waiting(0, 1), &budget).is_ok());
    }

    /// 1 s waited: a hedge needs more than 1 s left.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_needs_more_time_left_than_its_attempt_waited() {
        let hedging = Hedging::default();
        let budget = ten();
        let at = |left: Duration| Waiting {
            deadline: Some(Instant::now() + left),
            ..waiting(0, 1)
        };
        let granted = hedging.decide(&at(SECOND * 2), &budget);
        assert!(granted.is_ok());
        assert_eq!(
            hedging.decide(&at(SECOND), &budget).err(),
            Some(NoHedge::Spent)
        );
        // Only the hedge granted drew on the budget.
        assert_eq!(budget.snapshot().withdrawals, 1);
    }
}
