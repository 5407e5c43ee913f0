//! Whether and when a failed attempt is retried: the engine's policy, kept apart from how the
//! request moves (the [future](crate::ResponseFuture)), as tower keeps its `Policy` apart from its
//! retry future. Plain values and functions: everything here is decided without a service.
//!
//! A retryable failure is retried only if every check passes, cheapest first and the one with a
//! side effect last:
//!
//! 1. this layer may send the request again at all (its body was buffered, more than one attempt
//!    is allowed): otherwise the decision is the caller's;
//! 2. fewer than `max_attempts` attempts were sent;
//! 3. the breaker is not open: when it is (this failure may have opened it), the retry goes at
//!    once and draws nothing from the budget, to be refused and answered by the fallback, or
//!    moved elsewhere by a failover above;
//! 4. the delay: the server's hint through the [`HintPolicy`] (a hint above its maximum ends the
//!    request), else the next delay of the backoff schedule;
//! 5. the deadline: the retry must start after its delay and still have as long as the last
//!    attempt took;
//! 6. the budget grants a [`Ticket`].
//!
//! Under a router that can take the request elsewhere (a failover), an attempt that timed out
//! without an answer is not retried here: the request is handed on at once
//! ([`GiveUpCause::HandedOn`]); so is a 429 when the router has another backend free for the
//! request ([`Route::with_hand_off_429`](crate::Route::with_hand_off_429)).
//!
//! Whatever it decides, the policy counts the failures the server answered 429: a request
//! answered 429 on every attempt comes back saying so
//! ([`Report::rate_limited_throughout`](crate::Report::rate_limited_throughout)), for a failover
//! above to move it to another backend at once.
//!
//! The other decisions of a request are here too, as plain functions: whether it can go on
//! without an attempt whose clock fired ([`RetryPolicy::may_go_on`]), and how many continuations
//! its stream may send ([`RetryPolicy::continuations`]). When a hedge goes is
//! [`Hedging`](crate::Hedging)'s.

use std::time::Duration;

use stormguard_budget::{RetryBudget, RetryTokens, Ticket};
use stormguard_classify::{Outcome, Reason};
use stormguard_deadline::Deadline;
use stormguard_jitter::{Backoff, HintPolicy, HintedDelay};

use crate::error::GiveUpCause;

/// The settings of the retry decision, shared by every request of a layer.
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicy<Bk> {
    pub(crate) budget: RetryBudget,
    pub(crate) backoff: Bk,
    pub(crate) hint_policy: HintPolicy,
    /// Most attempts per request, the first included (at least 1).
    pub(crate) max_attempts: u32,
    /// gRPC's retry throttling (gRFC A6), asked beside the budget when there is one.
    pub(crate) tokens: Option<RetryTokens>,
}

/// What the policy remembers of one request between its attempts.
pub(crate) struct Retries<S> {
    /// The backoff schedule, made on the first retry (a request that succeeds never needs one).
    schedule: Option<S>,
    /// How long the last finished attempt took: a retry must have as long before the deadline.
    last_attempt: Duration,
    /// Attempts the server answered 429 (`Reason::RateLimited`; a refusal of this side's own
    /// rate limit, `RateLimitedLocally`, is no answer): when it is every attempt sent, the
    /// backend is rate-limiting this request whatever the retries do, and a failover above
    /// moves it to another backend at once instead of handing the 429 back.
    rate_limited: u32,
}

/// A failed attempt, as the policy is asked about it.
pub(crate) struct FailedAttempt<'a> {
    pub(crate) outcome: &'a Outcome,
    /// Attempts sent so far, the failed one included.
    pub(crate) sent: u32,
    /// Whether this layer can send the request again (its body was buffered).
    pub(crate) replayable: bool,
    /// Whether the backend's breaker is open now.
    pub(crate) breaker_open: bool,
    pub(crate) deadline: Option<Deadline>,
    /// Whether a router above can take the request elsewhere (a failover's next backend).
    pub(crate) hand_off: bool,
    /// Whether a router above takes a 429 elsewhere at once (another backend is free for it).
    pub(crate) hand_off_429: bool,
}

