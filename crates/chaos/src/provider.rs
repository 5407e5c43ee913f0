//! What the providers answer when they fail: the error bodies of OpenAI's and Anthropic's APIs,
//! their error events after a `200`, and a truncated content event, each in its provider's
//! shape. The one copy of each body in the workspace: the chaos layer injects them, and the
//! examples' mock provider answers with them.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use stormguard_classify::headers::RETRY_AFTER_MS;

/// Whose API a request went to, which decides the shape of an injected error: OpenAI's
/// (`{"error": {"message", "type", "param", "code"}}`, and OpenAI-compatible servers) or
/// Anthropic's (`{"type": "error", "error": {"type", "message"}}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI's API (Chat Completions, and every other path).
    #[default]
    OpenAi,
    /// Anthropic's Messages API (`POST /v1/messages`).
    Anthropic,
}

impl Provider {
    /// The provider a request to `path` goes to: Anthropic for Messages (a path ending in
    /// `/messages`), OpenAI for everything else.
    ///
    /// ```
    /// use stormguard_chaos::Provider;
    ///
    /// assert_eq!(Provider::of_path("/v1/messages"), Provider::Anthropic);
    /// assert_eq!(Provider::of_path("/v1/chat/completions"), Provider::OpenAi);
    /// ```
    pub fn of_path(path: &str) -> Self {
        if path.trim_end_matches('/').ends_with("/messages") {
            Provider::Anthropic
        } else {
            Provider::OpenAi
        }
    }

    /// The error event a stream of this provider fails with after its `200`, before any
    /// content: OpenAI's `data:` frame with the body of a 503 (`server_error`), Anthropic's
    /// `event: error` with an `overloaded_error`, as each sends it.
    pub fn error_event(self) -> Bytes {
        match self {
            Provider::OpenAi => Bytes::from_static(OPENAI_ERROR_EVENT.as_bytes()),
            Provider::Anthropic => Bytes::from_static(ANTHROPIC_ERROR_EVENT.as_bytes()),
        }
    }

    /// A content event cut short (its JSON ends mid-string), in this provider's event format:
    /// what a broken proxy or a truncated write leaves in a stream.
    pub fn malformed_event(self) -> Bytes {
        match self {
            Provider::OpenAi => Bytes::from_static(OPENAI_MALFORMED_EVENT.as_bytes()),
            Provider::Anthropic => Bytes::from_static(ANTHROPIC_MALFORMED_EVENT.as_bytes()),
        }
    }
}

/// An error answer of an LLM provider, with its status, its headers and its body in the shape
/// of the provider's API ([`Provider`]).
///
/// | answer | status | OpenAI | Anthropic | a client should |
/// |---|---|---|---|---|
/// | [`RateLimited`](Self::RateLimited) | 429 | `rate_limit_exceeded` | `rate_limit_error` | retry, after the hint if there is one |
/// | [`QuotaExhausted`](Self::QuotaExhausted) | 429 | `insufficient_quota` | `billing_error` | never retry |
/// | [`ContextTooLong`](Self::ContextTooLong) | 400 | `context_length_exceeded` | `invalid_request_error`, "prompt is too long" | never retry (a larger model may take it) |
/// | [`ServerError`](Self::ServerError) | 500 | `server_error` | `api_error` | retry |
/// | [`Unavailable`](Self::Unavailable) | 503 | `server_error`, "overloaded or not ready yet" | `api_error` | retry |
/// | [`Overloaded`](Self::Overloaded) | 529 | Anthropic's `overloaded_error` (OpenAI has no 529) | `overloaded_error` | retry |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorAnswer {
    /// 429, a rate limit; with `retry_after`, the `retry-after-ms` and `Retry-After` headers
    /// OpenAI sends (the seconds rounded up).
    RateLimited {
        /// The delay the answer asks for, if it asks.
        retry_after: Option<Duration>,
    },
    /// 429, the account is out of credit.
    QuotaExhausted,
    /// 400, the prompt is longer than the model's context window.
    ContextTooLong,
    /// 500, an internal error.
    ServerError,
    /// 503, the service is unavailable.
    Unavailable,
    /// 529, the provider is overloaded.
    Overloaded,
}

