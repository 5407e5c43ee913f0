//! `stormguard-gateway demo`: the gateway in front of a mock provider that fails on purpose, so
//! that a newcomer sees it work with no key and no account.
//!
//! [`start`] starts a mock provider twice, each on a loopback ephemeral port, speaking OpenAI's
//! `/v1/chat/completions` and Anthropic's `/v1/messages`, whole or streamed: a flaky one, which
//! fails on a fixed schedule, and a backup, which never fails (see [`DEFAULT_WORDS`],
//! [`CUT_AFTER_WORDS`], [`RETRY_AFTER_SECS`]). In front of them, a
//! gateway serves the config of [`config`]: the model `demo` (OpenAI's format) and
//! `demo-claude` (Anthropic's), each on two ranks, the flaky deployment first and the backup
//! second, every other setting its default, without caller keys and so on loopback only.
//!
//! What a caller sees, sending one request after the other:
//!
//! * whole answers: every other one was failed by the flaky rank first, in turn with a server
//!   error (OpenAI's 500, Anthropic's 529), retried there, and with a 429 carrying
//!   `Retry-After: 1`, moved at once to the backup rank (which `x-stormguard-backend` names), the
//!   flaky one passed over for that second: `x-stormguard-attempts: 2` each time;
//! * streams: every third one is cut by the flaky rank after a few words (its head says where,
//!   in `x-demo-fault`); the gateway asks the backup rank to continue from the words received,
//!   and splices the rest in, so the caller reads every word once, in order, with one end;
//! * answers count (`1 2 3 ... 12`), so a word repeated or missing shows at once.
//!
//! The mock is not `stormguard::chaos`: that layer is left out of the gateway's build on
//! purpose (a production binary cannot contain it), and the demo's faults are a schedule a
//! reader can predict rather than rates.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let demo = stormguard_gateway::demo::start("127.0.0.1:0".parse()?).await?;
//! print!("{}", stormguard_gateway::demo::instructions(demo.gateway.addr));
//! demo.gateway.wait().await?;
//! # Ok(())
//! # }
//! ```

mod provider;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;

pub use provider::{
    CUT_AFTER_WORDS, DEFAULT_WORDS, Injected, MAX_WORDS, RETRY_AFTER_SECS, X_DEMO_FAULT,
};
pub use stream::WORD_PACE;

use crate::config::{Config, ConfigErrors, Env};
use crate::serve::{self, Running, StartError};
use provider::Mock;

/// The model served in OpenAI's format.
pub const OPENAI_MODEL: &str = "demo";
/// The model served in Anthropic's format.
pub const ANTHROPIC_MODEL: &str = "demo-claude";

/// The demo running: the gateway, and the mock providers behind it.
pub struct Demo {
    /// The gateway.
    pub gateway: Running,
    /// Where the flaky provider listens.
    pub flaky: SocketAddr,
    /// Where the backup provider listens.
    pub backup: SocketAddr,
    mock: Arc<Mock>,
}

impl Demo {
    /// What the mock provider injected so far.
    pub fn injected(&self) -> Injected {
        self.mock.injected()
    }
}

/// Starts the mock providers on loopback ephemeral ports, and the gateway in front of them on
/// `listen`.
pub async fn start(listen: SocketAddr) -> Result<Demo, StartError> {
    let mock = Arc::new(Mock::default());
    let flaky = spawn_provider((Arc::clone(&mock), true)).await?;
    let backup = spawn_provider((Arc::clone(&mock), false)).await?;
    let config = config([flaky, backup], listen)
        .map_err(|errors| StartError::Upstream(format!("the demo's config: {errors}")))?;
    let gateway = serve::start(&config).await?;
    Ok(Demo {
        gateway,
        flaky,
        backup,
        mock,
    })
}

