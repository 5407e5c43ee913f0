//! The guards an attempt passes before it is sent, and the permits it holds while in flight.
//!
//! Every guard follows one protocol: it admits an attempt with a [`Pass`] (its permit), which
//! is told how the attempt ended ([`Permit::record`]) or, dropped untold, records what an
//! abandoned attempt means to its guard. The guards of a backend are one ordered list
//! ([`Guards`]); adding a guard is adding a kind of [`Guard`] and of [`Pass`] here, and nothing in
//! the path that moves a request. The order, and the rules between the guards:
//!
//! 1. the **rate limit**: a slot, waited for before anything else, because an attempt waiting for
//!    its slot is not in flight (the breaker's stall detector counts the attempts in flight, the
//!    throttle the ones sent);
//! 2. the **concurrency limit**: a place among the attempts in flight, waited for (within its
//!    `max_wait` and the request's deadline) once the quota allows the attempt, so that a wait for
//!    quota never holds a place, and before the breaker, whose stall detector must not count an
//!    attempt still waiting;
//! 3. the **circuit breaker**, then the **adaptive throttle**, once the slot has come. A half-open
//!    breaker's probe skips the throttle's draw (a throttle still full of the outage would drop
//!    the probes and hold the breaker open) but still tells it its outcome.
//!
//! A refusal drops the passes taken before it: the slot is given back, the place in flight and
//! the breaker's freed.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use http::request::Parts;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottlePermit};
use stormguard_breaker::{BreakerOpen, BreakerPermit, CircuitBreaker, Rejected, State};
use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_concurrency::{
    Acquire as AcquirePlace, ConcurrencyFull, ConcurrencyLimit, ConcurrencyPermit,
};
use stormguard_rate_limit::{Acquire, RateLimit, RateLimitPermit, RateLimited, Reservation, Usage};
use tokio::time::{Instant, Sleep};

/// Most guards a backend has: one of each kind.
const KINDS: usize = 4;

/// One guard of a backend's attempts, shared by every request of a layer.
#[derive(Clone, Debug)]
pub(crate) enum Guard {
    RateLimit(RateLimit),
    Concurrency(ConcurrencyLimit),
    Breaker(CircuitBreaker),
    Throttle(AdaptiveThrottle),
}

/// The guards of one backend, in the order they admit an attempt.
#[derive(Clone, Debug, Default)]
pub(crate) struct Guards {
    list: Vec<Guard>,
}

/// What one guard gave an attempt it admitted. A rate limit's is boxed: every attempt carries
/// room for a pass of each kind, and only a rate-limited one needs a rate limit's.
#[derive(Debug)]
pub(crate) enum Pass {
    /// A rate-limit slot, not sent yet: given back if dropped so.
    Slot(Box<Reservation>),
    RateLimit(Box<RateLimitPermit>),
    Concurrency(ConcurrencyPermit),
    Breaker(BreakerPermit),
    Throttle(ThrottlePermit),
}

/// The passes of one attempt: one per guard that admitted it, in the guards' order (the first
/// `held` places).
#[derive(Debug, Default)]
pub(crate) struct Permits {
    passes: [Option<Pass>; KINDS],
    held: u8,
}

/// Why an attempt was not admitted.
#[derive(Debug)]
pub(crate) enum Refusal {
    RateLimited(RateLimited),
    /// The concurrency limit stayed full for as long as the attempt could wait.
    Concurrency(ConcurrencyFull),
    /// The breaker is open, or its bulkhead full.
    Breaker(Rejected),
    /// The throttle dropped the attempt.
    Throttled,
}

/// What an attempt's admission comes to.
pub(crate) enum Admit {
    /// Every guard let it through: its passes are in its permits.
    Admitted,
    Refused(Refusal),
    /// A guard's answer is not there yet: wait with [`Guards::poll_wait`].
    Wait(Box<Wait>),
}

/// An admission waiting for a guard: the rate limit's fleet deciding on the slot, or the slot
/// to start. Boxed: only a paced attempt waits, and the path's state stays small for the rest.
pub(crate) struct Wait {
    /// The guard waited for.
    at: usize,
    /// The request's deadline, for the guards after it that wait too.
    deadline: Option<Instant>,
    waiting: Waiting,
}

enum Waiting {
    Decision(Acquire),
    Slot(Pin<Box<Sleep>>),
    /// A place among the attempts in flight.
    Place(AcquirePlace),
}