impl ErrorAnswer {
    /// The answer's HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorAnswer::RateLimited { .. } | ErrorAnswer::QuotaExhausted => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ErrorAnswer::ContextTooLong => StatusCode::BAD_REQUEST,
            ErrorAnswer::ServerError => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorAnswer::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorAnswer::Overloaded => OVERLOADED,
        }
    }

    /// The answer's JSON body, as `provider` writes it.
    pub fn body(self, provider: Provider) -> &'static str {
        match provider {
            Provider::OpenAi => match self {
                ErrorAnswer::RateLimited { .. } => OPENAI_RATE_LIMITED,
                ErrorAnswer::QuotaExhausted => OPENAI_INSUFFICIENT_QUOTA,
                ErrorAnswer::ContextTooLong => OPENAI_CONTEXT_LENGTH_EXCEEDED,
                ErrorAnswer::ServerError => OPENAI_SERVER_ERROR,
                ErrorAnswer::Unavailable => OPENAI_UNAVAILABLE,
                ErrorAnswer::Overloaded => ANTHROPIC_OVERLOADED,
            },
            Provider::Anthropic => match self {
                ErrorAnswer::RateLimited { .. } => ANTHROPIC_RATE_LIMITED,
                ErrorAnswer::QuotaExhausted => ANTHROPIC_BILLING,
                ErrorAnswer::ContextTooLong => ANTHROPIC_PROMPT_TOO_LONG,
                ErrorAnswer::ServerError | ErrorAnswer::Unavailable => ANTHROPIC_API_ERROR,
                ErrorAnswer::Overloaded => ANTHROPIC_OVERLOADED,
            },
        }
    }

    /// The whole answer, as `provider` sends it: its status, `content-type: application/json`,
    /// the hints of a rate limit that has some, and its body.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_chaos::{ErrorAnswer, Provider};
    ///
    /// let limited = ErrorAnswer::RateLimited { retry_after: Some(Duration::from_millis(1_500)) };
    /// let answer = limited.response(Provider::OpenAi);
    /// assert_eq!(answer.status(), 429);
    /// assert_eq!(answer.headers()["retry-after-ms"], "1500");
    /// assert_eq!(answer.headers()["retry-after"], "2");
    /// assert!(answer.body().starts_with(b"{\"error\":{"));
    /// ```
    pub fn response(self, provider: Provider) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from_static(self.body(provider).as_bytes()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let ErrorAnswer::RateLimited {
            retry_after: Some(delay),
        } = self
        {
            let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            let secs = delay
                .as_secs()
                .saturating_add(u64::from(delay.subsec_nanos() > 0));
            headers.insert(RETRY_AFTER_MS, HeaderValue::from(millis));
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// A short snake_case name: `rate_limited`, `quota_exhausted`, `context_too_long`,
    /// `server_error`, `unavailable`, `overloaded`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorAnswer::RateLimited { .. } => "rate_limited",
            ErrorAnswer::QuotaExhausted => "quota_exhausted",
            ErrorAnswer::ContextTooLong => "context_too_long",
            ErrorAnswer::ServerError => "server_error",
            ErrorAnswer::Unavailable => "unavailable",
            ErrorAnswer::Overloaded => "overloaded",
        }
    }
}

/// 529, Anthropic's "overloaded" (no standard name).
const OVERLOADED: StatusCode = match StatusCode::from_u16(529) {
    Ok(status) => status,
    Err(_) => StatusCode::SERVICE_UNAVAILABLE,
};

// OpenAI's bodies: "Error codes" in OpenAI's API reference.
const OPENAI_RATE_LIMITED: &str = r#"{"error":{"message":"Rate limit reached for requests. Please try again shortly.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
const OPENAI_INSUFFICIENT_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const OPENAI_CONTEXT_LENGTH_EXCEEDED: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const OPENAI_SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
const OPENAI_UNAVAILABLE: &str = r#"{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}"#;

// Anthropic's bodies: "Errors" in Anthropic's API reference.
const ANTHROPIC_RATE_LIMITED: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your per-minute rate limit."}}"#;
const ANTHROPIC_BILLING: &str = r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
const ANTHROPIC_PROMPT_TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
const ANTHROPIC_API_ERROR: &str =
    r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
