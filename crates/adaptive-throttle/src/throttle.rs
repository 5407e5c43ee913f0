//! [`AdaptiveThrottle`]: the shared, lock-free state behind the throttle layer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use stormguard_classify::{Outcome, Permit};
use stormguard_numbers::random::RandomSource;
use stormguard_numbers::window::SlidingWindow;

use crate::sync::{AtomicBool, AtomicU32, Ordering};
use crate::{ThrottleConfig, Throttled};

/// Slices the window is cut into: it slides in steps of `window / SLICES`. Twenty slices make the
/// 2 s default slide in 100 ms steps, so counts age out at most 5% of a window late.
const SLICES: usize = 20;

/// The window's counter of requests offered: dropped locally, or sent and recorded.
const REQUESTS: usize = 0;

/// The window's counter of requests the backend accepted.
const ACCEPTS: usize = 1;

/// Client-side adaptive throttling (Google SRE book, "Handling Overload", "Client-Side
/// Throttling"), shared by every clone.
///
/// Each request offered to the backend is counted in `requests` (a dropped one when it is dropped,
/// a sent one when its outcome is recorded); each request the backend *accepted* is counted in
/// `accepts`. A new request is dropped locally with probability
///
/// ```text
/// P_drop = max(0, (requests - K * accepts) / (requests + 1))
/// ```
///
/// capped at [`max_probability`](ThrottleConfig::max_probability) and zero while the request
/// rate is below [`min_rate`](ThrottleConfig::min_rate). Counts live in a sliding window that
/// decays slice by slice (see the crate docs for the window, the decay and the recovery run).
///
/// Cloning is cheap (an `Arc`): all clones share the counts and the configuration, which is fixed
/// when the throttle is made. [`try_acquire`](Self::try_acquire) and the [`ThrottlePermit`]'s
/// record take no lock: they read or add to the atomic counters of a
/// [`SlidingWindow`](stormguard_numbers::window::SlidingWindow). Under `--cfg stormguard_loom`
/// the atomics are loom's models: `tests/loom.rs` explores every interleaving of racing records,
/// snapshots and recovery runs.
#[derive(Clone)]
pub struct AdaptiveThrottle {
    shared: Arc<Shared>,
}

/// What the throttle saw over its window, as returned by [`AdaptiveThrottle::snapshot`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ThrottleSnapshot {
    /// Requests over the window: those dropped locally, and those sent whose outcome has been
    /// recorded (requests still in flight are not counted yet).
    pub requests: u64,
    /// Requests the backend accepted over the window.
    pub accepts: u64,
    /// Probability that the next request is dropped locally, after the cap and the minimum rate.
    pub probability: f64,
    /// The window the counts cover, as in use: a whole number of slices.
    pub window: Duration,
}

struct Shared {
    config: ThrottleConfig,
    window: SlidingWindow<2>,
    random: RandomSource,
    /// Set while the last computed probability was above zero: accepts then count towards the
    /// recovery run.
    throttling: AtomicBool,
    /// Accepts recorded in a row (no rejection in between) while throttling.
    run: AtomicU32,
}

/// Requests and accepts summed over the window.
#[derive(Clone, Copy, Debug)]
struct Totals {
    requests: u64,
    accepts: u64,
}

impl AdaptiveThrottle {
    /// A throttle with the settings of `config`.
    pub fn new(config: ThrottleConfig) -> Self {
        let random = RandomSource::from_seed(config.seed());
        Self {
            shared: Arc::new(Shared {
                config,
                window: SlidingWindow::new(config.window(), SLICES),
                random,
                throttling: AtomicBool::new(false),
                run: AtomicU32::new(0),
            }),
        }
    }

    /// The settings this throttle was made with.
    pub fn config(&self) -> &ThrottleConfig {
        &self.shared.config
    }

