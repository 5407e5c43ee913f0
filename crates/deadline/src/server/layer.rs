use std::time::Duration;

use tower_layer::Layer;

use super::ServerDeadline;
use crate::DEFAULT_TIMEOUT;

/// Default time a server gives a request that names no timeout: 300 s (5 minutes).
///
/// Callers that send no deadline header are mostly SDKs with their own 10-minute timeout (the
/// OpenAI and Anthropic defaults). A non-streaming generation of 8,000 tokens at the ~35 tokens/s of
/// a large model takes under 4 minutes, so 5 minutes lets long generations finish while still
/// bounding work nobody may be waiting for any more. A plain 60 s default would cut long
/// generations half way, which is the failure this crate exists to prevent.
pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_secs(300);

/// Server side: reads the caller's deadline, sheds requests that arrive expired, and times out the
/// rest. See the [module docs](crate::server).
#[derive(Clone, Copy, Debug)]
pub struct ServerDeadlineLayer {
    settings: ServerSettings,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ServerSettings {
    pub(crate) default: Duration,
    pub(crate) max: Duration,
    pub(crate) min_remaining: Duration,
}

impl Default for ServerDeadlineLayer {
    /// Default 300 s ([`DEFAULT_SERVER_TIMEOUT`]), maximum 600 s ([`DEFAULT_TIMEOUT`]), shed only
    /// requests with no time left.
    fn default() -> Self {
        Self {
            settings: ServerSettings {
                default: DEFAULT_SERVER_TIMEOUT,
                max: DEFAULT_TIMEOUT,
                min_remaining: Duration::ZERO,
            },
        }
    }
}

impl ServerDeadlineLayer {
    /// The default layer (see [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Timeout for requests that carry no (valid) deadline header (default 300 s,
    /// [`DEFAULT_SERVER_TIMEOUT`]). It is capped by the maximum too.
    ///
    /// It has no getter of the bare name: `default` is [`Default::default`].
    pub fn with_default(mut self, timeout: Duration) -> Self {
        self.settings.default = timeout;
        self
    }

    /// Longest timeout a caller may ask for; longer ones are cut to it (default 600 s,
    /// [`DEFAULT_TIMEOUT`]: a caller asking for a day does not get to pin the server for a day).
    pub fn with_max(mut self, max: Duration) -> Self {
        self.settings.max = max;
        self
    }

    /// The longest timeout a caller may ask for.
    pub fn max(&self) -> Duration {
        self.settings.max
    }

    /// Shed requests that arrive with less than this much time left (default zero: only those
    /// already expired). Useful when no meaningful work fits in a few milliseconds.
    pub fn with_min_remaining(mut self, min_remaining: Duration) -> Self {
        self.settings.min_remaining = min_remaining;
        self
    }

    /// The least time left a request must arrive with to be served.
    pub fn min_remaining(&self) -> Duration {
        self.settings.min_remaining
    }
}

impl<S> Layer<S> for ServerDeadlineLayer {
    type Service = ServerDeadline<S>;

    fn layer(&self, inner: S) -> ServerDeadline<S> {
        ServerDeadline::from_settings(inner, self.settings)
    }
}
