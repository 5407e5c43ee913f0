//! [`GrpcCodes`], a set of status codes, and [`ListedCodesClassifier`], which retries the codes of
//! a set and no other: a gRPC service config's `retryableStatusCodes` or `nonFatalStatusCodes`
//! (gRFC A6).

use std::fmt;

use http::StatusCode;

use super::GrpcCode;
use crate::headers;
use crate::hint::{self, Pushback};
use crate::outcome::{Outcome, Reason};

/// A set of gRPC status codes (one bit per code): cheap to copy and to test.
///
/// ```
/// use stormguard_classify::{GrpcCode, GrpcCodes};
///
/// let codes: GrpcCodes = [GrpcCode::Unavailable, GrpcCode::Aborted].into_iter().collect();
/// assert!(codes.contains(GrpcCode::Aborted));
/// assert!(!codes.contains(GrpcCode::Internal));
/// assert_eq!(codes.len(), 2);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GrpcCodes(u32);

impl GrpcCodes {
    /// No code.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// The set with `code` added.
    pub const fn with(self, code: GrpcCode) -> Self {
        Self(self.0 | 1 << code as u32)
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: GrpcCode) -> bool {
        self.0 & 1 << code as u32 != 0
    }

    /// How many codes the set holds.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set holds no code.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in the set, by number.
    pub fn iter(self) -> impl Iterator<Item = GrpcCode> {
        (0..=16)
            .filter_map(GrpcCode::from_i32)
            .filter(move |code| self.contains(*code))
    }
}

impl FromIterator<GrpcCode> for GrpcCodes {
    fn from_iter<I: IntoIterator<Item = GrpcCode>>(codes: I) -> Self {
        codes.into_iter().fold(Self::empty(), Self::with)
    }
}

impl fmt::Debug for GrpcCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(GrpcCode::as_str))
            .finish()
    }
}

/// Classifies gRPC answers the way a gRPC client with a service config does (gRFC A6): a failed
/// call is retryable only when its status is one of the listed codes (`retryableStatusCodes` of
/// a `retryPolicy`, `nonFatalStatusCodes` of a `hedgingPolicy`), and fatal otherwise, whatever
/// [`GrpcClassifier`](crate::GrpcClassifier)'s defaults say of the code.
///
/// Server pushback (`grpc-retry-pushback-ms`, gRFC A6 "Pushback") is read as A6 says: a
/// non-negative number of milliseconds is the delay before the retry of a listed code; a
/// negative or unparseable value means "do not retry", whatever the code (the outcome is fatal,
/// reason [`ServerSaidNoRetry`](Reason::ServerSaidNoRetry)). HTTP's `x-should-retry` and
/// `retry-after` are not read: the service config alone decides what is retried.
///
/// Whether the backend *accepted* the call (for the adaptive throttle and the breaker) is what
/// the code says of itself, as for [`GrpcClassifier`](crate::GrpcClassifier): `UNAVAILABLE`
/// was not accepted, `INVALID_ARGUMENT` was, whether listed or not. Errors without a response
/// are classified like [`TransportClassifier`](crate::TransportClassifier)'s (a refused
/// connection is retryable).
///
/// ```
/// use stormguard_classify::{Classify, GrpcCode, ListedCodesClassifier};
///
/// let classifier = ListedCodesClassifier::new([GrpcCode::Aborted].into_iter().collect());
/// let answer = |code: &str| {
///     let response = http::Response::builder().header("grpc-status", code).body(()).unwrap();
///     classifier.classify_http(&response.into_parts().0, b"")
/// };
/// assert!(answer("10").is_retryable()); // ABORTED, listed
/// assert!(answer("14").is_fatal()); // UNAVAILABLE, not listed
/// assert!(answer("0").is_success());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListedCodesClassifier {
    retryable: GrpcCodes,
}

impl ListedCodesClassifier {
    /// Retries `retryable` and nothing else.
    pub const fn new(retryable: GrpcCodes) -> Self {
        Self { retryable }
    }

    /// The codes retried.
    pub const fn retryable(&self) -> GrpcCodes {
        self.retryable
    }
}

