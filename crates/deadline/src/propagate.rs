//! Carrying the remaining time downstream in headers, and reading it back.
//!
//! A deadline is only useful across a hop if the next service knows it. The client side stamps the
//! time left (minus a safety margin) on the outgoing request:
//!
//! - **gRPC** (`content-type: application/grpc...`): `grpc-timeout`, in the format of gRPC's
//!   "PROTOCOL-HTTP2" specification: at most 8 ASCII digits and a unit, `H` (hours), `M` (minutes),
//!   `S` (seconds), `m` (milliseconds), `u` (microseconds) or `n` (nanoseconds).
//! - **HTTP**: `x-request-timeout-ms`, whole milliseconds.
//!
//! Values are always rounded *down*: a hop may shorten a deadline, never extend it.
//!
//! The server side ([`incoming_timeout`]) reads either of those, and Envoy's
//! `x-envoy-expected-rq-timeout-ms`. Parsing is total: a malformed or hostile value is ignored
//! (`None`), never a panic or an overflow.
//!
//! The retry engine calls [`refresh`] before each attempt, so a retry sent 3 s later carries 3 s
//! less; only requests that a [`DeadlineLayer`](crate::DeadlineLayer) stamped are re-stamped.

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use tokio::time::Instant;

use crate::Deadline;

/// `grpc-timeout`: the time the client allows for a gRPC call (gRPC "PROTOCOL-HTTP2").
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `x-request-timeout-ms`: the time the client allows for an HTTP request, in whole milliseconds.
pub const X_REQUEST_TIMEOUT_MS: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// `x-envoy-expected-rq-timeout-ms`: the timeout Envoy applies to the request it forwards, in
/// milliseconds (Envoy's router documentation). Read on the server side only.
pub const X_ENVOY_EXPECTED_RQ_TIMEOUT_MS: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

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

/// Longest `x-request-timeout-ms` accepted: 20 digits hold any `u64`.
const MAX_MS_DIGITS: usize = 20;

