//! gRPC status codes and the gRPC classification rules.

use std::fmt;
use std::time::SystemTime;

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::decimal::parse_decimal;
use crate::headers;
use crate::hint::{self, Pushback};
use crate::outcome::{Outcome, Reason};
use crate::status;

/// The gRPC status codes (0 ..= 16), as listed in the gRPC document "Status codes and their use
/// in gRPC".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum GrpcCode {
    /// 0: not an error.
    Ok = 0,
    /// 1: the operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// 2: unknown error.
    Unknown = 2,
    /// 3: the client specified an invalid argument.
    InvalidArgument = 3,
    /// 4: the deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// 5: some requested entity was not found.
    NotFound = 5,
    /// 6: the entity the client tried to create already exists.
    AlreadyExists = 6,
    /// 7: the caller lacks permission.
    PermissionDenied = 7,
    /// 8: some resource (quota, rate, space) has been exhausted.
    ResourceExhausted = 8,
    /// 9: the system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// 10: the operation was aborted, typically by a concurrency conflict.
    Aborted = 10,
    /// 11: the operation was attempted past the valid range.
    OutOfRange = 11,
    /// 12: the operation is not implemented or supported.
    Unimplemented = 12,
    /// 13: internal error.
    Internal = 13,
    /// 14: the service is currently unavailable.
    Unavailable = 14,
    /// 15: unrecoverable data loss or corruption.
    DataLoss = 15,
    /// 16: the request lacks valid authentication credentials.
    Unauthenticated = 16,
}

impl GrpcCode {
    const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code with this number, or `None` outside 0 ..= 16.
    pub const fn from_i32(value: i32) -> Option<Self> {
        if value >= 0 && value <= 16 {
            Some(Self::ALL[value as usize])
        } else {
            None
        }
    }

    /// The code's number.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// The code's canonical name, e.g. `UNAVAILABLE` (also the `status` string of Google's JSON
    /// errors).
    pub const fn as_str(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The metric label of [`Reason::Grpc`], e.g. `grpc_unavailable`.
    pub(crate) const fn metric_label(self) -> &'static str {
        match self {
            GrpcCode::Ok => "grpc_ok",
            GrpcCode::Cancelled => "grpc_cancelled",
            GrpcCode::Unknown => "grpc_unknown",
            GrpcCode::InvalidArgument => "grpc_invalid_argument",
            GrpcCode::DeadlineExceeded => "grpc_deadline_exceeded",
            GrpcCode::NotFound => "grpc_not_found",
            GrpcCode::AlreadyExists => "grpc_already_exists",
            GrpcCode::PermissionDenied => "grpc_permission_denied",
            GrpcCode::ResourceExhausted => "grpc_resource_exhausted",
            GrpcCode::FailedPrecondition => "grpc_failed_precondition",
            GrpcCode::Aborted => "grpc_aborted",
            GrpcCode::OutOfRange => "grpc_out_of_range",
            GrpcCode::Unimplemented => "grpc_unimplemented",
            GrpcCode::Internal => "grpc_internal",
            GrpcCode::Unavailable => "grpc_unavailable",
            GrpcCode::DataLoss => "grpc_data_loss",
            GrpcCode::Unauthenticated => "grpc_unauthenticated",
        }
    }

    /// The code named `name` (`"UNAVAILABLE"`, exact case), as Google's JSON errors spell it in
    /// their `status` field.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// The code in a `grpc-status` header value. A value that is not a decimal number in 0 ..= 16
    /// is `UNKNOWN`, as the gRPC HTTP/2 protocol document asks of clients.
    pub fn from_header(value: &HeaderValue) -> Self {
        let bytes = value.as_bytes().trim_ascii();
        // At most two digits: "014" is not a status code the protocol sends.
        parse_decimal(bytes)
            .ok()
            .filter(|_| bytes.len() <= 2)
            .and_then(|number| i32::try_from(number).ok())
            .and_then(Self::from_i32)
            .unwrap_or(GrpcCode::Unknown)
    }

    /// The code a client infers from the HTTP status of a gRPC response that carries no
    /// `grpc-status` (a proxy or load balancer answered), per the gRPC document "HTTP to gRPC
    /// Status Code Mapping": 400 `INTERNAL`, 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404
    /// `UNIMPLEMENTED`, 429, 502, 503, 504 `UNAVAILABLE`, anything else `UNKNOWN`.
    pub const fn from_http_status(status: StatusCode) -> Self {
        match status.as_u16() {
            200 => GrpcCode::Ok,
            400 => GrpcCode::Internal,
            401 => GrpcCode::Unauthenticated,
            403 => GrpcCode::PermissionDenied,
            404 => GrpcCode::Unimplemented,
            429 | 502 | 503 | 504 => GrpcCode::Unavailable,
            _ => GrpcCode::Unknown,
        }
    }