    /// Draw for one request: a [`ThrottlePermit`] means send it, `Err(Throttled)` means drop it
    /// locally.
    ///
    /// A dropped request is counted in `requests` at once (the SRE book counts every request the
    /// application attempted, and that is what keeps the pass rate near K times the accept rate).
    /// A request let through is counted when its permit is told the outcome
    /// ([`Permit::record`]), or dropped untold, which counts it as not accepted: a backend that
    /// hangs until the caller gives up must not look healthy.
    ///
    /// Counting sent requests on completion rather than on sending is a deliberate departure from
    /// the book: with answers that take seconds (LLM generations) and a 2 s window, requests still
    /// in flight would otherwise look like rejections, and a cold start with a burst of concurrent
    /// requests would throttle a healthy backend before its first answer. In a steady state both
    /// count the same rate.
    pub fn try_acquire(&self) -> Result<ThrottlePermit, Throttled> {
        let shared = &*self.shared;
        let epoch = shared.window.epoch_now();
        let probability = shared.probability(shared.totals(epoch));
        shared
            .throttling
            .store(probability > 0.0, Ordering::Relaxed);
        if probability > 0.0 && shared.random.f64() < probability {
            shared.window.add(epoch, REQUESTS);
            return Err(Throttled);
        }
        Ok(self.exempt())
    }

    /// A permit without a draw, for an attempt another guard admits on its own terms: a circuit
    /// breaker's half-open probe, which a throttle still full of the outage would otherwise drop,
    /// holding the breaker open. Its outcome counts like any other, so the throttle learns of the
    /// recovery from the probe's answer.
    pub fn exempt(&self) -> ThrottlePermit {
        ThrottlePermit {
            throttle: Some(self.clone()),
        }
    }

