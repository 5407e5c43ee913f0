//! stormguard-deadline's propagation parsers on arbitrary bytes: `parse_grpc_timeout` and
//! `parse_timeout_ms` are total, formatting what they parse never extends it, and
//! `incoming_timeout` over arbitrary header maps is exactly the tightest valid value.

use std::time::Duration;

use stormguard_classify::headers::{
    GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_TIMEOUT_MS,
};
use stormguard_deadline::propagate::{
    format_grpc_timeout, format_timeout_ms, incoming_timeout, parse_grpc_timeout, parse_timeout_ms,
};

/// 99,999,999 hours: the longest `grpc-timeout` can say.
const GRPC_MAX: Duration = Duration::from_secs(99_999_999 * 3600);

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    if let Some(timeout) = parse_grpc_timeout(data) {
        assert!(timeout <= GRPC_MAX);
        let again = parse_grpc_timeout(format_grpc_timeout(timeout).as_bytes());
        assert!(again.is_some_and(|again| again <= timeout));
    }
    if let Some(timeout) = parse_timeout_ms(data) {
        assert_eq!(
            parse_timeout_ms(format_timeout_ms(timeout).as_bytes()),
            Some(timeout)
        );
    }

    let names = [
        GRPC_TIMEOUT,
        X_REQUEST_TIMEOUT_MS,
        X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
    ];
    let (headers, _) = crate::input::headers_and_rest(data, &names);
    let grpc = headers
        .get_all(GRPC_TIMEOUT)
        .iter()
        .filter_map(|value| parse_grpc_timeout(value.as_bytes()));
    let millis_names = [X_REQUEST_TIMEOUT_MS, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS];
    let millis = millis_names
        .iter()
        .flat_map(|name| headers.get_all(name).iter())
        .filter_map(|value| parse_timeout_ms(value.as_bytes()));
    assert_eq!(incoming_timeout(&headers), grpc.chain(millis).min());
}
