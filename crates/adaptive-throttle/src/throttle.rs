//! [`AdaptiveThrottle`]: the shared, lock-free state behind the throttle layer.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::Throttled;
use crate::window::{Counter, Totals, Window};

/// Client-side adaptive throttling (Google SRE book, "Handling Overload", "Client-Side
/// Throttling"), shared by every clone.
///
/// Each request offered to the backend is counted in `requests` (a dropped one when it is dropped,
/// a sent one when its outcome is recorded); each request the backend *accepted* is counted in
/// `accepts`. A new request is dropped locally
/// with probability
///
/// ```text
/// P_drop = max(0, (requests - K * accepts) / (requests + 1))
/// ```
///
/// capped at [`with_max_probability`](Self::with_max_probability) and zero while the request
/// rate is below [`with_min_rate`](Self::with_min_rate). Counts live in a sliding window that
/// decays slice by slice (see the crate docs for the window, the decay and the recovery path).
///
/// Cloning is cheap (an `Arc`); all clones share the counts. [`try_acquire`](Self::try_acquire)
/// and [`record`](Self::record) take no lock: they are a few atomic operations on cache-line
/// padded buckets.
///
/// The `with_*` methods configure a throttle before it is shared. Called on a throttle that has
/// clones, they return a new, independent throttle with empty counts.
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
    /// The window the counts cover.
    pub window: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    k: f64,
    window: Duration,
    max_probability: f64,
    min_rate: f64,
    recovery_run: u32,
    seed: Option<u64>,
}

/// Where the random draws come from.
enum Draw {
    /// fastrand's thread-local generator: no shared state between threads.
    ThreadLocal,
    /// A shared seeded stream: the generator state of `fastrand::Rng::with_seed(seed)`, advanced
    /// with one `fetch_add` per draw so that threads share it without a lock. A single thread sees
    /// exactly the sequence of `fastrand::Rng::with_seed(seed).f64()`.
    Seeded(AtomicU64),
}

/// The increment of fastrand's WyRand generator: advancing the state by it is one `gen_u64`.
const WYRAND_INCREMENT: u64 = 0x2d35_8dcc_aa6c_78a5;

impl Draw {
    fn uniform(&self) -> f64 {
        match self {
            Self::ThreadLocal => fastrand::f64(),
            Self::Seeded(state) => {
                let state = state.fetch_add(WYRAND_INCREMENT, Ordering::Relaxed);
                fastrand::Rng::with_seed(state).f64()
            }
        }
    }
}

/// A `u32` alone on its cache line: the recovery run is written by every accept while throttling.
#[derive(Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU32);

/// The slice (tag + 1; 0 = none) in which the drop probability was last computed as zero with no
/// rejection recorded since, alone on its cache line: read by every request, written rarely.
#[derive(Default)]
#[repr(align(128))]
struct Calm(AtomicU64);

struct Shared {
    config: Config,
    window: Window,
    draw: Draw,
    /// Set while the last computed probability was above zero; read by `record` to decide
    /// whether accepts count towards the recovery run. Written only when it changes.
    throttling: AtomicBool,
    /// Accepts recorded in a row (no rejection in between) while throttling.
    run: PaddedCounter,
    /// The fast path of `try_acquire`. Within one slice, once the probability is zero, only a
    /// rejection can raise it: an accepted request adds 1 to `requests` and at least 1 to
    /// `K * accepts`, and slices age out only when the slice changes. So until the slice changes or
    /// a rejection is recorded, the window need not be summed again.
    calm: Calm,
}

impl AdaptiveThrottle {
    /// K, the multiplier of accepts: the SRE book's recommended value. With K = 2 the client sends
    /// up to twice what the backend accepts, and drops nothing while at least half is accepted.
    pub const DEFAULT_K: f64 = 2.0;

