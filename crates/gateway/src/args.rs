//! The command line: `stormguard-gateway [--config FILE] [--listen ADDR]`,
//! `stormguard-gateway check FILE` and `stormguard-gateway demo [--listen ADDR]`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::{Config, DEFAULT_FLEET_PREFIX, Fleet, LogFormat, Secret};

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Serve, from `config` (or from the environment alone), on `listen` if given.
    Serve {
        /// The config file.
        config: Option<PathBuf>,
        /// The listen address, over the config's.
        listen: Option<SocketAddr>,
        /// Over the config's: the fleet's Redis URL, and the log format.
        overrides: Overrides,
    },
    /// Validate a config file and print the effective config.
    Check(PathBuf),
    /// Serve in front of the embedded mock provider ([`crate::demo`]), on `listen` if given.
    Demo {
        /// The listen address, over the default.
        listen: Option<SocketAddr>,
    },
    /// Print the usage.
    Help,
}

/// Settings given on the command line over the config's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--redis URL`: share quotas and cooldowns with the other replicas through this Redis.
    pub redis: Option<String>,
    /// `--log-format text|json`.
    pub log_format: Option<LogFormat>,
}

impl Overrides {
    /// `config` with these settings put over its own.
    pub fn apply(&self, config: &mut Config) {
        if let Some(url) = &self.redis {
            let redis = Secret::from_flag("--redis", url);
            config.fleet = Some(match config.fleet.take() {
                Some(fleet) => Fleet { redis, ..fleet },
                None => Fleet {
                    redis,
                    replicas: None,
                    prefix: DEFAULT_FLEET_PREFIX.to_owned(),
                    timeout: stormguard::rate_limit::Fleet::DEFAULT_TIMEOUT,
                },
            });
        }
        if let Some(format) = self.log_format {
            config.log.format = format;
        }
    }
}

/// The usage text.
pub const USAGE: &str = "\
usage: stormguard-gateway [--config FILE] [--listen ADDR] [--redis URL] [--log-format text|json]
       stormguard-gateway check FILE
       stormguard-gateway demo [--listen ADDR]

Without --config, starts from the environment alone: OPENAI_API_KEY (OPENAI_BASE_URL),
ANTHROPIC_API_KEY (ANTHROPIC_BASE_URL), or STORMGUARD_UPSTREAM_URL (STORMGUARD_UPSTREAM_KEY)
for any OpenAI-compatible endpoint. `check` validates FILE and prints the effective config,
secrets shown as their variables. --redis shares each deployment's quota and cooldowns with
the other replicas started with the same Redis and config. `demo` serves in front of an
embedded mock provider that fails on purpose, and prints the curl commands to try (no key
needed).";

/// Parses the arguments after the program's name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut args = args.into_iter().map(|arg| {
        arg.into_string()
            .map_err(|_| "arguments must be UTF-8".to_owned())
    });
    let mut config = None;
    let mut listen = None;
    let mut overrides = Overrides::default();
    while let Some(arg) = args.next() {
        let arg = arg?;
        let mut value = |flag: &str| {
            args.next()
                .unwrap_or_else(|| Err(format!("{flag} needs a value")))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "check" if config.is_none() && listen.is_none() => {
                let file = value("check")?;
                if let Some(extra) = args.next() {
                    return Err(format!("unexpected argument `{}`", extra?));
                }
                return Ok(Command::Check(PathBuf::from(file)));
            }
            "demo" if config.is_none() && listen.is_none() => return parse_demo(args),
            "--config" | "-c" => config = Some(PathBuf::from(value("--config")?)),
            "--listen" => {
                listen = Some(listen_addr(&value("--listen")?)?);
            }
            "--redis" => overrides.redis = Some(value("--redis")?),
            "--log-format" => {
                let text = value("--log-format")?;
                let format = LogFormat::parse(&text)
                    .ok_or_else(|| format!("--log-format: `{text}` is not text or json"))?;
                overrides.log_format = Some(format);
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(Command::Serve {
        config,
        listen,
        overrides,
    })
}

/// The arguments after `demo`: `--listen ADDR` at most.
fn parse_demo(mut args: impl Iterator<Item = Result<String, String>>) -> Result<Command, String> {
    let listen = match args.next().transpose()?.as_deref() {
        None => None,
        Some("--listen") => Some(listen_addr(
            &args.next().transpose()?.ok_or("--listen needs a value")?,
        )?),
        Some(other) => return Err(format!("unexpected argument `{other}`")),
    };
    if let Some(extra) = args.next() {
        return Err(format!("unexpected argument `{}`", extra?));
    }
    Ok(Command::Demo { listen })
}

/// A `--listen` value.
fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("--listen: `{text}` is not an address such as 127.0.0.1:4000"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_the_commands() {
        assert_eq!(
            parse_str(&[]),
            Ok(Command::Serve {
                config: None,
                listen: None,
                overrides: Overrides::default(),
            })
        );
        assert_eq!(
            parse_str(&["--config", "g.toml", "--listen", "127.0.0.1:9"]),
            Ok(Command::Serve {
                config: Some("g.toml".into()),
                listen: Some("127.0.0.1:9".parse().unwrap()),
                overrides: Overrides::default(),
            })
        );
        assert_eq!(
            parse_str(&["--redis", "redis://127.0.0.1:6379/", "--log-format", "json"]),
            Ok(Command::Serve {
                config: None,
                listen: None,
                overrides: Overrides {
                    redis: Some("redis://127.0.0.1:6379/".to_owned()),
                    log_format: Some(LogFormat::Json),
                },
            })
        );
        assert_eq!(
            parse_str(&["check", "g.toml"]),
            Ok(Command::Check("g.toml".into()))
        );
        assert_eq!(parse_str(&["--help"]), Ok(Command::Help));
        assert!(parse_str(&["--config"]).is_err());
        assert!(parse_str(&["check"]).is_err());
        assert!(parse_str(&["check", "a", "b"]).is_err());
        assert!(parse_str(&["--listen", "nowhere"]).is_err());
        assert!(parse_str(&["serve"]).is_err());
        assert!(parse_str(&["--log-format", "xml"]).is_err());
        assert_eq!(parse_str(&["demo"]), Ok(Command::Demo { listen: None }));
        assert_eq!(
            parse_str(&["demo", "--listen", "127.0.0.1:0"]),
            Ok(Command::Demo {
                listen: Some("127.0.0.1:0".parse().unwrap())
            })
        );
        assert!(parse_str(&["demo", "--listen"]).is_err());
        assert!(parse_str(&["demo", "--config", "g.toml"]).is_err());
        assert!(parse_str(&["demo", "--listen", "127.0.0.1:0", "x"]).is_err());
    }
}