    /// The outcome of this code before any header is considered (see the table of [`GrpcClassifier`]).
    /// `RESOURCE_EXHAUSTED` comes out fatal here: only a hint makes it retryable.
    pub const fn outcome(self) -> Outcome {
        let reason = Reason::Grpc(self);
        match self {
            GrpcCode::Ok => Outcome::success(),
            GrpcCode::Unavailable | GrpcCode::Internal => Outcome::retryable(reason),
            GrpcCode::ResourceExhausted | GrpcCode::DeadlineExceeded => {
                Outcome::fatal(reason).with_accepted(false)
            }
            _ => Outcome::fatal(reason),
        }
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.as_i32(), self.as_str())
    }
}

/// Is this a gRPC message? True when `content-type` is `application/grpc`, optionally followed by
/// `+format` (`application/grpc+proto`), parameters (`;...`) or the gRPC-Web suffix `-web`
/// (whose trailers-only responses also carry `grpc-status` in the headers). Case-insensitive.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    const TYPE: &[u8] = b"application/";
    const SUBTYPE: &[u8] = b"grpc";
    let Some(value) = headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let Some((media_type, subtype)) = value.as_bytes().split_at_checked(TYPE.len()) else {
        return false;
    };
    // The subtype first: it is where `application/json`, on every LLM request and answer,
    // differs.
    let Some((grpc, rest)) = subtype.split_at_checked(SUBTYPE.len()) else {
        return false;
    };
    if !grpc.eq_ignore_ascii_case(SUBTYPE) || !media_type.eq_ignore_ascii_case(TYPE) {
        return false;
    }
    match rest {
        [] | [b'+' | b';' | b' ' | b'\t', ..] => true,
        rest => rest.len() >= 4 && rest[..4].eq_ignore_ascii_case(b"-web"),
    }
}

/// Classifies a gRPC response head (see [`GrpcClassifier`]). `now` dates HTTP-date hints.
pub(crate) fn classify(parts: &http::response::Parts, now: SystemTime) -> Outcome {
    let headers = &parts.headers;
    let code = match headers.get(headers::GRPC_STATUS) {
        Some(value) => GrpcCode::from_header(value),
        None => GrpcCode::from_http_status(parts.status),
    };
    if code == GrpcCode::Ok {
        return Outcome::success();
    }
    let mut outcome = code.outcome();
    let pushback = headers
        .get(headers::GRPC_RETRY_PUSHBACK_MS)
        .map(hint::grpc_pushback);
    let header_hint = hint::server_hint(headers, now);
    if code == GrpcCode::ResourceExhausted
        && (matches!(pushback, Some(Pushback::After(_))) || header_hint.is_some())
    {
        outcome = Outcome::retryable(Reason::Grpc(code));
    }
    if pushback == Some(Pushback::Stop) {
        // "Do not retry" from the server wins over everything, `x-should-retry: true` included,
        // whether the code was retryable or fatal on its own.
        outcome = Outcome::fatal(Reason::ServerSaidNoRetry).with_accepted(outcome.is_accepted());
    }
    let pushback_hint = match pushback {
        Some(Pushback::After(delay)) => Some(delay),
        _ => None,
    };
    status::finish(outcome, headers, header_hint.or(pushback_hint), now)
}

/// Ready classifier for gRPC services (tonic channels and servers): reads `grpc-status` from the
/// response headers (trailers-only responses), `grpc-retry-pushback-ms`, `retry-after[-ms]` and
/// `x-should-retry`; errors are classified like [`TransportClassifier`](crate::TransportClassifier).
///
/// It applies the gRPC rules to every response, whatever its `content-type`; the
/// [`LlmClassifier`](crate::LlmClassifier) picks gRPC or HTTP rules per response.
///
/// A gRPC response carries its status in the `grpc-status` trailer. When a server fails before
/// sending any message it answers "trailers-only": the status travels in the response headers,
/// which is what a classifier sees. A `200` gRPC response with no `grpc-status` header means the
/// stream started: a success from the classifier's point of view (a stream that failed later is
/// not retried silently anyway).
///
/// Retry rules follow gRFC A6 ("gRPC Retry Design"): only codes listed as retryable are retried,
/// and the server may push back with `grpc-retry-pushback-ms` (a non-negative integer: retry after
/// that many milliseconds; negative or unparseable: do not retry). A6 leaves the retryable codes to
/// the service config and uses `UNAVAILABLE` in its examples; the defaults here are:
///
/// | code | verdict | accepted | why |
/// |---|---|---|---|
/// | `OK` | success | yes | |
/// | `UNAVAILABLE` | retryable | no | the canonical transient code (gRFC A6, gRPC status code docs) |
/// | `INTERNAL` | retryable | no | like HTTP 500 (Gemini asks clients to retry its `INTERNAL` errors; Envoy offers `retry-on: internal`); the retry budget bounds the cost when it is a bug |
/// | `RESOURCE_EXHAUSTED` | retryable with a hint (pushback >= 0, `retry-after[-ms]`), else fatal | no | a quota that will not refill soon looks the same as a rate limit without a hint |
/// | `DEADLINE_EXCEEDED` | fatal | no | the deadline spans all attempts (gRFC A6): the server used it up |
/// | `CANCELLED` | fatal | yes | someone cancelled the call on purpose |
/// | `UNKNOWN`, `DATA_LOSS` | fatal | yes | usually an application exception: retrying repeats it |
/// | `ABORTED` | fatal | yes | the gRPC docs ask to retry "at a higher level" (the whole read-modify-write), not the call |
/// | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `UNAUTHENTICATED` | fatal | yes | the same request fails the same way |
///
/// A response without `grpc-status` and with a non-200 HTTP status (a proxy answered) is mapped to a
/// code with the table of the gRPC document "HTTP to gRPC Status Code Mapping".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcClassifier;