/// The policy's answer.
pub(crate) enum Decision {
    /// Retry after `delay`, with the budget's ticket for it (none when the breaker is open: the
    /// retry is sent only to be refused).
    Retry {
        delay: Duration,
        ticket: Option<Ticket>,
    },
    /// This layer cannot send the request again: the decision is the caller's.
    NotReplayable,
    /// Not retried, for this cause: the failure is final.
    GiveUp(GiveUpCause),
}

impl<Bk> RetryPolicy<Bk> {
    /// The same policy with another backoff.
    pub(crate) fn with_backoff<Bk2>(self, backoff: Bk2) -> RetryPolicy<Bk2> {
        RetryPolicy {
            budget: self.budget,
            backoff,
            hint_policy: self.hint_policy,
            max_attempts: self.max_attempts,
            tokens: self.tokens,
        }
    }
}

impl<Bk: Backoff> RetryPolicy<Bk> {
    /// Whether this layer may ever send a request more than once.
    pub(crate) fn may_retry(&self) -> bool {
        self.max_attempts > 1
    }

    /// A success: it deposits into the budget that retries draw from (and refills the retry
    /// tokens).
    pub(crate) fn succeeded(&self) {
        self.budget.deposit();
        if let Some(tokens) = &self.tokens {
            tokens.succeeded();
        }
    }

    /// An attempt failed with `outcome`: one retry token less when it is a failure gRFC A6
    /// counts, an answer a retry could help or one the server pushed back on. A refusal of a
    /// guard on this side never reached the server: it takes none.
    pub(crate) fn failed(&self, outcome: &Outcome) {
        let reason = outcome.reason();
        if let Some(tokens) = &self.tokens
            && !reason.is_local_refusal()
            && (outcome.is_retryable() || reason == Reason::ServerSaidNoRetry)
        {
            tokens.failed();
        }
    }

    /// Whether the retry tokens, if any, allow a retry or a hedge now.
    pub(crate) fn tokens_allow(&self) -> bool {
        self.tokens.as_ref().is_none_or(RetryTokens::allows)
    }

    /// Whether the retryable failure `failed` is retried, and after how long.
    pub(crate) fn decide(
        &self,
        retries: &mut Retries<Bk::Schedule>,
        failed: &FailedAttempt<'_>,
    ) -> Decision {
        retries.tally(failed.outcome);
        let outcome = failed.outcome;
        if failed.hand_off && outcome.reason() == Reason::Timeout && !outcome.is_accepted() {
            return Decision::GiveUp(GiveUpCause::HandedOn);
        }
        if failed.hand_off_429 && outcome.reason() == Reason::RateLimited {
            return Decision::GiveUp(GiveUpCause::HandedOn);
        }
        if !failed.replayable || !self.may_retry() {
            return Decision::NotReplayable;
        }
        if failed.sent >= self.max_attempts {
            return Decision::GiveUp(GiveUpCause::AttemptsExhausted);
        }
        if failed.breaker_open {
            let delay = Duration::ZERO;
            return Decision::Retry {
                delay,
                ticket: None,
            };
        }
        let delay = match failed.outcome.retry_after() {
            Some(hint) => match self.hint_policy.apply(hint) {
                HintedDelay::RetryAfter(delay) => delay,
                HintedDelay::TooLong { .. } => return Decision::GiveUp(GiveUpCause::HintTooLong),
            },
            None => retries.next_delay(&self.backoff),
        };
        let attempt = retries.last_attempt;
        if !failed
            .deadline
            .is_none_or(|deadline| deadline.fits(delay, attempt))
        {
            return Decision::GiveUp(GiveUpCause::Deadline);
        }
        if !self.tokens_allow() {
            return Decision::GiveUp(GiveUpCause::BudgetExhausted);
        }
        match self.budget.ticket() {
            Some(ticket) => Decision::Retry {
                delay,
                ticket: Some(ticket),
            },
            None => Decision::GiveUp(GiveUpCause::BudgetExhausted),
        }
    }