    /// Counts a request that was let through: in `requests`, and in `accepts` if the backend
    /// accepted it (it did the work and answered, even with an error of the caller's making).
    pub(crate) fn count(&self, accepted: bool) {
        let shared = &*self.shared;
        let epoch = shared.window.epoch_now();
        // The request before its accept: see `Shared::totals`.
        shared.window.add(epoch, REQUESTS);
        if !accepted {
            shared.run.store(0, Ordering::Relaxed);
            return;
        }
        shared.window.add(epoch, ACCEPTS);
        let needed = shared.config.recovery_run();
        if needed == 0 || !shared.throttling.load(Ordering::Relaxed) {
            return;
        }
        // AcqRel: the accept that completes the run reads every earlier step of it, so what each
        // accept of the run counted before its step is cleared with the window. Relaxed, an
        // accept could outlive the clear without its request: an accept of nothing, which would
        // mask K rejections.
        if shared.run.fetch_add(1, Ordering::AcqRel).saturating_add(1) >= needed {
            shared.run.store(0, Ordering::Relaxed);
            shared.window.clear(epoch);
            shared.throttling.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a request offered now is dropped with a probability below `share`: at once (no
    /// sum over the window) when the last draw dropped nothing, as it does while the backend is
    /// healthy; else from the window. For a router that asks it of several backends at every
    /// request (a failover's balancer).
    pub fn drops_less_than(&self, share: f64) -> bool {
        !self.shared.throttling.load(Ordering::Relaxed) || self.probability() < share
    }

    /// Probability that a request offered now is dropped.
    pub fn probability(&self) -> f64 {
        self.snapshot().probability
    }

    /// Requests, accepts and drop probability over the current window.
    pub fn snapshot(&self) -> ThrottleSnapshot {
        let shared = &*self.shared;
        let totals = shared.totals(shared.window.epoch_now());
        ThrottleSnapshot {
            requests: totals.requests,
            accepts: totals.accepts,
            probability: shared.probability(totals),
            window: shared.window.span(),
        }
    }
}

impl Shared {
    /// Requests and accepts over the window ending at `epoch`.
    fn totals(&self, epoch: u64) -> Totals {
        // Each slot's requests before its accepts: `count` counts a request before its accept,
        // in the same slot, so the accepts summed include the accept of every request already
        // summed, but for records caught between their two counts (one per thread at most). In
        // the other order, every request recorded between the two reads would look like a
        // rejection, and a busy, healthy backend would see drops.
        let sums = self.window.sums(epoch);
        let (requests, accepts) = (sums[REQUESTS], sums[ACCEPTS]);
        // Accepts recorded while the requests were summed may outnumber them; every accept is
        // also a request, so the window never reports more accepts than requests.
        Totals {
            requests,
            accepts: accepts.min(requests),
        }
    }

    /// `max(0, (requests - K * accepts) / (requests + 1))`, capped, and zero below the minimum rate.
    fn probability(&self, totals: Totals) -> f64 {
        let requests = totals.requests as f64;
        let accepts = totals.accepts as f64;
        let span = self.window.span().as_secs_f64();
        if requests < self.config.min_rate() * span {
            return 0.0;
        }
        let p = (requests - self.config.k() * accepts) / (requests + 1.0);
        p.clamp(0.0, self.config.max_probability())
    }
}

impl Default for AdaptiveThrottle {
    /// A throttle with [`ThrottleConfig::default`]: K = 2 over a 2 s window, capped at 99%, no
    /// drops below 5 requests per second, recovery after 10 accepts in a row.
    fn default() -> Self {
        Self::new(ThrottleConfig::default())
    }
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottle")
            .field("config", &self.shared.config)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

/// An attempt the [`AdaptiveThrottle`] let through ([`try_acquire`](AdaptiveThrottle::try_acquire)),
/// following stormguard's admission protocol ([`Permit`]): told the attempt's outcome, it counts
/// the attempt in `requests`, and in `accepts` if the outcome
/// [is accepted](Outcome::is_accepted); dropped untold (the caller gave up, a deadline passed),
/// it counts the attempt as not accepted.
#[must_use = "dropping the permit counts the attempt as not accepted"]
pub struct ThrottlePermit {
    /// `None` once counted.
    throttle: Option<AdaptiveThrottle>,
}

impl ThrottlePermit {
    /// The attempt counts for nothing: it was cut on this side with no answer to judge (a
    /// circuit breaker's stall cut it), and counting a black hole's silence would only leave the
    /// throttle drops to unlearn once the backend is back.
    pub fn forget(mut self) {
        self.throttle = None;
    }
}

impl Permit for ThrottlePermit {
    fn record(mut self, outcome: &Outcome, _headers: &HeaderMap) {
        if let Some(throttle) = self.throttle.take() {
            throttle.count(outcome.is_accepted());
        }
    }
}

impl Drop for ThrottlePermit {
    fn drop(&mut self) {
        if let Some(throttle) = self.throttle.take() {
            throttle.count(false);
        }
    }
}

impl fmt::Debug for ThrottlePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottlePermit")
            .field("counted", &self.throttle.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    fn throttle(config: ThrottleConfig) -> AdaptiveThrottle {
        AdaptiveThrottle::new(config)
    }

    /// Tells `permit` that the backend accepted the attempt, or rejected it.
    fn answer(permit: ThrottlePermit, accepted: bool) {
        let outcome = if accepted {
            Outcome::success()
        } else {
            Outcome::retryable(stormguard_classify::Reason::Overloaded).with_accepted(false)
        };
        permit.record(&outcome, &HeaderMap::new());
    }

    /// The protocol's two endings of an attempt: told, it counts as its outcome says; dropped
    /// untold, as not accepted; forgotten, not at all.
    #[tokio::test(start_paused = true)]
    async fn a_permit_counts_once_as_told_dropped_or_forgotten() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(0.0));
        answer(throttle.try_acquire().unwrap(), true);
        drop(throttle.try_acquire().unwrap());
        throttle.try_acquire().unwrap().forget();
        let rate_limited = Outcome::retryable(stormguard_classify::Reason::RateLimited);
        throttle.exempt().record(&rate_limited, &HeaderMap::new());
        let snapshot = throttle.snapshot();
        assert_eq!((snapshot.requests, snapshot.accepts), (3, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn rejections_apply_at_once_within_a_slice() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(0.0).with_seed(5));
        // Zero probability: the request passes.
        assert!(throttle.try_acquire().is_ok());
        // Within the same slice (the clock does not move), the backend starts rejecting.
        for _ in 0..200 {
            throttle.count(false);
        }
        let expected = throttle.probability();
        assert!(expected > 0.9, "{expected}");
        let passed = (0..1000).filter(|_| throttle.try_acquire().is_ok()).count();
        // The drop probability applies at once, not from the next slice on.
        assert!(passed < 100, "{passed} of 1000 passed at P = {expected}");
    }

    /// Offer `n` requests, one per millisecond, to a backend that answers with `accepted`;
    /// returns how many reached it.
    async fn offer(throttle: &AdaptiveThrottle, n: u32, accepted: bool) -> u32 {
        let mut sent = 0;
        for _ in 0..n {
            if let Ok(permit) = throttle.try_acquire() {
                answer(permit, accepted);
                sent += 1;
            }
            tokio::time::advance(TICK).await;
        }
        sent
    }

    #[test]
    fn hostile_configuration_is_sanitized() {
        let throttle = throttle(
            ThrottleConfig::default()
                .with_k(f64::NAN)
                .with_window(Duration::ZERO)
                .with_max_probability(f64::NAN)
                .with_min_rate(f64::NAN),
        );
        let config = throttle.config();
        assert_eq!(config.k(), ThrottleConfig::DEFAULT_K);
        assert_eq!(throttle.snapshot().window, Duration::from_millis(20));
        assert_eq!(
            config.max_probability(),
            ThrottleConfig::DEFAULT_MAX_PROBABILITY
        );
        assert_eq!(config.min_rate(), 0.0);

        let huge = AdaptiveThrottle::new(ThrottleConfig::default().with_window(Duration::MAX));
        assert!(huge.snapshot().window > Duration::from_secs(1 << 40));
        assert_eq!(huge.snapshot().probability, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_infinite_minimum_rate_never_drops() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(f64::INFINITY));
        assert_eq!(offer(&throttle, 5_000, false).await, 5_000);
        assert_eq!(throttle.probability(), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_cap_never_drops() {
        let throttle = throttle(ThrottleConfig::default().with_max_probability(0.0));
        assert_eq!(offer(&throttle, 5_000, false).await, 5_000);
    }

    /// Clones are one throttle: what one records, the other counts and draws against, and they
    /// read the same configuration. There is nothing to set on either of them.
    #[tokio::test(start_paused = true)]
    async fn clones_share_counts_and_configuration() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(0.0).with_seed(3));
        let clone = throttle.clone();
        offer(&throttle, 100, true).await;
        assert_eq!(clone.snapshot().requests, 100);
        assert_eq!(clone.snapshot().accepts, 100);
        offer(&clone, 50, false).await;
        let (one, other) = (throttle.snapshot(), clone.snapshot());
        assert_eq!(one, other);
        assert_eq!((one.requests, one.accepts), (150, 100));
        assert_eq!(clone.config(), throttle.config());
        assert_eq!(clone.config().min_rate(), 0.0);
        assert_eq!(clone.config().seed(), Some(3));

        // 250 failures more, through the clone: both see the same probability, above zero.
        offer(&clone, 250, false).await;
        let p = throttle.probability();
        assert!(p > 0.0, "{p}");
        assert_eq!(clone.probability(), p);
    }

    /// The router's check: a throttle that dropped nothing at its last draw answers at once;
    /// one that is dropping reads its window.
    #[tokio::test(start_paused = true)]
    async fn drops_less_than_reads_the_window_only_while_dropping() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(0.0));
        assert!(throttle.drops_less_than(0.5));
        for _ in 0..1_000 {
            throttle.count(false);
        }
        // Not drawn since: the last draw dropped nothing.
        assert!(throttle.drops_less_than(0.5));
        let _ = throttle.try_acquire();
        assert!(!throttle.drops_less_than(0.5));
        assert!(throttle.drops_less_than(1.0));
    }

    /// Decisions of a throttle held at `P_drop = 0.5` (the cap) by a window of failures.
    fn drops_at_one_half(config: ThrottleConfig) -> Vec<bool> {
        let throttle = throttle(config.with_max_probability(0.5).with_min_rate(0.0));
        for _ in 0..1_000 {
            throttle.count(false);
        }
        assert_eq!(throttle.probability(), 0.5);
        (0..10_000)
            .map(|_| throttle.try_acquire().is_err())
            .collect()
    }

    /// Seeded throttles replay the same drops; another seed drops others; all drop at the rate
    /// the formula gives (half of 10,000, within four standard deviations of 50).
    #[tokio::test(start_paused = true)]
    async fn seeded_throttles_replay_their_drops() {
        let first = drops_at_one_half(ThrottleConfig::default().with_seed(99));
        assert_eq!(
            first,
            drops_at_one_half(ThrottleConfig::default().with_seed(99))
        );
        let other = drops_at_one_half(ThrottleConfig::default().with_seed(100));
        assert_ne!(first, other);
        let unseeded = drops_at_one_half(ThrottleConfig::default());
        for decisions in [&first, &other, &unseeded] {
            let dropped = decisions.iter().filter(|&&dropped| dropped).count();
            assert!((4_800..=5_200).contains(&dropped), "{dropped}");
        }
    }

    /// The recovery run clears the window; if the backend was not really back, the cleared
    /// window has no accepts to mask the failures, and drops resume after about a dozen requests
    /// (the first ten are the minimum rate).
    #[tokio::test(start_paused = true)]
    async fn a_false_recovery_costs_about_a_dozen_requests() {
        let throttle = throttle(ThrottleConfig::default().with_seed(1));
        offer(&throttle, 5_000, false).await;
        assert_eq!(throttle.probability(), 0.99);

        // Ten lucky accepts in a row.
        let mut lucky = 0;
        while lucky < ThrottleConfig::DEFAULT_RECOVERY_RUN {
            if let Ok(permit) = throttle.try_acquire() {
                lucky += 1;
                answer(permit, true);
            }
            tokio::time::advance(TICK).await;
        }
        let snapshot = throttle.snapshot();
        assert_eq!((snapshot.requests, snapshot.accepts), (0, 0));
        assert_eq!(snapshot.probability, 0.0);

        // The backend is still dead.
        let mut until_dropping = 0;
        while throttle.probability() < 0.9 {
            offer(&throttle, 1, false).await;
            until_dropping += 1;
        }
        assert!((10..=15).contains(&until_dropping), "{until_dropping}");
    }

    /// A run broken by a rejection starts over.
    #[tokio::test(start_paused = true)]
    async fn a_rejection_breaks_the_run() {
        let throttle = throttle(
            ThrottleConfig::default()
                .with_max_probability(0.5)
                .with_seed(8),
        );
        offer(&throttle, 3_000, false).await;
        let mut accepted = 0;
        let mut n = 0_u32;
        while accepted < 50 {
            if let Ok(permit) = throttle.try_acquire() {
                // Nine accepts, one rejection, repeated: never ten in a row.
                let accept = n % 10 != 9;
                answer(permit, accept);
                accepted += u32::from(accept);
                n += 1;
            }
            tokio::time::advance(TICK).await;
        }
        assert!(
            throttle.snapshot().requests > 1_000,
            "{:?}",
            throttle.snapshot()
        );
        assert_eq!(throttle.shared.run.load(Ordering::Relaxed), accepted % 9);
    }

    /// With the recovery run disabled, accepts never clear the window.
    #[tokio::test(start_paused = true)]
    async fn a_disabled_recovery_run_never_clears() {
        let throttle = throttle(ThrottleConfig::default().with_recovery_run(0).with_seed(9));
        offer(&throttle, 3_000, false).await;
        let before = throttle.snapshot();
        offer(&throttle, 200, true).await;
        let after = throttle.snapshot();
        assert!(after.requests >= before.requests, "{before:?} {after:?}");
        assert!(after.probability > 0.9, "{after:?}");
    }

    /// Requests in flight are counted when their outcome arrives: a cold start with a burst of
    /// concurrent requests is not throttled before the first answers.
    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_are_not_counted() {
        let throttle = throttle(ThrottleConfig::default().with_min_rate(0.0));
        let in_flight: Vec<ThrottlePermit> =
            (0..16).map(|_| throttle.try_acquire().unwrap()).collect();
        assert_eq!(throttle.snapshot().requests, 0);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        for permit in in_flight {
            answer(permit, true);
        }
        let snapshot = throttle.snapshot();
        assert_eq!((snapshot.requests, snapshot.accepts), (16, 16));
        assert_eq!(snapshot.probability, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn debug_shows_configuration_and_counts() {
        let throttle = AdaptiveThrottle::default();
        offer(&throttle, 3, true).await;
        let debug = format!("{throttle:?}");
        assert!(debug.contains("k: 2.0"), "{debug}");
        assert!(debug.contains("requests: 3"), "{debug}");
    }
}
