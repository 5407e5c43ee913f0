//! What a provider says about its limits, read from its response headers, and [`Cubic`], the
//! rate a limit with no stated numbers settles on from the provider's 429s.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use stormguard_classify::headers;
use stormguard_classify::hint::{HINT_CEILING, go_duration, reset_at};
use stormguard_numbers::decimal::{DecimalError, parse_decimal};

/// One limit as a provider states it: its size a minute, what is left, and when it is whole again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Quota {
    pub(crate) limit: Option<u64>,
    pub(crate) remaining: Option<u64>,
    pub(crate) reset: Option<Duration>,
}

/// The request and token limits stated by a response's headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stated {
    pub(crate) requests: Quota,
    pub(crate) tokens: Quota,
}

/// The largest limit taken from a header: a minute of more than 2^32 requests or tokens is no
/// limit worth pacing at, and a hostile value must not make the pacing interval round to zero.
const LARGEST_LIMIT: u64 = u32::MAX as u64;

impl Stated {
    /// What `headers` state: OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
    /// (resets as Go durations, `6m0s`, `12ms`) or Anthropic's
    /// `anthropic-ratelimit-{requests,tokens,input-tokens}-{limit,remaining,reset}` (resets as
    /// RFC 3339 times, read against `now`; the tokens of Anthropic's most restrictive limit, else
    /// its input tokens). Values that do not parse, zero limits and resets in the past are left
    /// out: headers come from the network.
    pub(crate) fn read(headers: &HeaderMap, now: SystemTime) -> Self {
        use headers::*;
        // Most answers state no limit (a local model, a gateway): one pass over their names
        // instead of fifteen lookups.
        let states = headers.keys().any(|name| {
            let name = name.as_str();
            name.starts_with("x-ratelimit-") || name.starts_with("anthropic-ratelimit-")
        });
        if !states {
            return Self::default();
        }
        let openai = |limit, remaining, reset| Quota {
            limit: count(headers, limit).filter(|&n| n > 0),
            remaining: count(headers, remaining),
            reset: headers
                .get(reset)
                .and_then(|value| go_duration(value.as_bytes())),
        };
        let anthropic = |limit, remaining, reset| Quota {
            limit: count(headers, limit).filter(|&n| n > 0),
            remaining: count(headers, remaining),
            reset: headers.get(reset).and_then(|value| reset_at(value, now)),
        };
        let requests = openai(
            X_RATELIMIT_LIMIT_REQUESTS,
            X_RATELIMIT_REMAINING_REQUESTS,
            X_RATELIMIT_RESET_REQUESTS,
        )
        .or_else(|| {
            anthropic(
                ANTHROPIC_RATELIMIT_REQUESTS_LIMIT,
                ANTHROPIC_RATELIMIT_REQUESTS_REMAINING,
                ANTHROPIC_RATELIMIT_REQUESTS_RESET,
            )
        });
        let tokens = openai(
            X_RATELIMIT_LIMIT_TOKENS,
            X_RATELIMIT_REMAINING_TOKENS,
            X_RATELIMIT_RESET_TOKENS,
        )
        .or_else(|| {
            anthropic(
                ANTHROPIC_RATELIMIT_TOKENS_LIMIT,
                ANTHROPIC_RATELIMIT_TOKENS_REMAINING,
                ANTHROPIC_RATELIMIT_TOKENS_RESET,
            )
        })
        .or_else(|| {
            anthropic(
                ANTHROPIC_RATELIMIT_INPUT_TOKENS_LIMIT,
                ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING,
                ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET,
            )
        });
        Self { requests, tokens }
    }
}

impl Quota {
    /// What the provider says is left, as a share of the limit (0 to 1), and for how long that
    /// holds: until its reset, at most a minute (a limit is a minute's), a second without one.
    pub(crate) fn left(&self) -> Option<(f64, Duration)> {
        let (limit, remaining) = (self.limit?, self.remaining?);
        let share = (remaining as f64 / limit as f64).clamp(0.0, 1.0);
        let holds = self
            .reset
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(60));
        Some((share, holds))
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// This quota if the provider stated any of it, else the one `other` reads.
    fn or_else(self, other: impl FnOnce() -> Quota) -> Quota {
        if self.is_empty() { other() } else { self }
    }