    /// Whether a request whose attempt's clock fired can go on without that attempt: its other
    /// attempt in flight (`racing`), another attempt here (the request can be sent again, has
    /// attempts left after `sent`, and the budget would grant a retry), or, under a router
    /// (`hand_off`), another backend (the budget would grant the move). Else abandoning the
    /// attempt would only end the request early, when the attempt may still answer. The budget
    /// is asked, not drawn on: the retry or the move draws on it itself.
    pub(crate) fn may_go_on(
        &self,
        racing: bool,
        replayable: bool,
        sent: u32,
        hand_off: bool,
    ) -> bool {
        if racing {
            return true;
        }
        let here = replayable && sent < self.max_attempts;
        (hand_off || here) && self.tokens_allow() && self.budget.would_grant()
    }

    /// How many continuations the stream of a request may send: a retry's worth of attempts
    /// (`max_attempts - 1`) when continuation is `on` and the backend is asked (`prefill`: it
    /// takes an assistant prefill, as far as is known), none otherwise.
    pub(crate) fn continuations(&self, on: bool, prefill: bool) -> u32 {
        match on && prefill {
            true => self.max_attempts.saturating_sub(1),
            false => 0,
        }
    }
}

impl<S> Retries<S> {
    pub(crate) fn new() -> Self {
        Self {
            schedule: None,
            last_attempt: Duration::ZERO,
            rate_limited: 0,
        }
    }

    /// A retryable failure came back with `outcome`: a 429 from the server is counted.
    fn tally(&mut self, outcome: &Outcome) {
        if outcome.reason() == Reason::RateLimited {
            self.rate_limited = self.rate_limited.saturating_add(1);
        }
    }

    /// Whether the server answered 429 to each of the `sent` attempts (at least one). Counted
    /// from the retryable failures the policy is asked about: an attempt that ended otherwise
    /// (a fatal failure, cut in flight, an error without an answer) breaks the run.
    pub(crate) fn rate_limited_throughout(&self, sent: u32) -> bool {
        sent > 0 && self.rate_limited == sent
    }

    /// An attempt finished after `took`.
    pub(crate) fn attempt_took(&mut self, took: Duration) {
        self.last_attempt = took;
    }

    fn next_delay<Bk: Backoff<Schedule = S>>(&mut self, backoff: &Bk) -> Duration
    where
        S: Iterator<Item = Duration>,
    {
        let schedule = self.schedule.get_or_insert_with(|| backoff.schedule());
        schedule.next().unwrap_or_else(|| backoff.cap())
    }
}

#[cfg(test)]
mod tests {
    use stormguard_jitter::{Constant, FullJitter};

    use super::*;
    use stormguard_budget::BudgetConfig;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy(max_attempts: u32) -> RetryPolicy<Constant> {
        RetryPolicy {
            // 10 retries a second for free: the budget grants until it is drained.
            budget: RetryBudget::new(BudgetConfig::default().with_ratio(0.0)),
            backoff: Constant::new(SECOND),
            hint_policy: HintPolicy::default(),
            max_attempts,
            tokens: None,
        }
    }

