//! Parsers for the servers' "retry after" hints. Every function is total: hostile input (huge or
//! negative numbers, `inf`, `NaN`, 10 KB values, bytes that are not UTF-8) gives `None` (or
//! [`Pushback::Stop`] where gRFC A6 says so), never a panic or an overflow.
//!
//! Hints are returned as parsed, bounded only by [`HINT_CEILING`] (one day) so that no later
//! arithmetic can overflow. Whether a hint is too long to wait for is not decided here: the retry
//! engine's hint policy (stormguard-jitter's `HintPolicy`, whose maximum defaults to
//! [`DEFAULT_MAX_HINT`]) gives up on hints above it.
//!
//! Sources:
//! - `retry-after`: RFC 9110 section 10.2.3 (delay-seconds or HTTP-date) and section 5.6.7 (the
//!   three HTTP-date formats: IMF-fixdate, obsolete RFC 850, asctime).
//! - `retry-after-ms`, `x-should-retry`: OpenAI and Anthropic (their official SDKs read them first).
//! - `grpc-retry-pushback-ms`: gRFC A6.
//! - `x-ratelimit-reset-*`: OpenAI rate-limit headers, Go duration syntax (`6m0s`, `12ms`).
//! - `anthropic-ratelimit-*-reset`: Anthropic rate-limit headers, RFC 3339 timestamps.
//! - `RetryInfo.retryDelay`: Google's `google.rpc.RetryInfo` in Gemini / Vertex AI error bodies,
//!   a protobuf `Duration` in its JSON form (`"34s"`, `"1.5s"`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use stormguard_numbers::decimal::parse_decimal;

use crate::headers;

/// Upper bound of every parsed hint (one day). Values above it are reported as this ceiling: long
/// enough that any retry policy rejects it, small enough that adding it to an instant never
/// overflows.
pub const HINT_CEILING: Duration = Duration::from_secs(24 * 60 * 60);

/// Default longest server hint worth waiting for: 60 s. A longer wait outlives most callers'
/// patience and deadlines; the failure is better reported at once, with the hint, to whoever can
/// reschedule the work. The retry engine treats a longer hint as "do not retry" (stormguard-jitter's
/// `HintPolicy` uses this as its default maximum).
pub const DEFAULT_MAX_HINT: Duration = Duration::from_secs(60);

/// Longest header value any parser looks at; longer values are hostile and give no hint.
const MAX_LEN: usize = 64;

const NANOS_PER_SEC: u128 = 1_000_000_000;

fn bounded(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    (!value.is_empty() && value.len() <= MAX_LEN).then_some(value)
}

fn clamp(delay: Duration) -> Duration {
    delay.min(HINT_CEILING)
}

fn from_nanos_clamped(nanos: u128) -> Duration {
    let ceiling = HINT_CEILING.as_nanos();
    let nanos = nanos.min(ceiling);
    // `nanos` <= one day in nanoseconds, which fits a u64.
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// ASCII digits as a u64: `None` if empty, not all digits or overflowing.
fn digits_u64(digits: &[u8]) -> Option<u64> {
    parse_decimal(digits).ok()
}

/// `retry-after` (RFC 9110 section 10.2.3): either delay-seconds (`120`) or an HTTP-date in any
/// of the three formats of RFC 9110 section 5.6.7 (`Sun, 06 Nov 1994 08:49:37 GMT`,
/// `Sunday, 06-Nov-94 08:49:37 GMT`, `Sun Nov  6 08:49:37 1994`), for which the delay is
/// `date - now`.
///
/// No hint for: a date not after `now`, anything else that is not `1*DIGIT` or a valid date
/// (`abc`, `-5`, `1.5`, `inf`), and numbers that do not fit 64 bits. Delays above
/// [`HINT_CEILING`] are reported as the ceiling.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use http::HeaderValue;
/// use stormguard_classify::hint::retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:47 GMT");
/// assert_eq!(retry_after(&date, now), Some(Duration::from_secs(10)));
/// assert_eq!(retry_after(&HeaderValue::from_static("5"), now), Some(Duration::from_secs(5)));
/// assert_eq!(retry_after(&HeaderValue::from_static("-5"), now), None);
/// ```
pub fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let value = bounded(value.as_bytes())?;
    if value.iter().all(u8::is_ascii_digit) {
        return digits_u64(value).map(|secs| clamp(Duration::from_secs(secs)));
    }
    let text = std::str::from_utf8(value).ok()?;
    let date = httpdate::parse_http_date(text).ok()?;
    let delay = date.duration_since(now).ok()?;
    (!delay.is_zero()).then(|| clamp(delay))
}

