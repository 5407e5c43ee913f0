//! How many times an incoming request has already been tried, from the headers clients send: see
//! [`previous_attempts`].

use http::header::{HeaderMap, HeaderValue};
use stormguard_classify::headers::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, X_ENVOY_ATTEMPT_COUNT, X_RETRY_ATTEMPT, X_STAINLESS_RETRY_COUNT,
};
use stormguard_numbers::decimal::{DecimalError, parse_decimal};

/// What a present but invalid attempt header counts as: one previous attempt (see
/// [`previous_attempts`]).
const INVALID_HEADER_ATTEMPTS: u32 = 1;

/// Previous attempts of an incoming request (`0` = first try), from the headers clients send:
///
/// | header | sent by | value |
/// |---|---|---|
/// | `x-retry-attempt` | stormguard's retry engine (HTTP) | previous attempts: `0` on the first try |
/// | `grpc-previous-rpc-attempts` | gRPC clients with retries (gRFC A6), stormguard (gRPC) | previous attempts |
/// | `x-stainless-retry-count` | the official OpenAI and Anthropic SDKs | retries so far: `0` on the first try |
/// | `x-envoy-attempt-count` | Envoy (`include_attempt_count_in_request`) | attempt number: `1` on the first try |
///
/// (The names are [`stormguard_classify::headers`]' constants.) It reads all four, every value of
/// each if repeated, and returns the largest count, so a request that a proxy retried counts as a
/// retry even if the SDK behind it sent its first attempt. `0` when none is present.
///
/// # Hostile values
///
/// Headers come from the network. A header that is present but does not hold a valid count
/// (empty, negative, not a number, not UTF-8, or `x-envoy-attempt-count: 0`, which Envoy never
/// sends) counts as **one previous attempt**: a client that sends a retry header is saying it is
/// retrying, and for a server under pressure the safe reading is the one that lets the retry budget
/// shed it. The opposite choice would let any client skip the budget by sending garbage. Spaces
/// and tabs around the digits are allowed; a number too large for a `u32` (30 digits) saturates at
/// `u32::MAX`. Digits are read by [`parse_decimal`], which never panics or overflows and reads each
/// byte once.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use stormguard_budget::previous_attempts;
/// use stormguard_classify::headers::{X_ENVOY_ATTEMPT_COUNT, X_RETRY_ATTEMPT};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(previous_attempts(&headers), 0);
/// headers.insert(X_ENVOY_ATTEMPT_COUNT, HeaderValue::from_static("3"));
/// assert_eq!(previous_attempts(&headers), 2);
/// headers.insert(X_RETRY_ATTEMPT, HeaderValue::from_static("-1"));
/// assert_eq!(previous_attempts(&headers), 2);
/// ```
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
    // A header value holds no whitespace but spaces and tabs, so this trims exactly those.
    match parse_decimal(value.as_bytes().trim_ascii()) {
        Ok(count) => Some(u32::try_from(count).unwrap_or(u32::MAX)),
        Err(DecimalError::TooLarge) => Some(u32::MAX),
        Err(DecimalError::NotANumber) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::HeaderName;
    use proptest::prelude::*;

    use super::*;

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
