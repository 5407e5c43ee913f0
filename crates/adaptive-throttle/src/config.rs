//! [`ThrottleConfig`]: the settings of an [`AdaptiveThrottle`](crate::AdaptiveThrottle), fixed
//! before the throttle exists.

use std::time::Duration;

/// The settings of an [`AdaptiveThrottle`](crate::AdaptiveThrottle): a plain value, changed with
/// consuming `with_*` methods and read with getters of the same name.
///
/// A throttle takes its configuration when it is made
/// ([`AdaptiveThrottle::new`](crate::AdaptiveThrottle::new)) and never changes it, so every clone
/// of a throttle counts with the same settings.
///
/// ```
/// use std::time::Duration;
/// use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig};
///
/// let config = ThrottleConfig::default()
///     .with_window(Duration::from_secs(5))
///     .with_max_probability(0.9);
/// assert_eq!(config.k(), ThrottleConfig::DEFAULT_K);
/// assert_eq!(config.window(), Duration::from_secs(5));
/// let throttle = AdaptiveThrottle::new(config);
/// assert_eq!(throttle.config().max_probability(), 0.9);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleConfig {
    k: f64,
    window: Duration,
    max_probability: f64,
    min_rate: f64,
    recovery_run: u32,
    seed: Option<u64>,
}

impl ThrottleConfig {
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
    /// minutes takes about ten minutes to come back from a 10 s outage at 1,000 requests per
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

    /// Use `k` as the multiplier of accepts.
    ///
    /// `k` below 1 would drop requests to a backend that accepts everything, so it is raised to 1;
    /// a `k` that is not a number falls back to [`DEFAULT_K`](Self::DEFAULT_K).
    #[must_use]
    pub fn with_k(mut self, k: f64) -> Self {
        self.k = if k.is_nan() {
            Self::DEFAULT_K
        } else {
            k.max(1.0)
        };
        self
    }

    /// Count over a sliding `window`.
    ///
    /// The throttle cuts it into 20 slices of at least a millisecond, so windows shorter than
    /// 20 ms count over 20 ms; [`ThrottleSnapshot::window`](crate::ThrottleSnapshot::window) is
    /// the span in use.
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Cap the drop probability at `p` (clamped to `0.0..=1.0`; `1.0` removes the cap, a NaN
    /// keeps the current cap). At least `1 - p` of the requests always reach the backend.
    #[must_use]
    pub fn with_max_probability(mut self, p: f64) -> Self {
        if !p.is_nan() {
            self.max_probability = p.clamp(0.0, 1.0);
        }
        self
    }

    /// Never drop while fewer than `per_sec` requests per second were offered over the window.
    /// `0.0` (or a negative value or NaN) drops at any rate; infinity never drops.
    #[must_use]
    pub fn with_min_rate(mut self, per_sec: f64) -> Self {
        self.min_rate = if per_sec.is_nan() {
            0.0
        } else {
            per_sec.max(0.0)
        };
        self
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
    #[must_use]
    pub fn with_recovery_run(mut self, run: u32) -> Self {
        self.recovery_run = run;
        self
    }

    /// Draw from a [`RandomSource`](stormguard_numbers::random::RandomSource) seeded with
    /// `seed`, shared by every clone of the throttle, so that the same requests are dropped on
    /// every run. Unseeded throttles draw from the thread's generator.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The multiplier K.
    pub fn k(&self) -> f64 {
        self.k
    }

    /// The window, as set (see [`with_window`](Self::with_window) for the span in use).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The cap on the drop probability.
    pub fn max_probability(&self) -> f64 {
        self.max_probability
    }

    /// The request rate, per second, under which nothing is dropped.
    pub fn min_rate(&self) -> f64 {
        self.min_rate
    }

    /// The accepts in a row, while throttling, that clear the window (`0`: never).
    pub fn recovery_run(&self) -> u32 {
        self.recovery_run
    }

    /// The seed of the drops, if seeded.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }
}

impl Default for ThrottleConfig {
    /// K = 2 over a 2 s window, capped at 99%, no drops below 5 requests per second, recovery
    /// after 10 accepts in a row, unseeded: see the `DEFAULT_*` constants for why.
    fn default() -> Self {
        Self {
            k: Self::DEFAULT_K,
            window: Self::DEFAULT_WINDOW,
            max_probability: Self::DEFAULT_MAX_PROBABILITY,
            min_rate: Self::DEFAULT_MIN_RATE,
            recovery_run: Self::DEFAULT_RECOVERY_RUN,
            seed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_settings_are_sanitised() {
        let config = ThrottleConfig::default()
            .with_k(f64::NAN)
            .with_max_probability(f64::NAN)
            .with_min_rate(f64::NAN);
        assert_eq!(config.k(), ThrottleConfig::DEFAULT_K);
        assert_eq!(
            config.max_probability(),
            ThrottleConfig::DEFAULT_MAX_PROBABILITY
        );
        assert_eq!(config.min_rate(), 0.0);

        assert_eq!(ThrottleConfig::default().with_k(0.5).k(), 1.0);
        assert_eq!(
            ThrottleConfig::default().with_k(f64::INFINITY).k(),
            f64::INFINITY
        );
        let clamped = ThrottleConfig::default()
            .with_max_probability(7.0)
            .with_min_rate(-3.0);
        assert_eq!(clamped.max_probability(), 1.0);
        assert_eq!(clamped.min_rate(), 0.0);
        assert_eq!(
            ThrottleConfig::default()
                .with_max_probability(-1.0)
                .max_probability(),
            0.0
        );
        // A NaN cap keeps the one set before.
        assert_eq!(
            ThrottleConfig::default()
                .with_max_probability(0.5)
                .with_max_probability(f64::NAN)
                .max_probability(),
            0.5
        );
    }

    #[test]
    fn setters_and_getters_share_names() {
        let config = ThrottleConfig::default()
            .with_k(3.0)
            .with_window(Duration::from_secs(5))
            .with_max_probability(0.8)
            .with_min_rate(1.0)
            .with_recovery_run(4)
            .with_seed(9);
        assert_eq!(config.k(), 3.0);
        assert_eq!(config.window(), Duration::from_secs(5));
        assert_eq!(config.max_probability(), 0.8);
        assert_eq!(config.min_rate(), 1.0);
        assert_eq!(config.recovery_run(), 4);
        assert_eq!(config.seed(), Some(9));

        let default = ThrottleConfig::default();
        assert_eq!(
            (default.window(), default.recovery_run(), default.seed()),
            (Duration::from_secs(2), 10, None)
        );
        assert_ne!(config, default);
    }
}
