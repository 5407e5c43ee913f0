//! [`Failure`]: an [`Outcome`] travelling inside an error chain.

use std::error::Error;
use std::fmt;

use crate::outcome::Outcome;

/// A failed [`Outcome`] as an error, so that a classification survives being boxed into a
/// [`BoxError`](crate::BoxError). [`ClassifiedError`](crate::ClassifiedError) exposes it as its
/// `source()`, and every ready classifier's `classify_error` returns the outcome of the first
/// `Failure` in an error's source chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    outcome: Outcome,
}

impl Failure {
    /// Wraps an outcome.
    pub const fn new(outcome: Outcome) -> Self {
        Failure { outcome }
    }

    /// The wrapped outcome.
    pub const fn outcome(&self) -> Outcome {
        self.outcome
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "classified as {}", self.outcome)
    }
}

impl Error for Failure {}