    /// Window of the default throttle: 2 s, sliding in 100 ms slices.
    ///
    /// A total outage after healthy traffic starts drops once failures outnumber the accepts
    /// still in the window (`requests > 2 * accepts`), i.e. after `window / 2` = 1 s, and the
    /// probability passes 90% after `0.95 * window` = 1.9 s: well inside the 3 s in which the
    /// outage must be cut. A burst of failures shorter than half the window (a restart, a network
    /// blip) drops nothing. The SRE book keeps the last two minutes of history: after two healthy
    /// minutes a total outage then goes unnoticed for a minute, and the plain formula over two
    /// minutes takes about nine minutes to come back from a 10 s outage at 1,000 requests per
    /// second (measured).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(2);

    /// Cap on the drop probability of the default throttle: at least 1% of requests still reach
    /// the backend.
    ///
    /// Envoy's admission control filter caps rejection at 80% by default
    /// (`max_rejection_probability`); that sends a fifth of all traffic into a dead backend,
    /// above the 10% this crate promises during an outage. With no cap at all (the SRE book's
    /// plain formula) the few requests that pass are `~1 / (requests + 1)`: about one per window,
    /// too few to notice a recovery quickly. 99% keeps an outage down to 1% of the offered load
    /// (10 requests per second at 1,000 offered) while those 1% are the probes that see the
    /// backend come back.
    pub const DEFAULT_MAX_PROBABILITY: f64 = 0.99;

    /// Request rate (per second, over the window) under which the default throttle never drops:
    /// 5 per second, i.e. 10 requests in the default 2 s window.
    ///
    /// Below that the accept ratio rests on a handful of samples (two failures in a row would
    /// drop two thirds of the next requests), and a client this slow cannot storm a backend on
    /// its own. Envoy's admission control filter has the same knob (`rps_threshold`), off by
    /// default.
    pub const DEFAULT_MIN_RATE: f64 = 5.0;

    /// Accepts in a row, while throttling, after which the default throttle forgets its history.
    ///
    /// See [`with_recovery_run`](Self::with_recovery_run). When the backend accepts less than
    /// `1 / K` of requests (the only case in which the formula drops), ten accepts in a row
    /// happen by chance with probability below `0.5^10`, about 0.1%. Under overload, where the
    /// formula settles at sending K times what is accepted, such chance runs cost a few percent
    /// of extra traffic at most (a run of 5 would cost about 30%).
    pub const DEFAULT_RECOVERY_RUN: u32 = 10;

    /// A throttle with multiplier `k` over a sliding `window`, with the default cap, minimum rate
    /// and recovery run.
    ///
    /// `k` below 1 would drop requests to a backend that accepts everything, so it is raised to 1;
    /// a `k` that is not a number falls back to [`DEFAULT_K`](Self::DEFAULT_K). The window is cut
    /// into 20 slices; windows shorter than 20 ms are rounded up to 20 ms.
    pub fn new(k: f64, window: Duration) -> Self {
        let k = if k.is_nan() {
            Self::DEFAULT_K
        } else {
            k.max(1.0)
        };
        Self::from_config(Config {
            k,
            window,
            max_probability: Self::DEFAULT_MAX_PROBABILITY,
            min_rate: Self::DEFAULT_MIN_RATE,
            recovery_run: Self::DEFAULT_RECOVERY_RUN,
            seed: None,
        })
    }

    /// Cap the drop probability at `p` (clamped to `0.0..=1.0`; `1.0` removes the cap, a NaN keeps
    /// the current cap). At least `1 - p` of the requests always reach the backend.
    pub fn with_max_probability(self, p: f64) -> Self {
        if p.is_nan() {
            return self;
        }
        self.configure(|config| config.max_probability = p.clamp(0.0, 1.0))
    }

    /// Never drop while fewer than `per_sec` requests per second were offered over the window.
    /// `0.0` (or a negative value or NaN) drops at any rate; infinity never drops.
    pub fn with_min_rate(self, per_sec: f64) -> Self {
        let per_sec = if per_sec.is_nan() {
            0.0
        } else {
            per_sec.max(0.0)
        };
        self.configure(|config| config.min_rate = per_sec)
    }

