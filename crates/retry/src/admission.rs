//! The guards an attempt passes before it is sent, and the permits it holds while in flight.
//!
//! Every guard follows one protocol ([`Permit`]): admit an attempt with a permit; tell the permit
//! how the attempt ended; drop it untold and it records what an abandoned attempt means to its
//! guard. The order is fixed here, and so are the rules between the guards:
//!
//! 1. the **rate limit** ([`Guards::reserve`]): a slot, waited for before anything else, because
//!    an attempt waiting for its slot is not in flight (the breaker's stall detector counts the
//!    attempts in flight, the throttle the ones sent);
//! 2. the **circuit breaker**, then the **adaptive throttle** ([`Guards::admit`]), once the slot
//!    has come. A half-open breaker's probe skips the throttle's draw (a throttle still full of
//!    the outage would drop the probes and hold the breaker open) but still tells it its outcome.
//!    A refusal drops the permits taken before it: the slot is given back, the breaker's place in
//!    flight freed.

use std::task::{Context, Poll};

use http::HeaderMap;
use http::request::Parts;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottlePermit};
use stormguard_breaker::{BreakerOpen, BreakerPermit, CircuitBreaker, Rejected, State};
use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_rate_limit::{Acquire, RateLimit, RateLimitPermit, Reservation, Usage};
use tokio::time::Instant;

/// The guards of one backend, shared by every request of a layer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Guards {
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) breaker: Option<CircuitBreaker>,
    pub(crate) throttle: Option<AdaptiveThrottle>,
}

/// Why an attempt was not admitted.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The breaker is open, or its bulkhead full.
    Breaker(Rejected),
    /// The throttle dropped the attempt.
    Throttled,
}

/// The permits of one attempt in flight: one per guard that admitted it.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    rate_limit: Option<RateLimitPermit>,
    breaker: Option<BreakerPermit>,
    throttle: Option<ThrottlePermit>,
}

impl Guards {
    /// Asks the rate limit for a slot for the request with head `head`, weighing `tokens` (asked
    /// only if the limit counts tokens), that may wait until `deadline`; `None` without a rate
    /// limit.
    pub(crate) fn reserve(
        &self,
        head: &Parts,
        tokens: impl FnOnce() -> u64,
        deadline: Option<Instant>,
    ) -> Option<Acquire> {
        let limit = self.rate_limit.as_ref()?;
        let tokens = if limit.weighs_tokens(head) {
            tokens()
        } else {
            0
        };
        Some(limit.acquire(head, tokens, deadline))
    }

    /// Admits the attempt whose rate-limit slot (if any) has come: past the breaker, then the
    /// throttle; its permits are written into `permits` (empty: a new attempt's). The slot is
    /// spent only if both let the attempt through; a refusal gives back what the guards before
    /// it granted (the slot, the breaker's place in flight).
    pub(crate) fn admit(
        &self,
        slot: Option<Reservation>,
        permits: &mut Permits,
    ) -> Result<(), Refusal> {
        if let Some(breaker) = &self.breaker {
            permits.breaker = Some(breaker.try_acquire().map_err(Refusal::Breaker)?);
        }
        if let Some(throttle) = &self.throttle {
            let probe = permits
                .breaker
                .as_ref()
                .is_some_and(BreakerPermit::is_probe);
            let admitted = if probe {
                Ok(throttle.exempt())
            } else {
                throttle.try_acquire()
            };
            match admitted {
                Ok(permit) => permits.throttle = Some(permit),
                Err(_) => {
                    permits.breaker = None;
                    return Err(Refusal::Throttled);
                }
            }
        }
        if let Some(slot) = slot {
            permits.rate_limit = Some(slot.send());
        }
        Ok(())
    }

    /// Whether the breaker is open now (its wait not over).
    pub(crate) fn breaker_open(&self) -> bool {
        self.breaker
            .as_ref()
            .is_some_and(|breaker| breaker.state() == State::Open)
    }
}

impl Refusal {
    /// The reason the refused attempt ends with.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            Self::Breaker(rejected) => rejected.outcome().reason(),
            Self::Throttled => Reason::Throttled,
        }
    }
}

