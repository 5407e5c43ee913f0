//! Callers' access: their bearer keys, compared in constant time, and the listen address a
//! gateway without keys may use.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use http::{HeaderMap, Response, header};

use super::refusal::Refusal;
use crate::format::Format;

/// The callers' keys (empty: every caller is let in).
#[derive(Clone, Debug, Default)]
pub struct CallerKeys {
    keys: Vec<Vec<u8>>,
}

impl CallerKeys {
    /// Callers holding one of `keys`.
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        Self {
            keys: keys.into_iter().map(String::into_bytes).collect(),
        }
    }

    /// Whether no key is required.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `headers` carry one of the keys: `Authorization: Bearer KEY` (OpenAI's SDKs) or
    /// `x-api-key: KEY` (Anthropic's). Every key is compared, whichever matches.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        if self.is_open() {
            return true;
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .or_else(|| headers.get("x-api-key").map(|value| value.as_bytes()));
        let Some(presented) = presented else {
            return false;
        };
        self.keys
            .iter()
            .fold(false, |found, key| found | constant_time_eq(key, presented))
    }
}

/// Whether `presented` equals `expected`, in a time that depends on `expected`'s length only:
/// every byte of `expected` is compared, whatever `presented` holds, so a caller learns nothing
/// of a key from how long a refusal takes.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut difference = u8::from(expected.len() != presented.len());
    for (i, byte) in expected.iter().enumerate() {
        let other = presented.get(i).copied().unwrap_or(!byte);
        difference |= byte ^ other;
    }
    std::hint::black_box(difference) == 0
}

/// Middleware: lets a request through when it carries a caller key, else answers 401 in the
/// caller's format.
pub async fn require_key(
    State(keys): State<CallerKeys>,
    request: Request,
    next: Next,
) -> Response<Body> {
    if keys.admits(request.headers()) {
        next.run(request).await
    } else {
        Refusal::unauthorized().to_response(Format::of_path(request.uri().path()))
    }
}

/// Why a gateway does not start on its listen address.
#[derive(Debug)]
pub enum ListenRefused {
    /// A non-loopback address and no caller key, without `allow_unauthenticated = true`.
    Unauthenticated(SocketAddr),
}

impl std::fmt::Display for ListenRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unauthenticated(addr) => write!(
                f,
                "refusing to listen on {addr} without caller keys: anyone who reaches it could \
                 spend the providers' keys. Set [server] caller_keys_env, listen on 127.0.0.1, \
                 or set [server] allow_unauthenticated = true"
            ),
        }
    }
}

impl std::error::Error for ListenRefused {}

/// Whether a gateway with `keys` may listen on `addr`.
pub fn check_listen(
    addr: SocketAddr,
    keys: &CallerKeys,
    allow_unauthenticated: bool,
) -> Result<(), ListenRefused> {
    if keys.is_open() && !addr.ip().is_loopback() {
        if allow_unauthenticated {
            tracing::warn!(%addr, "no caller keys: serving anyone who reaches this address (allow_unauthenticated = true)");
        } else {
            return Err(ListenRefused::Unauthenticated(addr));
        }
    } else if keys.is_open() {
        tracing::info!(%addr, "no caller keys: listening on loopback only");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_every_byte_and_the_length() {
        assert!(constant_time_eq(b"sk-caller-1", b"sk-caller-1"));
        assert!(!constant_time_eq(b"sk-caller-1", b"sk-caller-2"));
        assert!(!constant_time_eq(b"sk-caller-1", b"sk-caller-"));
        assert!(!constant_time_eq(b"sk-caller-1", b"sk-caller-11"));
        assert!(!constant_time_eq(b"abc", b""));
        assert!(constant_time_eq(b"", b""));
        // A presented byte equal to the complement filler of a missing byte changes nothing.
        assert!(!constant_time_eq(&[0x00], &[]));
    }

    #[test]
    fn keys_come_as_bearer_or_x_api_key() {
        let keys = CallerKeys::new(["k1".to_owned(), "k2".to_owned()]);
        let mut headers = HeaderMap::new();
        assert!(!keys.admits(&headers));
        headers.insert(header::AUTHORIZATION, "Bearer k2".parse().unwrap());
        assert!(keys.admits(&headers));
        headers.insert(header::AUTHORIZATION, "Bearer k3".parse().unwrap());
        assert!(!keys.admits(&headers));
        let mut anthropic = HeaderMap::new();
        anthropic.insert("x-api-key", "k1".parse().unwrap());
        assert!(keys.admits(&anthropic));
    }

    #[test]
    fn a_public_address_without_keys_is_refused() {
        let open = CallerKeys::default();
        let public: SocketAddr = "0.0.0.0:4000".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert!(check_listen(public, &open, false).is_err());
        assert!(check_listen(public, &open, true).is_ok());
        assert!(check_listen(loopback, &open, false).is_ok());
        assert!(check_listen(public, &CallerKeys::new(["k".to_owned()]), false).is_ok());
    }
}
