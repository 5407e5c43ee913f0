//! [`ConcurrencyLimit`], the shared limit, and the [`ConcurrencyPermit`] of one attempt.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use http::HeaderMap;
use stormguard_classify::{GrpcCode, Outcome, Permit, Reason};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{ConcurrencyConfig, ConcurrencyFull};

/// An adaptive limit on the attempts in flight to one backend, shared by every clone: see the
/// [crate docs](crate) for the algorithm.
///
/// ```
/// use stormguard_classify::{Outcome, Permit, Reason};
/// use stormguard_concurrency::{ConcurrencyConfig, ConcurrencyLimit};
///
/// let limit = ConcurrencyLimit::new(ConcurrencyConfig::default().with_initial(10));
/// let permits: Vec<_> = (0..10).map(|_| limit.try_acquire().unwrap()).collect();
/// assert!(limit.try_acquire().is_err(), "ten in flight is the limit");
///
/// // The provider answers one of them with 529 Overloaded: the limit shrinks by a tenth.
/// let mut permits = permits.into_iter();
/// let overloaded = Outcome::retryable(Reason::Overloaded).with_accepted(false);
/// permits.next().unwrap().record(&overloaded, &http::HeaderMap::new());
/// assert_eq!(limit.snapshot().limit, 9);
/// assert_eq!(limit.snapshot().in_flight, 9);
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimit {
    shared: Arc<Shared>,
}

struct Shared {
    config: ConcurrencyConfig,
    state: Mutex<State>,
    /// Woken when a slot frees or the limit grows, for the attempts waiting for one.
    freed: Notify,
}

/// The limit's state: one short critical section per admission and per end, no await inside.
#[derive(Debug)]
struct State {
    /// Fractional, so that growth can add a fraction per answer; the attempts admitted are its
    /// floor.
    limit: f64,
    in_flight: u32,
    /// How many overload signals have counted: a permit admitted before the last one cannot
    /// shrink the limit again (one reduction per window of attempts). Zero: the limit is still in
    /// its slow start.
    epoch: u64,
    shrunk: u64,
    grown: u64,
}

/// What the limit is doing, for metrics and health checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Attempts it lets in flight now.
    pub limit: u32,
    /// Attempts in flight now (a streamed answer counts until its body ends).
    pub in_flight: u32,
    /// Times it shrank since it was made (an overload signal at the floor is not counted).
    pub shrunk: u64,
    /// Times its whole part grew by one since it was made.
    pub grown: u64,
}

/// What an attempt's end tells the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    /// The provider is over its capacity: 429, 503, 529, an overloaded event, a timeout.
    Overload,
    /// The provider took the attempt and answered (a success, or a 4xx it judged).
    Healthy,
    /// Nothing about the provider's capacity: a dropped attempt, a transport failure, a 500.
    Nothing,
}

impl ConcurrencyLimit {
    /// A limit with `config`.
    pub fn new(config: ConcurrencyConfig) -> Self {
        let state = State {
            limit: f64::from(config.initial()),
            in_flight: 0,
            epoch: 0,
            shrunk: 0,
            grown: 0,
        };
        Self {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(state),
                freed: Notify::new(),
            }),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &ConcurrencyConfig {
        &self.shared.config
    }

    /// A slot now, or [`ConcurrencyFull`] when the limit's worth of attempts is in flight.
    pub fn try_acquire(&self) -> Result<ConcurrencyPermit, ConcurrencyFull> {
        let mut state = self.shared.lock();
        let limit = state.admitted();
        if state.in_flight >= limit {
            return Err(ConcurrencyFull::new(limit));
        }
        state.in_flight += 1;
        Ok(ConcurrencyPermit {
            shared: Some(Arc::clone(&self.shared)),
            epoch: state.epoch,
            went_with: state.in_flight,
            learnt: false,
        })
    }

    /// A slot, waited for while the limit is full, until the configured
    /// [`max_wait`](ConcurrencyConfig::max_wait) or `deadline`, whichever comes first; then
    /// [`ConcurrencyFull`]. Waiters are woken in the order they came as slots free (a new
    /// attempt may still take a slot freed before a waiter was woken).
    pub fn acquire(&self, deadline: Option<Instant>) -> Acquire {
        let limit = self.clone();
        let mut until = Instant::now() + self.shared.config.max_wait();
        if let Some(deadline) = deadline {
            until = until.min(deadline);
        }
        Acquire {
            future: Box::pin(async move { limit.wait_until(until).await }),
        }
    }

