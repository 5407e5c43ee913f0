//! The headers the engine writes: attempt numbers and the idempotency key. (The "don't retry"
//! mark is classify's [`mark_do_not_retry`](stormguard_classify::headers::mark_do_not_retry).)

use std::cell::RefCell;
use std::hash::{BuildHasher, RandomState};

use bytes::{Bytes, BytesMut};
use http::header::Entry;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use stormguard_budget::attempt::{GRPC_PREVIOUS_RPC_ATTEMPTS, X_RETRY_ATTEMPT};
#[cfg(test)]
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
///
/// The key comes from this thread's stream: 128 random bits drawn once per thread, with a
/// scrambled counter in the last 48 bits. Keys never repeat within a thread and are as unlikely
/// to meet across threads, processes and machines as 74 random bits make them; no system call is
/// made per key (see the module source for the construction).
pub fn ensure_idempotency_key(headers: &mut HeaderMap) {
    if let Entry::Vacant(slot) = headers.entry(IDEMPOTENCY_KEY) {
        slot.insert(new_key_value());
    }
}

/// Keys rendered into one shared buffer before another is allocated: the allocation, and the
/// reference count each key's header value holds on it, are shared by this many requests (a key
/// kept alive keeps its buffer, 2.3 KiB, alive).
const KEYS_PER_CHUNK: usize = 64;

/// Length of a hyphenated UUID.
const KEY_LEN: usize = 36;

/// The counter's share of a key: the last 48 bits, the UUID's last group of 12 hex digits.
const COUNTER_BITS: u32 = 48;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// This thread's source of idempotency keys.
///
/// A key has to be unique, not secret: it travels in clear beside the request it names, to a
/// backend that scopes it to the caller's credentials. Each thread draws 128 random bits once
/// (std's [`RandomState`], keyed from the operating system), sets the version 4 and RFC 9562
/// variant bits, and makes every key by XOR-ing a scrambled counter into the last 48 bits:
///
/// * within a thread, keys cannot repeat for 2^48 requests (the scramble, a multiplication by an
///   odd number and an xorshift modulo 2^48, is a bijection), and the thread draws fresh bits
///   before its counter could wrap;
/// * across threads, processes and machines, two streams meet only if their other 74 random bits
///   are equal: a chance of about 2^-35 among a million streams.
///
/// This keeps the system call (`Uuid::new_v4` asks the operating system for every key, about a
/// microsecond, more than the rest of the engine's work on a request that succeeds) and the
/// hashing off the hot path: a key is 12 hex digits and a slice of a shared buffer. Like every
/// user-space generator, a process that forks and goes on sending from the thread that forked
/// would repeat, in the child, the keys its parent sends next.
struct KeyStream {
    /// The hyphenated text of the thread's random bits; each key rewrites its last 12 digits.
    text: [u8; KEY_LEN],
    /// The random last 48 bits the counter is XOR-ed into.
    low: u64,
    /// An odd multiplier for the scramble.
    multiplier: u64,
    next: u64,
    /// The buffer keys are rendered into, `KEYS_PER_CHUNK` at a time.
    chunk: BytesMut,
}

impl KeyStream {
    fn new() -> Self {
        let random = RandomState::new();
        let high = random.hash_one(0_u8);
        let low = random.hash_one(1_u8);
        let multiplier = random.hash_one(2_u8) | 1;
        let uuid = uuid::Builder::from_random_bytes(
            (u128::from(high) << 64 | u128::from(low)).to_be_bytes(),
        )
        .into_uuid();
        let mut text = [0; KEY_LEN];
        uuid.hyphenated().encode_lower(&mut text);
        Self {
            text,
            low: low & COUNTER_MASK,
            multiplier,
            next: 0,
            chunk: BytesMut::new(),
        }
    }

    fn next_key(&mut self) -> Bytes {
        if self.next > COUNTER_MASK {
            *self = Self::new();
        }
        let n = self.next;
        self.next += 1;
        let mut scrambled = n.wrapping_mul(self.multiplier) & COUNTER_MASK;
        scrambled ^= scrambled >> (COUNTER_BITS / 2);
        let tail = self.low ^ scrambled;
        for (i, digit) in self.text[KEY_LEN - 12..].iter_mut().enumerate() {
            let shift = 4 * (11 - i);
            *digit = HEX[((tail >> shift) & 0xf) as usize];
        }
        if self.chunk.capacity() - self.chunk.len() < KEY_LEN {
            self.chunk = BytesMut::with_capacity(KEY_LEN * KEYS_PER_CHUNK);
        }
        self.chunk.extend_from_slice(&self.text);
        self.chunk.split().freeze()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

thread_local! {
    static KEYS: RefCell<KeyStream> = RefCell::new(KeyStream::new());
}

/// A fresh version 4 UUID as a header value (see [`KeyStream`]).
fn new_key_value() -> HeaderValue {
    // `try_with`: a thread whose locals are being torn down gets a key from a stream of its own.
    let key = KEYS
        .try_with(|stream| stream.borrow_mut().next_key())
        .unwrap_or_else(|_| KeyStream::new().next_key());
    // Lowercase hex and hyphens: always a valid header value.
    HeaderValue::from_maybe_shared(key).unwrap_or(HeaderValue::from_static(""))
}

/// A fresh key, parsed back (tests).
#[cfg(test)]
fn new_key() -> Uuid {
    let value = new_key_value();
    Uuid::try_parse_ascii(value.as_bytes()).unwrap_or_default()
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
    fn keys_stay_distinct_across_chunks_and_a_counter_wrap() {
        let mut stream = KeyStream::new();
        let mut seen = std::collections::HashSet::new();
        // Three chunks' worth, then the last counter values before the 48-bit limit and past it
        // (the stream draws fresh random bits instead of wrapping).
        let mut take = |stream: &mut KeyStream, n: usize| {
            for _ in 0..n {
                let key = stream.next_key();
                let uuid = Uuid::try_parse_ascii(&key).expect("a hyphenated UUID");
                assert_eq!(uuid.get_version_num(), 4);
                assert!(seen.insert(key), "a key repeated");
            }
        };
        take(&mut stream, 3 * KEYS_PER_CHUNK + 5);
        let first_text = stream.text;
        stream.next = COUNTER_MASK - 2;
        take(&mut stream, 6);
        assert_eq!(stream.next, 3, "the stream starts over after 2^48 keys");
        assert_ne!(
            stream.text[..24],
            first_text[..24],
            "with fresh random bits"
        );
        assert_eq!(seen.len(), 3 * KEYS_PER_CHUNK + 11);
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
