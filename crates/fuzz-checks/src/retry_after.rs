//! Every hint parser of stormguard-classify on arbitrary header bytes: no panic, no overflow, no
//! hint above `HINT_CEILING`, and the header-map readers agree with the single-value parsers.

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use stormguard_classify::headers;
use stormguard_classify::hint::{self, HINT_CEILING, Pushback};

/// Latest `now` tried: 9999-12-31T23:59:59Z, the last second RFC 3339 and HTTP-dates can name.
const LAST_SECOND: u64 = 253_402_300_799;

fn bounded(hint: Option<Duration>) -> bool {
    hint.is_none_or(|hint| hint <= HINT_CEILING)
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let (secs, value) = crate::input::u64_and_rest(data);
    let now = UNIX_EPOCH + Duration::from_secs(secs % (LAST_SECOND + 1));
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };
    let retry_after = hint::retry_after(&value, now);
    let retry_after_ms = hint::retry_after_ms(&value);
    let reset = hint::reset_at(&value, now);
    let go = hint::go_duration(value.as_bytes());
    assert!(bounded(retry_after));
    assert!(bounded(retry_after_ms));
    assert!(bounded(reset));
    assert!(bounded(go));
    assert!(bounded(hint::protobuf_duration(&String::from_utf8_lossy(
        value.as_bytes()
    ))));
    if let Pushback::After(delay) = hint::grpc_pushback(&value) {
        assert!(delay <= HINT_CEILING);
    }
    let _ = hint::should_retry(&value);
    if let Some(at) = hint::rfc3339(value.as_bytes()) {
        // A parsed reset time in the future is exactly the reset hint (clamped).
        let expected = at
            .duration_since(now)
            .ok()
            .filter(|delay| !delay.is_zero())
            .map(|delay| delay.min(HINT_CEILING));
        assert_eq!(reset, expected);
    }
    let _ = stormguard_classify::GrpcCode::from_header(&value);

    // The same value under every header name: the map readers pick one of the parsed values.
    let mut map = HeaderMap::new();
    for name in [
        headers::RETRY_AFTER,
        headers::RETRY_AFTER_MS,
        headers::X_MS_RETRY_AFTER_MS,
        headers::X_RATELIMIT_RESET_REQUESTS,
        headers::X_RATELIMIT_RESET_TOKENS,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_RESET,
        headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET,
    ] {
        map.insert(name, value.clone());
    }
    map.insert(
        headers::X_RATELIMIT_REMAINING_TOKENS,
        HeaderValue::from_static("0"),
    );
    assert_eq!(hint::server_hint(&map, now), retry_after_ms.or(retry_after));
    let reset_hint = hint::rate_limit_reset(&map, now);
    assert!(bounded(reset_hint));
    assert!(reset_hint.is_none() || reset_hint == go || reset_hint == reset);
}
