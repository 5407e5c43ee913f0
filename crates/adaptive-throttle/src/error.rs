//! The error a request gets when the throttle drops it locally.

use std::fmt;

/// A request dropped locally by the adaptive throttle: it never reached the backend.
///
/// The backend has been rejecting most of what this client sent (see the crate docs for the
/// formula), so sending more would only add load to a backend that is already failing. The drop
/// is final: retrying it at once would defeat the throttle, so the retry engine never retries it.
/// Detect it with `error.downcast_ref::<Throttled>()` (or `is::<Throttled>()`) on the
/// [`BoxError`](stormguard_classify::BoxError) the throttle layer returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Throttled;

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request throttled locally: backend is rejecting")
    }
}

impl std::error::Error for Throttled {}
