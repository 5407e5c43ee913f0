//! The values a configuration holds beyond TOML's own: environment variables' names, base URLs,
//! durations.

use std::time::Duration;

use http::Uri;

/// Whether `name` can be an environment variable's name (`[A-Za-z_][A-Za-z0-9_]*`): a key
/// pasted where a name belongs (`sk-...`) is not one.
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// A provider's address: its origin, and a path put before the caller's (`/v1/...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    /// Scheme, host and port.
    pub origin: Uri,
    /// A path before `/v1/...` (empty, or starting with `/`, without a trailing `/`).
    pub prefix: String,
}

impl BaseUrl {
    /// Parses `text`: `http` or `https`, a host, an optional path. A trailing `/v1` is dropped,
    /// as the OpenAI SDKs' `base_url` ends with it and every relayed path starts with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri: Uri = text
            .parse()
            .map_err(|_| "not a URL (e.g. https://api.openai.com)".to_owned())?;
        let scheme = uri.scheme_str().unwrap_or("");
        if scheme != "http" && scheme != "https" {
            return Err("the scheme must be http or https".to_owned());
        }
        let Some(authority) = uri.authority() else {
            return Err("the URL has no host".to_owned());
        };
        if uri.query().is_some() || authority.as_str().contains('@') {
            return Err("a base URL holds no query and no credentials".to_owned());
        }
        let origin = Uri::builder()
            .scheme(scheme)
            .authority(authority.as_str())
            .path_and_query("/")
            .build()
            .map_err(|_| "not a URL".to_owned())?;
        let path = uri.path().trim_end_matches('/');
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        Ok(Self { origin, prefix })
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let origin = self.origin.to_string();
        write!(f, "{}{}", origin.trim_end_matches('/'), self.prefix)
    }
}

/// Parses a duration written with its unit: `500ms`, `30s`, `10m`, `1h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. \"600s\", \"10m\")"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => return Err(format!("`{text}` has no unit: ms, s, m or h")),
    };
    if duration.is_zero() {
        return Err("a duration must be longer than zero".to_owned());
    }
    Ok(duration)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_told_from_keys() {
        assert!(is_env_name("OPENAI_API_KEY"));
        assert!(is_env_name("_K2"));
        assert!(!is_env_name("sk-proj-abc"));
        assert!(!is_env_name("2KEY"));
        assert!(!is_env_name(""));
    }

    #[test]
    fn base_urls_keep_a_prefix_and_drop_v1() {
        let url = BaseUrl::parse("https://openrouter.ai/api/v1/").unwrap();
        assert_eq!(url.origin, "https://openrouter.ai/");
        assert_eq!(url.prefix, "/api");
        assert_eq!(BaseUrl::parse("http://127.0.0.1:8000").unwrap().prefix, "");
        assert!(BaseUrl::parse("ftp://x").is_err());
        assert!(BaseUrl::parse("https://user:pw@x").is_err());
    }

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
