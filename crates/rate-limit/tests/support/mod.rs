//! Request heads, provider headers and wall-clock times for the rate limit's tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue};
use stormguard_rate_limit::{RateLimit, Reservation};
use tokio::time::Instant;

/// The head of a request with no headers.
pub fn head() -> Parts {
    http::Request::new(()).into_parts().0
}

/// The head of a request carrying `x-api-key: key`.
pub fn head_with_key(key: &str) -> Parts {
    http::Request::builder()
        .header("x-api-key", key)
        .body(())
        .unwrap()
        .into_parts()
        .0
}

/// A header map from `(name, value)` pairs.
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            )
        })
        .collect()
}

/// How long after now the reservation's slot comes.
pub fn wait_of(reservation: &Reservation) -> Duration {
    reservation.start() - Instant::now()
}

/// Reserves a slot weighing `tokens` with no deadline, and sends it at once (the slot is spent
/// whenever it comes); returns the wait it was given.
pub fn take(limit: &RateLimit, tokens: u64) -> Duration {
    let reservation = limit.reserve(&head(), tokens, None).unwrap();
    let wait = wait_of(&reservation);
    drop(reservation.send());
    wait
}

/// `at` as RFC 3339 in UTC with milliseconds (`2026-01-01T00:00:01.500Z`), as Anthropic writes
/// its resets.
pub fn rfc3339(at: SystemTime) -> String {
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap();
    let seconds = since_epoch.as_secs();
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60,
        since_epoch.subsec_millis()
    )
}

/// The RFC 3339 time `after` from now on the wall clock (the clock Anthropic's resets are read
/// against).
pub fn wall_clock_in(after: Duration) -> String {
    rfc3339(SystemTime::now() + after)
}