impl Permits {
    /// The attempt ended with `outcome` (`headers`: its answer's): every permit is told. For a
    /// success, what corrects the rate limit's token weight to the answer's usage, if it does.
    #[inline]
    pub(crate) fn record(&mut self, outcome: &Outcome, headers: &HeaderMap) -> Option<Usage> {
        let mut usage = None;
        if let Some(permit) = self.rate_limit.take() {
            if outcome.is_success() {
                usage = permit.usage();
            }
            permit.record(outcome, headers);
        }
        if let Some(permit) = self.breaker.take() {
            permit.record(outcome, headers);
        }
        if let Some(permit) = self.throttle.take() {
            permit.record(outcome, headers);
        }
        usage
    }

    /// The breaker's permit, for a response whose end tells the breaker how it went (an event
    /// stream: it may still break after its first content).
    pub(crate) fn take_breaker(&mut self) -> Option<BreakerPermit> {
        self.breaker.take()
    }

    /// Ready when a stall opened the breaker since the attempt was admitted: the attempt is to
    /// be dropped, and counts for nothing with the throttle (it learns from answers, and a
    /// black hole's silence would only leave it drops to unlearn after the recovery).
    pub(crate) fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<BreakerOpen> {
        let Some(breaker) = &mut self.breaker else {
            return Poll::Pending;
        };
        let open = std::task::ready!(breaker.poll_cut(cx));
        self.breaker = None;
        if let Some(throttle) = self.throttle.take() {
            throttle.forget();
        }
        Poll::Ready(open)
    }

    /// The attempt lost a race to another attempt of its request (a hedge's) and is cancelled:
    /// the breaker frees its place and counts nothing, the throttle forgets it (being the slower
    /// of two says nothing about whether the backend accepts), a rate-limit slot stays spent
    /// (the attempt went out).
    pub(crate) fn lost(&mut self) {
        self.breaker = None;
        if let Some(throttle) = self.throttle.take() {
            throttle.forget();
        }
        self.rate_limit = None;
    }