impl GrpcClassifier {
    /// Classifies a gRPC response head, dating HTTP-date hints from `now` (deterministic tests).
    pub fn classify_http_at(&self, parts: &http::response::Parts, now: SystemTime) -> Outcome {
        classify(parts, now)
    }
}

impl crate::Classify for GrpcClassifier {
    fn classify_http(&self, parts: &http::response::Parts, _body: &[u8]) -> Outcome {
        if parts.status == StatusCode::OK && parts.headers.get(headers::GRPC_STATUS).is_none() {
            return Outcome::success();
        }
        classify(parts, SystemTime::now())
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        crate::transport::classify_error(error)
    }

    fn needs_body(&self, _parts: &http::response::Parts) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Classify;

    #[test]
    fn codes_round_trip() {
        for number in 0..=16 {
            let code = GrpcCode::from_i32(number).unwrap();
            assert_eq!(code.as_i32(), number);
            assert_eq!(GrpcCode::from_name(code.as_str()), Some(code));
            assert_eq!(GrpcCode::from_header(&HeaderValue::from(number)), code);
        }
        assert_eq!(GrpcCode::from_i32(-1), None);
        assert_eq!(GrpcCode::from_i32(17), None);
        assert_eq!(GrpcCode::from_name("unavailable"), None);
        assert_eq!(GrpcCode::Unavailable.to_string(), "14 UNAVAILABLE");
    }

    #[test]
    fn hostile_grpc_status_is_unknown() {
        for text in ["", "17", "-1", "1.0", "014", "abc", "99999999999999999999"] {
            let value = HeaderValue::from_str(text).unwrap();
            assert_eq!(GrpcCode::from_header(&value), GrpcCode::Unknown, "{text:?}");
        }
        assert_eq!(
            GrpcCode::from_header(&HeaderValue::from_static(" 14 ")),
            GrpcCode::Unavailable
        );
    }

    #[test]
    fn content_types() {
        let grpc = |content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_str(content_type).unwrap(),
            );
            is_grpc(&headers)
        };
        assert!(grpc("application/grpc"));
        assert!(grpc("application/grpc+proto"));
        assert!(grpc("application/grpc+json"));
        assert!(grpc("application/grpc; charset=utf-8"));
        assert!(grpc("Application/GRPC"));
        assert!(grpc("application/grpc-web"));
        assert!(grpc("application/grpc-web-text+proto"));
        assert!(!grpc("application/grpcx"));
        assert!(!grpc("application/json"));
        assert!(!grpc("application/grp"));
        assert!(!grpc(""));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn http_status_mapping() {
        let map = |status: u16| GrpcCode::from_http_status(StatusCode::from_u16(status).unwrap());
        assert_eq!(map(400), GrpcCode::Internal);
        assert_eq!(map(401), GrpcCode::Unauthenticated);
        assert_eq!(map(403), GrpcCode::PermissionDenied);
        assert_eq!(map(404), GrpcCode::Unimplemented);
        for status in [429, 502, 503, 504] {
            assert_eq!(map(status), GrpcCode::Unavailable);
        }
        assert_eq!(map(500), GrpcCode::Unknown);
    }

    #[test]
    fn grpc_classifier_applies_grpc_rules_whatever_the_content_type() {
        let (parts, ()) = http::Response::builder()
            .header("grpc-status", "14")
            .header("grpc-retry-pushback-ms", "40")
            .body(())
            .unwrap()
            .into_parts();
        let outcome = GrpcClassifier.classify_http(&parts, b"");
        assert!(outcome.is_retryable());
        assert_eq!(
            outcome.retry_after(),
            Some(std::time::Duration::from_millis(40))
        );
        assert!(!GrpcClassifier.needs_body(&parts));
        let (ok, ()) = http::Response::new(()).into_parts();
        assert!(GrpcClassifier.classify_http(&ok, b"").is_success());
    }
}