/// `retry-after-ms`: a non-negative decimal number of milliseconds (`1500`, `1500.5`), as OpenAI
/// sends it. No hint for anything else (`-1`, `1e3`, `inf`, `NaN`, overflowing numbers).
pub fn retry_after_ms(value: &HeaderValue) -> Option<Duration> {
    let value = bounded(value.as_bytes())?;
    let (whole, fraction) = match value.iter().position(|&byte| byte == b'.') {
        Some(dot) => (&value[..dot], Some(&value[dot + 1..])),
        None => (value, None),
    };
    let millis = digits_u64(whole)?;
    let mut nanos = u128::from(millis) * 1_000_000;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Sub-millisecond digits: the first six are nanoseconds, the rest is noise.
        let mut scale = 100_000_u128;
        for &digit in fraction.iter().take(6) {
            nanos += u128::from(digit - b'0') * scale;
            scale /= 10;
        }
    }
    Some(from_nanos_clamped(nanos))
}

/// `x-should-retry`: `true` or `false` (ASCII case-insensitive); `None` for anything else.
pub fn should_retry(value: &HeaderValue) -> Option<bool> {
    let value = value.as_bytes().trim_ascii();
    if value.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

/// What a `grpc-retry-pushback-ms` header says (gRFC A6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// A non-negative integer: retry after this delay (bounded by [`HINT_CEILING`]).
    After(Duration),
    /// Negative or unparseable: do not retry.
    Stop,
}

/// `grpc-retry-pushback-ms` (gRFC A6): a non-negative decimal integer is a delay in milliseconds
/// (a number too large for 64 bits is reported as [`HINT_CEILING`], still "wait, then retry");
/// a negative value or anything unparseable means "do not retry".
pub fn grpc_pushback(value: &HeaderValue) -> Pushback {
    let bytes = value.as_bytes().trim_ascii();
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Pushback::Stop;
    }
    let is_zero = digits.iter().all(|&digit| digit == b'0');
    if negative && !is_zero {
        return Pushback::Stop;
    }
    match digits_u64(digits) {
        Some(millis) => Pushback::After(clamp(Duration::from_millis(millis))),
        None => Pushback::After(HINT_CEILING),
    }
}

