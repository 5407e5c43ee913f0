//! The headers the engine writes: attempt numbers and the idempotency key. (The "don't retry"
//! mark is classify's [`mark_do_not_retry`](stormguard_classify::headers::mark_do_not_retry).)

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use stormguard_budget::attempt::{GRPC_PREVIOUS_RPC_ATTEMPTS, X_RETRY_ATTEMPT};
use uuid::Uuid;

/// `Idempotency-Key`: one UUID per request, the same on every attempt, so a backend that
/// honours it (Stripe, the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field") performs a
/// retried POST or PATCH once even when an earlier attempt did the work and only its answer was
/// lost. The engine adds it to requests whose method is not idempotent (RFC 9110 section 9.2.2:
/// anything but GET, HEAD, OPTIONS, TRACE, PUT, DELETE) when it may send them more than once, and
/// never replaces one the caller set.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Attempt numbers 0..=9, rendered once: the counts every request actually carries.
static SMALL_COUNTS: [HeaderValue; 10] = [
    HeaderValue::from_static("0"),
    HeaderValue::from_static("1"),
    HeaderValue::from_static("2"),
    HeaderValue::from_static("3"),
    HeaderValue::from_static("4"),
    HeaderValue::from_static("5"),
    HeaderValue::from_static("6"),
    HeaderValue::from_static("7"),
    HeaderValue::from_static("8"),
    HeaderValue::from_static("9"),
];

fn count_value(count: u32) -> HeaderValue {
    usize::try_from(count)
        .ok()
        .and_then(|index| SMALL_COUNTS.get(index))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(count))
}

/// Write the attempt number (`previous` = attempts sent before this one) the way the protocol
/// expects it: `x-retry-attempt: N` on every HTTP attempt (0 on the first), and gRPC's
/// `grpc-previous-rpc-attempts: N` (gRFC A6) on retries only, as gRPC clients send it.
/// The engine's count replaces any value already there: it is the layer that retries.
pub fn stamp_attempt(headers: &mut HeaderMap, previous: u32, grpc: bool) {
    if grpc {
        if previous > 0 {
            headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, count_value(previous));
        }
    } else {
        headers.insert(X_RETRY_ATTEMPT, count_value(previous));
    }
}

/// Whether RFC 9110 (section 9.2.2) calls `method` idempotent.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Add a fresh UUID v4 `Idempotency-Key` unless the caller set one.
pub fn ensure_idempotency_key(headers: &mut HeaderMap) {
    if headers.contains_key(IDEMPOTENCY_KEY) {
        return;
    }
    let mut text = KeyText([0; 36]);
    new_key().hyphenated().encode_lower(&mut text.0);
    // A hyphenated UUID is 36 visible ASCII characters: always a valid header value. Owned by
    // its `Bytes` (one allocation), so the copy each attempt gets is a reference count.
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from_owner(text)) {
        headers.insert(IDEMPOTENCY_KEY, value);
    }
}

/// The text of a hyphenated UUID.
struct KeyText([u8; 36]);

impl AsRef<[u8]> for KeyText {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// This thread's source of idempotency keys: a counter hashed with std's [`RandomState`], a
/// SipHash whose keys are drawn from the operating system's randomness once per thread.
///
/// A key has to be unique, not secret: it travels in clear beside the request it names.
/// `Uuid::new_v4` asks the operating system for every key, a system call that costs about a
/// microsecond, more than the rest of the engine's work on a request that succeeds. Two
/// SipHash outputs of a counter under per-thread random keys give the 122 random bits of a
/// version 4 UUID, as unlikely to repeat across threads, processes and machines as fresh random
/// ones, with no system call. Like every user-space generator (`rand`'s `ThreadRng` included),
/// a process that forks and goes on sending from the thread that forked would repeat, in the
/// child, the keys its parent sends next.
struct KeyStream {
    keys: RandomState,
    next: Cell<u64>,
}

thread_local! {
    static KEYS: KeyStream = KeyStream {
        keys: RandomState::new(),
        next: Cell::new(0),
    };
}

/// A fresh version 4 UUID (see [`KeyStream`]).
fn new_key() -> Uuid {
    KEYS.with(|stream| {
        let n = stream.next.get();
        stream.next.set(n.wrapping_add(1));
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&stream.keys.hash_one((n, 0_u8)).to_le_bytes());
        bytes[8..].copy_from_slice(&stream.keys.hash_one((n, 1_u8)).to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_as_decimal() {
        for count in [0, 1, 9, 10, 123, u32::MAX] {
            assert_eq!(
                count_value(count).to_str().ok(),
                Some(count.to_string().as_str())
            );
        }
    }

    #[test]
    fn http_attempts_are_numbered_from_zero_and_grpc_from_the_first_retry() {
        let mut http = HeaderMap::new();
        stamp_attempt(&mut http, 0, false);
        assert_eq!(http[X_RETRY_ATTEMPT], "0");
        stamp_attempt(&mut http, 2, false);
        assert_eq!(http[X_RETRY_ATTEMPT], "2");
        assert_eq!(http.len(), 1);

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
        assert_eq!(
            uuid::Uuid::parse_str(&key).map(|u| u.get_version_num()),
            Ok(4)
        );
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
            (0..n).map(|_| new_key()).collect()
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