    fn failed(outcome: &Outcome, sent: u32) -> FailedAttempt<'_> {
        FailedAttempt {
            outcome,
            sent,
            replayable: true,
            breaker_open: false,
            deadline: None,
            hand_off: false,
            hand_off_429: false,
        }
    }

    fn delay(decision: &Decision) -> Option<Duration> {
        match decision {
            Decision::Retry { delay, .. } => Some(*delay),
            _ => None,
        }
    }

    fn cause(decision: &Decision) -> Option<GiveUpCause> {
        match decision {
            Decision::GiveUp(cause) => Some(*cause),
            _ => None,
        }
    }

    const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

    #[tokio::test(start_paused = true)]
    async fn attempts_are_counted_against_the_maximum() {
        let policy = policy(3);
        let mut retries = Retries::new();
        assert_eq!(
            delay(&policy.decide(&mut retries, &failed(&UNAVAILABLE, 1))),
            Some(SECOND)
        );
        assert_eq!(
            delay(&policy.decide(&mut retries, &failed(&UNAVAILABLE, 2))),
            Some(SECOND)
        );
        let third = policy.decide(&mut retries, &failed(&UNAVAILABLE, 3));
        assert_eq!(cause(&third), Some(GiveUpCause::AttemptsExhausted));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_sent_once_or_one_attempt_leaves_the_decision_to_the_caller() {
        let mut retries = Retries::new();
        let once = FailedAttempt {
            replayable: false,
            ..failed(&UNAVAILABLE, 1)
        };
        assert!(matches!(
            policy(3).decide(&mut retries, &once),
            Decision::NotReplayable
        ));
        let single = policy(1).decide(&mut retries, &failed(&UNAVAILABLE, 1));
        assert!(matches!(single, Decision::NotReplayable));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_replaces_the_backoff_and_one_above_the_maximum_ends_the_request() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let hinted = UNAVAILABLE.with_retry_after(Some(Duration::from_secs(3)));
        let waited = delay(&policy.decide(&mut retries, &failed(&hinted, 1))).unwrap_or_default();
        // The hint policy adds up to 10% of jitter, never less than asked.
        assert!(waited >= Duration::from_secs(3) && waited <= Duration::from_millis(3_300));
        let too_long = UNAVAILABLE.with_retry_after(Some(Duration::from_secs(61)));
        let decision = policy.decide(&mut retries, &failed(&too_long, 1));
        assert_eq!(cause(&decision), Some(GiveUpCause::HintTooLong));
    }

    /// 10 s left: a 1 s delay and a last attempt of 8 s fit (9 s), one of 9 s does not (10 s is
    /// not before the deadline).
    #[tokio::test(start_paused = true)]
    async fn a_retry_must_fit_its_delay_and_the_last_attempt_before_the_deadline() {
        let policy = policy(3);
        let deadline = Some(Deadline::after(Duration::from_secs(10)));
        let mut retries = Retries::new();
        retries.attempt_took(Duration::from_secs(8));
        let within = FailedAttempt {
            deadline,
            ..failed(&UNAVAILABLE, 1)
        };
        assert_eq!(delay(&policy.decide(&mut retries, &within)), Some(SECOND));
        retries.attempt_took(Duration::from_secs(9));
        let decision = policy.decide(&mut retries, &within);
        assert_eq!(cause(&decision), Some(GiveUpCause::Deadline));
    }

    /// An open breaker: the retry goes at once and draws nothing, even from a spent budget.
    #[tokio::test(start_paused = true)]
    async fn an_open_breaker_sends_the_retry_at_once_without_a_ticket() {
        let policy = policy(3);
        while policy.budget.withdraw() {}
        let mut retries = Retries::new();
        let open = FailedAttempt {
            breaker_open: true,
            ..failed(&UNAVAILABLE, 1)
        };
        let decision = policy.decide(&mut retries, &open);
        assert!(matches!(
            decision,
            Decision::Retry {
                delay: Duration::ZERO,
                ticket: None
            }
        ));
        let closed = policy.decide(&mut retries, &failed(&UNAVAILABLE, 1));
        assert_eq!(cause(&closed), Some(GiveUpCause::BudgetExhausted));
    }

    /// The budget is asked last: a retry the other checks rule out withdraws nothing.
    #[tokio::test(start_paused = true)]
    async fn the_budget_is_asked_last_and_only_for_a_retry_that_goes() {
        let policy = policy(2);
        let mut retries = Retries::new();
        let _ = policy.decide(&mut retries, &failed(&UNAVAILABLE, 2));
        let too_long = UNAVAILABLE.with_retry_after(Some(Duration::from_secs(61)));
        let _ = policy.decide(&mut retries, &failed(&too_long, 1));
        assert_eq!(policy.budget.snapshot().withdrawals, 0);
        let granted = policy.decide(&mut retries, &failed(&UNAVAILABLE, 1));
        assert_eq!(policy.budget.snapshot().withdrawals, 1);
        drop(granted);
    }

    /// A ticket granted is given back unless its retry is sent.
    #[tokio::test(start_paused = true)]
    async fn a_ticket_is_given_back_unless_its_retry_is_sent() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let mut ticket = || match policy.decide(&mut retries, &failed(&UNAVAILABLE, 1)) {
            Decision::Retry { ticket, .. } => ticket.expect("a ticket"),
            _ => panic!("not retried"),
        };
        drop(ticket());
        assert_eq!(policy.budget.snapshot().withdrawals, 0);
        let mut sent = ticket();
        sent.send();
        drop(sent);
        assert_eq!(policy.budget.snapshot().withdrawals, 1);
    }

    const TIMED_OUT: Outcome = Outcome::retryable(Reason::Timeout).with_accepted(false);

    /// Under a router, an attempt that timed out unaccepted is handed on at once, with nothing
    /// drawn; a timeout the backend accepted and every other failure are retried here.
    #[tokio::test(start_paused = true)]
    async fn under_a_router_a_timeout_is_handed_on() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let routed = |outcome| FailedAttempt {
            hand_off: true,
            ..failed(outcome, 1)
        };
        let decision = policy.decide(&mut retries, &routed(&TIMED_OUT));
        assert_eq!(cause(&decision), Some(GiveUpCause::HandedOn));
        assert_eq!(policy.budget.snapshot().withdrawals, 0);
        let answered = Outcome::retryable(Reason::Timeout).with_accepted(true);
        assert_eq!(
            delay(&policy.decide(&mut retries, &routed(&answered))),
            Some(SECOND)
        );
        assert_eq!(
            delay(&policy.decide(&mut retries, &routed(&UNAVAILABLE))),
            Some(SECOND)
        );
        assert_eq!(
            delay(&policy.decide(&mut retries, &failed(&TIMED_OUT, 1))),
            Some(SECOND)
        );
    }

    /// Under a router with another backend free, a 429 (with a 2 s hint or none) is handed on at
    /// once, with nothing drawn, and still counted as a 429; without it, the hint is waited out;
    /// other failures are retried here as ever.
    #[tokio::test(start_paused = true)]
    async fn under_a_router_with_another_backend_a_429_is_handed_on() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let hinted =
            Outcome::retryable(Reason::RateLimited).with_retry_after(Some(Duration::from_secs(2)));
        let bare = Outcome::retryable(Reason::RateLimited);
        for outcome in [&hinted, &bare] {
            let routed = FailedAttempt {
                hand_off_429: true,
                ..failed(outcome, 1)
            };
            let decision = policy.decide(&mut retries, &routed);
            assert_eq!(cause(&decision), Some(GiveUpCause::HandedOn));
        }
        assert_eq!(policy.budget.snapshot().withdrawals, 0);
        assert!(retries.rate_limited_throughout(2));
        // Alone, the hint plus its jitter (at most 10% of it).
        let alone = delay(&policy.decide(&mut retries, &failed(&hinted, 1)));
        let waited = alone.unwrap_or_default().as_millis();
        assert!((2_000..=2_200).contains(&waited), "{waited} ms");
        let other = FailedAttempt {
            hand_off_429: true,
            ..failed(&UNAVAILABLE, 1)
        };
        assert_eq!(delay(&policy.decide(&mut retries, &other)), Some(SECOND));
    }

    /// An attempt whose clock fired is abandoned only if the request can go on without it: a
    /// race, attempts left here, or a router, and the budget would grant; asking draws nothing.
    #[tokio::test(start_paused = true)]
    async fn a_fired_clock_abandons_its_attempt_only_if_the_request_can_go_on() {
        let policy = policy(3);
        assert!(policy.may_go_on(false, true, 1, false));
        assert!(!policy.may_go_on(false, true, 3, false));
        assert!(!policy.may_go_on(false, false, 1, false));
        assert!(policy.may_go_on(false, false, 3, true));
        assert!(policy.may_go_on(true, false, 3, false));
        while policy.budget.withdraw() {}
        let rejected = policy.budget.snapshot().rejected;
        assert!(!policy.may_go_on(false, true, 1, true));
        assert!(policy.may_go_on(true, true, 1, false));
        assert_eq!(policy.budget.snapshot().rejected, rejected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_may_send_a_retrys_worth_of_continuations() {
        assert_eq!(policy(3).continuations(true, true), 2);
        assert_eq!(policy(1).continuations(true, true), 0);
        assert_eq!(policy(3).continuations(false, true), 0);
        assert_eq!(policy(3).continuations(true, false), 0);
    }

    const RATE_LIMITED: Outcome = Outcome::retryable(Reason::RateLimited).with_accepted(false);

    /// Three 429s: rate-limited throughout after each of them, the third one given up on.
    #[tokio::test(start_paused = true)]
    async fn a_429_on_every_attempt_is_remembered() {
        let policy = policy(3);
        let mut retries = Retries::new();
        assert!(!retries.rate_limited_throughout(0));
        for sent in 1..=2 {
            let decision = policy.decide(&mut retries, &failed(&RATE_LIMITED, sent));
            assert_eq!(delay(&decision), Some(SECOND));
            assert!(retries.rate_limited_throughout(sent), "after {sent}");
        }
        let third = policy.decide(&mut retries, &failed(&RATE_LIMITED, 3));
        assert_eq!(cause(&third), Some(GiveUpCause::AttemptsExhausted));
        assert!(retries.rate_limited_throughout(3));
    }

    /// One attempt answered otherwise, before the 429s or after them, breaks the run.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_answered_otherwise_breaks_the_run() {
        let policy = policy(3);
        let mut first_unavailable = Retries::new();
        let _ = policy.decide(&mut first_unavailable, &failed(&UNAVAILABLE, 1));
        let _ = policy.decide(&mut first_unavailable, &failed(&RATE_LIMITED, 2));
        assert!(!first_unavailable.rate_limited_throughout(2));

        let mut last_unavailable = Retries::new();
        let _ = policy.decide(&mut last_unavailable, &failed(&RATE_LIMITED, 1));
        let _ = policy.decide(&mut last_unavailable, &failed(&UNAVAILABLE, 2));
        assert!(!last_unavailable.rate_limited_throughout(2));

        // A 429, then a fatal failure the policy is never asked about: 1 of 2 attempts.
        let mut then_fatal = Retries::new();
        let _ = policy.decide(&mut then_fatal, &failed(&RATE_LIMITED, 1));
        assert!(!then_fatal.rate_limited_throughout(2));
    }

    /// The rate limit's own refusal on this side is no answer from the server.
    #[tokio::test(start_paused = true)]
    async fn a_local_rate_limit_refusal_is_no_429() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let local = Outcome::retryable(Reason::RateLimitedLocally).with_accepted(false);
        let _ = policy.decide(&mut retries, &failed(&local, 1));
        assert!(!retries.rate_limited_throughout(1));
    }

    /// A 429 asking for longer than the hint policy's maximum (60 s) ends the request at once,
    /// rate-limited throughout; so does one that cannot be retried here (a body sent once).
    #[tokio::test(start_paused = true)]
    async fn a_429_given_up_on_or_not_replayable_is_counted() {
        let policy = policy(3);
        let mut retries = Retries::new();
        let too_long = RATE_LIMITED.with_retry_after(Some(Duration::from_secs(120)));
        let decision = policy.decide(&mut retries, &failed(&too_long, 1));
        assert_eq!(cause(&decision), Some(GiveUpCause::HintTooLong));
        assert!(retries.rate_limited_throughout(1));

        let mut once = Retries::new();
        let not_replayable = FailedAttempt {
            replayable: false,
            ..failed(&RATE_LIMITED, 1)
        };
        let decision = policy.decide(&mut once, &not_replayable);
        assert!(matches!(decision, Decision::NotReplayable));
        assert!(once.rate_limited_throughout(1));
    }

    /// One schedule per request: the n-th retry's delay is drawn under `base * 2^n`, so delays
    /// above the base show that the schedule moved on from one retry to the next.
    #[tokio::test(start_paused = true)]
    async fn the_backoff_schedule_is_made_once_per_request() {
        let cap = Duration::from_secs(8);
        let policy = RetryPolicy {
            backoff: FullJitter::new(SECOND, cap).with_seed(3),
            budget: RetryBudget::new(BudgetConfig::default().with_min_per_sec(10).with_ratio(0.0)),
            hint_policy: HintPolicy::default(),
            max_attempts: 10,
            tokens: None,
        };
        let mut retries = Retries::new();
        let delays: Vec<Duration> = (1..9)
            .filter_map(|sent| delay(&policy.decide(&mut retries, &failed(&UNAVAILABLE, sent))))
            .collect();
        assert_eq!(delays.len(), 8);
        for (n, delay) in delays.iter().enumerate() {
            assert!(
                *delay <= (SECOND * (1 << n)).min(cap),
                "retry {n}: {delay:?}"
            );
        }
        assert!(delays.iter().any(|delay| *delay > SECOND), "{delays:?}");
    }

    /// gRPC's retry tokens, when on, are asked before the budget: at half or fewer no retry
    /// goes (and nothing is drawn from the budget); the failures a retry could help take a token,
    /// fatal ones other than a server's "do not retry" take none, successes refill.
    #[tokio::test(start_paused = true)]
    async fn retry_tokens_at_half_refuse_the_retry_before_the_budget() {
        let tokens = RetryTokens::new(4, 0.5);
        let policy = RetryPolicy {
            tokens: Some(tokens.clone()),
            ..policy(5)
        };
        let mut retries = Retries::new();
        policy.failed(&UNAVAILABLE);
        assert!(delay(&policy.decide(&mut retries, &failed(&UNAVAILABLE, 1))).is_some());
        policy.failed(&Outcome::fatal(Reason::Grpc(
            stormguard_classify::GrpcCode::InvalidArgument,
        )));
        assert_eq!(tokens.tokens(), 3.0, "a fatal status takes no token");
        policy.failed(&Outcome::fatal(Reason::ServerSaidNoRetry));
        assert_eq!(tokens.tokens(), 2.0, "a pushback that stops retries does");
        policy.failed(&Outcome::retryable(Reason::RateLimitedLocally));
        assert_eq!(
            tokens.tokens(),
            2.0,
            "a local refusal never reached the server"
        );
        let withdrawals = policy.budget.snapshot().withdrawals;
        let refused = policy.decide(&mut retries, &failed(&UNAVAILABLE, 2));
        assert_eq!(cause(&refused), Some(GiveUpCause::BudgetExhausted));
        assert_eq!(policy.budget.snapshot().withdrawals, withdrawals);
        assert!(!policy.may_go_on(false, true, 2, false));
        policy.succeeded();
        assert_eq!(tokens.tokens(), 2.5);
        assert!(delay(&policy.decide(&mut retries, &failed(&UNAVAILABLE, 2))).is_some());
    }
}
