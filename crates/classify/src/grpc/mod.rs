//! The gRPC classification rules, and the status codes they read ([`GrpcCode`], in [`code`]).

use std::time::SystemTime;

use http::{HeaderMap, StatusCode};

use crate::headers;
use crate::hint::{self, Pushback};
use crate::outcome::{Outcome, Reason};
use crate::status;

pub(crate) mod code;
mod listed;

pub use self::code::GrpcCode;
pub use self::listed::{GrpcCodes, ListedCodesClassifier};

// What a code means on its own is the first of the rules (the table of `GrpcClassifier`), so it
// lives with them rather than with the code, which `Reason` names.
impl GrpcCode {
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

/// Is this a gRPC message? True when `content-type` is `application/grpc`, optionally followed by
/// `+format` (`application/grpc+proto`), parameters (`;...`) or the gRPC-Web suffix `-web`
/// (whose trailers-only responses also carry `grpc-status` in the headers). Case-insensitive.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(is_grpc_type)
}

/// [`is_grpc`] of a `content-type` already read.
pub(crate) fn is_grpc_type(value: &http::HeaderValue) -> bool {
    const TYPE: &[u8] = b"application/";
    const SUBTYPE: &[u8] = b"grpc";
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

    use http::HeaderValue;

    use super::*;
    use crate::Classify;

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
