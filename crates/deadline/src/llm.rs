//! Deadlines sized for LLM requests from their JSON body.

use std::time::Duration;

use serde_json::Value;

use crate::DEFAULT_TIMEOUT;
use crate::body::BodyFields;

/// Bytes of prompt text per token, the usual rule of thumb for English text with BPE tokenizers
/// (OpenAI's and Anthropic's documentation both quote about 4 characters per token).
pub const BYTES_PER_TOKEN: u64 = 4;

/// Output tokens assumed when a request names no limit (or its body is not JSON): 4096, a common
/// default completion limit, so a request without `max_tokens` still gets room for a long answer.
pub const ASSUMED_OUTPUT_TOKENS: u64 = 4096;

/// Top-level fields naming the output-token limit: OpenAI Chat Completions (`max_tokens`,
/// `max_completion_tokens`), Anthropic Messages (`max_tokens`), OpenAI Responses
/// (`max_output_tokens`).
const OUTPUT_LIMIT_FIELDS: [&str; 3] = ["max_completion_tokens", "max_tokens", "max_output_tokens"];

/// Gemini / Vertex AI nest the limit: `generationConfig.maxOutputTokens` (REST JSON uses the camel
/// case; the snake case is accepted as well).
const NESTED_OUTPUT_LIMITS: [(&str, &str); 2] = [
    ("generationConfig", "maxOutputTokens"),
    ("generation_config", "max_output_tokens"),
];

/// A deadline estimated from an LLM request: a 4000-token generation gets a longer deadline than a
/// 50-token reply.
///
/// `estimate = min(max, base + prompt_tokens * per_prompt_token + output_tokens * per_output_token)`
///
/// where the output tokens are the request's own limit (`max_tokens`, `max_completion_tokens`,
/// `max_output_tokens`, Gemini's `generationConfig.maxOutputTokens`) and the prompt tokens are the
/// bytes of text under `messages` / `input` / `prompt` / `contents` / `system` / `instructions` at
/// [`BYTES_PER_TOKEN`] bytes per token.
///
/// Defaults ([`Default`]), and where they come from:
///
/// - `per_output_token` = **28 ms** (about 35 tokens/s). Large models decode at a few tens of
///   tokens per second in published throughput figures, and Anthropic's SDK sizes its non-streaming
///   timeout by the same rule: 3600 s per 128,000 `max_tokens`, i.e. 28.1 ms per output token.
/// - `per_prompt_token` = **1 ms**. Prefill runs one to two orders of magnitude faster than decode
///   (thousands of tokens per second); 1 ms per token stays conservative under load.
/// - `base` = **10 s**: queueing at the provider and time to first token, which alone reaches
///   seconds for large and reasoning models.
/// - `max` = **600 s** ([`DEFAULT_TIMEOUT`]): the default request timeout of the official OpenAI
///   and Anthropic SDKs (10 minutes); no default client waits longer.
///
/// When the body is not JSON or names no limit, [`ASSUMED_OUTPUT_TOKENS`] are assumed; a body
/// that was not read (larger than what the reader buffers: the client engine's replay cap, 1 MiB
/// by default) gets `max`.
///
/// As a [`TimeoutSource`](crate::client::TimeoutSource) it reads the body: the client retry engine,
/// which buffers request bodies for replay anyway, makes the estimate.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::LlmDeadline;
///
/// let llm = LlmDeadline::default();
/// let short = llm.estimate(br#"{"max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}"#);
/// // "user" + "Hi" = 6 bytes of text = 2 prompt tokens.
/// assert_eq!(short.as_millis(), 10_000 + 2 + 50 * 28);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlmDeadline {
    /// Fixed part: queueing and time to first token.
    pub base: Duration,
    /// Time per prompt token (prefill).
    pub per_prompt_token: Duration,
    /// Time per output token (decode).
    pub per_output_token: Duration,
    /// Upper bound of any estimate, and the deadline of requests whose body cannot be read.
    pub max: Duration,
}