    /// Draw from a seeded generator (the stream of `fastrand::Rng::with_seed(seed)`, shared by all
    /// clones) instead of a thread-local one, so tests see the same drops on every run.
    pub fn with_seed(self, seed: u64) -> Self {
        self.configure(|config| config.seed = Some(seed))
    }

    /// Forget the whole window once `run` requests in a row were accepted while throttling
    /// (`0` disables it).
    ///
    /// While nearly everything is dropped, the window is full of drops and only the few requests
    /// that pass can see the backend recover; the plain formula then needs several windows of
    /// compounding (each accept lets about K more requests through) to climb back. A run of
    /// accepts is strong evidence that the backend is back, and forgetting is cheap when it is
    /// not: with the old accepts forgotten too, a backend that still fails is throttled again
    /// after a dozen requests.
    pub fn with_recovery_run(self, run: u32) -> Self {
        self.configure(|config| config.recovery_run = run)
    }

    /// The multiplier K.
    pub fn k(&self) -> f64 {
        self.shared.config.k
    }

    /// The window the counts cover (a whole number of slices).
    pub fn window(&self) -> Duration {
        self.shared.window.span()
    }

    /// Draw for one request: `Ok` means send it, `Err(Throttled)` means drop it locally.
    ///
    /// A dropped request is counted in `requests` at once (the SRE book counts every request the
    /// application attempted, and that is what keeps the pass rate near K times the accept rate).
    /// A request let through is counted when its outcome is [`record`](Self::record)ed, so every
    /// `Ok` must be followed by exactly one `record` (the layer does this, and records a call
    /// dropped before it completes as not accepted).
    ///
    /// Counting sent requests on completion rather than on sending is a deliberate departure from
    /// the book: with answers that take seconds (LLM generations) and a 2 s window, requests still
    /// in flight would otherwise look like rejections, and a cold start with a burst of concurrent
    /// requests would throttle a healthy backend before its first answer. In a steady state both
    /// count the same rate.
    pub fn try_acquire(&self) -> Result<(), Throttled> {
        let shared = &*self.shared;
        let slice = shared.window.slice(Instant::now());
        let calm = slice.calm_mark();
        if shared.calm.0.load(Ordering::Relaxed) == calm {
            return Ok(());
        }
        let probability = shared.probability(shared.window.totals(slice));
        shared.set_throttling(probability > 0.0);
        if probability <= 0.0 {
            shared.calm.0.store(calm, Ordering::Relaxed);
            return Ok(());
        }
        if shared.draw.uniform() < probability {
            shared.window.add(slice, Counter::Requests);
            return Err(Throttled);
        }
        Ok(())
    }

    /// Record the outcome of a request that [`try_acquire`](Self::try_acquire) let through:
    /// `true` if the backend accepted it (it did the work and answered, even with an error of
    /// the caller's making), `false` if it rejected or failed it, or never answered. The request
    /// is counted in `requests` now, and in `accepts` if accepted.
    pub fn record(&self, accepted: bool) {
        let shared = &*self.shared;
        let slice = shared.window.slice(Instant::now());
        shared.window.add(slice, Counter::Requests);
        let run = &shared.run.0;
        if !accepted {
            if shared.calm.0.load(Ordering::Relaxed) != 0 {
                shared.calm.0.store(0, Ordering::Relaxed);
            }
            if run.load(Ordering::Relaxed) != 0 {
                run.store(0, Ordering::Relaxed);
            }
            return;
        }
        shared.window.add(slice, Counter::Accepts);
        let needed = shared.config.recovery_run;
        if needed == 0 || !shared.throttling.load(Ordering::Relaxed) {
            return;
        }
        if run.fetch_add(1, Ordering::Relaxed).saturating_add(1) >= needed {
            run.store(0, Ordering::Relaxed);
            shared.window.clear(slice);
            shared.throttling.store(false, Ordering::Relaxed);
        }
    }

    /// Probability that a request offered now is dropped.
    pub fn probability(&self) -> f64 {
        self.snapshot().probability
    }

