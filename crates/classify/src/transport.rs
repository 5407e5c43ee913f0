//! Classification of errors a service returns instead of a response.

use std::error::Error;
use std::io;

use crate::failure::{Failure, chain};
use crate::outcome::{Outcome, Reason};

/// Classifies a service error (see the table of [`TransportClassifier`]).
pub fn classify_error(error: &(dyn Error + 'static)) -> Outcome {
    let mut io_fallback: Option<Outcome> = None;
    for link in chain(error) {
        if let Some(failure) = link.downcast_ref::<Failure>() {
            return failure.outcome();
        }
        if link.is::<tower::timeout::error::Elapsed>() || link.is::<tokio::time::error::Elapsed>() {
            return Outcome::retryable(Reason::Timeout);
        }
        // An io error decides only if nothing more specific follows in the error it wraps.
        if let Some(io_error) = link.downcast_ref::<io::Error>() {
            io_fallback.get_or_insert(classify_io(io_error.kind()));
        }
    }
    io_fallback.unwrap_or(Outcome::retryable(Reason::Other))
}

/// The outcome of an io error kind (see the table of [`TransportClassifier`]).
pub const fn classify_io(kind: io::ErrorKind) -> Outcome {
    use io::ErrorKind as K;
    match kind {
        K::TimedOut => Outcome::retryable(Reason::Timeout),
        K::InvalidInput | K::InvalidData | K::PermissionDenied | K::Unsupported => {
            Outcome::fatal(Reason::Transport).with_accepted(false)
        }
        _ => Outcome::retryable(Reason::Transport),
    }
}

/// Ready classifier for transport errors: errors by the table below; every response is
/// a success (a response arrived, so the transport worked). Use it where only connectivity
/// matters; [`HttpClassifier`](crate::HttpClassifier), [`GrpcClassifier`](crate::GrpcClassifier)
/// and [`LlmClassifier`](crate::LlmClassifier) classify errors the same way.
///
/// The classifier walks the error's `source()` chain ([`chain`](crate::chain): at most
/// [`MAX_CHAIN`](crate::MAX_CHAIN) links, so a pathological chain cannot hang it) and stops at the
/// first link it recognises:
///
/// | error | verdict | accepted | reason |
/// |---|---|---|---|
/// | [`Failure`](crate::Failure) (every stormguard error carries one) | its own outcome | | |
/// | `tower::timeout::error::Elapsed`, `tokio::time::error::Elapsed` | retryable | no | `timeout` |
/// | `io::Error` `TimedOut` | retryable | no | `timeout` |
/// | `io::Error` `ConnectionRefused`, `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`, `NotConnected`, `UnexpectedEof`, `AddrNotAvailable`, `HostUnreachable`, `NetworkUnreachable`, `NetworkDown`, `Interrupted`, `WouldBlock`, `WriteZero` | retryable | no | `transport` |
/// | `io::Error` `InvalidInput`, `InvalidData`, `PermissionDenied`, `Unsupported` | fatal | no | `transport` (a bad request, a TLS certificate rejected, a sandbox: the same attempt fails the same way) |
/// | `io::Error` of any other kind | retryable | no | `transport` |
/// | anything else | retryable | no | `other` |
///
/// An `io::Error` that wraps another error (`io::Error::other(inner)`) is looked through: the
/// walk continues with `inner`, and only if nothing more specific is found does the io kind
/// decide.
///
/// Unknown errors are retryable and not accepted: they are most often connection-level failures
/// of a client library stormguard does not know (hyper's "connection closed before message
/// completed", an h2 stream reset, a DNS failure), and the retry budget bounds the cost of being
/// wrong. They are not accepted because no answer from the backend was seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportClassifier;

impl crate::Classify for TransportClassifier {
    fn classify_http(&self, _parts: &http::response::Parts, _body: &[u8]) -> Outcome {
        Outcome::success()
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        classify_error(error)
    }

    fn needs_body(&self, _parts: &http::response::Parts) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fmt;
    use std::time::Duration;

    use super::*;
    use crate::{BoxError, Classify, HttpClassifier, LlmClassifier};

    /// An error that wraps another, like a client library's error types do.
    #[derive(Debug)]
    struct Wrapper(&'static str, BoxError);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.1)
        }
    }

    #[derive(Debug)]
    struct Opaque;

    impl fmt::Display for Opaque {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("opaque")
        }
    }

    impl Error for Opaque {}

    fn io(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    #[test]
    fn connection_failures_are_retryable_and_not_accepted() {
        use io::ErrorKind as K;
        for kind in [
            K::ConnectionRefused,
            K::ConnectionReset,
            K::ConnectionAborted,
            K::BrokenPipe,
            K::UnexpectedEof,
            K::NotConnected,
            K::AddrNotAvailable,
            K::Interrupted,
        ] {
            let outcome = classify_error(&io(kind));
            assert!(outcome.is_retryable(), "{kind:?}");
            assert!(!outcome.is_accepted(), "{kind:?}");
            assert_eq!(outcome.reason(), Reason::Transport, "{kind:?}");
        }
        let timed_out = classify_error(&io(K::TimedOut));
        assert_eq!(timed_out, Outcome::retryable(Reason::Timeout));
    }

    #[test]
    fn local_faults_are_fatal() {
        use io::ErrorKind as K;
        for kind in [
            K::InvalidInput,
            K::InvalidData,
            K::PermissionDenied,
            K::Unsupported,
        ] {
            let outcome = classify_error(&io(kind));
            assert!(outcome.is_fatal(), "{kind:?}");
            assert!(!outcome.is_accepted(), "{kind:?}");
        }
    }

    #[test]
    fn io_error_three_levels_deep() {
        let error = Wrapper(
            "request failed",
            Box::new(Wrapper(
                "connect error",
                Box::new(Wrapper(
                    "tcp connect",
                    Box::new(io(io::ErrorKind::ConnectionRefused)),
                )),
            )),
        );
        let outcome = LlmClassifier::default().classify_error(&error);
        assert_eq!(outcome, Outcome::retryable(Reason::Transport));
        let timeout = Wrapper(
            "a",
            Box::new(Wrapper("b", Box::new(io(io::ErrorKind::TimedOut)))),
        );
        assert_eq!(classify_error(&timeout).reason(), Reason::Timeout);
    }

    #[test]
    fn timeouts_of_tower_and_tokio() {
        let tower_elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(
            classify_error(&*tower_elapsed),
            Outcome::retryable(Reason::Timeout)
        );
        let wrapped = Wrapper("layer", tower_elapsed);
        assert_eq!(
            classify_error(&wrapped),
            Outcome::retryable(Reason::Timeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_elapsed_is_a_timeout() {
        let elapsed = tokio::time::timeout(Duration::from_millis(1), std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(
            classify_error(&elapsed),
            Outcome::retryable(Reason::Timeout)
        );
        // Wrapped in an io::Error, as some clients do: looked through.
        let io_wrapped = io::Error::other(elapsed);
        assert_eq!(
            classify_error(&io_wrapped),
            Outcome::retryable(Reason::Timeout)
        );
    }

    #[test]
    fn io_error_with_a_plain_message_keeps_its_kind() {
        let error = io::Error::new(io::ErrorKind::ConnectionReset, "peer reset");
        assert_eq!(
            classify_error(&error),
            Outcome::retryable(Reason::Transport)
        );
        let error = io::Error::new(io::ErrorKind::InvalidData, Opaque);
        assert!(classify_error(&error).is_fatal());
    }

    #[test]
    fn unknown_errors_are_retryable_and_not_accepted() {
        let outcome = HttpClassifier.classify_error(&Opaque);
        assert_eq!(outcome, Outcome::retryable(Reason::Other));
        assert!(!outcome.is_accepted());
    }

    #[test]
    fn failure_in_the_chain_wins() {
        let fatal = Outcome::fatal(Reason::QuotaExhausted);
        let error = Wrapper("outer", Box::new(Failure::new(fatal)));
        assert_eq!(classify_error(&error), fatal);
    }

    #[test]
    fn transport_classifier_calls_every_response_a_success() {
        let (parts, ()) = http::Response::builder()
            .status(503)
            .body(())
            .unwrap()
            .into_parts();
        assert!(TransportClassifier.classify_http(&parts, b"").is_success());
        assert!(!TransportClassifier.needs_body(&parts));
    }
}
