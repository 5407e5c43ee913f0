//! [`BreakerConfig`]: the settings of a [`CircuitBreaker`](crate::CircuitBreaker), fixed before
//! the breaker exists.

use std::time::Duration;

/// The settings of a [`CircuitBreaker`](crate::CircuitBreaker): a plain value, changed with
/// consuming `with_*` methods and read with getters of the same name. A breaker takes its
/// configuration when it is made and never changes it, so every clone judges alike.
///
/// ```
/// use std::time::Duration;
/// use stormguard_breaker::{BreakerConfig, CircuitBreaker};
///
/// let config = BreakerConfig::default()
///     .with_min_calls(50)
///     .with_max_in_flight(Some(2_000));
/// let breaker = CircuitBreaker::new(config);
/// assert_eq!(breaker.config().failure_ratio(), 0.5);
/// assert_eq!(breaker.config().max_in_flight(), Some(2_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    window: Duration,
    failure_ratio: f64,
    min_calls: u32,
    open_wait: Duration,
    max_open_wait: Duration,
    probes: u32,
    probe_lease: Duration,
    min_silence: Duration,
    silent_answers: f64,
    cancel_on_stall: bool,
    max_in_flight: Option<u32>,
    consecutive_failures: Option<u32>,
    seed: Option<u64>,
}

impl BreakerConfig {
    /// Window over which health failures are counted: 10 s, sliding in 1 s slices. Hystrix's
    /// rolling statistics window (`metrics.rollingStats.timeInMilliseconds`, 10 buckets), and the
    /// span of the incident this crate answers, which the breaker must cut within seconds.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// Share of health failures among the window's answers that opens the breaker: 50%, the
    /// default of Hystrix (`errorThresholdPercentage`) and Resilience4j (`failureRateThreshold`).
    pub const DEFAULT_FAILURE_RATIO: f64 = 0.5;

    /// Answers the window must hold before its failure ratio counts: 20, Hystrix's
    /// `requestVolumeThreshold` (Resilience4j asks 100 by default). Two failures out of three
    /// calls say little; twenty do.
    pub const DEFAULT_MIN_CALLS: u32 = 20;

    /// First wait in the open state before probing: 1 s (Hystrix waits 5 s, Resilience4j 60 s).
    /// Probes are a handful of requests, cheap for any backend, and the incident asks for traffic
    /// back within 2 s of the provider's return: a short wait, doubled while probes keep being
    /// answered with failures, finds the return soon without loading a backend that answers.
    pub const DEFAULT_OPEN_WAIT: Duration = Duration::from_secs(1);

    /// Longest wait in the open state: 30 s. Envoy's outlier detection grows its ejection time
    /// with every ejection (`base_ejection_time` 30 s, up to `max_ejection_time` 300 s); an LLM
    /// client gives up on most requests well before five minutes, so the wait stops growing at
    /// half a minute.
    pub const DEFAULT_MAX_OPEN_WAIT: Duration = Duration::from_secs(30);

    /// Probes let through at once when the wait is over: 3 (Hystrix lets 1 through, Resilience4j
    /// 10). Enough that one slow or lost probe does not hold the way back, few enough not to
    /// matter to the backend.
    pub const DEFAULT_PROBES: u32 = 3;

    /// How long a probe may hold its slot: 2 s, more than twice the median latency of an LLM
    /// call (800 ms) and enough for the first byte of a stream. When its lease ends the slot goes
    /// to the next probe (the probe itself carries on, and still closes the breaker should it
    /// succeed), so that against a backend that answers nothing the breaker keeps probing, about
    /// once every `lease / probes`, instead of waiting on probes that never end.
    pub const DEFAULT_PROBE_LEASE: Duration = Duration::from_secs(2);

    /// Shortest silence, while attempts are in flight, that counts as a stall: 2 s. Shorter
    /// pauses happen to healthy backends (a garbage collection, a network hiccup), and a false
    /// stall cancels every attempt in flight; 2 s still cuts a black hole within the 3 s the
    /// incident asks for.
    pub const DEFAULT_MIN_SILENCE: Duration = Duration::from_secs(2);

    /// How many answers the answer rate before a silence must have promised in it before it
    /// counts as a stall: 20. With answers arriving as a Poisson process at rate `r`, a silence
    /// of `20 / r` happens by chance with probability `e^-20` (about 2 in a billion): at 1 answer
    /// a second (long generations at a low rate) that is 20 s of silence, at 100 a second 0.2 s
    /// (then the minimum silence decides). With fewer than 20 attempts in flight, no silence is a
    /// stall: no more answers can be missed than there are attempts to answer.
    pub const DEFAULT_SILENT_ANSWERS: f64 = 20.0;

    /// Count over a sliding `window` (10 slices of at least a millisecond each).
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Open when health failures reach `ratio` of the window's answers (clamped to `0.0..=1.0`; a
    /// NaN keeps the current ratio). `1.0` opens only when every answer failed.
    #[must_use]
    pub fn with_failure_ratio(mut self, ratio: f64) -> Self {
        if !ratio.is_nan() {
            self.failure_ratio = ratio.clamp(0.0, 1.0);
        }
        self
    }

    /// Judge the failure ratio only once the window holds `calls` answers (at least 1).
    #[must_use]
    pub fn with_min_calls(mut self, calls: u32) -> Self {
        self.min_calls = calls.max(1);
        self
    }

    /// Wait `wait` in the open state before the first probes, and at most `max` however often
    /// probes fail (`max` is raised to `wait` if below it).
    #[must_use]
    pub fn with_open_wait(mut self, wait: Duration, max: Duration) -> Self {
        self.open_wait = wait;
        self.max_open_wait = max.max(wait);
        self
    }

