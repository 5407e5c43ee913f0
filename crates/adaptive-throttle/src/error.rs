//! The error a request gets when the throttle drops it locally.

use std::error::Error;
use std::fmt;

use stormguard_classify::{Failure, Outcome, Reason};

/// What a local drop is in the shared vocabulary: fatal (retrying at once would defeat the
/// throttle), with reason [`Reason::Throttled`], and not accepted (the backend never saw it).
static THROTTLED: Failure = Failure::new(Outcome::fatal(Reason::Throttled).with_accepted(false));

/// A request dropped locally by the adaptive throttle: it never reached the backend.
///
/// The backend has been rejecting most of what this client sent (see the crate docs for the
/// formula), so sending more would only add load to a backend that is already failing. The drop
/// is final: retrying it at once would defeat the throttle.
///
/// Its source is a [`Failure`] with the outcome `Outcome::fatal(Reason::Throttled)`, not
/// accepted, so that [`outcome_of`](stormguard_classify::outcome_of) and every classifier's
/// `classify_error` say what it is without knowing this type. Detect it directly with
/// `error.is::<Throttled>()` on the [`BoxError`](stormguard_classify::BoxError) the throttle
/// layer returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Throttled;

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request throttled locally: backend is rejecting")
    }
}

impl Error for Throttled {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&THROTTLED)
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for Throttled {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use stormguard_classify::{BoxError, Classify, LlmClassifier, outcome_of};

    use super::*;

    #[test]
    fn a_drop_is_fatal_and_not_accepted_for_every_classifier() {
        let expected = Outcome::fatal(Reason::Throttled).with_accepted(false);
        assert_eq!(outcome_of(&Throttled), Some(expected));

        let boxed: BoxError = Box::new(Throttled);
        let outcome = LlmClassifier::default().classify_error(&*boxed);
        assert!(outcome.is_fatal());
        assert!(!outcome.is_accepted());
        assert_eq!(outcome.reason(), Reason::Throttled);
        assert_eq!(outcome, expected);

        assert_eq!(
            Throttled.to_string(),
            "request throttled locally: backend is rejecting"
        );
    }
}
