use std::error::Error;
use std::fmt;
use std::sync::Mutex;

use crate::failure::Failure;
use crate::outcome::Outcome;

/// A response the classifier called a failure, as an error: the whole response (head and
/// unread body) and its [`Outcome`]. Its `source()` is a [`Failure`] with the same outcome, so
/// `classify_error` of any ready classifier recovers it from a boxed error without knowing `B`.
pub struct ClassifiedError<B> {
    parts: http::response::Parts,
    // A `Mutex` only to make the error `Sync` (as `BoxError` requires) for bodies that are
    // `Send` but not `Sync`; it is never locked while shared.
    body: Mutex<B>,
    failure: Failure,
}

impl<B> ClassifiedError<B> {
    /// Wraps a response and its (failed) outcome.
    pub fn new(parts: http::response::Parts, body: B, outcome: Outcome) -> Self {
        ClassifiedError {
            parts,
            body: Mutex::new(body),
            failure: Failure::new(outcome),
        }
    }

    /// The classification.
    pub fn outcome(&self) -> Outcome {
        self.failure.outcome()
    }

    /// The response head.
    pub fn parts(&self) -> &http::response::Parts {
        &self.parts
    }

    /// The response status.
    pub fn status(&self) -> http::StatusCode {
        self.parts.status
    }

    /// The response headers.
    pub fn headers(&self) -> &http::HeaderMap {
        &self.parts.headers
    }

    /// The response, whole again.
    pub fn into_response(self) -> http::Response<B> {
        let body = self
            .body
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        http::Response::from_parts(self.parts, body)
    }
}

impl<B> fmt::Debug for ClassifiedError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedError")
            .field("status", &self.parts.status)
            .field("outcome", &self.failure.outcome())
            .finish_non_exhaustive()
    }
}

impl<B> fmt::Display for ClassifiedError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "response {} classified as {}",
            self.parts.status,
            self.failure.outcome()
        )
    }
}

impl<B> Error for ClassifiedError<B> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.failure)
    }
}
