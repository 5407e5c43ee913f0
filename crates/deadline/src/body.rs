//! An LLM request's JSON body, read for what sizes it: its few small top-level fields kept, its
//! prompt's text counted as it is read.
//!
//! The body is read on every request that has one, and a chat request carries its whole
//! conversation: parsing it into a [`Value`] would allocate every key and string of it to read a
//! handful of fields. Here the prompt fields' strings are only counted, other fields are skipped,
//! and only the small fields that size or shape the request (`stream`, the output limits, the
//! reasoning settings) are kept as values. The result is the same as reading the whole body into a
//! [`Value`] and picking those fields out of it: a key given twice counts at its last occurrence,
//! and a body that is not JSON, or not an object, has none of them.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Top-level fields holding the prompt: chat `messages`, Responses/embeddings `input`, legacy
/// completions `prompt`, Gemini `contents`, Anthropic's `system` and Responses' `instructions`.
pub(crate) const PROMPT_FIELDS: [&str; 6] = [
    "messages",
    "input",
    "prompt",
    "contents",
    "system",
    "instructions",
];

/// The small top-level fields kept as values: whether it streams, its output limit (flat or
/// nested), and whether it asks the model to reason first.
const KEPT_FIELDS: [&str; 9] = [
    "stream",
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
    "generationConfig",
    "generation_config",
    "reasoning_effort",
    "reasoning",
    "thinking",
];

/// A JSON object body, read: the kept fields, and the bytes of text in each prompt field.
#[derive(Debug, Default)]
pub(crate) struct BodyFields {
    /// The kept fields ([`KEPT_FIELDS`]) the body has.
    pub(crate) kept: Map<String, Value>,
    /// The bytes of text in each of [`PROMPT_FIELDS`] (0 when absent).
    prompt_bytes: [u64; PROMPT_FIELDS.len()],
}

impl BodyFields {
    /// The fields of `body`; `None` when it is not a JSON object.
    pub(crate) fn read(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The bytes of text in the prompt fields, together, saturating.
    pub(crate) fn prompt_bytes(&self) -> u64 {
        self.prompt_bytes
            .iter()
            .fold(0, |sum, bytes| sum.saturating_add(*bytes))
    }
}

impl<'de> Deserialize<'de> for BodyFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = BodyFields;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BodyFields, A::Error> {
        let mut fields = BodyFields::default();
        while let Some(name) = map.next_key::<FieldName>()? {
            match name {
                FieldName::Prompt(index) => {
                    fields.prompt_bytes[index] = map.next_value::<TextBytes>()?.0;
                }
                FieldName::Kept(name) => {
                    let value = map.next_value::<Value>()?;
                    fields.kept.insert(name.to_owned(), value);
                }
                FieldName::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// A top-level key, recognised without being copied.
enum FieldName {
    Prompt(usize),
    Kept(&'static str),
    Other,
}

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = FieldName;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a field name")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<FieldName, E> {
                if let Some(index) = PROMPT_FIELDS.iter().position(|field| *field == name) {
                    return Ok(FieldName::Prompt(index));
                }
                Ok(KEPT_FIELDS
                    .iter()
                    .find(|field| **field == name)
                    .map_or(FieldName::Other, |field| FieldName::Kept(field)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// Bytes of text in a JSON value: the sum of its strings' lengths, object keys not counted
/// (message roles are, which is noise of a few bytes per message). Nesting is bounded by
/// `serde_json`'s recursion limit (128), past which the body is not read at all.
struct TextBytes(u64);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = TextBytes;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<TextBytes, E> {
        Ok(TextBytes(u64::try_from(text.len()).unwrap_or(u64::MAX)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_unit<E: de::Error>(self) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<TextBytes, A::Error> {
        let mut total: u64 = 0;
        while let Some(TextBytes(bytes)) = items.next_element()? {
            total = total.saturating_add(bytes);
        }
        Ok(TextBytes(total))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<TextBytes, A::Error> {
        let mut total: u64 = 0;
        while let Some((IgnoredAny, TextBytes(bytes))) = fields.next_entry()? {
            total = total.saturating_add(bytes);
        }
        Ok(TextBytes(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What reading the whole body into a `Value` gives: the reference the reader must match.
    fn by_value(body: &[u8]) -> Option<(Map<String, Value>, u64)> {
        let Ok(Value::Object(all)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        fn text(value: &Value) -> u64 {
            match value {
                Value::String(text) => text.len() as u64,
                Value::Array(items) => items.iter().map(text).sum(),
                Value::Object(fields) => fields.values().map(text).sum(),
                _ => 0,
            }
        }
        let prompt = PROMPT_FIELDS
            .iter()
            .filter_map(|name| all.get(*name))
            .map(text)
            .sum();
        let kept = all
            .into_iter()
            .filter(|(name, _)| KEPT_FIELDS.contains(&name.as_str()))
            .collect();
        Some((kept, prompt))
    }

    #[test]
    fn reads_what_a_whole_parse_reads() {
        let bodies: [&[u8]; 12] = [
            br#"{"model": "m", "stream": true, "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}"#,
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "caf\u00e9 \"q\""}]}], "system": "be brief"}"#,
            br#"{"input": "a", "input": "longer text", "stream": false, "stream": true}"#,
            br#"{"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 7, "thinkingConfig": {"thinkingBudget": 0}}}"#,
            br#"{"reasoning": {"effort": "high"}, "instructions": "think", "prompt": ["one", "two", 3, null, true]}"#,
            br#"{"thinking": {"type": "enabled"}, "max_tokens": 12.5, "extra": {"deep": [[["ignored"]]]}}"#,
            br#"{"m\u0061x_tokens": 9, "reasoning_effort": "none"}"#,
            br#"{}"#,
            br#"[1, 2]"#,
            br#""a string""#,
            b"\xff not json",
            br#"{"messages": "unterminated"#,
        ];
        for body in bodies {
            let read = BodyFields::read(body).map(|fields| {
                let prompt = fields.prompt_bytes();
                (fields.kept, prompt)
            });
            assert_eq!(read, by_value(body), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn nesting_past_the_recursion_limit_is_not_read_and_does_not_overflow() {
        let deep = format!(
            r#"{{"messages": {}"x"{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(BodyFields::read(deep.as_bytes()).is_none());
        let shallow = format!(
            r#"{{"messages": {}"xyz"{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(
            BodyFields::read(shallow.as_bytes()).map(|f| f.prompt_bytes()),
            Some(3)
        );
    }
}