    /// When the quota is spent (`remaining: 0`), how long until it is whole again.
    pub(crate) fn spent_for(&self) -> Option<Duration> {
        (self.remaining == Some(0))
            .then_some(self.reset)
            .flatten()
            .and_then(believed)
    }
}

/// A wait the provider asks for (a reset, a `Retry-After`), if it is believable: shorter than a
/// day. The hint parsers report anything longer (a garbled or hostile value, a reset in the year
/// 9999) as exactly [`HINT_CEILING`], a day; believed, it would hold every request that long.
pub(crate) fn believed(wait: Duration) -> Option<Duration> {
    (wait < HINT_CEILING).then_some(wait)
}

/// A non-negative decimal count from a header, capped at [`LARGEST_LIMIT`].
fn count(headers: &HeaderMap, name: HeaderName) -> Option<u64> {
    let value: &HeaderValue = headers.get(name)?;
    match parse_decimal(value.as_bytes().trim_ascii()) {
        Ok(count) => Some(count.min(LARGEST_LIMIT)),
        Err(DecimalError::TooLarge) => Some(LARGEST_LIMIT),
        Err(DecimalError::NotANumber) => None,
    }
}

/// The multiplicative decrease of the request rate on a 429: to 70% of the rate that met it.
/// AWS SDKs' adaptive retry mode (the Smithy reference architecture's "client rate limiter",
/// after CUBIC, RFC 8312) uses `β = 0.7`.
pub(crate) const BETA: f64 = 0.7;

/// How fast the rate grows back after a 429 (CUBIC's `C`): 0.4, as in AWS's adaptive retry mode.
pub(crate) const SCALE: f64 = 0.4;

/// The slowest rate the adaptive limit falls to: half a request a second (AWS's minimum fill
/// rate).
pub(crate) const MIN_RATE: f64 = 0.5;

/// The request rate of a limit that learns from 429s alone (no numbers configured or stated):
/// CUBIC congestion control on requests a second, as AWS SDKs' adaptive retry mode applies it.
///
/// Unlimited until the first 429. Then, with `w_max` the rate that met the 429, the rate drops to
/// `β · w_max` and grows back as `C · (t - K)^3 + w_max`, `K = ∛(w_max · (1 - β) / C)`: quickly
/// while far below `w_max`, slowly near it (where the last 429 came), quickly again beyond it (the
/// limit may have been raised). It never exceeds twice the rate actually sent, so a quiet spell
/// does not leave it unbounded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Cubic {
    /// The rate that met the last 429, requests a second.
    w_max: f64,
    /// When the last 429 came, seconds on the limit's clock.
    since: f64,
}

impl Cubic {
    /// After a 429 at `now` (seconds), with requests sent at `sent_rate` a second and the limit
    /// then at `rate` (if any).
    pub(crate) fn throttled(now: f64, sent_rate: f64, rate: Option<f64>) -> Self {
        let w_max = rate
            .map_or(sent_rate, |rate| rate.min(sent_rate))
            .max(MIN_RATE);
        Self { w_max, since: now }
    }

    /// Whether a request reserved at `at` (seconds) was paced at the rate of the last cut: one
    /// reserved before it went at the rate the cut already answered, and its 429 says nothing
    /// new (as TCP cuts its window once for the losses of one window).
    pub(crate) fn paced(&self, at: f64) -> bool {
        at > self.since
    }

