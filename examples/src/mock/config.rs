//! What the mock does: its faults, its latency and its capacity.

use std::time::Duration;

/// A failure the mock answers with, shaped like the real providers' answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 429 `rate_limit_exceeded` (OpenAI's shape) with `retry-after-ms` and `Retry-After` hints.
    RateLimited {
        /// The delay the mock asks for.
        retry_after: Duration,
    },
    /// 503 `server_error`: the backend is unavailable.
    Unavailable,
    /// 529 `overloaded_error` (Anthropic's shape).
    Overloaded,
    /// 429 `insufficient_quota`: the account is out of credit. Never gets better by retrying.
    QuotaExhausted,
    /// A streamed answer that fails before its content (a stream fault): `200`,
    /// `text/event-stream`, the opening events, then an error event and the end of the stream.
    /// OpenAI's error frame is `data: {"error": {"message": ..., "type": "server_error", "code":
    /// null}}` (the body of a 503); Anthropic's `event: error` carries an `overloaded_error`.
    /// Nothing has reached the user yet: a client reads it as a retryable failure, like a 503 or
    /// a 529.
    ErrorBeforeContent,
    /// A streamed answer cut mid-stream (a stream fault): `200`, `text/event-stream`, the opening
    /// events and the first half of the content events (at least one), then the connection
    /// fails: the body ends with an error, without its terminal event (`data: [DONE]`,
    /// `message_stop`).
    CutMidStream,
}

impl Fault {
    /// The HTTP status of this fault: `200` for the stream faults, which fail in the body.
    pub const fn status(self) -> u16 {
        match self {
            Fault::RateLimited { .. } | Fault::QuotaExhausted => 429,
            Fault::Unavailable => 503,
            Fault::Overloaded => 529,
            Fault::ErrorBeforeContent | Fault::CutMidStream => 200,
        }
    }

    /// A short snake_case name, sent in [`MOCK_FAULT`](super::MOCK_FAULT): `rate_limited`,
    /// `unavailable`, `overloaded`, `quota_exhausted`, `error_before_content`, `cut_mid_stream`.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::RateLimited { .. } => "rate_limited",
            Fault::Unavailable => "unavailable",
            Fault::Overloaded => "overloaded",
            Fault::QuotaExhausted => "quota_exhausted",
            Fault::ErrorBeforeContent => "error_before_content",
            Fault::CutMidStream => "cut_mid_stream",
        }
    }

    /// Whether this fault fails a streamed answer after its `200`. Stream faults only happen to
    /// streaming requests (`"stream": true`).
    pub const fn is_stream(self) -> bool {
        matches!(self, Fault::ErrorBeforeContent | Fault::CutMidStream)
    }
}

/// Configuration of the mock LLM server.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Fraction (0.0 ..= 1.0) of requests within capacity that fail with a fault from
    /// [`faults`](Self::faults). 1.0 is a total outage.
    pub error_rate: f64,
    /// The faults to pick from, each with a relative weight. Stream faults
    /// ([`Fault::is_stream`]) are picked for streaming requests only: a plain request that fails
    /// picks among the other faults, and is answered normally when there are none.
    pub faults: Vec<(Fault, u32)>,
    /// The first requests' faults, in arrival order: the n-th request to arrive fails with the
    /// n-th fault, whatever the load and [`error_rate`](Self::error_rate) (`vec![fault]` fails the
    /// first request only). A stream fault scripted for a plain request does not apply: that
    /// request is served as usual. Requests past the end of the list are served as usual.
    pub first_faults: Vec<Fault>,
    /// Fixed part of a successful answer's latency.
    pub base_latency: Duration,
    /// Latency added per requested output token (`max_tokens`), like a generation. A streamed
    /// answer sends one content chunk per token, this long apart.
    pub latency_per_token: Duration,
    /// `max_tokens` assumed when a request does not say.
    pub default_max_tokens: u32,
    /// Requests served at once before the mock degrades. Above it, excess requests are shed with
    /// 503 or 529 and every request's latency grows with the excess, like an overloaded backend.
    pub capacity: usize,
    /// Seed of the fault draws, so that a run can be repeated.
    pub seed: u64,
    /// Streamed answers number their words (`w0 w1 w2 ...`, see
    /// [`word_numbers`](super::word_numbers)) instead of repeating the mock's sentence, so that a
    /// reader can tell a word shown twice or missing wherever a stream was cut.
    pub numbered: bool,
    /// Keep every `Idempotency-Key` seen ([`StatsSnapshot::idempotency_keys`](super::StatsSnapshot::idempotency_keys)).
    /// A long run turns it off: the keys would grow its memory by one per attempt.
    pub keep_idempotency_keys: bool,
}

