//! How many times an incoming request has already been tried, from the headers clients send.
//!
//! | header | sent by | value |
//! |---|---|---|
//! | [`X_RETRY_ATTEMPT`] | stormguard's retry engine (HTTP) | previous attempts: `0` on the first try |
//! | [`GRPC_PREVIOUS_RPC_ATTEMPTS`] | gRPC clients with retries (gRFC A6), stormguard (gRPC) | previous attempts |
//! | [`X_STAINLESS_RETRY_COUNT`] | the official OpenAI and Anthropic SDKs | retries so far: `0` on the first try |
//! | [`X_ENVOY_ATTEMPT_COUNT`] | Envoy (`include_attempt_count_in_request`) | attempt number: `1` on the first try |
//!
//! [`previous_attempts`] reads all four and returns the largest count, so a request that a proxy
//! retried counts as a retry even if the SDK behind it sent its first attempt.
//!
//! ## Hostile values
//!
//! Headers come from the network. A header that is present but does not hold a valid count
//! (empty, negative, not a number, not UTF-8, or `x-envoy-attempt-count: 0`, which Envoy never
//! sends) counts as **one previous attempt**: a client that sends a retry header is saying it is
//! retrying, and for a server under pressure the safe reading is the one that lets the retry budget
//! shed it. The opposite choice would let any client skip the budget by sending garbage. A number
//! too large for a `u32` (30 digits) saturates at `u32::MAX`. No value panics, overflows or makes
//! parsing take longer than the header is long.
//!
//! ```
//! use http::{HeaderMap, HeaderValue};
//! use stormguard_budget::attempt::{self, previous_attempts};
//!
//! let mut headers = HeaderMap::new();
//! assert_eq!(previous_attempts(&headers), 0);
//! headers.insert(attempt::X_ENVOY_ATTEMPT_COUNT, HeaderValue::from_static("3"));
//! assert_eq!(previous_attempts(&headers), 2);
//! headers.insert(attempt::X_RETRY_ATTEMPT, HeaderValue::from_static("-1"));
//! assert_eq!(previous_attempts(&headers), 2);
//! ```

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// `x-retry-attempt: N`: the number of attempts made before this one (`0` = first try). Set by
/// stormguard's retry engine on HTTP requests.
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");

/// `grpc-previous-rpc-attempts: N`: the number of attempts made before this one, as defined by
/// gRFC A6 (gRPC retry design) and sent by gRPC clients with retries enabled.
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// `x-stainless-retry-count: N`: the retries made so far (`0` = first try), sent by the official
/// OpenAI and Anthropic SDKs on every request.
pub const X_STAINLESS_RETRY_COUNT: HeaderName = HeaderName::from_static("x-stainless-retry-count");

/// `x-envoy-attempt-count: N`: the attempt number, counting from `1` (first try), set by Envoy when
/// a route enables `include_attempt_count_in_request`. Previous attempts are `N - 1`.
pub const X_ENVOY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// What a present but invalid attempt header counts as: one previous attempt (see the module docs).
pub const INVALID_HEADER_ATTEMPTS: u32 = 1;

/// Previous attempts of an incoming request (`0` = first try): the largest count found in
/// [`X_RETRY_ATTEMPT`], [`GRPC_PREVIOUS_RPC_ATTEMPTS`], [`X_STAINLESS_RETRY_COUNT`] and
/// [`X_ENVOY_ATTEMPT_COUNT`] (every value of each, if repeated). `0` when none is present; a
/// present but invalid value counts as [`INVALID_HEADER_ATTEMPTS`] (one).
pub fn previous_attempts(headers: &HeaderMap) -> u32 {
    let previous = [
        X_RETRY_ATTEMPT,
        GRPC_PREVIOUS_RPC_ATTEMPTS,
        X_STAINLESS_RETRY_COUNT,
    ]
    .into_iter()
    .flat_map(|name| headers.get_all(name))
    .map(|value| parse_count(value).unwrap_or(INVALID_HEADER_ATTEMPTS));
    let envoy =
        headers
            .get_all(X_ENVOY_ATTEMPT_COUNT)
            .iter()
            .map(|value| match parse_count(value) {
                Some(attempt @ 1..) => attempt - 1,
                Some(0) | None => INVALID_HEADER_ATTEMPTS,
            });
    previous.chain(envoy).max().unwrap_or(0)
}