/// Serves a mock provider on a loopback ephemeral port: where it listens.
async fn spawn_provider(provider: provider::Provider) -> Result<SocketAddr, StartError> {
    let app = Router::new()
        .fallback(provider::answer)
        .with_state(provider);
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(StartError::Bind)?;
    let addr = listener.local_addr().map_err(StartError::Bind)?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The demo's config: the gateway on `listen`, models [`OPENAI_MODEL`] and [`ANTHROPIC_MODEL`]
/// on two ranks, the flaky provider at `providers[0]`, then the backup at `providers[1]`, every
/// other setting its default.
pub fn config(providers: [SocketAddr; 2], listen: SocketAddr) -> Result<Config, ConfigErrors> {
    let mut text = format!("[server]\nlisten = \"{listen}\"\n");
    for (format, model) in [("openai", OPENAI_MODEL), ("anthropic", ANTHROPIC_MODEL)] {
        for (rank, role, provider) in [(1, "flaky", providers[0]), (2, "backup", providers[1])] {
            text.push_str(&format!(
                "[providers.{role}-{format}]\nformat = \"{format}\"\n\
                 base_url = \"http://{provider}\"\n\
                 [[models.{model}.deployments]]\nprovider = \"{role}-{format}\"\n\
                 model = \"mock\"\nrank = {rank}\n"
            ));
        }
    }
    Config::parse("(demo)", &text, &Env::new())
}

/// What the demo prints once the gateway listens at `addr`: what runs, and the `curl` commands
/// to try, each on one line.
pub fn instructions(addr: SocketAddr) -> String {
    let url = format!("http://{addr}");
    let json = "-H 'content-type: application/json'";
    let ask = r#""messages":[{"role":"user","content":"Count for me"}]"#;
    format!(
        "\
stormguard-gateway demo: the gateway listens on {url},
in front of mock providers that fail on purpose (no key needed). Models: `{OPENAI_MODEL}` (OpenAI's
format) and `{ANTHROPIC_MODEL}` (Anthropic's), each on two ranks: a flaky provider, then a backup.
Answers count (1 2 3 ...), so a word repeated or missing shows at once. Send each a few times:

A whole answer. Every other one is failed first: a 500, retried on the flaky provider, then a
429 with Retry-After: 1, moved at once to the backup. Look at x-stormguard-attempts (2) and
x-stormguard-backend.
  curl -i {url}/v1/chat/completions {json} -d '{{\"model\":\"{OPENAI_MODEL}\",{ask}}}'

A streamed answer. Every third stream is cut after a few words (x-demo-fault says where); the
backup continues it, and the numbers still arrive once each, in order, with one [DONE].
  curl -N -i {url}/v1/chat/completions {json} -d '{{\"model\":\"{OPENAI_MODEL}\",\"stream\":true,{ask}}}'

The same in Anthropic's format (a 529 instead of the 500):
  curl -N -i {url}/v1/messages {json} -H 'anthropic-version: 2023-06-01' -d '{{\"model\":\"{ANTHROPIC_MODEL}\",\"max_tokens\":12,\"stream\":true,{ask}}}'

The gateway's log below shows each fault and retry. Ctrl-C stops the demo.
"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_config_puts_the_flaky_deployment_before_the_backup() {
        let providers = [
            "127.0.0.1:8".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        ];
        let config = config(providers, "127.0.0.1:0".parse().unwrap()).unwrap();
        for model in [OPENAI_MODEL, ANTHROPIC_MODEL] {
            let ranks = &config.models[model].ranks;
            assert_eq!(ranks.len(), 2);
            assert!(ranks[0][0].provider.starts_with("flaky-"));
            assert!(ranks[1][0].provider.starts_with("backup-"));
        }
        let backup = &config.providers["backup-anthropic"];
        assert_eq!(backup.base_url.to_string(), "http://127.0.0.1:9");
        assert!(backup.keys.is_empty());
        assert!(config.server.caller_keys.is_empty());
        assert_eq!(
            config.server.max_connections,
            crate::config::DEFAULT_MAX_CONNECTIONS
        );
    }

    #[test]
    fn the_instructions_name_the_address_in_each_curl_line() {
        let text = instructions("127.0.0.1:4567".parse().unwrap());
        let curls: Vec<&str> = text
            .lines()
            .filter(|line| line.trim_start().starts_with("curl "))
            .collect();
        assert_eq!(curls.len(), 3, "{text}");
        for curl in &curls {
            assert!(curl.contains("http://127.0.0.1:4567/v1/"), "{curl}");
        }
        assert!(curls[1].contains(r#""stream":true"#) && curls[1].contains("\"model\":\"demo\""));
        assert!(
            curls[2].contains("/v1/messages") && curls[2].contains("\"model\":\"demo-claude\"")
        );
    }
}