    /// Let `probes` probes through at once in the half-open state (at least 1), each leased for
    /// `lease` (at least a millisecond).
    #[must_use]
    pub fn with_probes(mut self, probes: u32, lease: Duration) -> Self {
        self.probes = probes.max(1);
        self.probe_lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Count a silence while attempts are in flight as a stall once it is longer than `min` and
    /// than the time in which the recent answer rate promised `answers` answers. A NaN or
    /// negative `answers` is taken as the default.
    #[must_use]
    pub fn with_stall_detection(mut self, min: Duration, answers: f64) -> Self {
        self.min_silence = min;
        self.silent_answers = if answers.is_nan() || answers <= 0.0 {
            Self::DEFAULT_SILENT_ANSWERS
        } else {
            answers
        };
        self
    }

    /// No stall detection: only answered failures open the breaker.
    #[must_use]
    pub fn without_stall_detection(mut self) -> Self {
        self.silent_answers = f64::INFINITY;
        self
    }

    /// Opening on a stall no longer cancels the attempts already in flight. By default it does:
    /// they fail with [`BreakerOpen`](crate::BreakerOpen) instead of holding their connections
    /// until their deadlines.
    #[must_use]
    pub fn without_cancel_on_stall(mut self) -> Self {
        self.cancel_on_stall = false;
        self
    }

    /// Refuse attempts beyond `max` in flight at once with [`BulkheadFull`](crate::BulkheadFull)
    /// (`None`, the default: no cap).
    #[must_use]
    pub fn with_max_in_flight(mut self, max: Option<u32>) -> Self {
        self.max_in_flight = max;
        self
    }

    /// Also open after `failures` health failures in a row, however few calls the window holds
    /// (`None`, the default: the failure ratio alone opens). A failover routes on it: a backend
    /// that failed 3 times in a row is left for the next, never one that failed once.
    #[must_use]
    pub fn with_consecutive_failures(mut self, failures: Option<u32>) -> Self {
        self.consecutive_failures = failures.map(|n| n.max(1));
        self
    }

    /// Makes the jitter of the open waits replay on every run.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The window over which health failures are counted.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The share of health failures that opens the breaker.
    pub fn failure_ratio(&self) -> f64 {
        self.failure_ratio
    }

    /// The answers the window must hold before its failure ratio counts.
    pub fn min_calls(&self) -> u32 {
        self.min_calls
    }

    /// The first wait in the open state, and the longest.
    pub fn open_wait(&self) -> (Duration, Duration) {
        (self.open_wait, self.max_open_wait)
    }

    /// The probes let through at once, and each one's lease.
    pub fn probes(&self) -> (u32, Duration) {
        (self.probes, self.probe_lease)
    }

    /// The shortest silence that counts as a stall, and the answers it must have missed
    /// (infinite: no stall detection).
    pub fn stall_detection(&self) -> (Duration, f64) {
        (self.min_silence, self.silent_answers)
    }

    /// Whether opening on a stall cancels the attempts in flight.
    pub fn cancel_on_stall(&self) -> bool {
        self.cancel_on_stall
    }

    /// The health failures in a row that open the breaker, if any.
    pub fn consecutive_failures(&self) -> Option<u32> {
        self.consecutive_failures
    }

    /// The cap on attempts in flight, if any.
    pub fn max_in_flight(&self) -> Option<u32> {
        self.max_in_flight
    }

    /// The seed of the open waits' jitter, if any.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }
}

impl Default for BreakerConfig {
    /// The `DEFAULT_*` constants: right for an LLM API (see each for why).
    fn default() -> Self {
        Self {
            window: Self::DEFAULT_WINDOW,
            failure_ratio: Self::DEFAULT_FAILURE_RATIO,
            min_calls: Self::DEFAULT_MIN_CALLS,
            open_wait: Self::DEFAULT_OPEN_WAIT,
            max_open_wait: Self::DEFAULT_MAX_OPEN_WAIT,
            probes: Self::DEFAULT_PROBES,
            probe_lease: Self::DEFAULT_PROBE_LEASE,
            min_silence: Self::DEFAULT_MIN_SILENCE,
            silent_answers: Self::DEFAULT_SILENT_ANSWERS,
            cancel_on_stall: true,
            max_in_flight: None,
            consecutive_failures: None,
            seed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_settings_are_sanitised() {
        let config = BreakerConfig::default()
            .with_failure_ratio(f64::NAN)
            .with_min_calls(0)
            .with_open_wait(Duration::from_secs(5), Duration::from_secs(1))
            .with_probes(0, Duration::ZERO)
            .with_stall_detection(Duration::from_secs(1), f64::NAN);
        assert_eq!(config.failure_ratio(), 0.5);
        assert_eq!(config.min_calls(), 1);
        assert_eq!(
            config.open_wait(),
            (Duration::from_secs(5), Duration::from_secs(5))
        );
        assert_eq!(config.probes(), (1, Duration::from_millis(1)));
        assert_eq!(
            config.stall_detection(),
            (
                Duration::from_secs(1),
                BreakerConfig::DEFAULT_SILENT_ANSWERS
            )
        );
        assert_eq!(
            BreakerConfig::default()
                .with_failure_ratio(7.0)
                .failure_ratio(),
            1.0
        );
        assert!(
            BreakerConfig::default()
                .without_stall_detection()
                .stall_detection()
                .1
                .is_infinite()
        );
    }
}