impl Default for LlmDeadline {
    /// Base 10 s, 1 ms per prompt token, 28 ms per output token, at most 600 s (see the type docs).
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            per_prompt_token: Duration::from_millis(1),
            per_output_token: Duration::from_millis(28),
            max: DEFAULT_TIMEOUT,
        }
    }
}

impl LlmDeadline {
    /// The time allowed for a request with this (JSON) body. Total: any bytes give an estimate in
    /// `[base, max]` (or `max` if `base > max`).
    pub fn estimate(&self, body: &[u8]) -> Duration {
        let tokens = TokenEstimate::of(body);
        self.for_tokens(tokens.prompt, tokens.output)
    }

    /// `min(max, base + prompt_tokens * per_prompt_token + output_tokens * per_output_token)`,
    /// saturating.
    pub fn for_tokens(&self, prompt_tokens: u64, output_tokens: u64) -> Duration {
        let nanos = self
            .base
            .as_nanos()
            .saturating_add(
                self.per_prompt_token
                    .as_nanos()
                    .saturating_mul(u128::from(prompt_tokens)),
            )
            .saturating_add(
                self.per_output_token
                    .as_nanos()
                    .saturating_mul(u128::from(output_tokens)),
            );
        if nanos >= self.max.as_nanos() {
            return self.max;
        }
        // Below `max`, so it fits a `Duration`.
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        Duration::new(secs, (nanos % 1_000_000_000) as u32)
    }
}

/// The tokens an LLM request will use, estimated from its JSON body before it is sent: the
/// prompt (its text at [`BYTES_PER_TOKEN`] bytes per token) and the output it allows (its own
/// limit, or [`ASSUMED_OUTPUT_TOKENS`]). What [`LlmDeadline`] sizes a deadline from, and what a
/// tokens-per-minute rate limit weighs a request by (providers count a request's `max_tokens`
/// against the quota when they admit it).
///
/// ```
/// use stormguard_deadline::TokenEstimate;
///
/// let tokens = TokenEstimate::of(br#"{"max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}"#);
/// assert_eq!((tokens.prompt, tokens.output, tokens.total()), (2, 50, 52));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEstimate {
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens the request allows.
    pub output: u64,
}

impl TokenEstimate {
    /// The estimate for a request with this body (not JSON: no prompt, the assumed output).
    pub fn of(body: &[u8]) -> Self {
        BodyFields::read(body).map_or_else(Self::unknown, |fields| Self::of_fields(&fields))
    }

    /// The estimate for a body that is not a JSON object: no prompt, the assumed output.
    pub(crate) fn unknown() -> Self {
        Self {
            prompt: 0,
            output: ASSUMED_OUTPUT_TOKENS,
        }
    }

    /// The estimate for a request whose JSON body has these `fields`.
    pub(crate) fn of_fields(body: &BodyFields) -> Self {
        let fields = &body.kept;
        let output = OUTPUT_LIMIT_FIELDS
            .iter()
            .find_map(|name| fields.get(*name).and_then(token_count))
            .or_else(|| {
                NESTED_OUTPUT_LIMITS.iter().find_map(|(outer, inner)| {
                    fields.get(*outer)?.get(*inner).and_then(token_count)
                })
            })
            .unwrap_or(ASSUMED_OUTPUT_TOKENS);
        Self {
            prompt: body.prompt_bytes().div_ceil(BYTES_PER_TOKEN),
            output,
        }
    }

    /// Prompt and output together, saturating.
    pub fn total(&self) -> u64 {
        self.prompt.saturating_add(self.output)
    }
}