/// A Go duration as `time.ParseDuration` writes it (`6m0s`, `12ms`, `1.5s`, `1h2m3s`, `250us`,
/// `0`): one or more decimal numbers, each with a unit `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`,
/// `h`. Used by OpenAI's `x-ratelimit-reset-*` headers. Negative durations, numbers without a
/// unit (other than `0`) and overflowing values give `None`.
pub fn go_duration(text: &[u8]) -> Option<Duration> {
    let mut rest = bounded(text)?;
    if rest == b"0" {
        return Some(Duration::ZERO);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let (whole, after) = rest.split_at(int_len);
        let (fraction, after) = match after {
            [b'.', tail @ ..] => {
                let len = tail.iter().take_while(|b| b.is_ascii_digit()).count();
                tail.split_at(len)
            }
            _ => (&[][..], after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .iter()
            .take_while(|b| !b.is_ascii_digit() && **b != b'.')
            .count();
        let (unit, tail) = after.split_at(unit_len);
        // `µs` is U+00B5 (micro sign) or U+03BC (Greek mu) in UTF-8.
        let unit_nanos: u128 = match unit {
            b"ns" => 1,
            b"us" | [0xC2, 0xB5, b's'] | [0xCE, 0xBC, b's'] => 1_000,
            b"ms" => 1_000_000,
            b"s" => NANOS_PER_SEC,
            b"m" => 60 * NANOS_PER_SEC,
            b"h" => 3_600 * NANOS_PER_SEC,
            _ => return None,
        };
        let whole = if whole.is_empty() {
            0
        } else {
            digits_u64(whole)?
        };
        let mut nanos = u128::from(whole).checked_mul(unit_nanos)?;
        // At most 18 fraction digits count; the product stays far below u128::MAX.
        let kept = &fraction[..fraction.len().min(18)];
        if let Some(numerator) = digits_u64(kept) {
            let denominator = 10_u128.pow(u32::try_from(kept.len()).unwrap_or(18));
            nanos = nanos.checked_add(u128::from(numerator) * unit_nanos / denominator)?;
        }
        total = total.checked_add(nanos)?;
        rest = tail;
    }
    Some(from_nanos_clamped(total))
}

/// A protobuf `Duration` in its JSON form (`"34s"`, `"1.5s"`, `"0.000000001s"`), as Google's
/// `google.rpc.RetryInfo.retryDelay` carries it in Gemini / Vertex AI errors. Negative or
/// malformed values give `None`.
pub fn protobuf_duration(text: &str) -> Option<Duration> {
    let text = bounded(text.as_bytes())?;
    let number = text.strip_suffix(b"s")?;
    let (whole, fraction) = match number.iter().position(|&byte| byte == b'.') {
        Some(dot) => (&number[..dot], Some(&number[dot + 1..])),
        None => (number, None),
    };
    let secs = digits_u64(whole)?;
    let mut nanos: u32 = 0;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || fraction.len() > 9 {
            return None;
        }
        let value = u32::try_from(digits_u64(fraction)?).ok()?;
        let missing = u32::try_from(9 - fraction.len()).unwrap_or(0);
        nanos = value * 10_u32.pow(missing);
    }
    let delay = Duration::from_secs(secs.min(HINT_CEILING.as_secs()))
        .saturating_add(Duration::from_nanos(u64::from(nanos)));
    Some(clamp(delay))
}

/// A strict RFC 3339 timestamp (`2024-05-01T12:00:30Z`, `2024-05-01T14:00:30.25+02:00`), as
/// Anthropic's `anthropic-ratelimit-*-reset` headers carry it. `T` and `Z` may be lower case
/// (RFC 3339 section 5.6); a space instead of `T`, missing seconds or offset, and out-of-range
/// fields (month 13, February 30, hour 24) give `None`. Second `60` (a leap second) is accepted.
pub fn rfc3339(text: &[u8]) -> Option<SystemTime> {
    let text = bounded(text)?;
    let number = |range: std::ops::Range<usize>| -> Option<u64> { digits_u64(text.get(range)?) };
    let punct =
        |index: usize, expected: &[u8]| text.get(index).is_some_and(|b| expected.contains(b));
    if !(punct(4, b"-") && punct(7, b"-") && punct(10, b"Tt") && punct(13, b":") && punct(16, b":"))
    {
        return None;
    }
    let year = number(0..4)?;
    let month = number(5..7)?;
    let day = number(8..10)?;
    let hour = number(11..13)?;
    let minute = number(14..16)?;
    let second = number(17..19)?;
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos: u64 = 0;
    if let [b'.', tail @ ..] = rest {
        let len = tail.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 {
            return None;
        }
        let kept = &tail[..len.min(9)];
        let missing = u32::try_from(9 - kept.len()).unwrap_or(0);
        nanos = digits_u64(kept)? * 10_u64.pow(missing);
        rest = &tail[len..];
    }
    let offset_secs: i64 = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hours = digits_u64(&[*h1, *h2])?;
            let minutes = digits_u64(&[*m1, *m2])?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = i64::try_from(hours * 3600 + minutes * 60).ok()?;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let days = days_since_epoch(year, month, day);
    let local = days * 86_400 + i64::try_from(hour * 3600 + minute * 60 + second).ok()?;
    let utc = local - offset_secs;
    let whole = Duration::from_secs(utc.unsigned_abs());
    let instant = if utc >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    instant.checked_add(Duration::from_nanos(nanos))
}

fn is_leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (negative before 1970). Counts
/// whole 400-year eras from year 0 with the year starting in March, so February's length never
/// matters inside the year.
fn days_since_epoch(year: u64, month: u64, day: u64) -> i64 {
    // Inputs are validated: year <= 9999, month 1..=12, day 1..=31; all fit an i64 comfortably.
    let year = i64::try_from(year).unwrap_or(0) - i64::from(month <= 2);
    let month = i64::try_from(month).unwrap_or(1);
    let day = i64::try_from(day).unwrap_or(1);
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719_468 days separate 0000-03-01 from 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// The delay until an RFC 3339 reset time (`anthropic-ratelimit-*-reset`), `None` if malformed or
/// not after `now`.
pub fn reset_at(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let at = rfc3339(value.as_bytes())?;
    let delay = at.duration_since(now).ok()?;
    (!delay.is_zero()).then(|| clamp(delay))
}

/// The hint of the standard headers, by precedence: `retry-after-ms` (more precise; OpenAI's SDK
/// reads it first), Azure's `x-ms-retry-after-ms`, then `retry-after`. A header that is present
/// but unparseable is skipped.
pub fn server_hint(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    headers
        .get(headers::RETRY_AFTER_MS)
        .and_then(retry_after_ms)
        .or_else(|| {
            headers
                .get(headers::X_MS_RETRY_AFTER_MS)
                .and_then(retry_after_ms)
        })
        .or_else(|| {
            headers
                .get(headers::RETRY_AFTER)
                .and_then(|v| retry_after(v, now))
        })
}

/// How a rate-limit reset header is written.
#[derive(Clone, Copy)]
enum ResetFormat {
    GoDuration,
    Rfc3339,
}

/// (remaining header, reset header, format of the reset header).
const RESET_HEADERS: [(http::HeaderName, http::HeaderName, ResetFormat); 6] = [
    (
        headers::X_RATELIMIT_REMAINING_REQUESTS,
        headers::X_RATELIMIT_RESET_REQUESTS,
        ResetFormat::GoDuration,
    ),
    (
        headers::X_RATELIMIT_REMAINING_TOKENS,
        headers::X_RATELIMIT_RESET_TOKENS,
        ResetFormat::GoDuration,
    ),
    (
        headers::ANTHROPIC_RATELIMIT_REQUESTS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_RESET,
        ResetFormat::Rfc3339,
    ),
    (
        headers::ANTHROPIC_RATELIMIT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
        ResetFormat::Rfc3339,
    ),
    (
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET,
        ResetFormat::Rfc3339,
    ),
    (
        headers::ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET,
        ResetFormat::Rfc3339,
    ),
];

/// The hint of the rate-limit reset headers (`x-ratelimit-reset-*` as Go durations,
/// `anthropic-ratelimit-*-reset` as RFC 3339 times), the weakest hint there is: these headers say
/// when a limit is *fully* replenished, not when the next request fits.
///
/// When some limit's `remaining` header says `0`, the hint is the latest reset among the exhausted
/// limits (the request cannot pass before all of them reset). Otherwise it is the earliest reset
/// (an optimistic guess; the backoff takes over if it was wrong).
pub fn rate_limit_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut exhausted: Option<Duration> = None;
    let mut earliest: Option<Duration> = None;
    for (remaining, reset, format) in &RESET_HEADERS {
        let Some(value) = headers.get(reset) else {
            continue;
        };
        let delay = match format {
            ResetFormat::GoDuration => go_duration(value.as_bytes()),
            ResetFormat::Rfc3339 => reset_at(value, now),
        };
        let Some(delay) = delay else {
            continue;
        };
        let is_exhausted = headers
            .get(remaining)
            .is_some_and(|value| value.as_bytes().trim_ascii() == b"0");
        if is_exhausted {
            exhausted = Some(exhausted.map_or(delay, |d| d.max(delay)));
        }
        earliest = Some(earliest.map_or(delay, |d| d.min(delay)));
    }
    exhausted.or(earliest)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Sun, 06 Nov 1994 08:49:37 GMT.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    fn value(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn retry_after_delay_seconds() {
        assert_eq!(
            retry_after(&value("120"), now()),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after(&value("0"), now()), Some(Duration::ZERO));
        assert_eq!(
            retry_after(&value("007"), now()),
            Some(Duration::from_secs(7))
        );
        for hostile in [
            "", " ", "abc", "-5", "+5", "1.5", "inf", "NaN", "5s", "5 6", "0x10",
        ] {
            assert_eq!(retry_after(&value(hostile), now()), None, "{hostile:?}");
        }
        let thirty = "9".repeat(30);
        assert_eq!(retry_after(&value(&thirty), now()), None);
        assert_eq!(retry_after(&value("86401"), now()), Some(HINT_CEILING));
    }

    #[test]
    fn retry_after_http_dates() {
        let in_ten = Some(Duration::from_secs(10));
        assert_eq!(
            retry_after(&value("Sun, 06 Nov 1994 08:49:47 GMT"), now()),
            in_ten
        );
        assert_eq!(
            retry_after(&value("Sunday, 06-Nov-94 08:49:47 GMT"), now()),
            in_ten
        );
        assert_eq!(
            retry_after(&value("Sun Nov  6 08:49:47 1994"), now()),
            in_ten
        );
        // One day and more later is reported as the ceiling.
        assert_eq!(
            retry_after(&value("Tue, 08 Nov 1994 08:49:37 GMT"), now()),
            Some(HINT_CEILING)
        );
        assert_eq!(
            retry_after(&value("Sun, 06 Nov 1994 08:49:36 GMT"), now()),
            None
        );
        assert_eq!(
            retry_after(&value("Sun, 06 Nov 1994 08:49:37 GMT"), now()),
            None
        );
        assert_eq!(
            retry_after(&value("Sun, 06 Nov 1994 25:49:37 GMT"), now()),
            None
        );
        assert_eq!(
            retry_after(&value("Sun, 06 Nov 1994 08:49:47 UTC"), now()),
            None
        );
    }

    #[test]
    fn retry_after_ms_values() {
        assert_eq!(
            retry_after_ms(&value("1500")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after_ms(&value("0.25")),
            Some(Duration::from_micros(250))
        );
        assert_eq!(
            retry_after_ms(&value("1.0000019")),
            Some(Duration::from_nanos(1_000_001))
        );
        assert_eq!(retry_after_ms(&value("86400001")), Some(HINT_CEILING));
        for hostile in ["", "-1", "1e3", "inf", "NaN", ".5", "5.", "1,5", "1500ms"] {
            assert_eq!(retry_after_ms(&value(hostile)), None, "{hostile:?}");
        }
        assert_eq!(retry_after_ms(&value(&"9".repeat(30))), None);
    }

    #[test]
    fn should_retry_values() {
        assert_eq!(should_retry(&value("true")), Some(true));
        assert_eq!(should_retry(&value(" False ")), Some(false));
        assert_eq!(should_retry(&value("1")), None);
        assert_eq!(should_retry(&value("yes")), None);
    }

    #[test]
    fn grpc_pushback_values() {
        assert_eq!(
            grpc_pushback(&value("250")),
            Pushback::After(Duration::from_millis(250))
        );
        assert_eq!(grpc_pushback(&value("0")), Pushback::After(Duration::ZERO));
        assert_eq!(grpc_pushback(&value("-0")), Pushback::After(Duration::ZERO));
        assert_eq!(grpc_pushback(&value("-1")), Pushback::Stop);
        assert_eq!(grpc_pushback(&value("-250")), Pushback::Stop);
        assert_eq!(grpc_pushback(&value("")), Pushback::Stop);
        assert_eq!(grpc_pushback(&value("1.5")), Pushback::Stop);
        assert_eq!(grpc_pushback(&value("soon")), Pushback::Stop);
        assert_eq!(
            grpc_pushback(&value(&"9".repeat(30))),
            Pushback::After(HINT_CEILING)
        );
    }

    #[test]
    fn go_durations() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("6m0s", Some(Duration::from_secs(360))),
            ("12ms", Some(Duration::from_millis(12))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("1h2m3s", Some(Duration::from_secs(3723))),
            ("2m59.56s", Some(Duration::from_millis(179_560))),
            ("250us", Some(Duration::from_micros(250))),
            ("250µs", Some(Duration::from_micros(250))),
            ("250μs", Some(Duration::from_micros(250))),
            ("7ns", Some(Duration::from_nanos(7))),
            (".5s", Some(Duration::from_millis(500))),
            ("0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("48h", Some(HINT_CEILING)),
            ("", None),
            ("5", None),
            ("-1s", None),
            ("1d", None),
            ("s", None),
            (".s", None),
            ("1.5.5s", None),
            ("1s ", Some(Duration::from_secs(1))),
            ("1 s", None),
            ("99999999999999999999999h", None),
        ];
        for (text, expected) in cases {
            assert_eq!(go_duration(text.as_bytes()), *expected, "{text:?}");
        }
    }

    #[test]
    fn protobuf_durations() {
        assert_eq!(protobuf_duration("34s"), Some(Duration::from_secs(34)));
        assert_eq!(protobuf_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(
            protobuf_duration("0.000000001s"),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(
            protobuf_duration("36.429760048s"),
            Some(Duration::new(36, 429_760_048))
        );
        assert_eq!(protobuf_duration("315576000000s"), Some(HINT_CEILING));
        for hostile in [
            "",
            "34",
            "-1s",
            "1.s",
            "1.0000000001s",
            "1e3s",
            "infs",
            "34 s",
        ] {
            assert_eq!(protobuf_duration(hostile), None, "{hostile:?}");
        }
    }

    #[test]
    fn rfc3339_timestamps() {
        let at = |secs: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        let cases: &[(&str, Option<SystemTime>)] = &[
            ("1970-01-01T00:00:00Z", at(0, 0)),
            ("1994-11-06T08:49:37Z", at(784_111_777, 0)),
            ("1994-11-06t08:49:37z", at(784_111_777, 0)),
            ("1994-11-06T09:49:37+01:00", at(784_111_777, 0)),
            ("1994-11-06T03:19:37-05:30", at(784_111_777, 0)),
            ("1994-11-06T08:49:37.25Z", at(784_111_777, 250_000_000)),
            (
                "1994-11-06T08:49:37.1234567891Z",
                at(784_111_777, 123_456_789),
            ),
            ("2024-02-29T00:00:00Z", at(1_709_164_800, 0)),
            ("2000-02-29T00:00:00Z", at(951_782_400, 0)),
            ("2016-12-31T23:59:60Z", at(1_483_228_800, 0)),
            ("9999-12-31T23:59:59Z", at(253_402_300_799, 0)),
            ("2023-02-29T00:00:00Z", None),
            ("1900-02-29T00:00:00Z", None),
            ("2024-13-01T00:00:00Z", None),
            ("2024-00-01T00:00:00Z", None),
            ("2024-04-31T00:00:00Z", None),
            ("2024-01-01T24:00:00Z", None),
            ("2024-01-01T00:60:00Z", None),
            ("2024-01-01T00:00:61Z", None),
            ("2024-01-01 00:00:00Z", None),
            ("2024-01-01T00:00:00", None),
            ("2024-01-01T00:00Z", None),
            ("2024-01-01T00:00:00.Z", None),
            ("2024-01-01T00:00:00+24:00", None),
            ("2024-01-01T00:00:00+0100", None),
            ("2024-1-01T00:00:00Z", None),
            ("+2024-01-01T00:00:00Z", None),
            ("2024-01-01T00:00:00ZZ", None),
        ];
        for (text, expected) in cases {
            assert_eq!(rfc3339(text.as_bytes()), *expected, "{text:?}");
        }
        // Before the epoch is representable, and simply never a hint.
        assert!(rfc3339(b"1969-12-31T23:59:59Z").is_some());
        assert_eq!(reset_at(&value("1969-12-31T23:59:59Z"), now()), None);
        assert_eq!(
            reset_at(&value("1994-11-06T08:50:07Z"), now()),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn days_since_epoch_matches_a_day_by_day_count() {
        // Walk every day from 1970 to 2100 and compare with the formula.
        let mut expected: i64 = 0;
        for year in 1970..2100 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(
                        days_since_epoch(year, month, day),
                        expected,
                        "{year}-{month}-{day}"
                    );
                    expected += 1;
                }
            }
        }
    }

    #[test]
    fn header_precedence() {
        let mut headers = HeaderMap::new();
        headers.insert(headers::RETRY_AFTER, value("5"));
        assert_eq!(server_hint(&headers, now()), Some(Duration::from_secs(5)));
        headers.insert(headers::X_MS_RETRY_AFTER_MS, value("2500"));
        assert_eq!(
            server_hint(&headers, now()),
            Some(Duration::from_millis(2500))
        );
        headers.insert(headers::RETRY_AFTER_MS, value("1500"));
        assert_eq!(
            server_hint(&headers, now()),
            Some(Duration::from_millis(1500))
        );
        headers.insert(headers::RETRY_AFTER_MS, value("garbage"));
        assert_eq!(
            server_hint(&headers, now()),
            Some(Duration::from_millis(2500))
        );
    }

    #[test]
    fn rate_limit_reset_picks_the_exhausted_limit() {
        let mut headers = HeaderMap::new();
        assert_eq!(rate_limit_reset(&headers, now()), None);
        headers.insert(headers::X_RATELIMIT_RESET_REQUESTS, value("6m0s"));
        headers.insert(headers::X_RATELIMIT_RESET_TOKENS, value("12ms"));
        assert_eq!(
            rate_limit_reset(&headers, now()),
            Some(Duration::from_millis(12))
        );
        headers.insert(headers::X_RATELIMIT_REMAINING_REQUESTS, value("0"));
        assert_eq!(
            rate_limit_reset(&headers, now()),
            Some(Duration::from_secs(360))
        );
        headers.insert(headers::X_RATELIMIT_REMAINING_TOKENS, value("0"));
        headers.insert(headers::ANTHROPIC_RATELIMIT_TOKENS_REMAINING, value("0"));
        headers.insert(
            headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
            value("1994-11-06T09:49:37Z"),
        );
        assert_eq!(
            rate_limit_reset(&headers, now()),
            Some(Duration::from_secs(3600))
        );
        headers.insert(
            headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
            value("not a time"),
        );
        assert_eq!(
            rate_limit_reset(&headers, now()),
            Some(Duration::from_secs(360))
        );
    }
}
