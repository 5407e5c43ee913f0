//! What the throttle's tests share: telling a permit how its attempt ended.

use http::HeaderMap;
use stormguard_adaptive_throttle::ThrottlePermit;
use stormguard_classify::{Outcome, Permit, Reason};

/// Tells `permit` that the backend accepted its attempt (a success), or did not (overloaded).
pub fn answer(permit: ThrottlePermit, accepted: bool) {
    let outcome = if accepted {
        Outcome::success()
    } else {
        Outcome::retryable(Reason::Overloaded).with_accepted(false)
    };
    permit.record(&outcome, &HeaderMap::new());
}