    async fn wait_until(self, until: Instant) -> Result<ConcurrencyPermit, ConcurrencyFull> {
        let mut expired = pin!(tokio::time::sleep_until(until));
        loop {
            let mut freed = pin!(self.shared.freed.notified());
            // Registered before trying, so a slot freed between the try and the wait wakes it.
            freed.as_mut().enable();
            let full = match self.try_acquire() {
                Ok(permit) => return Ok(permit),
                Err(full) => full,
            };
            let woken = poll_fn(|cx| {
                if freed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                expired.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if !woken {
                return Err(full);
            }
        }
    }

    /// What the limit is doing now.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.shared.lock();
        Snapshot {
            limit: state.admitted(),
            in_flight: state.in_flight,
            shrunk: state.shrunk,
            grown: state.grown,
        }
    }
}

impl Default for ConcurrencyLimit {
    /// A limit with [`ConcurrencyConfig::default`].
    fn default() -> Self {
        Self::new(ConcurrencyConfig::default())
    }
}

impl fmt::Debug for ConcurrencyLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("config", &self.shared.config)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a handful of numbers, each write whole: one left by a panicking thread
        // is still a valid state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An attempt admitted in `epoch` (with `went_with` in flight, itself included) ended with
    /// `signal`: the limit learns from it, and, if `free`, its slot is freed.
    fn settle(&self, epoch: u64, went_with: u32, signal: Signal, free: bool) {
        let mut state = self.lock();
        self.learn(&mut state, epoch, went_with, signal);
        if free {
            state.in_flight = state.in_flight.saturating_sub(1);
            drop(state);
            self.freed.notify_one();
        }
    }

    fn learn(&self, state: &mut State, epoch: u64, went_with: u32, signal: Signal) {
        let (min, max) = self.config.bounds();
        // Used if the limit was nearly full as the attempt went, or as it ends: a stream that
        // ran while others filled the limit counts, as in dialogue (which looks at the end).
        let used = state.used(self.config.used(), went_with.max(state.in_flight));
        match signal {
            Signal::Overload if epoch == state.epoch => {
                state.epoch += 1;
                if state.limit > f64::from(min) {
                    state.limit = (state.limit * self.config.backoff()).max(f64::from(min));
                    state.shrunk += 1;
                }
            }
            Signal::Healthy if used => {
                let before = state.admitted();
                // Slow start until the first overload signal (one more per answer: the limit
                // doubles in a window), then one more per window of answers.
                let step = if state.epoch == 0 {
                    1.0
                } else {
                    1.0 / state.limit
                };
                state.limit = (state.limit + step).min(f64::from(max));
                if state.admitted() > before {
                    state.grown += 1;
                }
            }
            Signal::Overload | Signal::Healthy | Signal::Nothing => {}
        }
    }
}

impl State {
    /// Whether `in_flight` attempts use the limit: at least the `share` of it.
    fn used(&self, share: f64, in_flight: u32) -> bool {
        f64::from(in_flight) >= (share * self.limit).floor()
    }

    /// The attempts the limit admits.
    fn admitted(&self) -> u32 {
        // `limit` stays within the configured u32 bounds, so the cast only drops the fraction.
        self.limit as u32
    }
}

/// The future of [`ConcurrencyLimit::acquire`]: a slot, or [`ConcurrencyFull`] once the wait is
/// over.
pub struct Acquire {
    future: Pin<Box<dyn Future<Output = Result<ConcurrencyPermit, ConcurrencyFull>> + Send>>,
}

impl Future for Acquire {
    type Output = Result<ConcurrencyPermit, ConcurrencyFull>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.future.as_mut().poll(cx)
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire").finish_non_exhaustive()
    }
}

/// One attempt's slot, held while it is in flight: for a streamed answer, until its body ends.
///
/// Told how the attempt ended ([`Permit::record`]), the limit learns from it: an overload
/// answer shrinks it, a healthy answer of an attempt that went or ended with the limit nearly full grows it.
/// Dropped untold (the caller gave up, the attempt lost a hedge's race), the slot is freed and the
/// limit learns nothing: a caller's impatience says nothing about the provider. A timeout must be
/// told as one to count.
pub struct ConcurrencyPermit {
    /// Taken when settled.
    shared: Option<Arc<Shared>>,
    epoch: u64,
    /// Attempts in flight as it went, itself included.
    went_with: u32,
    /// Told by [`learn`](Self::learn) already: what comes after only frees the slot.
    learnt: bool,
}

impl ConcurrencyPermit {
    /// Frees the slot, the limit learning nothing (what dropping it does).
    pub fn forget(self) {}

    /// Tells the limit how the attempt ended, and keeps the slot until the permit is dropped: for
    /// an answer whose provider is done (a whole JSON answer) but whose body is still being
    /// read. Told again, or dropped, it only frees the slot.
    pub fn learn(&mut self, outcome: &Outcome) {
        if let Some(shared) = &self.shared {
            let mut state = shared.lock();
            shared.learn(&mut state, self.epoch, self.went_with, signal(outcome));
            self.learnt = true;
        }
    }

    fn settle(&mut self, outcome: Option<&Outcome>) {
        if let Some(shared) = self.shared.take() {
            let signal = match outcome {
                Some(outcome) if !self.learnt => signal(outcome),
                _ => Signal::Nothing,
            };
            shared.settle(self.epoch, self.went_with, signal, true);
        }
    }
}

