//! `stormguard-gateway`: see the library's docs.

use std::process::ExitCode;
use std::sync::Arc;

use stormguard_gateway::args::{self, Command, USAGE};
use stormguard_gateway::config::{self, Config};

/// Exit code of a config with errors (and of `check` on one).
const EXIT_CONFIG: u8 = 1;
/// Exit code of a usage error or a refused start (a listen address, a missing caller key).
const EXIT_START: u8 = 2;

/// mimalloc in place of the system's allocator: a request allocates about a hundred times on its
/// way through the gateway (heads, extensions, boxed futures), and glibc's malloc and free took
/// about a fifth of the instructions a request costs (docs/PERFORMANCE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let command = match args::parse(std::env::args_os().skip(1)) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("stormguard-gateway: {message}\n\n{USAGE}");
            return ExitCode::from(EXIT_START);
        }
    };
    let env = config::process_env();
    match command {
        Command::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Command::Check(path) => match Config::load(&path, &env) {
            Ok(config) => {
                print!("{}", config.show());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Serve {
            config,
            listen,
            overrides,
        } => serve(config.as_deref(), listen, &overrides, &env),
        Command::Demo { listen } => demo(listen.unwrap_or(config::DEFAULT_LISTEN)),
    }
}

fn serve(
    path: Option<&std::path::Path>,
    listen: Option<std::net::SocketAddr>,
    overrides: &args::Overrides,
    env: &config::Env,
) -> ExitCode {
    let loaded = match path {
        Some(path) => Config::load(path, env),
        None => config::from_env(env),
    };
    let mut config = match loaded {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Some(listen) = listen {
        config.server.listen = listen;
    }
    overrides.apply(&mut config);
    init_logs(config.log);
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(exit) => return exit,
    };
    runtime.block_on(async move {
        // Before it listens: a signal sent as soon as it does finds its handler.
        #[cfg(unix)]
        let signals = match stormguard_gateway::serve::Signals::install() {
            Ok(signals) => signals,
            Err(error) => {
                eprintln!("stormguard-gateway: cannot handle signals: {error}");
                return ExitCode::from(EXIT_START);
            }
        };
        let workers = match stormguard_gateway::serve::Workers::per_core() {
            Ok(workers) => Arc::new(workers),
            Err(error) => {
                eprintln!("stormguard-gateway: cannot start its workers: {error}");
                return ExitCode::from(EXIT_START);
            }
        };
        match stormguard_gateway::serve::start_on(&config, Some(workers)).await {
            #[cfg(unix)]
            Ok(running) => {
                let reload = path.map(|path| move || reread(path, listen, overrides, env));
                match stormguard_gateway::serve::serve_until_signalled(running, signals, reload)
                    .await
                {
                    Some(_) => ExitCode::SUCCESS,
                    None => ExitCode::FAILURE,
                }
            }
            #[cfg(not(unix))]
            Ok(running) => match running.wait().await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "stopped");
                    ExitCode::FAILURE
                }
            },
            Err(error) => {
                tracing::error!(%error, "not started");
                eprintln!("stormguard-gateway: {error}");
                ExitCode::from(EXIT_START)
            }
        }
    })
}

/// The runtime of the accept loop, the signals, the reload and the drain (connections are
/// served on the workers, one thread a core), or the exit code of a start that cannot have one.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|error| {
            eprintln!("stormguard-gateway: cannot start the runtime: {error}");
            ExitCode::from(EXIT_START)
        })
}

/// Log lines on stderr at INFO and above, as text or one JSON object a line, with the engine's
/// spans only when `[log] spans` asks for them (a span nobody takes is not made at all).
fn init_logs(log: config::Log) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let spans = log.spans;
    let shown = tracing_subscriber::filter::filter_fn(move |meta| {
        *meta.level() <= tracing::Level::INFO && (spans || !meta.is_span())
    });
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match log.format {
        config::LogFormat::Text => lines.with_filter(shown).boxed(),
        config::LogFormat::Json => lines.json().with_filter(shown).boxed(),
    };
    tracing_subscriber::registry().with(lines).init();
}

/// The config file read again for a reload, with the `--listen` and the other settings the
/// gateway was started with (the log format stays the one it started with).
#[cfg(unix)]
fn reread(
    path: &std::path::Path,
    listen: Option<std::net::SocketAddr>,
    overrides: &args::Overrides,
    env: &config::Env,
) -> Result<Config, config::ConfigErrors> {
    let mut config = Config::load(path, env)?;
    if let Some(listen) = listen {
        config.server.listen = listen;
    }
    overrides.apply(&mut config);
    Ok(config)
}

/// `demo`: the gateway in front of its embedded mock provider, until the process ends.
fn demo(listen: std::net::SocketAddr) -> ExitCode {
    init_logs(config::Log::default());
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(exit) => return exit,
    };
    runtime.block_on(async move {
        let demo = match stormguard_gateway::demo::start(listen).await {
            Ok(demo) => demo,
            Err(error) => {
                eprintln!("stormguard-gateway: {error}");
                return ExitCode::from(EXIT_START);
            }
        };
        println!(
            "{}",
            stormguard_gateway::demo::instructions(demo.gateway.addr)
        );
        match demo.gateway.wait().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "stopped");
                ExitCode::FAILURE
            }
        }
    })
}
