//! [`Failure`]: an [`Outcome`] travelling inside an error chain, and the one walk down such chains.

use std::error::Error;
use std::fmt;
use std::io;

use crate::BoxError;
use crate::outcome::Outcome;

/// The longest `source()` chain walked: a hostile or buggy error whose source is itself cannot
/// make a walk endless.
pub const MAX_CHAIN: usize = 32;

/// An [`Outcome`] as an error, so that a classification survives being boxed into a
/// [`BoxError`]: the vocabulary in which stormguard's errors say what they are.
///
/// Every error stormguard raises (a throttled request, an expired deadline, a request the retry
/// engine gave up on, a response [`ClassifyLayer`](crate::ClassifyLayer) turned into an error)
/// has a `Failure` in its source chain, and every ready classifier's `classify_error` returns the
/// outcome of the first one it meets ([`outcome_of`]). So a layer or a gateway tells a local
/// refusal from an upstream failure, and a retry from a final answer, without knowing the types
/// of the crates that raised them.
///
/// A `Failure` may carry the error it classifies as its own source.
#[derive(Debug)]
pub struct Failure {
    outcome: Outcome,
    source: Option<BoxError>,
}

impl Failure {
    /// Wraps an outcome.
    pub const fn new(outcome: Outcome) -> Self {
        Failure {
            outcome,
            source: None,
        }
    }

    /// Wraps an outcome and the error it classifies.
    pub fn with_source(outcome: Outcome, source: BoxError) -> Self {
        Failure {
            outcome,
            source: Some(source),
        }
    }

    /// The wrapped outcome.
    pub const fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The error it classifies, if it carries one.
    pub fn into_source(self) -> Option<BoxError> {
        self.source
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "classified as {}", self.outcome)
    }
}

impl Error for Failure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}

/// The links of `error`'s source chain, `error` first, at most [`MAX_CHAIN`] of them.
///
/// `std::io::Error` takes a special step: its `source()` skips the error it wraps (it returns the
/// wrapped error's own source), so the wrapped error is reached through `get_ref`.
pub fn chain<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&link| next_link(link)).take(MAX_CHAIN)
}

fn next_link<'a>(link: &'a (dyn Error + 'static)) -> Option<&'a (dyn Error + 'static)> {
    match link.downcast_ref::<io::Error>() {
        Some(io) => io.get_ref().map(|inner| inner as &(dyn Error + 'static)),
        None => link.source(),
    }
}

/// The outcome of the first [`Failure`] in `error`'s chain, if there is one.
pub fn outcome_of(error: &(dyn Error + 'static)) -> Option<Outcome> {
    chain(error).find_map(|link| link.downcast_ref::<Failure>().map(Failure::outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reason;

    #[derive(Debug)]
    struct Loop;

    impl fmt::Display for Loop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("loop")
        }
    }

    impl Error for Loop {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&Loop)
        }
    }

    #[test]
    fn a_self_referencing_chain_is_cut_at_the_bound() {
        assert_eq!(chain(&Loop).count(), MAX_CHAIN);
        assert_eq!(outcome_of(&Loop), None);
        // The classifiers' walk ends too, on "unidentified": retryable, not accepted.
        let outcome = crate::transport::classify_error(&Loop);
        assert_eq!(outcome, Outcome::retryable(Reason::Other));
    }

    #[test]
    fn a_failure_is_found_behind_an_io_error_and_keeps_its_source() {
        let outcome = Outcome::fatal(Reason::QuotaExhausted);
        let inner = io::Error::from(io::ErrorKind::ConnectionReset);
        let failure = Failure::with_source(outcome, Box::new(inner));
        assert!(
            failure
                .source()
                .is_some_and(|source| source.is::<io::Error>())
        );
        let wrapped = io::Error::other(failure);
        assert_eq!(outcome_of(&wrapped), Some(outcome));
        // The walk goes on to the io error below the failure: three links in all.
        assert_eq!(chain(&wrapped).count(), 3);
    }
}
