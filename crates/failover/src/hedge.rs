//! A failover's hedges: when a hop has produced no content (its answer's head; a stream, its
//! first content event) after the hedge's delay, a second hop goes to the next healthy backend,
//! or to the same one when there is no other, without cancelling the first
//! ([`Failover::with_hedging`](crate::Failover::with_hedging)). The rules are the engine's
//! (`stormguard_retry::hedge`): the delay is fixed or the percentile of the hop's backend's
//! learned time to first content, at most `max_hedges` per request, only with time left, each
//! one a withdrawal from the budget every backend shares (a spent budget sends none), and the
//! second backend's guards admit or refuse its attempts as they do any. The first hop to answer
//! is handed back, marked with its backend; the other is cancelled as a loser. A hop that fails
//! while the other is in flight is withdrawn (its attempts counted, its withdrawal spent if it
//! sent any), and the other is the request's only hop from then on: it fails over as any would.
//!
//! Not hedged: a continuation (it goes to one backend chosen for its prefill), a request whose
//! body is sent once, a hop whose backend's engine is not ready at once when the hedge is due.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::Request;
use http_body::Body;
use stormguard_breaker::State;
use stormguard_budget::Withdrawal;
use stormguard_classify::Classify;
use stormguard_deadline::clocks::Shape;
use stormguard_jitter::Backoff;
use stormguard_retry::NoHedge;
use tokio::time::Instant;
use tower_service::Service;

use crate::future::{Hop, Hops};

impl<S, B, RB, C, Bk> Hops<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    /// When the hop the path steps, just handed to its engine, is hedged: never without
    /// hedging, once the request's hedges are spent, for a continuation or a body sent once.
    pub(crate) fn hedge_due(&self) -> Option<Instant> {
        let hedging = self.shared.hedging?;
        let body = self.body.as_ref()?;
        if self.continues_from.is_some() || self.hedges >= hedging.max_hedges() {
            return None;
        }
        let clocks = self.shared.routes[self.hop.backend].backend.clocks();
        let streaming = clocks.is_some_and(|clocks| {
            Shape::of_request(&self.head.uri, Some(body), &clocks.settings().whole).streaming
        });
        let delay = hedging.delay_for(clocks, streaming)?;
        self.hop.started.checked_add(delay)
    }

    /// The hop the path steps is due to be hedged: the backend the hedge goes to and the
    /// budget's withdrawal for it, if the policy lets one go.
    pub(crate) fn hedge(&self) -> Option<(usize, Withdrawal)> {
        let hedging = self.shared.hedging?;
        let from = self.hop.backend;
        let waited = self.hop.started.elapsed();
        let deadline = self.deadline.map(|deadline| deadline.instant());
        match hedging.try_hedge(self.hedges, waited, deadline, &self.budget) {
            Ok(withdrawal) => Some((self.next_healthy().unwrap_or(from), withdrawal)),
            Err(NoHedge::Budget) => {
                self.hedged(from, "budget");
                None
            }
            Err(NoHedge::Spent) => None,
        }
    }

    /// A hedge went to backend `index`, its engine called: its hop is set aside.
    pub(crate) fn hedge_sent(&mut self, index: usize, withdrawal: Withdrawal) {
        self.tried |= 1 << index;
        self.hedges = self.hedges.saturating_add(1);
        let mut hop = Hop::new(index, Some(withdrawal));
        hop.calling = true;
        hop.hedge = true;
        hop.in_flight = Some(self.shared.routes[index].load.start());
        self.aside = Some(hop);
        self.hedged(index, "sent");
    }

    /// The hedge answered first: the request's own hop (set aside) was cancelled. What it
    /// waited teaches its backend's time to first content as a lower bound (it waited past the
    /// hedge's delay, and would have taken longer still).
    pub(crate) fn hedge_won(&mut self) {
        let Some(lost) = self.aside.take() else {
            return;
        };
        self.hedged(self.hop.backend, "won");
        let clocks = self.shared.routes[lost.backend].backend.clocks();
        if let (Some(clocks), Some(body)) = (clocks, &self.body) {
            let whole = &clocks.settings().whole;
            let streaming = Shape::of_request(&self.head.uri, Some(body), whole).streaming;
            clocks.record_to_first_content(streaming, lost.started.elapsed());
        }
    }

    /// The request's own hop answered first: the hedge was cancelled.
    pub(crate) fn hedge_lost(&mut self) {
        if let Some(hedge) = self.aside.take() {
            self.hedged(hedge.backend, "cancelled");
        }
    }

    /// Whether the other hop of a hedge is in flight beside the one the path steps: then a
    /// failure of this one only takes it out of the race.
    pub(crate) fn racing(&self) -> bool {
        self.aside.is_some()
    }

    /// Puts the hop set aside in the place of the one the path steps, and that one aside.
    pub(crate) fn switch(&mut self) {
        if let Some(other) = &mut self.aside {
            std::mem::swap(&mut self.hop, other);
        }
    }

    /// The hop the path steps failed while the other was in flight: the other is the request's
    /// only hop from now on.
    pub(crate) fn withdraw(&mut self) {
        if let Some(other) = self.aside.take() {
            let failed = std::mem::replace(&mut self.hop, other);
            if failed.hedge {
                self.hedged(failed.backend, "failed");
            }
        }
    }

    /// Whether backend `index` is left for a cooldown another replica (or this one) shared.
    pub(crate) fn cooling(&self, index: usize) -> bool {
        let shared = &self.shared;
        shared
            .cooldowns
            .as_ref()
            .is_some_and(|cooldowns| cooldowns.cooling(shared.routes[index].backend.name()))
    }

    /// After a failed hop: if its backend's breaker opened since its cooldown was last shared,
    /// shares it, for as long as the breaker lets no probe through.
    pub(crate) fn share_cooldown(&self) {
        let Some(cooldowns) = &self.shared.cooldowns else {
            return;
        };
        let route = &self.shared.routes[self.hop.backend];
        let breaker = route.backend.breaker();
        if breaker.state() != State::Open {
            return;
        }
        let snapshot = breaker.snapshot();
        let published = route
            .published
            .fetch_max(snapshot.opened, Ordering::Relaxed);
        if let Some(wait) = snapshot.retry_after
            && published < snapshot.opened
        {
            cooldowns.publish(route.backend.name(), wait);
        }
    }

    /// Counts a hedge's `event` on the backend at `index`: logged at DEBUG, and counted
    /// (`stormguard.hedges`, feature `metrics`) under that backend's name.
    fn hedged(&self, index: usize, event: &'static str) {
        let name: &Arc<str> = self.shared.routes[index].backend.shared_name();
        tracing::debug!(backend = &**name, event, "hedge");
        #[cfg(feature = "metrics")]
        metrics::counter!(
            stormguard_retry::metrics::HEDGES,
            stormguard_retry::metrics::PROVIDER => metrics::SharedString::from(Arc::clone(name)),
            "outcome" => event
        )
        .increment(1);
    }
}