    /// Requests, accepts and drop probability over the current window.
    pub fn snapshot(&self) -> ThrottleSnapshot {
        let window = &self.shared.window;
        let totals = window.totals(window.slice(Instant::now()));
        ThrottleSnapshot {
            requests: totals.requests,
            accepts: totals.accepts,
            probability: self.shared.probability(totals),
            window: window.span(),
        }
    }

    fn from_config(config: Config) -> Self {
        let draw = match config.seed {
            Some(seed) => Draw::Seeded(AtomicU64::new(seed)),
            None => Draw::ThreadLocal,
        };
        Self {
            shared: Arc::new(Shared {
                config,
                window: Window::new(config.window),
                draw,
                throttling: AtomicBool::new(false),
                run: PaddedCounter::default(),
                calm: Calm::default(),
            }),
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.shared.config;
        change(&mut config);
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => {
                if shared.config.seed != config.seed {
                    shared.draw = match config.seed {
                        Some(seed) => Draw::Seeded(AtomicU64::new(seed)),
                        None => Draw::ThreadLocal,
                    };
                }
                shared.config = config;
                self
            }
            None => Self::from_config(config),
        }
    }
}

impl Shared {
    /// `max(0, (requests - K * accepts) / (requests + 1))`, capped, and zero below the minimum rate.
    fn probability(&self, totals: Totals) -> f64 {
        let requests = totals.requests as f64;
        let accepts = totals.accepts as f64;
        let span = self.window.span().as_secs_f64();
        if requests < self.config.min_rate * span {
            return 0.0;
        }
        let p = (requests - self.config.k * accepts) / (requests + 1.0);
        p.clamp(0.0, self.config.max_probability)
    }

    fn set_throttling(&self, throttling: bool) {
        if self.throttling.load(Ordering::Relaxed) != throttling {
            self.throttling.store(throttling, Ordering::Relaxed);
        }
    }
}

impl Default for AdaptiveThrottle {
    /// K = 2 over a 2 s window, capped at 99%, no drops below 5 requests per second, recovery
    /// after 10 accepts in a row: see the `DEFAULT_*` constants for why.
    fn default() -> Self {
        Self::new(Self::DEFAULT_K, Self::DEFAULT_WINDOW)
    }
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.shared.config;
        f.debug_struct("AdaptiveThrottle")
            .field("k", &config.k)
            .field("window", &self.shared.window.span())
            .field("max_probability", &config.max_probability)
            .field("min_rate", &config.min_rate)
            .field("recovery_run", &config.recovery_run)
            .field("seeded", &config.seed.is_some())
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn a_rejection_ends_the_calm_fast_path_within_the_slice() {
        let throttle = AdaptiveThrottle::new(2.0, Duration::from_secs(2))
            .with_min_rate(0.0)
            .with_seed(5);
        // Zero probability: the window is calm and requests pass without summing it.
        assert!(throttle.try_acquire().is_ok());
        // Within the same slice (the clock does not move), the backend starts rejecting.
        for _ in 0..200 {
            throttle.record(false);
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
            if throttle.try_acquire().is_ok() {
                throttle.record(accepted);
                sent += 1;
            }
            tokio::time::advance(TICK).await;
        }
        sent
    }