/// What the guards are told about the attempt they admit.
pub(crate) struct Ask<'a, T: FnOnce() -> u64> {
    pub(crate) head: &'a Parts,
    /// The request's weight in tokens, asked only of a limit that counts tokens.
    pub(crate) tokens: T,
    /// The request's deadline: a slot is waited for only until then.
    pub(crate) deadline: Option<Instant>,
}

/// Told of each rate-limit slot reserved, and when it starts (for the metrics).
pub(crate) type OnSlot<'a> = &'a mut dyn FnMut(Instant, &RateLimit);

impl Guard {
    /// Its place in the order.
    fn rank(&self) -> usize {
        match self {
            Self::RateLimit(_) => 0,
            Self::Concurrency(_) => 1,
            Self::Breaker(_) => 2,
            Self::Throttle(_) => 3,
        }
    }
}

impl Guards {
    /// The guards with `guard` in its place (replacing one of its kind).
    pub(crate) fn with(mut self, guard: Guard) -> Self {
        self.list.retain(|held| held.rank() != guard.rank());
        let at = self.list.partition_point(|held| held.rank() < guard.rank());
        self.list.insert(at, guard);
        self
    }

    /// The guards without the one of `guard`'s kind.
    pub(crate) fn without(mut self, kind: fn(&Guard) -> bool) -> Self {
        self.list.retain(|held| !kind(held));
        self
    }

    pub(crate) fn rate_limit(&self) -> Option<&RateLimit> {
        self.list.iter().find_map(|guard| match guard {
            Guard::RateLimit(limit) => Some(limit),
            _ => None,
        })
    }

    pub(crate) fn concurrency(&self) -> Option<&ConcurrencyLimit> {
        self.list.iter().find_map(|guard| match guard {
            Guard::Concurrency(limit) => Some(limit),
            _ => None,
        })
    }

    pub(crate) fn breaker(&self) -> Option<&CircuitBreaker> {
        self.list.iter().find_map(|guard| match guard {
            Guard::Breaker(breaker) => Some(breaker),
            _ => None,
        })
    }

    pub(crate) fn throttle(&self) -> Option<&AdaptiveThrottle> {
        self.list.iter().find_map(|guard| match guard {
            Guard::Throttle(throttle) => Some(throttle),
            _ => None,
        })
    }

    /// Whether the breaker is open now (its wait not over).
    pub(crate) fn breaker_open(&self) -> bool {
        self.breaker()
            .is_some_and(|breaker| breaker.state() == State::Open)
    }

    /// Admits an attempt past every guard, in order, its passes written into `permits` (empty:
    /// a new attempt's). A refusal gives back what the guards before it granted.
    pub(crate) fn admit<T: FnOnce() -> u64>(
        &self,
        permits: &mut Permits,
        ask: Ask<'_, T>,
        on_slot: OnSlot<'_>,
    ) -> Admit {
        let deadline = ask.deadline;
        self.admit_from(0, permits, Some(ask), deadline, on_slot)
    }

    /// Admits past the guards from the `at`-th on (`ask`: none once the rate limit, the only
    /// guard that reads it, has decided; `deadline`: the request's).
    fn admit_from<T: FnOnce() -> u64>(
        &self,
        at: usize,
        permits: &mut Permits,
        mut ask: Option<Ask<'_, T>>,
        deadline: Option<Instant>,
        on_slot: OnSlot<'_>,
    ) -> Admit {
        for (index, guard) in self.list.iter().enumerate().skip(at) {
            let pass = match guard {
                Guard::RateLimit(limit) => {
                    let Some(ask) = ask.take() else { continue };
                    let tokens = if limit.weighs_tokens(ask.head) {
                        (ask.tokens)()
                    } else {
                        0
                    };
                    let mut acquire = limit.acquire(ask.head, tokens, ask.deadline);
                    let Some(decision) = acquire.now() else {
                        let waiting = Waiting::Decision(acquire);
                        return Admit::Wait(Box::new(Wait {
                            at: index,
                            deadline,
                            waiting,
                        }));
                    };
                    match self.reserved(index, decision, deadline, permits, on_slot) {
                        Some(wait_or_refusal) => return wait_or_refusal,
                        None => continue,
                    }
                }
                Guard::Concurrency(limit) => match limit.try_acquire() {
                    Ok(permit) => Pass::Concurrency(permit),
                    Err(_) => {
                        let waiting = Waiting::Place(limit.acquire(deadline));
                        return Admit::Wait(Box::new(Wait {
                            at: index,
                            deadline,
                            waiting,
                        }));
                    }
                },
                Guard::Breaker(breaker) => match breaker.try_acquire() {
                    Ok(permit) => Pass::Breaker(permit),
                    Err(rejected) => return refused(permits, Refusal::Breaker(rejected)),
                },
                Guard::Throttle(throttle) => {
                    let admitted = if permits.probe() {
                        Ok(throttle.exempt())
                    } else {
                        throttle.try_acquire()
                    };
                    match admitted {
                        Ok(permit) => Pass::Throttle(permit),
                        Err(_) => return refused(permits, Refusal::Throttled),
                    }
                }
            };
            permits.hold(index, pass);
        }
        Admit::Admitted
    }

