//! What of a caller's request head reaches a provider: never its credentials (the gateway sets
//! the provider's), never a header only the gateway may set, never a hop-by-hop header.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// The header the gateway sets on each answer: how many attempts the request took, on every
/// deployment (the failover sets `x-stormguard-backend`, the one that answered).
pub const X_STORMGUARD_ATTEMPTS: HeaderName = HeaderName::from_static("x-stormguard-attempts");

/// Credentials a caller may send and a provider must never see from the caller: the caller's
/// key is the gateway's business, the provider's key the gateway's alone, and the account a
/// request is billed to (OpenAI's organization and project) is the one of the gateway's key.
const CREDENTIALS: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "openai-organization",
    "openai-project",
];

/// Hop-by-hop headers (RFC 9110 section 7.6.1), and the ones that say where a request goes.
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "forwarded",
    "x-forwarded-host",
];

/// Removes from `headers` what must not reach a provider: credentials, hop-by-hop headers (and
/// those `Connection` names), `x-stormguard-*`, and `accept-encoding`, so that the provider's
/// answers arrive uncompressed and the engine can read its error bodies.
///
/// One pass over the names the caller sent (a handful), each compared with the lists, rather
/// than a removal per listed name: a removal by `&str` parses and hashes the name, and 18 of them
/// cost 5,400 instructions a request, 4% of the gateway's success path (callgrind,
/// `docs/PERFORMANCE.md`, "The gateway").
pub fn strip(headers: &mut HeaderMap) {
    let mut doomed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    doomed.extend(
        headers
            .keys()
            .filter(|name| never_relayed(name.as_str()))
            .cloned(),
    );
    for name in doomed {
        headers.remove(name);
    }
}

/// Whether a header of this (lowercase) name is never relayed, whatever its value.
fn never_relayed(name: &str) -> bool {
    CREDENTIALS.contains(&name)
        || HOP_BY_HOP.contains(&name)
        || name == header::ACCEPT_ENCODING.as_str()
        || name.starts_with("x-stormguard-")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn strips_credentials_hops_and_gateway_headers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer caller"),
            ("x-api-key", "caller"),
            ("openai-organization", "org-caller"),
            ("connection", "x-secret-hop"),
            ("x-secret-hop", "1"),
            ("x-stormguard-backend", "forged"),
            ("accept-encoding", "gzip"),
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
        ] {
            headers.insert(HeaderName::from_static(name), value.parse().unwrap());
        }
        strip(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type", "anthropic-version"]);
    }

    #[test]
    fn strips_every_value_of_every_listed_name_and_keeps_the_rest() {
        let mut headers = HeaderMap::new();
        for name in CREDENTIALS.iter().chain(HOP_BY_HOP.iter()) {
            headers.append(HeaderName::from_static(name), "1".parse().unwrap());
            headers.append(HeaderName::from_static(name), "2".parse().unwrap());
        }
        headers.append("connection", "X-Custom-Hop, keep-alive".parse().unwrap());
        headers.insert("x-custom-hop", "1".parse().unwrap());
        headers.insert("x-stormguard-attempts", "9".parse().unwrap());
        headers.insert("x-stormguard", "kept: not the prefix".parse().unwrap());
        headers.insert("x-request-id", "abc".parse().unwrap());
        strip(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-stormguard", "x-request-id"]);
        assert_eq!(headers.len(), 2);
    }
}
