//! [`GrpcCode`]: the gRPC status codes, their numbers and names, and how a client reads one from a
//! response. It needs nothing of the classification rules, so that [`Reason`](crate::Reason) can
//! name a code; what a code means for a retry, [`GrpcCode::outcome`], is one of the rules of
//! [`crate::grpc`].

use std::fmt;

use http::{HeaderValue, StatusCode};
use stormguard_numbers::decimal::parse_decimal;

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

    /// The metric label of [`Reason::Grpc`](crate::Reason::Grpc), e.g. `grpc_unavailable`.
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
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.as_i32(), self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
}
