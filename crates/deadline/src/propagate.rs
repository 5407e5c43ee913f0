//! Carrying the remaining time downstream in headers, and reading it back.
//!
//! A deadline is only useful across a hop if the next service knows it. The client side stamps the
//! time left (minus a safety margin) on the outgoing request ([`stamp`]):
//!
//! - **gRPC** (`content-type: application/grpc...`): [`GRPC_TIMEOUT`], in the format of gRPC's
//!   "PROTOCOL-HTTP2" specification: at most 8 ASCII digits and a unit, `H` (hours), `M` (minutes),
//!   `S` (seconds), `m` (milliseconds), `u` (microseconds) or `n` (nanoseconds).
//! - **HTTP**: [`X_REQUEST_TIMEOUT_MS`], whole milliseconds.
//!
//! Values are always rounded *down*: a hop may shorten a deadline, never extend it.
//!
//! The server side ([`incoming_timeout`]) reads either of those, and Envoy's
//! [`X_ENVOY_EXPECTED_RQ_TIMEOUT_MS`]. Parsing is total: a malformed or hostile value is ignored
//! (`None`), never a panic or an overflow. The header names are those of
//! [`stormguard_classify::headers`].
//!
//! A [`Deadline`] is a plain instant, so stamping is repeatable: the retry engine stamps every
//! attempt with [`stamp`], and a retry sent 3 s after the first attempt carries 3 s less.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_classify::headers::X_REQUEST_TIMEOUT_MS;
//! use stormguard_deadline::{Deadline, propagate};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let mut request = http::Request::new(());
//! Deadline::after(Duration::from_secs(2)).apply_to(&mut request);
//! assert!(propagate::stamp(&mut request, propagate::DEFAULT_MARGIN));
//! assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "1950");
//! # }
//! ```
//!
//! [`GRPC_TIMEOUT`]: stormguard_classify::headers::GRPC_TIMEOUT
//! [`X_REQUEST_TIMEOUT_MS`]: stormguard_classify::headers::X_REQUEST_TIMEOUT_MS
//! [`X_ENVOY_EXPECTED_RQ_TIMEOUT_MS`]: stormguard_classify::headers::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request};
use stormguard_classify::headers::{
    GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_TIMEOUT_MS,
};
use stormguard_classify::is_grpc;
use stormguard_numbers::decimal::parse_decimal;

use crate::Deadline;

/// Default safety margin subtracted from the remaining time before it is sent downstream: 50 ms.
///
/// The downstream service should give up slightly *before* the caller does, so that its answer
/// (a 504 or gRPC `DEADLINE_EXCEEDED` saying where the time went) arrives while the caller still
/// listens, instead of racing the caller's own timer. The margin has to cover the time between
/// stamping the header and the server starting its clock: a network hop and queueing, around a
/// millisecond within a region and tens of milliseconds across regions. 50 ms covers both and is
/// negligible next to LLM deadlines of seconds to minutes.
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(50);

/// Largest value gRPC allows in `grpc-timeout`: 8 digits.
const GRPC_MAX_VALUE: u64 = 99_999_999;

/// Most digits of a `grpc-timeout` value (gRPC "PROTOCOL-HTTP2": `TimeoutValue` is at most 8).
const GRPC_MAX_DIGITS: usize = 8;

/// Longest `x-request-timeout-ms` accepted: 20 digits hold any `u64`.
const MAX_MS_DIGITS: usize = 20;

/// `grpc-timeout` units from the finest, with their length in nanoseconds.
const GRPC_UNITS: [(char, u128); 6] = [
    ('n', 1),
    ('u', 1_000),
    ('m', 1_000_000),
    ('S', 1_000_000_000),
    ('M', 60_000_000_000),
    ('H', 3_600_000_000_000),
];