    /// The request's deadline passed with the attempt in flight (if one is: a permit told
    /// already is gone): a timeout, which the breaker counts as a health failure and the
    /// throttle as not accepted. The rate limit has nothing to learn from a silence.
    pub(crate) fn timed_out(&mut self) {
        let timeout = Outcome::retryable(Reason::DeadlineExceeded).with_accepted(false);
        if let Some(permit) = self.breaker.take() {
            permit.record(&timeout, &HeaderMap::new());
        }
        if let Some(permit) = self.throttle.take() {
            permit.record(&timeout, &HeaderMap::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use stormguard_adaptive_throttle::ThrottleConfig;
    use stormguard_breaker::BreakerConfig;
    use stormguard_rate_limit::RateLimitConfig;

    use super::*;

    const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

    fn head() -> Parts {
        http::Request::new(()).into_parts().0
    }

    /// One request a second, a bucket of one: what a slot given back or spent shows.
    fn one_a_second() -> RateLimit {
        RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(60)))
    }

    /// A throttle that drops every attempt.
    fn dropping() -> AdaptiveThrottle {
        let throttle = AdaptiveThrottle::new(
            ThrottleConfig::default()
                .with_min_rate(0.0)
                .with_max_probability(1.0)
                .with_window(Duration::from_secs(60)),
        );
        for _ in 0..10_000 {
            drop(throttle.try_acquire());
        }
        throttle
    }

    /// Admits an attempt with `slot`: its permits, or the refusal.
    fn admit(guards: &Guards, slot: Option<Reservation>) -> Result<Permits, Refusal> {
        let mut permits = Permits::default();
        guards.admit(slot, &mut permits).map(|()| permits)
    }

    fn slot(guards: &Guards) -> Option<Reservation> {
        let mut acquire = guards.reserve(&head(), || 0, None)?;
        acquire.now()?.ok()
    }

    fn open(breaker: &CircuitBreaker) {
        for _ in 0..20 {
            if let Ok(permit) = breaker.try_acquire() {
                permit.record(&UNAVAILABLE, &HeaderMap::new());
            }
        }
        assert_eq!(breaker.state(), State::Open);
    }

    fn available(guards: &Guards) -> Option<u64> {
        guards.rate_limit.as_ref()?.snapshot().requests_available
    }

    #[tokio::test(start_paused = true)]
    async fn a_breaker_refusal_gives_the_slot_back() {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(4));
        open(&breaker);
        let guards = Guards {
            rate_limit: Some(one_a_second()),
            breaker: Some(breaker),
            throttle: None,
        };
        let refused = admit(&guards, slot(&guards));
        assert!(matches!(refused, Err(Refusal::Breaker(Rejected::Open(_)))));
        assert_eq!(available(&guards), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_drop_frees_the_breakers_place_and_gives_the_slot_back() {
        let guards = Guards {
            rate_limit: Some(one_a_second()),
            breaker: Some(CircuitBreaker::default()),
            throttle: Some(dropping()),
        };
        let requests = guards.throttle.as_ref().map(|t| t.snapshot().requests);
        let refused = admit(&guards, slot(&guards));
        assert!(matches!(refused, Err(Refusal::Throttled)));
        assert_eq!(available(&guards), Some(1));
        let breaker = guards.breaker.as_ref().map(CircuitBreaker::snapshot);
        assert_eq!(breaker.map(|b| (b.in_flight, b.calls)), Some((0, 0)));
        // The drop itself is one more request for the throttle.
        let after = guards.throttle.as_ref().map(|t| t.snapshot().requests);
        assert_eq!(after, requests.map(|n| n + 1));
    }

    /// Half open, the probe passes a throttle that drops everything, and its success is counted
    /// by both: the breaker closes, the throttle counts an accept.
    #[tokio::test(start_paused = true)]
    async fn a_half_open_probe_skips_the_throttles_draw_but_tells_it_its_outcome() {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(4));
        open(&breaker);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(breaker.state(), State::HalfOpen);
        let guards = Guards {
            rate_limit: None,
            breaker: Some(breaker),
            throttle: Some(dropping()),
        };
        let accepts = guards.throttle.as_ref().map(|t| t.snapshot().accepts);
        let Ok(mut permits) = admit(&guards, None) else {
            panic!("the probe was refused");
        };
        assert!(
            permits
                .record(&Outcome::success(), &HeaderMap::new())
                .is_none()
        );
        assert_eq!(
            guards.breaker.as_ref().map(CircuitBreaker::state),
            Some(State::Closed)
        );
        let after = guards.throttle.as_ref().map(|t| t.snapshot().accepts);
        assert_eq!(after, accepts.map(|n| n + 1));
    }

    /// Admitted and dropped untold (the caller gave up): the slot stays spent (the attempt
    /// went), the breaker counts nothing and frees its place, the throttle counts a rejection.
    #[tokio::test(start_paused = true)]
    async fn permits_dropped_untold_settle_as_an_abandoned_attempt() {
        let guards = Guards {
            rate_limit: Some(one_a_second()),
            breaker: Some(CircuitBreaker::default()),
            throttle: Some(AdaptiveThrottle::default()),
        };
        let Ok(permits) = admit(&guards, slot(&guards)) else {
            panic!("refused");
        };
        drop(permits);
        assert_eq!(available(&guards), Some(0));
        let breaker = guards.breaker.as_ref().map(CircuitBreaker::snapshot);
        assert_eq!(breaker.map(|b| (b.in_flight, b.calls)), Some((0, 0)));
        let throttle = guards.throttle.as_ref().map(AdaptiveThrottle::snapshot);
        assert_eq!(throttle.map(|t| (t.requests, t.accepts)), Some((1, 0)));
    }

    /// A deadline passed in flight: a health failure for the breaker, not accepted for the
    /// throttle.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_timed_out_counts_as_a_failure_for_both() {
        let guards = Guards {
            rate_limit: None,
            breaker: Some(CircuitBreaker::default()),
            throttle: Some(AdaptiveThrottle::default()),
        };
        let Ok(mut permits) = admit(&guards, None) else {
            panic!("refused");
        };
        permits.timed_out();
        let breaker = guards.breaker.as_ref().map(CircuitBreaker::snapshot);
        assert_eq!(breaker.map(|b| (b.calls, b.failures)), Some((1, 1)));
        let throttle = guards.throttle.as_ref().map(AdaptiveThrottle::snapshot);
        assert_eq!(throttle.map(|t| (t.requests, t.accepts)), Some((1, 0)));
    }

    #[tokio::test(start_paused = true)]
    async fn no_guards_admit_everything_and_record_nothing() {
        let guards = Guards::default();
        assert!(guards.reserve(&head(), || 0, None).is_none());
        assert!(!guards.breaker_open());
        let Ok(mut permits) = admit(&guards, None) else {
            panic!("refused");
        };
        assert!(
            permits
                .record(&Outcome::success(), &HeaderMap::new())
                .is_none()
        );
    }
}
