//! What a request is, for its clocks: read once from its JSON body (and its address).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::body::BodyFields;
use crate::{LlmDeadline, TokenEstimate};

/// What a request is, for its clocks: streamed or not, the time its size needs, its prompt, and
/// whether it asks the model to reason first ([`RequestShape::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestShape {
    /// It asked for an event stream (`"stream": true`).
    pub streaming: bool,
    /// What a whole answer to it may take when healthy: its [`LlmDeadline`] estimate.
    pub size: Duration,
    /// Its prompt, in tokens ([`TokenEstimate`]): what the provider reads before its first token.
    pub prompt_tokens: u64,
    /// It asks the model to think before it answers ([`asks_for_reasoning`]).
    pub reasoning: bool,
}

impl RequestShape {
    /// A request of `size`, streamed or not, with no prompt to speak of and no reasoning asked
    /// for.
    pub const fn new(streaming: bool, size: Duration) -> Self {
        Self {
            streaming,
            size,
            prompt_tokens: 0,
            reasoning: false,
        }
    }

    /// The shape of a request to `uri` with this JSON body: [`of`](Self::of), streamed also when
    /// the address asks for an event stream whatever the body says, as Gemini's and Vertex AI's
    /// do (`:streamGenerateContent`, `alt=sse`).
    pub fn of_request(uri: &http::Uri, body: Option<&[u8]>, estimate: &LlmDeadline) -> Self {
        let mut shape = Self::of(body, estimate);
        shape.streaming |= streams_by_address(uri);
        shape
    }

    /// The shape of a request with this JSON body (`None`: a body that was not read, sized at
    /// the estimate's maximum; not JSON: a whole answer of the assumed size).
    pub fn of(body: Option<&[u8]>, estimate: &LlmDeadline) -> Self {
        match body {
            Some(body) => BodyShape::of(body).sized(estimate),
            None => Self::new(false, estimate.max),
        }
    }
}

/// What a request's body (and address) says of it, before an estimate sizes it: whether it
/// streams, its tokens, whether it asks for reasoning. Reading it is the costly part of a
/// [`RequestShape`], and each backend sizes it with its own estimate
/// ([`sized`](Self::sized)): a router and the engines it hands the request to read it once
/// between them ([`SharedBodyShape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyShape {
    streaming: bool,
    tokens: TokenEstimate,
    reasoning: bool,
}

impl BodyShape {
    /// The shape of a request to `uri` with this JSON body (see
    /// [`RequestShape::of_request`]).
    pub fn of_request(uri: &http::Uri, body: &[u8]) -> Self {
        let mut shape = Self::of(body);
        shape.streaming |= streams_by_address(uri);
        shape
    }

    /// The shape of a request with this JSON body (not JSON, or not an object: a whole answer
    /// with no prompt and the assumed output).
    pub fn of(body: &[u8]) -> Self {
        let body = BodyFields::read(body).unwrap_or_default();
        let fields = &body.kept;
        Self {
            streaming: fields.get("stream") == Some(&Value::Bool(true)),
            tokens: TokenEstimate::of_fields(&body),
            reasoning: asks_for_reasoning(fields),
        }
    }

    /// Whether the request asks for an event stream.
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// The request sized by `estimate`.
    pub fn sized(&self, estimate: &LlmDeadline) -> RequestShape {
        RequestShape {
            streaming: self.streaming,
            size: estimate.for_tokens(self.tokens.prompt, self.tokens.output),
            prompt_tokens: self.tokens.prompt,
            reasoning: self.reasoning,
        }
    }
}

/// A [`BodyShape`] read at most once, by whichever of its holders asks first. A router and the
/// engines it hands a request to share one (`stormguard-retry`'s `Route::with_body_shape`), so
/// that the body is read once for all their clocks, and not at all when none asks (an answer
/// that came at once). Clones share the one reading.
#[derive(Clone, Debug, Default)]
pub struct SharedBodyShape(Arc<OnceLock<BodyShape>>);

impl SharedBodyShape {
    /// What the body of a request to `uri` says, read from `body` the first time one of the
    /// holders asks (each holder hands the same bytes).
    pub fn get_or_read(&self, uri: &http::Uri, body: &[u8]) -> BodyShape {
        *self.0.get_or_init(|| BodyShape::of_request(uri, body))
    }
}

/// Whether the address asks for an event stream whatever the body says, as Gemini's and Vertex
/// AI's do (`:streamGenerateContent`, `alt=sse`).
fn streams_by_address(uri: &http::Uri) -> bool {
    uri.path().ends_with(":streamGenerateContent")
        || uri
            .query()
            .is_some_and(|query| query.split('&').any(|pair| pair == "alt=sse"))
}