/// A non-negative decimal count, optionally surrounded by spaces or tabs; saturates at
/// `u32::MAX`. `None` for anything else, including an empty value.
fn parse_count(value: &HeaderValue) -> Option<u32> {
    let digits = value.as_bytes().trim_ascii_start().trim_ascii_end();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u32, |count, digit| {
        count
            .saturating_mul(10)
            .saturating_add(u32::from(digit - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(HeaderName, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn no_header_is_a_first_attempt() {
        assert_eq!(previous_attempts(&HeaderMap::new()), 0);
        assert_eq!(
            previous_attempts(&headers(&[(http::header::RETRY_AFTER, b"3")])),
            0
        );
    }

    #[test]
    fn each_header_and_its_counting_convention() {
        assert_eq!(previous_attempts(&headers(&[(X_RETRY_ATTEMPT, b"0")])), 0);
        assert_eq!(previous_attempts(&headers(&[(X_RETRY_ATTEMPT, b"2")])), 2);
        assert_eq!(
            previous_attempts(&headers(&[(GRPC_PREVIOUS_RPC_ATTEMPTS, b"4")])),
            4
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_STAINLESS_RETRY_COUNT, b"0")])),
            0
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_STAINLESS_RETRY_COUNT, b"1")])),
            1
        );
        // Envoy counts attempts from 1.
        assert_eq!(
            previous_attempts(&headers(&[(X_ENVOY_ATTEMPT_COUNT, b"1")])),
            0
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_ENVOY_ATTEMPT_COUNT, b"3")])),
            2
        );
    }

    #[test]
    fn largest_count_wins() {
        // An SDK's first attempt, retried twice by a proxy.
        let map = headers(&[
            (X_STAINLESS_RETRY_COUNT, b"0"),
            (X_ENVOY_ATTEMPT_COUNT, b"3"),
        ]);
        assert_eq!(previous_attempts(&map), 2);
        let repeated = headers(&[(X_RETRY_ATTEMPT, b"1"), (X_RETRY_ATTEMPT, b"5")]);
        assert_eq!(previous_attempts(&repeated), 5);
    }

    #[test]
    fn hostile_values_count_as_a_retry() {
        let hostile: [&[u8]; 9] = [
            b"",
            b"   ",
            b"-1",
            b"+1",
            b"1.5",
            b"abc",
            b"0x10",
            b"1 2",
            b"\xff\xfe",
        ];
        for value in hostile {
            assert_eq!(
                previous_attempts(&headers(&[(X_RETRY_ATTEMPT, value)])),
                1,
                "{value:?}"
            );
        }
        assert_eq!(
            previous_attempts(&headers(&[(X_ENVOY_ATTEMPT_COUNT, b"0")])),
            1
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_ENVOY_ATTEMPT_COUNT, b"-")])),
            1
        );
        // Whitespace around a valid number is fine.
        assert_eq!(
            previous_attempts(&headers(&[(X_RETRY_ATTEMPT, b" 3\t")])),
            3
        );
    }

    #[test]
    fn huge_numbers_saturate() {
        let thirty = headers(&[(
            GRPC_PREVIOUS_RPC_ATTEMPTS,
            b"123456789012345678901234567890",
        )]);
        assert_eq!(previous_attempts(&thirty), u32::MAX);
        assert_eq!(
            previous_attempts(&headers(&[(X_RETRY_ATTEMPT, b"4294967295")])),
            u32::MAX
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_RETRY_ATTEMPT, b"4294967296")])),
            u32::MAX
        );
        assert_eq!(
            previous_attempts(&headers(&[(X_ENVOY_ATTEMPT_COUNT, b"99999999999999")])),
            u32::MAX - 1
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
            which in proptest::collection::vec(0usize..4, 4),
        ) {
            let names = [X_RETRY_ATTEMPT, GRPC_PREVIOUS_RPC_ATTEMPTS, X_STAINLESS_RETRY_COUNT, X_ENVOY_ATTEMPT_COUNT];
            let mut map = HeaderMap::new();
            let mut any_present = false;
            for (value, name) in values.iter().zip(&which) {
                if let Ok(value) = HeaderValue::from_bytes(value) {
                    map.append(names[*name].clone(), value);
                    any_present = true;
                }
            }
            let previous = previous_attempts(&map);
            // Only a valid "first attempt" value in every present header reads as 0.
            if previous == 0 {
                for (name, first) in names.iter().zip(["0", "0", "0", "1"]) {
                    for value in map.get_all(name) {
                        prop_assert_eq!(value.as_bytes().trim_ascii(), first.as_bytes());
                    }
                }
            }
            if !any_present {
                prop_assert_eq!(previous, 0);
            }
        }

        #[test]
        fn decimal_counts_round_trip(count in any::<u32>()) {
            let map = headers(&[(X_RETRY_ATTEMPT, count.to_string().as_bytes())]);
            prop_assert_eq!(previous_attempts(&map), count);
        }
    }
}