impl crate::Classify for ListedCodesClassifier {
    fn classify_http(&self, parts: &http::response::Parts, _body: &[u8]) -> Outcome {
        let headers = &parts.headers;
        let code = match headers.get(headers::GRPC_STATUS) {
            Some(value) => GrpcCode::from_header(value),
            // A started stream (200, its status still to come in the trailers) is a success here.
            None if parts.status == StatusCode::OK => return Outcome::success(),
            None => GrpcCode::from_http_status(parts.status),
        };
        if code == GrpcCode::Ok {
            return Outcome::success();
        }
        let accepted = code.outcome().is_accepted();
        let reason = Reason::Grpc(code);
        match headers
            .get(headers::GRPC_RETRY_PUSHBACK_MS)
            .map(hint::grpc_pushback)
        {
            Some(Pushback::Stop) => {
                Outcome::fatal(Reason::ServerSaidNoRetry).with_accepted(accepted)
            }
            _ if !self.retryable.contains(code) => Outcome::fatal(reason).with_accepted(accepted),
            Some(Pushback::After(delay)) => Outcome::retryable(reason)
                .with_accepted(accepted)
                .with_retry_after(Some(delay)),
            None => Outcome::retryable(reason).with_accepted(accepted),
        }
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

    use std::time::Duration;

    use super::*;
    use crate::Classify;

    fn answer(classifier: &ListedCodesClassifier, headers: &[(&str, &str)]) -> Outcome {
        let mut response = http::Response::builder();
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        let (parts, ()) = response.body(()).unwrap().into_parts();
        classifier.classify_http(&parts, b"")
    }

    #[test]
    fn only_listed_codes_are_retried() {
        let classifier = ListedCodesClassifier::new(
            [GrpcCode::ResourceExhausted, GrpcCode::Unavailable]
                .into_iter()
                .collect(),
        );
        assert!(answer(&classifier, &[("grpc-status", "8")]).is_retryable());
        let unavailable = answer(&classifier, &[("grpc-status", "14")]);
        assert!(unavailable.is_retryable() && !unavailable.is_accepted());
        // INTERNAL is retryable by the default rules, not here.
        let internal = answer(&classifier, &[("grpc-status", "13")]);
        assert!(internal.is_fatal());
        assert_eq!(internal.reason(), Reason::Grpc(GrpcCode::Internal));
        assert!(answer(&classifier, &[("grpc-status", "0")]).is_success());
        assert!(answer(&classifier, &[]).is_success());
        // x-should-retry is HTTP's: the service config decides.
        let forced = answer(
            &classifier,
            &[("grpc-status", "3"), ("x-should-retry", "true")],
        );
        assert!(forced.is_fatal() && forced.is_accepted());
    }

    #[test]
    fn pushback_sets_the_delay_or_stops_retries() {
        let classifier = ListedCodesClassifier::new(GrpcCodes::empty().with(GrpcCode::Unavailable));
        let after = answer(
            &classifier,
            &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "250")],
        );
        assert_eq!(after.retry_after(), Some(Duration::from_millis(250)));
        for stop in ["-1", "soon", "1.5"] {
            let outcome = answer(
                &classifier,
                &[("grpc-status", "14"), ("grpc-retry-pushback-ms", stop)],
            );
            assert!(outcome.is_fatal(), "{stop}");
            assert_eq!(outcome.reason(), Reason::ServerSaidNoRetry);
        }
    }

    #[test]
    fn a_set_lists_its_codes() {
        let codes: GrpcCodes = [
            GrpcCode::Unavailable,
            GrpcCode::Cancelled,
            GrpcCode::Unavailable,
        ]
        .into_iter()
        .collect();
        assert_eq!(
            codes.iter().collect::<Vec<_>>(),
            [GrpcCode::Cancelled, GrpcCode::Unavailable]
        );
        assert_eq!(format!("{codes:?}"), r#"{"CANCELLED", "UNAVAILABLE"}"#);
        assert!(GrpcCodes::empty().is_empty());
    }
}