/// Whether a request body's top-level `fields` ask the model to reason before it answers, in the
/// spelling of each API:
///
/// - OpenAI Chat Completions: `reasoning_effort`, unless `"none"`;
/// - OpenAI Responses (and OpenRouter): a `reasoning` object, unless its `effort` is `"none"` or
///   it says `"enabled": false`;
/// - Anthropic Messages: `thinking`, unless its `type` is `"disabled"`;
/// - Gemini: `generationConfig.thinkingConfig`, unless its `thinkingBudget` is 0.
///
/// A model that reasons without being asked (OpenAI's o-series, for one) is not seen here: its
/// cold clocks only hedge, which cannot lose its answer (see [`ColdClocks`](super::ColdClocks)).
pub fn asks_for_reasoning(fields: &Map<String, Value>) -> bool {
    let not = |value: Option<&Value>, off: &Value| value != Some(off);
    if let Some(effort) = fields.get("reasoning_effort") {
        return effort.is_string() && effort != "none";
    }
    if let Some(Value::Object(reasoning)) = fields.get("reasoning") {
        return not(reasoning.get("effort"), &Value::from("none"))
            && not(reasoning.get("enabled"), &Value::Bool(false));
    }
    if let Some(Value::Object(thinking)) = fields.get("thinking") {
        return not(thinking.get("type"), &Value::from("disabled"));
    }
    let gemini = ["generationConfig", "generation_config"]
        .iter()
        .filter_map(|name| fields.get(*name))
        .find_map(|config| {
            config
                .get("thinkingConfig")
                .or(config.get("thinking_config"))
        });
    match gemini {
        Some(Value::Object(thinking)) => {
            let budget = thinking
                .get("thinkingBudget")
                .or(thinking.get("thinking_budget"));
            not(budget, &Value::from(0))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(body: &str) -> RequestShape {
        RequestShape::of(Some(body.as_bytes()), &LlmDeadline::default())
    }

    #[test]
    fn a_body_read_once_sizes_alike_for_every_estimate() {
        let body = br#"{"stream": true, "max_tokens": 250, "reasoning_effort": "high", "messages": [{"role": "user", "content": "Hello there"}]}"#;
        let uri: http::Uri = "https://o.test/v1/chat/completions"
            .parse()
            .unwrap_or_default();
        let read = BodyShape::of_request(&uri, body);
        let slow = LlmDeadline {
            per_output_token: Duration::from_millis(100),
            ..LlmDeadline::default()
        };
        for estimate in [LlmDeadline::default(), slow] {
            let shape = read.sized(&estimate);
            assert_eq!(shape, RequestShape::of_request(&uri, Some(body), &estimate));
            assert!(shape.streaming && shape.reasoning);
            assert_eq!(shape.prompt_tokens, 4); // "user" and "Hello there": 15 bytes
        }
        assert_eq!(
            read.sized(&slow).size,
            Duration::from_millis(10_000 + 4 + 25_000)
        );
    }

    #[test]
    fn a_shape_is_read_from_the_body() {
        let estimate = LlmDeadline::default();
        let body = br#"{"stream": true, "max_tokens": 250, "messages": []}"#;
        let stream = RequestShape::of(Some(body), &estimate);
        assert!(stream.streaming);
        assert_eq!(stream.size, Duration::from_secs(17));
        assert_eq!((stream.prompt_tokens, stream.reasoning), (0, false));
        let whole = RequestShape::of(Some(br#"{"stream": "yes"}"#), &estimate);
        assert!(!whole.streaming);
        assert_eq!(
            RequestShape::of(None, &estimate).size,
            Duration::from_secs(600)
        );
        let not_json = RequestShape::of(Some(b"\xff not json"), &estimate);
        assert_eq!(not_json, RequestShape::new(false, estimate.estimate(b"")));
        // Gemini streams by its address, whatever the body says.
        let gemini: http::Uri = "https://g.test/v1beta/models/m:streamGenerateContent?alt=sse"
            .parse()
            .unwrap_or_default();
        assert!(RequestShape::of_request(&gemini, Some(b"{}"), &estimate).streaming);
        let chat: http::Uri = "https://o.test/v1/chat/completions?x=alt%3Dsse"
            .parse()
            .unwrap_or_default();
        assert!(!RequestShape::of_request(&chat, Some(b"{}"), &estimate).streaming);
    }

    #[test]
    fn the_size_and_the_prompt_are_the_token_estimates() {
        let body = format!(
            r#"{{"max_tokens": 100, "messages": [{{"role": "user", "content": "{}"}}]}}"#,
            "x".repeat(3996)
        );
        let shape = shape(&body);
        // "user" and 3,996 bytes: 1,000 prompt tokens.
        assert_eq!(shape.prompt_tokens, 1_000);
        assert_eq!(shape.size, LlmDeadline::default().estimate(body.as_bytes()));
    }

    #[test]
    fn reasoning_is_read_in_each_apis_spelling() {
        let asked = [
            r#"{"reasoning_effort": "high"}"#,
            r#"{"reasoning_effort": "minimal"}"#,
            r#"{"reasoning": {"effort": "medium", "summary": "auto"}}"#,
            r#"{"reasoning": {"enabled": true}}"#,
            r#"{"thinking": {"type": "enabled", "budget_tokens": 10000}}"#,
            r#"{"thinking": {"type": "adaptive"}}"#,
            r#"{"generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}}}"#,
            r#"{"generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}}"#,
            r#"{"generation_config": {"thinking_config": {"thinking_level": "high"}}}"#,
        ];
        for body in asked {
            assert!(shape(body).reasoning, "{body}");
        }
        let not_asked = [
            r#"{"messages": []}"#,
            r#"{"reasoning_effort": "none"}"#,
            r#"{"reasoning_effort": null}"#,
            r#"{"reasoning": {"effort": "none"}}"#,
            r#"{"reasoning": {"enabled": false}}"#,
            r#"{"reasoning": null}"#,
            r#"{"thinking": {"type": "disabled"}}"#,
            r#"{"thinking": "yes"}"#,
            r#"{"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}"#,
            r#"{"generationConfig": {"thinkingConfig": null}}"#,
            r#"[{"thinking": {"type": "enabled"}}]"#,
        ];
        for body in not_asked {
            assert!(!shape(body).reasoning, "{body}");
        }
    }
}