/// Formats `d` as a `grpc-timeout` value: at most 8 digits in the finest unit that fits, rounded
/// down. Durations beyond 99,999,999 hours (11,000 years) are clipped to that.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::propagate::format_grpc_timeout;
///
/// assert_eq!(format_grpc_timeout(Duration::from_millis(1500)), "1500000u");
/// assert_eq!(format_grpc_timeout(Duration::from_secs(30)), "30000000u");
/// assert_eq!(format_grpc_timeout(Duration::from_secs(600)), "600000m");
/// ```
pub fn format_grpc_timeout(d: Duration) -> HeaderValue {
    let nanos = d.as_nanos();
    let (unit, value) = GRPC_UNITS
        .iter()
        .find_map(|&(unit, length)| {
            let value = nanos / length;
            (value <= u128::from(GRPC_MAX_VALUE)).then_some((unit, value))
        })
        .unwrap_or(('H', u128::from(GRPC_MAX_VALUE)));
    // ASCII digits and a unit letter are always a valid header value; were they not, a zero
    // timeout errs on the side of shortening.
    HeaderValue::try_from(format!("{value}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
/// Anything else (a sign, a ninth digit, an unknown unit, surrounding text) is `None`.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::propagate::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(b"2H"), Some(Duration::from_secs(7200)));
/// assert_eq!(parse_grpc_timeout(b"99999999999S"), None);
/// assert_eq!(parse_grpc_timeout(b"-1m"), None);
/// assert_eq!(parse_grpc_timeout(b"10X"), None);
/// ```
pub fn parse_grpc_timeout(v: &[u8]) -> Option<Duration> {
    let (unit, digits) = v.trim_ascii().split_last()?;
    if digits.len() > GRPC_MAX_DIGITS {
        return None;
    }
    let value = parse_decimal(digits).ok()?;
    // At most 99,999,999 of any unit: even in hours that is 3.6e11 seconds, far inside u64.
    Some(match unit {
        b'H' => Duration::from_secs(value * 3600),
        b'M' => Duration::from_secs(value * 60),
        b'S' => Duration::from_secs(value),
        b'm' => Duration::from_millis(value),
        b'u' => Duration::from_micros(value),
        b'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

/// Formats `d` as whole milliseconds, rounded down (`x-request-timeout-ms`). Durations beyond
/// `u64::MAX` milliseconds are clipped to that.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::propagate::format_timeout_ms;
///
/// assert_eq!(format_timeout_ms(Duration::from_micros(1_999_999)), "1999");
/// ```
pub fn format_timeout_ms(d: Duration) -> HeaderValue {
    HeaderValue::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Parses a whole number of milliseconds (`x-request-timeout-ms`,
/// `x-envoy-expected-rq-timeout-ms`): ASCII digits only, at most 20 of them, fitting a `u64`.
/// Signs, fractions, units, overflow and anything else are `None`.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::propagate::parse_timeout_ms;
///
/// assert_eq!(parse_timeout_ms(b"2000"), Some(Duration::from_secs(2)));
/// assert_eq!(parse_timeout_ms(b"1.5"), None);
/// assert_eq!(parse_timeout_ms(b"18446744073709551616"), None);
/// ```
pub fn parse_timeout_ms(v: &[u8]) -> Option<Duration> {
    let v = v.trim_ascii();
    if v.len() > MAX_MS_DIGITS {
        return None;
    }
    parse_decimal(v).ok().map(Duration::from_millis)
}

/// The timeout a caller sent: the tightest valid value among `grpc-timeout`,
/// `x-request-timeout-ms` and `x-envoy-expected-rq-timeout-ms` (every occurrence of each). Invalid
/// values are ignored; `None` if there is no valid one.
pub fn incoming_timeout(headers: &HeaderMap) -> Option<Duration> {
    let grpc = headers
        .get_all(GRPC_TIMEOUT)
        .iter()
        .filter_map(|v| parse_grpc_timeout(v.as_bytes()));
    let millis = [X_REQUEST_TIMEOUT_MS, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS]
        .into_iter()
        .flat_map(|name| headers.get_all(name).iter())
        .filter_map(|v| parse_timeout_ms(v.as_bytes()));
    grpc.chain(millis).min()
}

/// Stamps the time left until the request's [`Deadline`], minus `margin`, in its propagation
/// header: `grpc-timeout` for gRPC requests, `x-request-timeout-ms` otherwise (replacing any value
/// already there). Does nothing (and returns `false`) when the request carries no deadline.
///
/// Stamping again later writes the smaller time left then: the retry engine stamps every attempt.
pub fn stamp<B>(request: &mut Request<B>, margin: Duration) -> bool {
    let Some(deadline) = Deadline::of(request) else {
        return false;
    };
    stamp_headers(
        request.headers_mut(),
        deadline.remaining().saturating_sub(margin),
    );
    true
}

/// [`stamp`], for a caller that holds the deadline and the headers apart (a request head kept to
/// build attempts from) and has worked out the time to send: `time_left` in `grpc-timeout` when
/// the headers say gRPC, else in `x-request-timeout-ms`.
pub fn stamp_headers(headers: &mut HeaderMap, time_left: Duration) {
    let grpc = is_grpc(headers);
    write_timeout(headers, time_left, grpc);
}

/// Writes `timeout` in the propagation header of a gRPC (`grpc`) or an HTTP request.
pub(crate) fn write_timeout(headers: &mut HeaderMap, timeout: Duration, grpc: bool) {
    if grpc {
        headers.insert(GRPC_TIMEOUT, format_grpc_timeout(timeout));
    } else {
        headers.insert(X_REQUEST_TIMEOUT_MS, format_timeout_ms(timeout));
    }
}
