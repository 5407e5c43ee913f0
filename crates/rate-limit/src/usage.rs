//! The tokens an answer says it used, read from its JSON body.

use serde_json::Value;

/// Largest answer body read for its usage: 256 KiB. A non-streamed chat completion of a few
/// thousand tokens is some tens of kilobytes; a longer body is passed on unread.
pub const USAGE_BODY_LIMIT: usize = 256 * 1024;

/// The tokens a provider's answer says the request used, prompt and output together: OpenAI's
/// `usage.total_tokens` (or `prompt_tokens + completion_tokens`, or the Responses API's
/// `input_tokens + output_tokens`), Anthropic's `usage.input_tokens + output_tokens` (cache reads
/// and writes included), Gemini's `usageMetadata.totalTokenCount`. `None` when the body is not
/// JSON or names no usage.
///
/// ```
/// use stormguard_rate_limit::usage_tokens;
///
/// let openai = br#"{"usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}"#;
/// assert_eq!(usage_tokens(openai), Some(42));
/// let anthropic = br#"{"usage": {"input_tokens": 12, "output_tokens": 30}}"#;
/// assert_eq!(usage_tokens(anthropic), Some(42));
/// assert_eq!(usage_tokens(b"not json"), None);
/// ```
pub fn usage_tokens(body: &[u8]) -> Option<u64> {
    let value: Value = serde_json::from_slice(body).ok()?;
    if let Some(total) = value
        .get("usageMetadata")
        .and_then(|usage| usage.get("totalTokenCount"))
        .and_then(Value::as_u64)
    {
        return Some(total);
    }
    let usage = value.get("usage")?;
    if let Some(total) = usage.get("total_tokens").and_then(Value::as_u64) {
        return Some(total);
    }
    let count = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
    let total = [
        "prompt_tokens",
        "completion_tokens",
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .into_iter()
    .map(count)
    .fold(0u64, u64::saturating_add);
    (total > 0).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_format_and_nothing_else() {
        assert_eq!(
            usage_tokens(br#"{"usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 9}}"#),
            Some(9)
        );
        assert_eq!(
            usage_tokens(br#"{"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100}}"#),
            Some(115)
        );
        assert_eq!(
            usage_tokens(br#"{"usage": {"prompt_tokens": 7, "completion_tokens": 3}}"#),
            Some(10)
        );
        for body in [
            &br#"{"usage": {}}"#[..],
            br#"{"usage": {"total_tokens": -4}}"#,
            br#"{"usage": "many"}"#,
            br#"[1, 2]"#,
            b"",
            br#"{"choices": []}"#,
        ] {
            assert_eq!(
                usage_tokens(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            usage_tokens(
                br#"{"usage": {"input_tokens": 18446744073709551615, "output_tokens": 9}}"#
            ),
            Some(u64::MAX)
        );
    }
}