/// A token limit: a non-negative integer (a float is truncated); anything else is no limit.
fn token_count(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        let float = value.as_f64()?;
        // `as` saturates for floats: 1e300 becomes u64::MAX, which `for_tokens` clips to `max`.
        (float.is_finite() && float >= 0.0).then_some(float as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(prompt_chars: usize, max_tokens: u64) -> Vec<u8> {
        serde_json::json!({
            "model": "gpt-4o",
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "x".repeat(prompt_chars)}],
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn long_generation_with_long_prompt_gets_a_proportionally_longer_deadline() {
        let llm = LlmDeadline::default();
        // 20,000 characters ("user" adds 4 bytes) = 5,001 prompt tokens; 4,000 output tokens.
        let long = llm.estimate(&chat(20_000, 4000));
        assert_eq!(long, Duration::from_millis(10_000 + 5_001 + 4_000 * 28));
        // A 50-token reply to a 20-character prompt: 6 prompt tokens.
        let short = llm.estimate(&chat(20, 50));
        assert_eq!(short, Duration::from_millis(10_000 + 6 + 50 * 28));
        // Beyond the fixed base, time grows with the work asked for.
        let long_work = long - llm.base;
        let short_work = short - llm.base;
        assert!(
            long_work > short_work * 80,
            "{long_work:?} vs {short_work:?}"
        );
    }

    #[test]
    fn every_provider_spelling_of_the_output_limit_is_read() {
        let llm = LlmDeadline {
            base: Duration::ZERO,
            per_prompt_token: Duration::ZERO,
            per_output_token: Duration::from_millis(10),
            max: Duration::from_secs(3600),
        };
        let bodies = [
            r#"{"max_tokens": 100}"#,
            r#"{"max_completion_tokens": 100}"#,
            r#"{"max_output_tokens": 100}"#,
            r#"{"generationConfig": {"maxOutputTokens": 100}}"#,
            r#"{"generation_config": {"max_output_tokens": 100}}"#,
            r#"{"max_tokens": 100.7}"#,
        ];
        for body in bodies {
            assert_eq!(
                llm.estimate(body.as_bytes()),
                Duration::from_secs(1),
                "{body}"
            );
        }
    }

    #[test]
    fn prompt_fields_of_every_provider_count() {
        let llm = LlmDeadline {
            base: Duration::ZERO,
            per_prompt_token: Duration::from_millis(1),
            per_output_token: Duration::ZERO,
            max: Duration::from_secs(3600),
        };
        let text = "y".repeat(4000); // 1000 tokens
        for field in ["input", "prompt", "system", "instructions"] {
            let body = serde_json::json!({ field: text }).to_string();
            assert_eq!(
                llm.estimate(body.as_bytes()),
                Duration::from_secs(1),
                "{field}"
            );
        }
        let gemini = serde_json::json!({"contents": [{"parts": [{"text": text}]}]}).to_string();
        assert_eq!(llm.estimate(gemini.as_bytes()), Duration::from_secs(1));
    }

    #[test]
    fn missing_or_hostile_limits_fall_back_to_the_assumed_output() {
        let llm = LlmDeadline::default();
        let assumed = Duration::from_millis(10_000 + 4096 * 28);
        for body in [
            &b""[..],
            b"not json",
            b"[1, 2]",
            br#"{"max_tokens": -5}"#,
            br#"{"max_tokens": "lots"}"#,
            br#"{"messages": null}"#,
            b"\xff\xfe\x00",
        ] {
            assert_eq!(llm.estimate(body), assumed, "{body:?}");
        }
    }

    #[test]
    fn estimates_never_exceed_max() {
        let llm = LlmDeadline::default();
        assert_eq!(
            llm.estimate(br#"{"max_tokens": 1e300}"#),
            Duration::from_secs(600)
        );
        assert_eq!(
            llm.estimate(br#"{"max_tokens": 18446744073709551615}"#),
            Duration::from_secs(600)
        );
        assert_eq!(llm.for_tokens(u64::MAX, u64::MAX), Duration::from_secs(600));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            llm.estimate(deep.as_bytes()),
            Duration::from_millis(10_000 + 4096 * 28)
        );
    }
}
