use std::time::Duration;

use http::request::Parts;

use crate::LlmDeadline;

/// Where a request's timeout comes from: a fixed [`Duration`], a function of the request head
/// ([`FromFn`]), or an estimate from the request body ([`LlmDeadline`]). `None` sets no new
/// deadline (a deadline already on the request still applies).
///
/// [`DeadlineLayer`](crate::DeadlineLayer) reads no body and always passes `body: None`. A caller
/// that buffers request bodies anyway (the client retry engine, which replays them) asks
/// [`reads_body`](Self::reads_body) and, when it is true, passes the body it read, or `None` when
/// it could not read it whole (too large, or of unknown length).
///
/// The trait is object safe and its implementations here are `Send + Sync` (a [`FromFn`] when its
/// function is), so a layer may hold any of them as an `Arc<dyn TimeoutSource + Send + Sync>`.
pub trait TimeoutSource {
    /// The timeout for the request with this head and, if it was read, this body.
    fn timeout(&self, parts: &Parts, body: Option<&[u8]>) -> Option<Duration>;

    /// Whether [`timeout`](Self::timeout) looks at the body, so that a caller reads it first.
    /// False unless an implementation says otherwise.
    fn reads_body(&self) -> bool {
        false
    }
}

impl TimeoutSource for Duration {
    fn timeout(&self, _parts: &Parts, _body: Option<&[u8]>) -> Option<Duration> {
        Some(*self)
    }
}

/// A timeout computed by a function of the request head (method, URI, headers, extensions).
#[derive(Clone, Copy, Debug)]
pub struct FromFn<F>(F);

impl<F> FromFn<F> {
    /// The timeout `f` gives each request head (`None`: no new deadline).
    pub fn new(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Duration>,
    {
        Self(f)
    }
}

impl<F> TimeoutSource for FromFn<F>
where
    F: Fn(&Parts) -> Option<Duration>,
{
    fn timeout(&self, parts: &Parts, _body: Option<&[u8]>) -> Option<Duration> {
        (self.0)(parts)
    }
}

/// The estimate of the body ([`LlmDeadline::estimate`]); a body that was not read gets
/// [`LlmDeadline::max`].
impl TimeoutSource for LlmDeadline {
    fn timeout(&self, _parts: &Parts, body: Option<&[u8]>) -> Option<Duration> {
        Some(body.map_or(self.max, |body| self.estimate(body)))
    }

    fn reads_body(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn head(path: &str) -> Parts {
        let request = http::Request::get(path).body(()).expect("a valid request");
        request.into_parts().0
    }

    #[test]
    fn an_llm_deadline_estimates_a_body_and_gives_its_maximum_without_one() {
        let llm = LlmDeadline::default();
        let body = br#"{"max_tokens": 100, "messages": [{"role": "user", "content": "12345678"}]}"#;
        // 10 s + 3 prompt tokens ("user" + 8 characters) at 1 ms + 100 output tokens at 28 ms.
        assert_eq!(
            llm.timeout(&head("/v1/messages"), Some(body)),
            Some(Duration::from_millis(10_000 + 3 + 2_800))
        );
        assert_eq!(
            llm.timeout(&head("/v1/messages"), None),
            Some(Duration::from_secs(600))
        );
        assert!(llm.reads_body());
    }

    #[test]
    fn head_sources_ignore_the_body_and_do_not_ask_for_it() {
        let fixed = Duration::from_secs(7);
        assert_eq!(fixed.timeout(&head("/"), Some(b"{}")), Some(fixed));
        assert!(!fixed.reads_body());
        let by_path = FromFn(|parts: &Parts| {
            (parts.uri.path() == "/v1/embeddings").then_some(Duration::from_secs(5))
        });
        assert_eq!(
            by_path.timeout(&head("/v1/embeddings"), None),
            Some(Duration::from_secs(5))
        );
        assert_eq!(by_path.timeout(&head("/health"), Some(b"{}")), None);
        assert!(!by_path.reads_body());
    }

    #[test]
    fn every_source_fits_a_shared_trait_object() {
        let sources: [Arc<dyn TimeoutSource + Send + Sync>; 3] = [
            Arc::new(Duration::from_secs(1)),
            Arc::new(FromFn(|_: &Parts| Some(Duration::from_secs(2)))),
            Arc::new(LlmDeadline::default()),
        ];
        let timeouts: Vec<_> = sources
            .iter()
            .map(|source| source.timeout(&head("/"), None))
            .collect();
        assert_eq!(
            timeouts,
            [1, 2, 600].map(|secs| Some(Duration::from_secs(secs)))
        );
    }
}