impl Permit for ConcurrencyPermit {
    fn record(mut self, outcome: &Outcome, _headers: &HeaderMap) {
        self.settle(Some(outcome));
    }
}

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        self.settle(None);
    }
}

impl fmt::Debug for ConcurrencyPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyPermit")
            .field("epoch", &self.epoch)
            .field("went_with", &self.went_with)
            .finish()
    }
}

/// What an outcome says about the provider's capacity. A 429 counts as overload even though it
/// may be a quota's: with the rate limit in front, the ones left are the provider's own pressure
/// (and a `insufficient_quota` 429 is accepted, so it is healthy here, the rate limit's business).
fn signal(outcome: &Outcome) -> Signal {
    let overload = matches!(
        outcome.reason(),
        Reason::RateLimited
            | Reason::Overloaded
            | Reason::Unavailable
            | Reason::Timeout
            | Reason::DeadlineExceeded
            | Reason::Grpc(
                GrpcCode::ResourceExhausted | GrpcCode::Unavailable | GrpcCode::DeadlineExceeded
            )
    );
    if overload && !outcome.is_accepted() {
        Signal::Overload
    } else if outcome.is_success() || outcome.is_accepted() {
        Signal::Healthy
    } else {
        Signal::Nothing
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn overloaded() -> Outcome {
        Outcome::retryable(Reason::Overloaded).with_accepted(false)
    }

    #[test]
    fn signals() {
        assert_eq!(signal(&Outcome::success()), Signal::Healthy);
        assert_eq!(signal(&overloaded()), Signal::Overload);
        let limited = Outcome::retryable(Reason::RateLimited).with_accepted(false);
        assert_eq!(signal(&limited), Signal::Overload);
        let quota = Outcome::fatal(Reason::QuotaExhausted);
        assert_eq!(signal(&quota), Signal::Healthy);
        let reset = Outcome::retryable(Reason::Transport).with_accepted(false);
        assert_eq!(signal(&reset), Signal::Nothing);
        let bug = Outcome::retryable(Reason::ServerError).with_accepted(false);
        assert_eq!(signal(&bug), Signal::Nothing);
    }

    #[test]
    fn one_shrink_per_window_of_attempts() {
        let limit = ConcurrencyLimit::new(ConcurrencyConfig::default().with_initial(20));
        let permits: Vec<_> = (0..20).flat_map(|_| limit.try_acquire()).collect();
        for permit in permits {
            permit.record(&overloaded(), &HeaderMap::new());
        }
        // Twenty 429s of one burst: one shrink, not twenty (0.9^20 would be 2).
        assert_eq!(limit.snapshot().limit, 18);
        assert_eq!(limit.snapshot().shrunk, 1);
        // An attempt admitted after the shrink shrinks it again.
        let permit = limit.try_acquire().unwrap();
        permit.record(&overloaded(), &HeaderMap::new());
        assert_eq!(limit.snapshot().limit, 16);
    }

    #[test]
    fn never_below_the_minimum_and_grows_from_it() {
        let config = ConcurrencyConfig::default()
            .with_initial(10)
            .with_bounds(3, 100);
        let limit = ConcurrencyLimit::new(config);
        for _ in 0..100 {
            let permit = limit.try_acquire().unwrap();
            permit.record(&overloaded(), &HeaderMap::new());
        }
        assert_eq!(limit.snapshot().limit, 3);
        // Three in flight at a time, each answered well: back above the floor within a window.
        for _ in 0..3 {
            let permits: Vec<_> = (0..3).flat_map(|_| limit.try_acquire()).collect();
            assert_eq!(permits.len(), 3);
            for permit in permits {
                permit.record(&Outcome::success(), &HeaderMap::new());
            }
        }
        assert!(limit.snapshot().limit >= 4, "{:?}", limit.snapshot());
    }

    #[test]
    fn a_permit_learns_at_the_head_and_frees_its_slot_when_dropped() {
        let limit = ConcurrencyLimit::new(ConcurrencyConfig::default().with_initial(10));
        let mut permit = limit.try_acquire().unwrap();
        permit.learn(&overloaded());
        assert_eq!((limit.snapshot().limit, limit.snapshot().in_flight), (9, 1));
        // Told again, it only frees its slot: one answer, one lesson.
        permit.record(&overloaded(), &HeaderMap::new());
        assert_eq!((limit.snapshot().limit, limit.snapshot().in_flight), (9, 0));
        assert_eq!(limit.snapshot().shrunk, 1);
    }

    #[test]
    fn dropped_permits_free_their_slot_and_teach_nothing() {
        let limit = ConcurrencyLimit::new(ConcurrencyConfig::default().with_initial(5));
        let permits: Vec<_> = (0..5).flat_map(|_| limit.try_acquire()).collect();
        assert_eq!(limit.snapshot().in_flight, 5);
        drop(permits);
        let snapshot = limit.snapshot();
        assert_eq!((snapshot.limit, snapshot.in_flight), (5, 0));
        assert_eq!((snapshot.shrunk, snapshot.grown), (0, 0));
    }
}
