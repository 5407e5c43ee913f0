//! The error raised when a deadline passes, and what it classifies as.

use std::error::Error;
use std::fmt;

use stormguard_classify::{Failure, Outcome, Reason};

/// What an expired deadline is: fatal (the deadline spans every attempt, so no retry can meet
/// it) and not accepted (no backend did the work). The outcome of [`DeadlineExceeded`], and of the
/// refusals this crate answers with.
pub(crate) const EXPIRED: Outcome = Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false);

/// The source of every [`DeadlineExceeded`]: one value, since they all say the same.
static EXPIRED_FAILURE: Failure = Failure::new(EXPIRED);

/// The request's [`Deadline`](crate::Deadline) passed before a response arrived (or had already
/// passed when the request was about to be sent, in which case it was not sent).
///
/// Retrying cannot help: the deadline spans every attempt. Its source is a
/// [`Failure`] with a fatal, not accepted outcome of reason [`Reason::DeadlineExceeded`], so every
/// classifier and layer reads it as final without knowing this type.
///
/// ```
/// use stormguard_classify::{Reason, outcome_of};
/// use stormguard_deadline::DeadlineExceeded;
///
/// let outcome = outcome_of(&DeadlineExceeded::new()).expect("a classified error");
/// assert!(outcome.is_fatal());
/// assert!(!outcome.is_accepted());
/// assert_eq!(outcome.reason(), Reason::DeadlineExceeded);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadlineExceeded {
    _private: (),
}

impl DeadlineExceeded {
    /// The error.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl Error for DeadlineExceeded {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&EXPIRED_FAILURE)
    }
}

/// Answered by [`error_response`](stormguard_classify::error_response) as it is held.
impl stormguard_classify::AsError for DeadlineExceeded {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard_classify::{BoxError, outcome_of};

    #[test]
    fn classifies_as_a_fatal_unaccepted_deadline_also_when_boxed() {
        let expected = Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false);
        assert_eq!(outcome_of(&DeadlineExceeded::new()), Some(expected));
        let boxed: BoxError = Box::new(DeadlineExceeded::new());
        assert_eq!(outcome_of(boxed.as_ref()), Some(expected));
        let wrapped = std::io::Error::other(DeadlineExceeded::new());
        assert_eq!(outcome_of(&wrapped), Some(expected));
        assert_eq!(DeadlineExceeded::new().to_string(), "deadline exceeded");
    }
}
