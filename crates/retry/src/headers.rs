//! The headers the engine writes on every attempt: its number and, for non-idempotent methods,
//! the idempotency key. (The "do not retry" mark is classify's
//! [`mark_do_not_retry`](stormguard_classify::headers::mark_do_not_retry).)

use http::header::Entry;
use http::{HeaderMap, HeaderValue, Method};
use stormguard_classify::headers::{GRPC_PREVIOUS_RPC_ATTEMPTS, IDEMPOTENCY_KEY, X_RETRY_ATTEMPT};

/// Writes the attempt number (`previous` = attempts sent before this one) the way the protocol
/// expects it: `x-retry-attempt: N` on every HTTP attempt (0 on the first), and gRPC's
/// `grpc-previous-rpc-attempts: N` (gRFC A6) on retries only, as gRPC clients send it. The
/// engine's count replaces any value already there: it is the layer that retries.
pub fn stamp_attempt(headers: &mut HeaderMap, previous: u32, grpc: bool) {
    if !grpc {
        headers.insert(X_RETRY_ATTEMPT, HeaderValue::from(previous));
    } else if previous > 0 {
        headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from(previous));
    }
}

/// Whether RFC 9110 (section 9.2.2) calls `method` idempotent: GET, HEAD, OPTIONS, TRACE, PUT
/// and DELETE.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Adds a fresh `Idempotency-Key` unless the caller set one: a version 4 UUID (RFC 9562) from
/// 122 bits of `rand`'s thread generator (ChaCha12 seeded from the operating system: no system
/// call per key). A key must be unique, not secret: it travels beside the request it names.
pub fn ensure_idempotency_key(headers: &mut HeaderMap) {
    if let Entry::Vacant(slot) = headers.entry(IDEMPOTENCY_KEY) {
        let uuid = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        let key = uuid.hyphenated().encode_lower(&mut text);
        // Lowercase hex and hyphens: always a valid header value.
        if let Ok(value) = HeaderValue::from_str(key) {
            slot.insert(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn http_attempts_are_numbered_from_zero_and_grpc_from_the_first_retry() {
        let mut http = HeaderMap::new();
        stamp_attempt(&mut http, 0, false);
        assert_eq!(http[X_RETRY_ATTEMPT], "0");
        stamp_attempt(&mut http, 2, false);
        assert_eq!(http[X_RETRY_ATTEMPT], "2");
        assert_eq!(http.len(), 1);
        stamp_attempt(&mut http, u32::MAX, false);
        assert_eq!(http[X_RETRY_ATTEMPT], "4294967295");

        let mut grpc = HeaderMap::new();
        stamp_attempt(&mut grpc, 0, true);
        assert!(grpc.is_empty());
        stamp_attempt(&mut grpc, 1, true);
        assert_eq!(grpc[GRPC_PREVIOUS_RPC_ATTEMPTS], "1");
        assert!(!grpc.contains_key(X_RETRY_ATTEMPT));
    }

    #[test]
    fn idempotency_key_is_a_uuid_and_never_replaced() {
        let mut headers = HeaderMap::new();
        ensure_idempotency_key(&mut headers);
        let key = headers[IDEMPOTENCY_KEY].to_str().expect("ascii").to_owned();
        assert_eq!(Uuid::parse_str(&key).map(|u| u.get_version_num()), Ok(4));
        ensure_idempotency_key(&mut headers);
        assert_eq!(headers[IDEMPOTENCY_KEY], key.as_str());

        let mut caller = HeaderMap::new();
        caller.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("caller-key"));
        ensure_idempotency_key(&mut caller);
        assert_eq!(caller[IDEMPOTENCY_KEY], "caller-key");
    }

    #[test]
    fn keys_do_not_repeat_within_or_across_threads() {
        fn keys(n: usize) -> Vec<Uuid> {
            (0..n)
                .map(|_| {
                    let mut headers = HeaderMap::new();
                    ensure_idempotency_key(&mut headers);
                    Uuid::try_parse_ascii(headers[IDEMPOTENCY_KEY].as_bytes()).expect("a UUID")
                })
                .collect()
        }
        let mut seen = std::collections::HashSet::new();
        let here = keys(10_000);
        let there = std::thread::spawn(|| keys(10_000))
            .join()
            .expect("key thread");
        for key in here.iter().chain(&there) {
            assert_eq!(key.get_version_num(), 4);
            assert_eq!(key.get_variant(), uuid::Variant::RFC4122);
            assert!(seen.insert(*key), "{key} repeated");
        }
        assert_eq!(seen.len(), 20_000);
    }

    #[test]
    fn only_rfc_9110_idempotent_methods_skip_the_key() {
        for method in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
            assert!(is_idempotent(&method), "{method}");
        }
        for method in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(&method), "{method}");
        }
    }
}
