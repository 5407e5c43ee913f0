//! [`Attempt`]: one attempt of a request as a value, before it is sent and while it is in flight.

use std::time::Duration;

use http::HeaderMap;
use stormguard_budget::Ticket;
use stormguard_classify::Outcome;
use stormguard_rate_limit::Usage;
use tokio::time::Instant;

use crate::admission::Permits;
use crate::observe::AttemptWatch;

/// One attempt of a request. Before it is sent: the budget's ticket if it is a retry, a hedge or
/// a router's move, and its passes once its guards admitted it (a rate-limit slot among them). In
/// flight: its passes and its ticket, when it started, when its clocks are due, and its span.
/// Each part settles itself by its own rules when it is dropped untold (a ticket never sent and a
/// slot never used are given back; see [`Permits`] for the guards'), so a request dropped
/// anywhere owes nothing.
///
/// It lives beside the state of the lane that moves it, not in it: the state moves at every step
/// of a request, and this stays where it is.
#[derive(Default)]
pub(crate) struct Attempt {
    pub(crate) ticket: Option<Ticket>,
    pub(crate) permits: Permits,
    /// When it was sent (tracked under a deadline, which the retry decision needs, and once it
    /// waits for its answer, which its clocks need).
    pub(crate) started: Option<Instant>,
    /// When its head clock fires, worked out the first time it waits for its answer.
    pub(crate) head_by: Due,
    /// It is a hedge: a second attempt, sent while the first waits.
    pub(crate) hedge: bool,
    /// It was handed to the service.
    pub(crate) sent: bool,
    /// Its span, and what the metrics time of it.
    pub(crate) watch: AttemptWatch,
}

/// When a clock of an attempt in flight is due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Due {
    /// Not worked out yet: the attempt has not waited. An answer that comes at the first poll
    /// never needs it, and teaches the clocks nothing: it did not wait on the backend (a cache,
    /// a service that answers locally).
    #[default]
    Unset,
    /// At this instant.
    At(Instant),
    /// Never.
    Never,
}

impl Attempt {
    /// An attempt paid for with `ticket` (a retry's, a router's move's; none for a request's
    /// first attempt or a retry an open breaker is to refuse).
    pub(crate) fn paid(ticket: Option<Ticket>) -> Self {
        Self {
            ticket,
            ..Self::default()
        }
    }

    /// A hedge, with the budget's ticket for it.
    pub(crate) fn hedge(ticket: Ticket) -> Self {
        Self {
            ticket: Some(ticket),
            hedge: true,
            ..Self::default()
        }
    }

    /// The attempt goes (`now`: when, if it is timed): its slot and its ticket are spent.
    #[inline]
    pub(crate) fn send(&mut self, now: Option<Instant>) {
        self.permits.send();
        if let Some(ticket) = &mut self.ticket {
            ticket.send();
        }
        self.started = now;
        self.head_by = Due::Unset;
        self.sent = true;
    }

    /// The attempt ended with `outcome` (`headers`: its answer's): its guards and its ticket
    /// are told (a ticket is given back when a layer below refused the attempt on this side of
    /// the network: it never left). For a success, what corrects the rate limit's token weight.
    #[inline]
    pub(crate) fn settle(&mut self, outcome: &Outcome, headers: &HeaderMap) -> Option<Usage> {
        let usage = self.permits.record(outcome, headers);
        if let Some(ticket) = self.ticket.take() {
            ticket.settle(!outcome.reason().is_local_refusal());
        }
        usage
    }

    /// How long the attempt took until now, the first time it is asked.
    pub(crate) fn took(&mut self) -> Option<Duration> {
        self.started.take().map(|started| started.elapsed())
    }

    /// How long the attempt has been in flight, if it is timed.
    pub(crate) fn in_flight(&self) -> Option<Duration> {
        self.started.map(|started| started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use stormguard_budget::{BudgetConfig, RetryBudget};
    use stormguard_classify::Reason;

    use super::*;

    /// A ticket is spent once its attempt is sent, unless the attempt's outcome shows a layer
    /// below refused it locally; never sent, it goes back.
    #[tokio::test(start_paused = true)]
    async fn a_ticket_is_given_back_unless_its_attempt_left() {
        let budget = RetryBudget::new(BudgetConfig::default().with_ratio(0.0));
        let never = Attempt::paid(budget.ticket());
        drop(never);
        assert_eq!(budget.snapshot().withdrawals, 0);

        let mut refused = Attempt::paid(budget.ticket());
        refused.send(None);
        let throttled = Outcome::fatal(Reason::Throttled).with_accepted(false);
        refused.settle(&throttled, &HeaderMap::new());
        assert_eq!(budget.snapshot().withdrawals, 0);

        let mut cancelled = Attempt::paid(budget.ticket());
        cancelled.send(None);
        drop(cancelled);
        let mut answered = Attempt::paid(budget.ticket());
        answered.send(None);
        let unavailable = Outcome::retryable(Reason::Unavailable).with_accepted(false);
        answered.settle(&unavailable, &HeaderMap::new());
        assert_eq!(budget.snapshot().withdrawals, 2);
    }
}