/// `grpc-timeout` units from the finest, with their length in nanoseconds.
const GRPC_UNITS: [(u8, u128); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60_000_000_000),
    (b'H', 3_600_000_000_000),
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
        .find_map(|(unit, length)| {
            let value = nanos / length;
            (value <= u128::from(GRPC_MAX_VALUE)).then_some((*unit, value))
        })
        .unwrap_or((b'H', u128::from(GRPC_MAX_VALUE)));
    // At most 8 digits: fits a u64. The unit goes in the top byte of the cache key.
    let value = u64::try_from(value).unwrap_or(GRPC_MAX_VALUE);
    let render = || header_value(format!("{value}{}", char::from(unit)));
    // `try_with`: a thread whose locals are being torn down renders afresh.
    LAST_GRPC_TIMEOUT
        .try_with(|last| last.get_or_render(u64::from(unit) << 56 | value, render))
        .unwrap_or_else(|_| render())
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
    let v = v.trim_ascii();
    let (unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let value = parse_digits(digits)?;
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

/// Formats `d` as whole milliseconds, rounded down (`x-request-timeout-ms`).
pub fn format_timeout_ms(d: Duration) -> HeaderValue {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    LAST_TIMEOUT_MS
        .try_with(|last| last.get_or_render(millis, || render_millis(millis)))
        .unwrap_or_else(|_| render_millis(millis))
}

fn render_millis(millis: u64) -> HeaderValue {
    let mut digits = Digits {
        text: [b'0'; 20],
        start: 20,
    };
    let mut rest = millis;
    // A u64 has at most 20 digits: `start` stays in bounds.
    while digits.start == 20 || rest > 0 {
        digits.start -= 1;
        digits.text[digits.start] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    // Owned by its `Bytes`: one allocation, and the copy each retry attempt gets is a reference
    // count (`HeaderValue::from(u64)` builds a growable buffer that a clone copies again).
    HeaderValue::from_maybe_shared(Bytes::from_owner(digits))
        .unwrap_or_else(|_| HeaderValue::from(millis))
}

/// The last header value a thread rendered, by the number it renders.
///
/// Requests sent close together with the same timeout carry the same value: a client sending
/// thousands of requests a second with a 600 s deadline stamps the same millisecond count on most
/// of them. Reusing the last rendering makes the stamp a reference count instead of an
/// allocation and a formatting.
struct LastRendered(RefCell<Option<(u64, HeaderValue)>>);

impl LastRendered {
    const fn new() -> Self {
        Self(RefCell::new(None))
    }

    fn get_or_render(&self, key: u64, render: impl FnOnce() -> HeaderValue) -> HeaderValue {
        let mut last = self.0.borrow_mut();
        match &*last {
            Some((rendered, value)) if *rendered == key => value.clone(),
            _ => {
                let value = render();
                *last = Some((key, value.clone()));
                value
            }
        }
    }
}

thread_local! {
    static LAST_TIMEOUT_MS: LastRendered = const { LastRendered::new() };
    static LAST_GRPC_TIMEOUT: LastRendered = const { LastRendered::new() };
}

/// The decimal digits of a `u64`, right-aligned in `text` from `start`.
struct Digits {
    text: [u8; 20],
    start: usize,
}

impl AsRef<[u8]> for Digits {
    fn as_ref(&self) -> &[u8] {
        &self.text[self.start..]
    }
}

/// Parses a whole number of milliseconds (`x-request-timeout-ms`,
/// `x-envoy-expected-rq-timeout-ms`): ASCII digits only, at most 20 of them, fitting a `u64`.
/// Signs, fractions, units and anything else are `None`.
pub fn parse_timeout_ms(v: &[u8]) -> Option<Duration> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > MAX_MS_DIGITS {
        return None;
    }
    parse_digits(v).map(Duration::from_millis)
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

/// Stamps the request's remaining time, minus `margin`, in its propagation header (`grpc-timeout`
/// for gRPC requests, `x-request-timeout-ms` otherwise), and records the margin so that
/// [`refresh`] can stamp it again later. Does nothing (and returns `false`) when the request carries
/// no [`Deadline`].
pub fn stamp<B>(request: &mut Request<B>, margin: Duration) -> bool {
    with_parts(request, |headers, extensions| {
        let grpc = is_grpc(headers);
        stamp_parts(headers, extensions, margin, Instant::now(), grpc)
    })
}

/// Re-stamps the propagation header from the request's [`Deadline`] extension: the time remaining
/// *now*, minus the margin recorded when the header was first stamped. Requests that were never
/// stamped are left untouched. Called by the retry engine before each attempt.
pub fn refresh<B>(request: &mut Request<B>) {
    let Some(margin) = Deadline::of(request).and_then(|deadline| deadline.stamped_margin) else {
        return;
    };
    with_parts(request, |headers, extensions| {
        let grpc = is_grpc(headers);
        stamp_parts(headers, extensions, margin, Instant::now(), grpc)
    });
}

pub(crate) use stormguard_classify::is_grpc;

/// Stamps the time left at `now`, minus `margin` (see [`stamp`]), in the header for a gRPC
/// (`grpc`) or an HTTP request.
pub(crate) fn stamp_parts(
    headers: &mut HeaderMap,
    extensions: &mut http::Extensions,
    margin: Duration,
    now: Instant,
    grpc: bool,
) -> bool {
    let Some(deadline) = extensions.get_mut::<Deadline>() else {
        return false;
    };
    // Recorded for `refresh`, in place (no allocation).
    deadline.stamped_margin = Some(margin);
    let budget = deadline
        .instant()
        .saturating_duration_since(now)
        .saturating_sub(margin);
    if grpc {
        headers.insert(GRPC_TIMEOUT, format_grpc_timeout(budget));
    } else {
        headers.insert(X_REQUEST_TIMEOUT_MS, format_timeout_ms(budget));
    }
    true
}

/// Runs `f` on the request's headers and extensions at once (`Request` lends only one of them
/// mutably at a time; taking the extensions out is a pointer move).
fn with_parts<B, T>(
    request: &mut Request<B>,
    f: impl FnOnce(&mut HeaderMap, &mut http::Extensions) -> T,
) -> T {
    let mut extensions = std::mem::take(request.extensions_mut());
    let result = f(request.headers_mut(), &mut extensions);
    *request.extensions_mut() = extensions;
    result
}

/// Parses ASCII digits into a `u64`; `None` on anything else or on overflow.
fn parse_digits(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |value, byte| {
        let digit = byte.is_ascii_digit().then(|| u64::from(byte - b'0'))?;
        value.checked_mul(10)?.checked_add(digit)
    })
}

/// A `grpc-timeout` value from text this module produced (ASCII digits and a unit letter).
fn header_value(text: String) -> HeaderValue {
    // Cannot fail for that alphabet; were it to, a zero timeout errs on the side of shortening.
    HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("0n"))
}