const ANTHROPIC_OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

// A stream's error event after its `200`.
const OPENAI_ERROR_EVENT: &str = concat!(
    "data: ",
    r#"{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}"#,
    "\n\n"
);
const ANTHROPIC_ERROR_EVENT: &str = concat!(
    "event: error\ndata: ",
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    "\n\n"
);

// A content event whose JSON was cut short.
const OPENAI_MALFORMED_EVENT: &str = concat!(
    "data: ",
    r#"{"id":"chatcmpl-chaos","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"#,
    "\n\n"
);
const ANTHROPIC_MALFORMED_EVENT: &str = concat!(
    "event: content_block_delta\ndata: ",
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"#,
    "\n\n"
);

#[cfg(test)]
mod tests {
    use stormguard_classify::{LlmClassifier, Reason};

    use super::*;

    const ANSWERS: [ErrorAnswer; 7] = [
        ErrorAnswer::RateLimited { retry_after: None },
        ErrorAnswer::RateLimited {
            retry_after: Some(Duration::from_millis(250)),
        },
        ErrorAnswer::QuotaExhausted,
        ErrorAnswer::ContextTooLong,
        ErrorAnswer::ServerError,
        ErrorAnswer::Unavailable,
        ErrorAnswer::Overloaded,
    ];

    /// What stormguard's own classifier makes of each answer: the bodies are real enough for
    /// it to tell a rate limit from an exhausted quota.
    #[test]
    fn every_answer_reads_as_the_provider_means_it() {
        for provider in [Provider::OpenAi, Provider::Anthropic] {
            for answer in ANSWERS {
                let (parts, body) = answer.response(provider).into_parts();
                let outcome = LlmClassifier::default().classify_http(&parts, &body);
                let expected = match answer {
                    ErrorAnswer::RateLimited { .. } => (true, Reason::RateLimited),
                    ErrorAnswer::QuotaExhausted => (false, Reason::QuotaExhausted),
                    ErrorAnswer::ContextTooLong => (false, outcome.reason()),
                    ErrorAnswer::ServerError => (true, Reason::ServerError),
                    ErrorAnswer::Unavailable => (true, outcome.reason()),
                    ErrorAnswer::Overloaded => (true, Reason::Overloaded),
                };
                assert_eq!(
                    (outcome.is_retryable(), outcome.reason()),
                    expected,
                    "{provider:?} {answer:?}: {outcome}"
                );
                assert_eq!(parts.headers[CONTENT_TYPE], "application/json");
            }
        }
        // OpenAI names the context window in its code.
        let (parts, body) = ErrorAnswer::ContextTooLong
            .response(Provider::OpenAi)
            .into_parts();
        let outcome = LlmClassifier::default().classify_http(&parts, &body);
        assert_eq!(outcome.reason(), Reason::ContextTooLong);
    }

    #[test]
    fn a_rate_limit_carries_its_hint_only_when_it_has_one() {
        let hinted = ErrorAnswer::RateLimited {
            retry_after: Some(Duration::from_millis(250)),
        }
        .response(Provider::Anthropic);
        assert_eq!(hinted.headers()[RETRY_AFTER_MS], "250");
        assert_eq!(hinted.headers()[RETRY_AFTER], "1");
        let bare = ErrorAnswer::RateLimited { retry_after: None }.response(Provider::OpenAi);
        assert!(bare.headers().get(RETRY_AFTER).is_none());
        assert!(bare.headers().get(RETRY_AFTER_MS).is_none());
        assert_eq!(ErrorAnswer::Overloaded.status().as_u16(), 529);
    }

    #[test]
    fn the_error_events_end_in_a_blank_line_in_each_format() {
        let openai = Provider::OpenAi.error_event();
        assert!(openai.starts_with(b"data: {\"error\":") && openai.ends_with(b"}\n\n"));
        let anthropic = Provider::Anthropic.error_event();
        assert!(anthropic.starts_with(b"event: error\ndata: {") && anthropic.ends_with(b"\n\n"));
        for provider in [Provider::OpenAi, Provider::Anthropic] {
            let malformed = provider.malformed_event();
            assert!(malformed.ends_with(b":\n\n"), "{malformed:?}");
        }
    }
}
