//! The tokens an answer says it used ([`TokenCounts`]), read from the usage object of the LLM
//! APIs' answers: OpenAI's `usage.prompt_tokens` / `completion_tokens`, Anthropic's
//! `usage.input_tokens` / `output_tokens` (its cache reads and writes are input too, and in a
//! stream the usage sits in `message_start`'s `message`), Gemini's `usageMetadata`
//! (`promptTokenCount`, `candidatesTokenCount`).

use serde_json::Value;

/// Input and output tokens of one answer (or one event of a streamed one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Prompt tokens.
    pub input: u64,
    /// Generated tokens.
    pub output: u64,
}

impl TokenCounts {
    /// The counts a JSON body (a whole answer, or one event's data) reports, if it reports any.
    ///
    /// ```
    /// use stormguard_classify::usage::TokenCounts;
    ///
    /// let openai = br#"{"usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}"#;
    /// assert_eq!(TokenCounts::of_json(openai), Some(TokenCounts { input: 12, output: 30 }));
    /// let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#;
    /// assert_eq!(TokenCounts::of_json(start), Some(TokenCounts { input: 9, output: 1 }));
    /// assert_eq!(TokenCounts::of_json(b"not json"), None);
    /// ```
    pub fn of_json(body: &[u8]) -> Option<Self> {
        let value: Value = serde_json::from_slice(body).ok()?;
        let usage = value.get("usage").or_else(|| {
            value
                .get("message")
                .and_then(|message| message.get("usage"))
        });
        if let Some(usage) = usage.filter(|usage| usage.is_object()) {
            return Some(Self::of_usage(usage));
        }
        let gemini = value.get("usageMetadata")?;
        let count = |name: &str| gemini.get(name).and_then(Value::as_u64).unwrap_or(0);
        Some(Self {
            input: count("promptTokenCount"),
            output: count("candidatesTokenCount"),
        })
    }

    /// The counts of an OpenAI or Anthropic usage object.
    fn of_usage(usage: &Value) -> Self {
        let count = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
        let input = [
            "prompt_tokens",
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .into_iter()
        .map(count)
        .fold(0u64, u64::saturating_add);
        let output = count("completion_tokens").saturating_add(count("output_tokens"));
        Self { input, output }
    }

    /// The larger of each count: a stream reports its usage as it grows (Anthropic's
    /// `message_start`, then `message_delta`'s running output), never less than before.
    #[must_use]
    pub fn max(self, other: Self) -> Self {
        Self {
            input: self.input.max(other.input),
            output: self.output.max(other.output),
        }
    }
}

/// The model a JSON text names, read without parsing the rest: the value of its first `"model"`
/// key (OpenAI's and Anthropic's requests, answers and stream events, Ollama's), else of
/// `"modelVersion"` (Gemini's answers). `None` when it names none, or not as a string. A string
/// with an escape is cut after its first backslash (a model's name has none: whoever reads it
/// as a label can refuse it).
///
/// ```
/// use stormguard_classify::usage::model_named;
///
/// assert_eq!(model_named(br#"{"messages":[],"model":"gpt-4o"}"#), Some("gpt-4o"));
/// assert_eq!(model_named(br#"{"modelVersion":"gemini-2.0-flash-001"}"#), Some("gemini-2.0-flash-001"));
/// assert_eq!(model_named(br#"{"contents":[{"role":"model"}]}"#), None);
/// ```
pub fn model_named(json: &[u8]) -> Option<&str> {
    string_of(json, b"\"model\"").or_else(|| string_of(json, b"\"modelVersion\""))
}

/// The string value of the first `key` (quoted) of `json` followed by a colon.
fn string_of<'a>(json: &'a [u8], key: &[u8]) -> Option<&'a str> {
    let mut from = 0;
    while let Some(at) = json.get(from..)?.windows(key.len()).position(|w| w == key) {
        let start = from + at;
        from = start + key.len();
        // The quotes of a key inside a string are escaped; a value `"model"` (Gemini's role) is
        // followed by no colon.
        if start > 0 && json[start - 1] == b'\\' {
            continue;
        }
        let Some(rest) = json[from..].trim_ascii_start().strip_prefix(b":") else {
            continue;
        };
        let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
        let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
        let end = if rest[end] == b'\\' { end + 1 } else { end };
        return std::str::from_utf8(&rest[..end]).ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_the_first_model_key_s_string() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (br#"{"model":"gpt-4o","messages":[]}"#, Some("gpt-4o")),
            (
                br#"{"messages":[{"role":"user","content":"say \"model\": \"x\""}], "model" : "m-2"}"#,
                Some("m-2"),
            ),
            (br#"{"contents":[{"role":"model","parts":[]}],"model": "g"}"#, Some("g")),
            (br#"{"modelVersion":"g-001","x":{"model":"inner"}}"#, Some("inner")),
            (br#"{"model":null}"#, None),
            (br#"{"model":"a\"b"}"#, Some("a\\")),
            (br#"{"model":"unterminated"#, None),
            (br#"{"model""#, None),
            (b"\"model\"", None),
            (b"", None),
            (&[0xff, b'"', b'm'], None),
        ];
        for (json, model) in cases {
            assert_eq!(
                model_named(json),
                *model,
                "{}",
                String::from_utf8_lossy(json)
            );
        }
    }

    #[test]
    fn each_api_s_usage_is_read_and_hostile_bodies_report_none() {
        let anthropic =
            br#"{"usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":7}}"#;
        assert_eq!(
            TokenCounts::of_json(anthropic),
            Some(TokenCounts {
                input: 100,
                output: 7
            })
        );
        let gemini = br#"{"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":6}}"#;
        assert_eq!(
            TokenCounts::of_json(gemini),
            Some(TokenCounts {
                input: 5,
                output: 6
            })
        );
        let huge = br#"{"usage":{"prompt_tokens":18446744073709551615,"input_tokens":1}}"#;
        assert_eq!(TokenCounts::of_json(huge).map(|c| c.input), Some(u64::MAX));
        for body in [&b"{}"[..], b"[]", b"{\"usage\": 3}", b"\xff"] {
            assert_eq!(TokenCounts::of_json(body), None, "{body:?}");
        }
    }
}
