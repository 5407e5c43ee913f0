//! Request builders: a JSON `POST`, and the providers' chat requests.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

/// A small OpenAI chat completion request, as [`openai_chat`] sends it with `max_tokens: 16`.
pub const OPENAI_CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":16}"#;

/// A small Anthropic messages request, as [`anthropic_messages`] sends it with `max_tokens: 16`.
pub const ANTHROPIC_MESSAGES: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

/// A `POST` of `body` to `uri`, as JSON (`content-type: application/json`).
///
/// # Panics
///
/// If `uri` is not a valid URI.
pub fn post(uri: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.into()))
        .expect("a valid URI")
}

/// An OpenAI chat completion request to `uri` (one user message, `gpt-4o-mini`) asking for at
/// most `max_tokens`.
///
/// # Panics
///
/// If `uri` is not a valid URI.
pub fn openai_chat(uri: &str, max_tokens: u32) -> Request<Full<Bytes>> {
    post(
        uri,
        format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens}}}"#
        ),
    )
}

/// An Anthropic messages request to `uri` (one user message, with the `anthropic-version`
/// header) asking for at most `max_tokens`.
///
/// # Panics
///
/// If `uri` is not a valid URI.
pub fn anthropic_messages(uri: &str, max_tokens: u32) -> Request<Full<Bytes>> {
    let mut request = post(
        uri,
        format!(
            r#"{{"model":"claude-sonnet-4-5","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
        ),
    );
    request.headers_mut().insert(
        "anthropic-version",
        http::HeaderValue::from_static("2023-06-01"),
    );
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_providers_bodies_are_the_documented_ones() {
        let openai = openai_chat("http://llm.test/v1/chat/completions", 16);
        let body = openai.into_body().collect().await.map(|c| c.to_bytes());
        assert_eq!(body.ok(), Some(Bytes::from_static(OPENAI_CHAT.as_bytes())));
        let anthropic = anthropic_messages("http://llm.test/v1/messages", 16);
        assert_eq!(anthropic.headers()["anthropic-version"], "2023-06-01");
        let body = anthropic.into_body().collect().await.map(|c| c.to_bytes());
        assert_eq!(
            body.ok(),
            Some(Bytes::from_static(ANTHROPIC_MESSAGES.as_bytes()))
        );
    }
}