    #[test]
    fn hostile_configuration_is_sanitized() {
        let throttle = AdaptiveThrottle::new(f64::NAN, Duration::ZERO)
            .with_max_probability(f64::NAN)
            .with_min_rate(f64::NAN);
        assert_eq!(throttle.k(), AdaptiveThrottle::DEFAULT_K);
        assert_eq!(throttle.window(), Duration::from_millis(20));
        let config = throttle.shared.config;
        assert_eq!(
            config.max_probability,
            AdaptiveThrottle::DEFAULT_MAX_PROBABILITY
        );
        assert_eq!(config.min_rate, 0.0);

        assert_eq!(AdaptiveThrottle::new(0.5, Duration::MAX).k(), 1.0);
        assert_eq!(
            AdaptiveThrottle::new(f64::INFINITY, Duration::from_secs(1)).k(),
            f64::INFINITY
        );
        let clamped = AdaptiveThrottle::default()
            .with_max_probability(7.0)
            .with_min_rate(-3.0);
        assert_eq!(clamped.shared.config.max_probability, 1.0);
        assert_eq!(clamped.shared.config.min_rate, 0.0);
        assert_eq!(
            AdaptiveThrottle::default()
                .with_max_probability(-1.0)
                .shared
                .config
                .max_probability,
            0.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_infinite_minimum_rate_never_drops() {
        let throttle = AdaptiveThrottle::default().with_min_rate(f64::INFINITY);
        assert_eq!(offer(&throttle, 5_000, false).await, 5_000);
        assert_eq!(throttle.probability(), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_cap_never_drops() {
        let throttle = AdaptiveThrottle::default().with_max_probability(0.0);
        assert_eq!(offer(&throttle, 5_000, false).await, 5_000);
    }

    #[tokio::test(start_paused = true)]
    async fn configuring_a_shared_throttle_gives_an_independent_one() {
        let throttle = AdaptiveThrottle::default();
        offer(&throttle, 100, true).await;
        let clone = throttle.clone();
        let reconfigured = clone.with_min_rate(0.0);
        assert_eq!(reconfigured.snapshot().requests, 0);
        assert_eq!(throttle.snapshot().requests, 100);
        assert_eq!(
            throttle.shared.config.min_rate,
            AdaptiveThrottle::DEFAULT_MIN_RATE
        );

        // Unshared, the same call keeps the counts.
        let kept = throttle.with_max_probability(0.5);
        assert_eq!(kept.snapshot().requests, 100);
        assert_eq!(kept.shared.config.max_probability, 0.5);
    }

    #[test]
    fn seeded_draws_follow_fastrands_stream() {
        let draw = Draw::Seeded(AtomicU64::new(99));
        let mut rng = fastrand::Rng::with_seed(99);
        for _ in 0..1_000 {
            assert_eq!(draw.uniform(), rng.f64());
        }
    }

    /// The recovery run clears the window; if the backend was not really back, the cleared
    /// window has no accepts to mask the failures, and drops resume after about a dozen requests
    /// (the first ten are the minimum rate).
    #[tokio::test(start_paused = true)]
    async fn a_false_recovery_costs_about_a_dozen_requests() {
        let throttle = AdaptiveThrottle::default().with_seed(1);
        offer(&throttle, 5_000, false).await;
        assert_eq!(throttle.probability(), 0.99);

        // Ten lucky accepts in a row.
        let mut lucky = 0;
        while lucky < AdaptiveThrottle::DEFAULT_RECOVERY_RUN {
            if throttle.try_acquire().is_ok() {
                lucky += 1;
                throttle.record(true);
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
        let throttle = AdaptiveThrottle::default()
            .with_max_probability(0.5)
            .with_seed(8);
        offer(&throttle, 3_000, false).await;
        let mut accepted = 0;
        let mut n = 0_u32;
        while accepted < 50 {
            if throttle.try_acquire().is_ok() {
                // Nine accepts, one rejection, repeated: never ten in a row.
                let accept = n % 10 != 9;
                throttle.record(accept);
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
        assert_eq!(throttle.shared.run.0.load(Ordering::Relaxed), accepted % 9);
    }

    /// With the recovery run disabled, accepts never clear the window.
    #[tokio::test(start_paused = true)]
    async fn a_disabled_recovery_run_never_clears() {
        let throttle = AdaptiveThrottle::default()
            .with_recovery_run(0)
            .with_seed(9);
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
        let throttle = AdaptiveThrottle::default().with_min_rate(0.0);
        for _ in 0..16 {
            assert!(throttle.try_acquire().is_ok());
        }
        assert_eq!(throttle.snapshot().requests, 0);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        for _ in 0..16 {
            throttle.record(true);
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