    /// The rate at `now` (seconds), requests a second, for a client sending at `sent_rate`.
    pub(crate) fn rate(&self, now: f64, sent_rate: f64) -> f64 {
        let k = (self.w_max * (1.0 - BETA) / SCALE).cbrt();
        let t = (now - self.since).max(0.0);
        let cubic = SCALE * (t - k).powi(3) + self.w_max;
        cubic.min(2.0 * sent_rate.max(MIN_RATE)).max(MIN_RATE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    HeaderName::from_bytes(name.as_bytes()).unwrap_or(headers::RETRY_AFTER),
                    HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("")),
                )
            })
            .collect()
    }

    #[test]
    fn openai_headers_state_both_limits() {
        let stated = Stated::read(
            &headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "120ms"),
                ("x-ratelimit-limit-tokens", "30000"),
                ("x-ratelimit-remaining-tokens", "29000"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ]),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            stated.requests,
            Quota {
                limit: Some(500),
                remaining: Some(0),
                reset: Some(Duration::from_millis(120)),
            }
        );
        assert_eq!(
            stated.requests.spent_for(),
            Some(Duration::from_millis(120))
        );
        assert_eq!(stated.tokens.limit, Some(30_000));
        assert_eq!(stated.tokens.reset, Some(Duration::from_secs(360)));
        assert_eq!(stated.tokens.spent_for(), None);
    }

    #[test]
    fn anthropic_headers_state_both_limits_against_the_clock() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
        let stated = Stated::read(
            &headers(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:01Z"),
                ("anthropic-ratelimit-input-tokens-limit", "40000"),
                ("anthropic-ratelimit-input-tokens-remaining", "0"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2026-01-01T00:00:30Z",
                ),
            ]),
            now,
        );
        assert_eq!(stated.requests.limit, Some(50));
        assert_eq!(stated.requests.reset, Some(Duration::from_secs(1)));
        assert_eq!(stated.tokens.limit, Some(40_000));
        assert_eq!(stated.tokens.spent_for(), Some(Duration::from_secs(30)));
    }

    #[test]
    fn hostile_values_are_left_out() {
        for value in [
            "-1",
            "1e9",
            "",
            " ",
            "12abc",
            "99999999999999999999999999",
            "0x10",
        ] {
            let stated = Stated::read(
                &headers(&[
                    ("x-ratelimit-limit-requests", value),
                    ("x-ratelimit-remaining-requests", value),
                    ("x-ratelimit-reset-requests", value),
                ]),
                SystemTime::UNIX_EPOCH,
            );
            assert!(
                stated.requests.limit.is_none() || stated.requests.limit == Some(LARGEST_LIMIT),
                "{value}: {stated:?}"
            );
        }
        // Huge counts are capped; a zero limit states nothing.
        let stated = Stated::read(
            &headers(&[
                ("x-ratelimit-limit-requests", "18446744073709551616"),
                ("x-ratelimit-limit-tokens", "0"),
            ]),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(stated.requests.limit, Some(LARGEST_LIMIT));
        assert_eq!(stated.tokens.limit, None);
        // A reset in the past is none.
        let stated = Stated::read(
            &headers(&[("anthropic-ratelimit-requests-reset", "1999-01-01T00:00:00Z")]),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600),
        );
        assert_eq!(stated.requests.reset, None);
    }

    #[test]
    fn cubic_drops_to_70_percent_and_grows_back_past_the_old_rate() {
        let cubic = Cubic::throttled(10.0, 100.0, None);
        assert!((cubic.rate(10.0, 100.0) - 70.0).abs() < 1e-9);
        // K = cbrt(100 * 0.3 / 0.4) = 4.22 s: back at 100 then, beyond it later.
        let k = (100.0_f64 * 0.3 / 0.4).cbrt();
        assert!((cubic.rate(10.0 + k, 100.0) - 100.0).abs() < 1e-9);
        assert!(cubic.rate(10.0 + k + 3.0, 100.0) > 110.0);
        // Never above twice the rate sent, never below half a request a second.
        assert_eq!(cubic.rate(1_000.0, 10.0), 20.0);
        assert_eq!(Cubic::throttled(0.0, 0.0, None).rate(0.0, 0.0), MIN_RATE);
    }
}
