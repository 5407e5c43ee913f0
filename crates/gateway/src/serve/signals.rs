//! The binary's signals (unix): SIGTERM and SIGINT drain, SIGHUP reloads.

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{Drained, Running};
use crate::config::{Config, ConfigErrors};

/// The signals the gateway handles, installed before it listens: a signal sent as soon as it
/// does finds them in place rather than the default action (which ends the process).
pub struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    /// Installs the handlers of SIGTERM, SIGINT and SIGHUP.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// Serves until SIGTERM or SIGINT, then [drains](Running::drain). On each SIGHUP, `reload` reads
/// the config again and the gateway [reloads](Running::reload) it (a config with errors is
/// refused and logged, the one in use kept); without `reload` (a start from the environment
/// alone, which a running process cannot see change) SIGHUP is logged and changes nothing.
///
/// A second SIGTERM or SIGINT during the drain ends it at once (an operator's second Ctrl-C):
/// `None` then, as nothing was waited for.
pub async fn serve_until_signalled<F>(
    running: Running,
    mut signals: Signals,
    reload: Option<F>,
) -> Option<Drained>
where
    F: Fn() -> Result<Config, ConfigErrors>,
{
    loop {
        tokio::select! {
            _ = signals.terminate.recv() => {
                tracing::info!("SIGTERM: draining");
                break;
            }
            _ = signals.interrupt.recv() => {
                tracing::info!("SIGINT: draining");
                break;
            }
            _ = signals.hangup.recv() => match &reload {
                Some(read) => match read() {
                    Ok(config) => {
                        let _ = running.reload(&config);
                    }
                    Err(errors) => tracing::error!(
                        "SIGHUP: reload refused, the config in use is kept:\n{errors}"
                    ),
                },
                None => tracing::info!(
                    "SIGHUP: started from the environment alone, which a running process cannot \
                     see change: nothing to reload"
                ),
            },
        }
    }
    let drained = tokio::select! {
        drained = running.drain() => Some(drained),
        _ = signals.terminate.recv() => None,
        _ = signals.interrupt.recv() => None,
    };
    if drained.is_none() {
        tracing::warn!("a second signal: ending without waiting for the drain");
    }
    drained
}
