use std::time::Duration;

use http::request::Parts;

/// Where a [`DeadlineLayer`](crate::DeadlineLayer) takes a request's timeout from, before any body
/// is read. `None` sets no new deadline (a deadline already on the request still applies).
///
/// Implemented for a fixed [`Duration`] and for [`FromFn`]. The LLM estimate, which reads the body,
/// is [`LlmDeadline`](crate::LlmDeadline) and has a service of its own.
pub trait TimeoutSource {
    /// The timeout for the request with these parts.
    fn timeout(&self, parts: &Parts) -> Option<Duration>;
}

impl TimeoutSource for Duration {
    fn timeout(&self, _parts: &Parts) -> Option<Duration> {
        Some(*self)
    }
}

/// A timeout computed by a function of the request head (method, URI, headers, extensions).
#[derive(Clone, Copy, Debug)]
pub struct FromFn<F>(pub(crate) F);

impl<F> TimeoutSource for FromFn<F>
where
    F: Fn(&Parts) -> Option<Duration>,
{
    fn timeout(&self, parts: &Parts) -> Option<Duration> {
        (self.0)(parts)
    }
}
