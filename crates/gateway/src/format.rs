//! The two API formats the gateway passes through, and which paths speak each.

use serde::Deserialize;

/// An LLM API format: how a provider is called and how its errors look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// OpenAI's (and every OpenAI-compatible server's): `Authorization: Bearer`, errors as
    /// `{"error":{"message","type","param","code"}}`.
    OpenAi,
    /// Anthropic's: `x-api-key` and `anthropic-version`, errors as
    /// `{"type":"error","error":{"type","message"}}`.
    Anthropic,
}

/// OpenAI's chat completions.
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
/// OpenAI's legacy completions.
pub const COMPLETIONS: &str = "/v1/completions";
/// OpenAI's embeddings.
pub const EMBEDDINGS: &str = "/v1/embeddings";
/// OpenAI's responses.
pub const RESPONSES: &str = "/v1/responses";
/// Anthropic's messages.
pub const MESSAGES: &str = "/v1/messages";
/// The model list (OpenAI's format).
pub const MODELS: &str = "/v1/models";

/// Every path the gateway relays to a provider, with the format it speaks.
pub const RELAYED: [(&str, Format); 5] = [
    (CHAT_COMPLETIONS, Format::OpenAi),
    (COMPLETIONS, Format::OpenAi),
    (EMBEDDINGS, Format::OpenAi),
    (RESPONSES, Format::OpenAi),
    (MESSAGES, Format::Anthropic),
];

impl Format {
    /// The format a caller of `path` speaks: Anthropic's on `/v1/messages`, OpenAI's elsewhere.
    pub fn of_path(path: &str) -> Self {
        if path.starts_with(MESSAGES) {
            Self::Anthropic
        } else {
            Self::OpenAi
        }
    }

    /// Its name in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// Where its public API lives, when the config names no `base_url`.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com",
            Self::Anthropic => "https://api.anthropic.com",
        }
    }

    /// The path callers use for it, named in the error that sends them there.
    pub fn example_path(self) -> &'static str {
        match self {
            Self::OpenAi => CHAT_COMPLETIONS,
            Self::Anthropic => MESSAGES,
        }
    }
}