    /// The rate limit (the `at`-th guard) decided on the attempt's slot: `None` when the slot is
    /// free now (kept in `permits`), else the wait for it or the refusal.
    fn reserved(
        &self,
        at: usize,
        decision: Result<Reservation, RateLimited>,
        deadline: Option<Instant>,
        permits: &mut Permits,
        on_slot: OnSlot<'_>,
    ) -> Option<Admit> {
        let slot = match decision {
            Ok(slot) => slot,
            Err(limited) => return Some(refused(permits, Refusal::RateLimited(limited))),
        };
        let start = slot.start();
        if let Some(limit) = self.rate_limit() {
            on_slot(start, limit);
        }
        permits.hold(at, Pass::Slot(Box::new(slot)));
        // Read after the reservation: a slot free now starts at the limit's own reading of the
        // clock, later than this step's, and waiting for it would still cost a timer rounded up
        // to the next millisecond.
        if start <= Instant::now() {
            return None;
        }
        let waiting = Waiting::Slot(Box::pin(tokio::time::sleep_until(start)));
        Some(Admit::Wait(Box::new(Wait {
            at,
            deadline,
            waiting,
        })))
    }

    /// Polls what the admission waits for; once it comes, admits past the guards after it.
    pub(crate) fn poll_wait(
        &self,
        wait: &mut Wait,
        permits: &mut Permits,
        on_slot: OnSlot<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<Admit> {
        match &mut wait.waiting {
            Waiting::Decision(acquire) => {
                let decision = ready!(Pin::new(acquire).poll(cx));
                if let Some(admit) =
                    self.reserved(wait.at, decision, wait.deadline, permits, on_slot)
                {
                    let Admit::Wait(paced) = admit else {
                        return Poll::Ready(admit);
                    };
                    *wait = *paced;
                    return self.poll_wait(wait, permits, on_slot, cx);
                }
            }
            Waiting::Slot(sleep) => ready!(sleep.as_mut().poll(cx)),
            Waiting::Place(acquire) => match ready!(Pin::new(acquire).poll(cx)) {
                Ok(permit) => permits.hold(wait.at, Pass::Concurrency(permit)),
                Err(full) => return Poll::Ready(refused(permits, Refusal::Concurrency(full))),
            },
        }
        let next = wait.at + 1;
        let deadline = wait.deadline;
        Poll::Ready(self.admit_from::<fn() -> u64>(next, permits, None, deadline, on_slot))
    }
}

/// The attempt is refused for `refusal`: the passes taken before are given back.
fn refused(permits: &mut Permits, refusal: Refusal) -> Admit {
    for pass in permits.held() {
        *pass = None;
    }
    Admit::Refused(refusal)
}

impl Refusal {
    /// The reason the refused attempt ends with.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            Self::RateLimited(_) => Reason::RateLimitedLocally,
            Self::Concurrency(full) => full.outcome().reason(),
            Self::Breaker(rejected) => rejected.outcome().reason(),
            Self::Throttled => Reason::Throttled,
        }
    }
}

/// Every pass follows its guard's protocol: told how the attempt ended.
impl Permit for Pass {
    fn record(self, outcome: &Outcome, headers: &HeaderMap) {
        match self {
            // Never sent: given back.
            Self::Slot(_) => {}
            Self::RateLimit(permit) => Permit::record(*permit, outcome, headers),
            Self::Concurrency(permit) => Permit::record(permit, outcome, headers),
            Self::Breaker(permit) => Permit::record(permit, outcome, headers),
            Self::Throttle(permit) => Permit::record(permit, outcome, headers),
        }
    }
}

impl Pass {
    /// For a rate limit's pass of an attempt that succeeded, what corrects the limit's token
    /// weight to the answer's usage, if it does.
    fn usage(&self) -> Option<Usage> {
        match self {
            Self::RateLimit(permit) => permit.usage(),
            _ => None,
        }
    }

