//! `stormguard_budget::previous_attempts` on arbitrary header maps: no panic, 0 only
//! when no attempt header is present, and never below what any single header says.

use http::{HeaderMap, HeaderName};
use stormguard_budget::previous_attempts;
use stormguard_classify::headers::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, X_ENVOY_ATTEMPT_COUNT, X_RETRY_ATTEMPT, X_STAINLESS_RETRY_COUNT,
};

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let names = [
        X_RETRY_ATTEMPT,
        GRPC_PREVIOUS_RPC_ATTEMPTS,
        X_STAINLESS_RETRY_COUNT,
        X_ENVOY_ATTEMPT_COUNT,
        HeaderName::from_static("x-unrelated"),
    ];
    let (headers, _) = crate::input::headers_and_rest(data, &names);
    let previous = previous_attempts(&headers);
    let present = names[..4].iter().any(|name| headers.contains_key(name));
    assert_eq!(previous == 0, !present || all_say_first(&headers));
    // Each header on its own never counts more than all of them together.
    for (name, value) in &headers {
        let mut single = HeaderMap::new();
        single.insert(name.clone(), value.clone());
        assert!(previous_attempts(&single) <= previous);
    }
}

/// Every attempt header present says "first try": `0` (Envoy: `1`), surrounded by optional
/// whitespace and leading zeros.
fn all_say_first(headers: &HeaderMap) -> bool {
    let counts = |name: &HeaderName, first: u32| {
        headers.get_all(name).iter().all(|value| {
            let text = value.as_bytes().trim_ascii();
            !text.is_empty()
                && text.iter().all(u8::is_ascii_digit)
                && text.iter().try_fold(0_u32, |n, d| {
                    n.checked_mul(10)?.checked_add(u32::from(d - b'0'))
                }) == Some(first)
        })
    };
    counts(&X_RETRY_ATTEMPT, 0)
        && counts(&GRPC_PREVIOUS_RPC_ATTEMPTS, 0)
        && counts(&X_STAINLESS_RETRY_COUNT, 0)
        && counts(&X_ENVOY_ATTEMPT_COUNT, 1)
}
