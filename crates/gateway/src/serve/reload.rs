//! Reloading: a new config applied to new requests, the requests in flight left on the one they
//! started with; a config that cannot be served refused, the one in use kept.
//!
//! A reload builds every route anew: each deployment starts with a closed breaker, a fresh
//! adaptive throttle, empty rate-limit windows, and a key set aside before is tried again (a
//! reload is also how an operator says a refused key was replaced). What a reload cannot change
//! is the listener's: `listen` and `max_connections` are kept, with a warning, until a restart.

use std::path::Path;

use super::{Running, StartError, app_with, check_listen, current};
use crate::config::{Config, ConfigErrors, Env};

/// Why a reload was refused (the config in use is kept).
#[derive(Debug)]
pub enum ReloadError {
    /// The file has errors, each `FILE:LINE: key: message`.
    Config(ConfigErrors),
    /// The config is valid but cannot be served: a caller key's variable is not set, a provider
    /// key cannot be sent, or the address in use may not serve without caller keys.
    Refused(StartError),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(errors) => errors.fmt(f),
            Self::Refused(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ReloadError {}

impl Running {
    /// Serves `config` from now on: requests that arrive after this returns are routed by it,
    /// let in by its caller keys and held to its limits; requests in flight keep the config
    /// they started with. On an error nothing changes. Logged either way.
    pub fn reload(&self, config: &Config) -> Result<(), ReloadError> {
        let applied = self.try_reload(config);
        match &applied {
            Ok(()) => tracing::info!(
                source = %config.source,
                models = config.models.len(),
                "config reloaded: new requests use it"
            ),
            Err(error) => tracing::error!(
                source = %config.source,
                "reload refused, the config in use is kept: {error}"
            ),
        }
        applied
    }

    /// Reads and validates the file at `path` with `env`, then [`reload`](Running::reload)s it.
    /// A file with errors is refused and each error logged as `FILE:LINE: key: message`.
    pub fn reload_file(&self, path: &Path, env: &Env) -> Result<(), ReloadError> {
        match Config::load(path, env) {
            Ok(config) => self.reload(&config),
            Err(errors) => {
                tracing::error!(
                    file = %path.display(),
                    "reload refused, the config in use is kept:\n{errors}"
                );
                Err(ReloadError::Config(errors))
            }
        }
    }

    fn try_reload(&self, config: &Config) -> Result<(), ReloadError> {
        let (app, keys) = app_with(config, self.ending.clone()).map_err(ReloadError::Refused)?;
        // The address in use is the one the new callers' keys must be checked against.
        check_listen(self.listen, &keys, config.server.allow_unauthenticated)
            .map_err(|refused| ReloadError::Refused(StartError::Listen(refused)))?;
        if config.server.listen != self.listen {
            tracing::warn!(
                listen = %self.listen,
                asked = %config.server.listen,
                "a new listen address needs a restart: still listening on the old one"
            );
        }
        if config.server.max_connections != self.max_connections {
            tracing::warn!(
                max_connections = self.max_connections,
                asked = config.server.max_connections,
                "a new max_connections needs a restart: the old one is kept"
            );
        }
        self.current.send_replace(current(config, app));
        Ok(())
    }
}