    /// The attempt's end says nothing about the backend (it lost a race, or a stall cut it): the
    /// breaker frees its place and counts nothing, the throttle forgets it, a slot sent stays
    /// spent.
    fn forget(self) {
        if let Self::Throttle(permit) = self {
            permit.forget();
        }
    }
}

impl Permits {
    /// The guard at `at` admitted the attempt with `pass`.
    fn hold(&mut self, at: usize, pass: Pass) {
        self.passes[at] = Some(pass);
        self.held = self.held.max(at as u8 + 1);
    }

    /// The places that may hold a pass.
    fn held(&mut self) -> &mut [Option<Pass>] {
        &mut self.passes[..usize::from(self.held)]
    }

    /// Whether no guard holds a pass.
    pub(crate) fn is_empty(&self) -> bool {
        self.passes.iter().all(Option::is_none)
    }

    /// Whether the breaker let the attempt through as a half-open probe.
    fn probe(&self) -> bool {
        self.passes[..usize::from(self.held)]
            .iter()
            .flatten()
            .any(|pass| matches!(pass, Pass::Breaker(permit) if permit.is_probe()))
    }

    /// The attempt goes: a rate-limit slot is spent.
    pub(crate) fn send(&mut self) {
        for pass in self.held() {
            if let Some(Pass::Slot(_)) = pass
                && let Some(Pass::Slot(slot)) = pass.take()
            {
                *pass = Some(Pass::RateLimit(Box::new(slot.send())));
            }
        }
    }

    /// The attempt ended with `outcome` (`headers`: its answer's): every pass is told. For a
    /// success, what corrects the rate limit's token weight to the answer's usage, if it does.
    #[inline]
    pub(crate) fn record(&mut self, outcome: &Outcome, headers: &HeaderMap) -> Option<Usage> {
        let mut usage = None;
        for pass in self.held().iter_mut().filter_map(Option::take) {
            if outcome.is_success() && usage.is_none() {
                usage = pass.usage();
            }
            pass.record(outcome, headers);
        }
        usage
    }

    /// The passes to be told how a response's body ends, not its head (an event stream may
    /// still break after its first content): the breaker's, and the concurrency limit's, whose
    /// place the stream holds until its end.
    pub(crate) fn take_body_end(&mut self) -> Permits {
        let mut body_end = Permits::default();
        for (at, pass) in self.held().iter_mut().enumerate() {
            if let Some(Pass::Breaker(_) | Pass::Concurrency(_)) = pass
                && let Some(pass) = pass.take()
            {
                body_end.hold(at, pass);
            }
        }
        body_end
    }

    /// The concurrency limit's pass, taken out to be held by a whole answer's body while it is
    /// read (told the outcome at the head, it frees its place when the body ends).
    pub(crate) fn take_place(&mut self) -> Option<ConcurrencyPermit> {
        if self.held == 0 {
            return None;
        }
        let place =
            (self.held().iter_mut()).find(|pass| matches!(pass, Some(Pass::Concurrency(_))))?;
        match place.take() {
            Some(Pass::Concurrency(permit)) => Some(permit),
            _ => None,
        }
    }

    /// Ready when a stall opened the breaker since the attempt was admitted: the attempt is to
    /// be dropped, and counts for nothing with the throttle (it learns from answers, and a black
    /// hole's silence would only leave it drops to unlearn after the recovery).
    pub(crate) fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<BreakerOpen> {
        let breaker = self.held().iter_mut().find_map(|pass| match pass {
            Some(Pass::Breaker(permit)) => Some(permit),
            _ => None,
        });
        let Some(breaker) = breaker else {
            return Poll::Pending;
        };
        let open = ready!(breaker.poll_cut(cx));
        self.forget();
        Poll::Ready(open)
    }

    /// The attempt lost a race to another attempt of its request (a hedge's) and is cancelled:
    /// being the slower of two says nothing about whether the backend accepts (see
    /// [`Pass::forget`]).
    pub(crate) fn forget(&mut self) {
        for pass in self.held().iter_mut().filter_map(Option::take) {
            pass.forget();
        }
    }

    /// The request's deadline passed with the attempt in flight: a timeout, which the breaker
    /// counts as a health failure and the throttle as not accepted. (A rate limit learns nothing
    /// from a silence.)
    pub(crate) fn time_out(&mut self) {
        let timeout = Outcome::retryable(Reason::DeadlineExceeded).with_accepted(false);
        self.record(&timeout, &HeaderMap::new());
    }
}