impl Default for MockConfig {
    /// A healthy-looking provider: 5% errors (rate limits, 503, 529), 2 ms + 1 ms per output
    /// token, 64 requests at once.
    fn default() -> Self {
        Self {
            error_rate: 0.05,
            faults: vec![
                (
                    Fault::RateLimited {
                        retry_after: Duration::from_millis(200),
                    },
                    2,
                ),
                (Fault::Unavailable, 1),
                (Fault::Overloaded, 1),
            ],
            first_faults: Vec::new(),
            base_latency: Duration::from_millis(2),
            latency_per_token: Duration::from_millis(1),
            default_max_tokens: 16,
            capacity: 64,
            seed: 7,
            numbered: false,
            keep_idempotency_keys: true,
        }
    }
}

impl MockConfig {
    /// A mock that answers at once and never fails: change the fields a test cares about.
    pub fn healthy() -> Self {
        Self {
            error_rate: 0.0,
            base_latency: Duration::ZERO,
            latency_per_token: Duration::ZERO,
            ..Self::default()
        }
    }

    /// Fails every request with `fault`.
    pub fn outage(fault: Fault) -> Self {
        Self {
            error_rate: 1.0,
            faults: vec![(fault, 1)],
            ..Self::healthy()
        }
    }

    /// The mock's latency for a request asking for `max_tokens`, with `in_flight` requests
    /// being served (this one included).
    pub fn latency(&self, max_tokens: u32, in_flight: usize) -> Duration {
        let work = self
            .base_latency
            .saturating_add(self.latency_per_token.saturating_mul(max_tokens));
        work.saturating_mul(self.slowdown(in_flight))
    }

    /// The time between two content chunks of a streamed answer, with `in_flight` requests
    /// being served (this one included): a stream takes as long as the answer it streams.
    pub fn token_latency(&self, in_flight: usize) -> Duration {
        self.latency_per_token
            .saturating_mul(self.slowdown(in_flight))
    }

    /// How many times slower than usual the mock works with `in_flight` requests.
    fn slowdown(&self, in_flight: usize) -> u32 {
        let capacity = self.capacity.max(1);
        let excess = in_flight.saturating_sub(capacity);
        // Above capacity every request slows down in proportion: twice the load, twice the time.
        let factor = 1 + excess / capacity;
        u32::try_from(factor).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_grows_with_tokens_and_with_load_above_capacity() {
        let config = MockConfig {
            base_latency: Duration::from_millis(2),
            latency_per_token: Duration::from_millis(1),
            capacity: 10,
            ..MockConfig::default()
        };
        assert_eq!(config.latency(8, 1), Duration::from_millis(10));
        assert_eq!(config.latency(98, 10), Duration::from_millis(100));
        assert_eq!(config.latency(8, 20), Duration::from_millis(20));
        assert_eq!(config.latency(8, 35), Duration::from_millis(30));
        // Hostile numbers saturate instead of overflowing.
        assert!(config.latency(u32::MAX, usize::MAX) > Duration::from_secs(4_000_000));
        // A stream paces its chunks by the same rule.
        assert_eq!(config.token_latency(1), Duration::from_millis(1));
        assert_eq!(config.token_latency(35), Duration::from_millis(3));
    }

    #[test]
    fn only_the_stream_faults_answer_200_and_fail_in_the_body() {
        assert!(Fault::ErrorBeforeContent.is_stream() && Fault::CutMidStream.is_stream());
        assert_eq!(Fault::CutMidStream.status(), 200);
        assert!(!Fault::Overloaded.is_stream() && !Fault::QuotaExhausted.is_stream());
    }
}
