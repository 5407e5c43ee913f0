//! [`RateLimitConfig`]: the settings of a [`RateLimit`](crate::RateLimit).

use std::time::Duration;

use crate::store::FleetStore;

/// The settings of a [`RateLimit`](crate::RateLimit): a plain value, changed with consuming
/// `with_*` methods and read with getters of the same name, fixed when the limit is made.
///
/// ```
/// use std::time::Duration;
/// use stormguard_rate_limit::{RateLimit, RateLimitConfig};
///
/// let limit = RateLimit::new(
///     RateLimitConfig::default()
///         .with_requests_per_minute(Some(500))
///         .with_tokens_per_minute(Some(30_000))
///         .with_max_wait(Duration::from_secs(5)),
/// );
/// assert_eq!(limit.config().requests_per_minute(), Some(500));
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitConfig {
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    max_wait: Duration,
    burst: Duration,
    learn: bool,
    usage_correction: bool,
    max_keys: usize,
    idle: Duration,
    fleet: Option<FleetStore>,
}

impl RateLimitConfig {
    /// Longest a request waits for its slot: 2 s, the wait of the incident this crate answers
    /// (pacing bursts with a bounded wait instead of sending them into 429s). Beyond it the
    /// request fails fast with [`RateLimited`](crate::RateLimited); a request's deadline bounds
    /// the wait too.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(2);

    /// How much of the rate may go at once: 1 s worth. Providers enforce per-minute quotas over
    /// shorter periods (OpenAI's documentation: "quantized", a 60,000 RPM limit may be enforced
    /// as 1,000 requests per second), so a client that bursts a minute's quota in a second is
    /// refused.
    pub const DEFAULT_BURST: Duration = Duration::from_secs(1);

    /// Most keys a keyed limit holds: 10,000. Beyond it, idle keys are forgotten first, then the
    /// least recently used.
    pub const DEFAULT_MAX_KEYS: usize = 10_000;

    /// A key unused for this long is forgotten when room is needed: 10 minutes.
    pub const DEFAULT_IDLE: Duration = Duration::from_secs(600);

    /// Requests a minute (`None`: no configured limit; learned from the provider if learning is
    /// on).
    #[must_use]
    pub fn with_requests_per_minute(mut self, limit: Option<u32>) -> Self {
        self.requests_per_minute = limit.filter(|&n| n > 0);
        self
    }

    /// Tokens a minute, a request weighing its prompt and its output limit (`None`: no
    /// configured limit; learned from the provider if learning is on).
    #[must_use]
    pub fn with_tokens_per_minute(mut self, limit: Option<u32>) -> Self {
        self.tokens_per_minute = limit.filter(|&n| n > 0);
        self
    }

    /// Wait at most `max_wait` for a slot.
    #[must_use]
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Let `burst` worth of the rate go at once (at least one request, one token).
    #[must_use]
    pub fn with_burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    /// Learn nothing from the provider: only the configured limits apply. By default the limit
    /// learns the limits the provider's headers state, when it says a quota is spent, and its
    /// 429s (see the crate docs); configured limits are never replaced, only obeyed more strictly
    /// while the provider says its quota is spent.
    #[must_use]
    pub fn without_learning(mut self) -> Self {
        self.learn = false;
        self
    }

    /// Correct a request's token weight to the `usage` its answer reports (off by default).
    /// Anthropic corrects output tokens to the real output at the end of a request; OpenAI keeps
    /// counting `max_tokens`: turn this on for a provider that gives unused tokens back, or the
    /// limit would send more than the provider's quota.
    #[must_use]
    pub fn with_usage_correction(mut self) -> Self {
        self.usage_correction = true;
        self
    }

    /// Hold at most `max_keys` keys (at least 1), forgetting those idle for `idle` first.
    #[must_use]
    pub fn with_keys(mut self, max_keys: usize, idle: Duration) -> Self {
        self.max_keys = max_keys.max(1);
        self.idle = idle;
        self
    }

    /// Keep the limit's state in Redis, shared by every replica configured with the same fleet
    /// settings and numbers (see [`Fleet`](crate::Fleet)): the replicas together admit at most
    /// the quota, and each falls back to its share of it while Redis is away.
    #[cfg(feature = "redis")]
    #[must_use]
    pub fn with_fleet(mut self, fleet: crate::Fleet) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// Where the limit's state is shared, if in Redis.
    #[cfg(feature = "redis")]
    pub fn fleet(&self) -> Option<&crate::Fleet> {
        self.fleet.as_ref()
    }

    /// The store that shares the limit beyond this process, if any (a fleet's, with the `redis`
    /// feature; never one without it).
    pub(crate) fn store(&self) -> Option<&FleetStore> {
        self.fleet.as_ref()
    }

    /// The configured requests a minute.
    pub fn requests_per_minute(&self) -> Option<u32> {
        self.requests_per_minute
    }

    /// The configured tokens a minute.
    pub fn tokens_per_minute(&self) -> Option<u32> {
        self.tokens_per_minute
    }

    /// The longest wait for a slot.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How much of the rate may go at once.
    pub fn burst(&self) -> Duration {
        self.burst
    }

    /// Whether the limit learns from the provider.
    pub fn learning(&self) -> bool {
        self.learn
    }

    /// Whether token weights are corrected to the answers' usage.
    pub fn usage_correction(&self) -> bool {
        self.usage_correction
    }

    /// The most keys held, and the idle time after which a key is forgotten first.
    pub fn keys(&self) -> (usize, Duration) {
        (self.max_keys, self.idle)
    }
}

impl Default for RateLimitConfig {
    /// No configured limit (it learns), a 2 s wait, a 1 s burst, 10,000 keys idle after 10 min.
    fn default() -> Self {
        Self {
            requests_per_minute: None,
            tokens_per_minute: None,
            max_wait: Self::DEFAULT_MAX_WAIT,
            burst: Self::DEFAULT_BURST,
            learn: true,
            usage_correction: false,
            max_keys: Self::DEFAULT_MAX_KEYS,
            idle: Self::DEFAULT_IDLE,
            fleet: None,
        }
    }
}
