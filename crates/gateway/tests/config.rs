//! The config file: every kind of error with its line and key, secrets never in the file nor in
//! a message, the environment-only start in its three styles, and `check`.

#![allow(clippy::unwrap_used)]

mod kit;

use kit::{env, mock, post};
use stormguard_gateway::config::{self, Config, ConfigError};
use stormguard_gateway::format::Format;

/// The errors of `text`, as `(line, key)`, and their messages.
fn errors(text: &str) -> (Vec<(usize, String)>, String) {
    let errors = Config::parse("gateway.toml", text, &env(&[])).unwrap_err();
    let places = errors
        .errors()
        .iter()
        .map(|e| (e.line, e.key.clone()))
        .collect();
    (places, errors.to_string())
}

const PROVIDER: &str = "[providers.openai]\nformat = \"openai\"\nkeys_env = [\"OPENAI_API_KEY\"]\n";

#[test]
fn toml_errors_name_their_line_and_key() {
    let (places, text) = errors(&format!("{PROVIDER}base_ur = \"https://x\"\n"));
    assert_eq!(places, [(4, "providers.openai.base_ur".to_owned())]);
    assert!(
        text.starts_with("gateway.toml:4: providers.openai.base_ur: unknown field `base_ur`"),
        "{text}"
    );

    let (places, _) = errors("[server]\nlisten = \"127.0.0.1:4000\"\nlisten2 = \n");
    assert_eq!(places[0].0, 3);

    let (places, text) = errors("[providers.openai]\nformat = \"openia\"\n");
    assert_eq!(places, [(2, "providers.openai.format".to_owned())]);
    assert!(text.contains("unknown variant `openia`"), "{text}");

    let (places, _) = errors(&format!(
        "{PROVIDER}\n[[models.gpt.deployments]]\nprovider = \"openai\"\nrpm = \"lots\"\n"
    ));
    assert_eq!(places, [(7, "models.gpt.deployments.rpm".to_owned())]);
}

#[test]
fn a_secret_in_the_file_is_an_error_that_never_repeats_it() {
    let secret = "sk-live-0123456789abcdef";
    let (places, text) = errors(&format!("{PROVIDER}api_key = \"{secret}\"\n"));
    assert_eq!(places, [(4, "providers.openai.api_key".to_owned())]);
    assert!(
        text.contains("secrets are read from the environment only"),
        "{text}"
    );

    let (places, text) = errors(&format!(
        "[providers.openai]\nformat = \"openai\"\nkeys_env = [\"{secret}\"]\n"
    ));
    // (and the file has no model, an error of line 1)
    assert_eq!(
        places,
        [
            (1, "models".to_owned()),
            (3, "providers.openai.keys_env".to_owned())
        ]
    );
    assert!(
        text.contains("not the name of an environment variable"),
        "{text}"
    );

    // A key where a list of names belongs: TOML's own message would quote it.
    let (places, text) = errors(&format!(
        "[providers.openai]\nformat = \"openai\"\nkeys_env = \"{secret}\"\n"
    ));
    assert_eq!(places[0].0, 3);
    assert!(!text.contains(secret), "{text}");
    let (_, text) = errors(&format!("[server]\ncaller_keys_env = [\"{secret}\"]\n"));
    assert!(
        text.contains("\ngateway.toml:2: server.caller_keys_env: not the name"),
        "{text}"
    );
    assert!(!text.contains(secret));
}

#[test]
fn every_invalid_value_is_reported_at_once_in_line_order() {
    let text = r#"[server]
listen = "everywhere"
max_body_bytes = 0
max_deadline = "10"

[providers.openai]
format = "openai"
base_url = "ftp://example.com"
keys_env = ["OPENAI_API_KEY"]

[providers.anthropic]
format = "anthropic"
keys_env = ["ANTHROPIC_API_KEY"]

[[models.gpt.deployments]]
provider = "opnai"

[[models.gpt.deployments]]
provider = "anthropic"
keys_env = ["OPENAI_API_KEY"]

[[models.claude.deployments]]
provider = "anthropic"
rank = 0
"#;
    let (places, message) = errors(text);
    let expected = [
        (2, "server.listen"),
        (3, "server.max_body_bytes"),
        (4, "server.max_deadline"),
        (8, "providers.openai.base_url"),
        (16, "models.gpt.deployments.provider"),
        (20, "models.gpt.deployments.keys_env"),
        (24, "models.claude.deployments.rank"),
    ];
    let expected: Vec<(usize, String)> = expected
        .iter()
        .map(|(l, k)| (*l, (*k).to_owned()))
        .collect();
    assert_eq!(places, expected, "{message}");
    assert!(
        message.contains("gateway.toml:16: models.gpt.deployments.provider: no provider `opnai`"),
        "{message}"
    );
}

#[test]
fn a_model_cannot_mix_formats_and_a_file_needs_a_model() {
    let text = format!(
        "{PROVIDER}\n[providers.anthropic]\nformat = \"anthropic\"\n\n[[models.mixed.deployments]]\nprovider = \"openai\"\n\n[[models.mixed.deployments]]\nprovider = \"anthropic\"\n"
    );
    let (places, message) = errors(&text);
    assert_eq!(places, [(8, "models.mixed.deployments".to_owned())]);
    assert!(message.contains("does not translate"));
    let (places, _) = errors(PROVIDER);
    assert_eq!(places, [(1, "models".to_owned())]);
}

#[test]
fn the_example_file_is_valid_and_sorted_into_ranks() {
    let text = include_str!("../gateway.example.toml");
    let config = Config::parse(
        "gateway.example.toml",
        text,
        &env(&[("OPENAI_API_KEY", "sk-1")]),
    )
    .unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:4000");
    assert_eq!(config.server.max_deadline.as_secs(), 600);
    assert_eq!(config.models.len(), 3);
    let gpt = &config.models["gpt-4o"];
    assert_eq!(gpt.ranks.len(), 2);
    assert_eq!(gpt.ranks[0][0].provider, "openai");
    assert_eq!(gpt.ranks[0][0].keys.len(), 2);
    assert_eq!(
        (gpt.ranks[0][0].rpm, gpt.ranks[0][0].tpm),
        (Some(500), Some(30000))
    );
    assert_eq!(gpt.ranks[1][0].model, "Qwen/Qwen2.5-72B-Instruct");
    assert_eq!(
        config.models["text-embedding-3-small"].ranks[0][0].model,
        "text-embedding-3-small"
    );
    assert_eq!(
        config.model_format(&config.models["claude"]),
        Some(Format::Anthropic)
    );
    assert_eq!(gpt.hedging, config::HedgingChoice::Cold);
    assert_eq!(
        gpt.cures,
        [(
            config::Cure::ContextTooLong,
            "local/Qwen/Qwen2.5-72B-Instruct".to_owned()
        )]
    );
    assert!(
        gpt.degraded
            .as_deref()
            .unwrap()
            .starts_with("The assistant is busy")
    );
    assert_eq!(config.log.format, config::LogFormat::Text);
    assert_eq!(config.fleet, None);
}

#[test]
fn a_models_policy_the_log_and_the_fleet_name_their_errors() {
    let model = "[[models.m.deployments]]\nprovider = \"openai\"\nmodel = \"x\"\n";
    let text = format!(
        "{PROVIDER}[log]\nformat = \"xml\"\n[fleet]\nredis_url_env = \"redis://h:6379\"\n\
         [models.m]\nhedging = \"sometimes\"\ndegraded = \" \"\n\
         [models.m.cures]\ncontext_too_long = \"openai/y\"\nrate_limited = \"openai/x\"\n{model}"
    );
    let (places, message) = errors(&text);
    let keys = [
        (5, "log.format"),
        (7, "fleet.redis_url_env"),
        (9, "models.m.hedging"),
        (10, "models.m.degraded"),
        (12, "models.m.cures.context_too_long"),
        (13, "models.m.cures.rate_limited"),
    ]
    .map(|(line, key)| (line, key.to_owned()));
    assert_eq!(places, keys, "{message}");
    assert!(
        message.contains("`openai/y` is not one of this model's deployments"),
        "{message}"
    );
    // The Redis URL is a secret: a URL in its place is refused and never repeated.
    assert!(!message.contains("redis://h"), "{message}");

    let fleet = format!("{PROVIDER}[fleet]\nredis_url_env = \"REDIS\"\nreplicas = 3\n{model}");
    let config = Config::parse(
        "g.toml",
        &fleet,
        &env(&[("REDIS", "redis://:pw@127.0.0.1/")]),
    )
    .unwrap();
    let shown = config.show();
    assert!(
        shown.contains("redis_url_env = \"REDIS\"  # $REDIS (set)"),
        "{shown}"
    );
    assert!(shown.contains("replicas = 3"), "{shown}");
    assert!(!shown.contains(":pw@"), "{shown}");
}

#[test]
fn the_environment_alone_starts_each_style() {
    let openai = config::from_env(&env(&[("OPENAI_API_KEY", "sk-o")])).unwrap();
    assert_eq!(
        openai.providers["openai"].base_url.to_string(),
        "https://api.openai.com"
    );
    assert_eq!(openai.pass_through["openai"], "openai");
    assert_eq!(openai.source, config::ENVIRONMENT);

    let anthropic = config::from_env(&env(&[
        ("ANTHROPIC_API_KEY", "sk-a"),
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
    ]))
    .unwrap();
    assert_eq!(anthropic.providers["anthropic"].format, Format::Anthropic);
    assert_eq!(
        anthropic.providers["anthropic"].base_url.to_string(),
        "http://127.0.0.1:9"
    );
    assert_eq!(anthropic.pass_through.len(), 1);

    let upstream = config::from_env(&env(&[
        ("STORMGUARD_UPSTREAM_URL", "http://127.0.0.1:8000/v1"),
        ("OPENAI_API_KEY", "sk-o"),
    ]))
    .unwrap();
    assert_eq!(upstream.providers.keys().collect::<Vec<_>>(), ["upstream"]);
    assert!(upstream.providers["upstream"].keys.is_empty());
    assert_eq!(upstream.providers["upstream"].base_url.prefix, "");

    let both = config::from_env(&env(&[
        ("OPENAI_API_KEY", "sk-o"),
        ("ANTHROPIC_API_KEY", "sk-a"),
    ]))
    .unwrap();
    assert_eq!(both.pass_through.len(), 2);

    let none = config::from_env(&env(&[])).unwrap_err();
    assert!(none.to_string().contains("no config file"));
    let bad = config::from_env(&env(&[
        ("OPENAI_API_KEY", "sk-o"),
        ("OPENAI_BASE_URL", "nowhere"),
    ]))
    .unwrap_err();
    assert_eq!(
        bad.errors()[0],
        ConfigError {
            file: config::ENVIRONMENT.to_owned(),
            line: 0,
            key: "OPENAI_BASE_URL".to_owned(),
            message: "the scheme must be http or https".to_owned(),
        }
    );
}

#[tokio::test]
async fn an_upstream_from_the_environment_gets_every_model_name_as_it_is() {
    let upstream = mock(kit::echo()).await;
    let vars = env(&[
        ("STORMGUARD_UPSTREAM_URL", &upstream.url()),
        ("STORMGUARD_UPSTREAM_KEY", "sk-up-42"),
    ]);
    let mut config = config::from_env(&vars).unwrap();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    let gateway = kit::gateway(&config).await;
    for model in ["llama-3.1-8b", "qwen2.5:7b"] {
        let (status, headers, _) = post(
            gateway.addr,
            "/v1/chat/completions",
            &format!(r#"{{"model":"{model}"}}"#),
            &[],
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-stormguard-backend"], "upstream/1");
    }
    let models: Vec<String> = upstream
        .seen()
        .iter()
        .map(|seen| seen.model.clone())
        .collect();
    assert_eq!(models, ["llama-3.1-8b", "qwen2.5:7b"]);
    assert!(
        upstream
            .seen()
            .iter()
            .all(|seen| seen.key() == Some("sk-up-42"))
    );
    // No Anthropic provider: its path knows no model.
    assert_eq!(
        post(gateway.addr, "/v1/messages", r#"{"model":"claude"}"#, &[])
            .await
            .0,
        404
    );
    gateway.stop().await;
}

#[test]
fn check_prints_the_effective_config_redacted_or_each_error() {
    let binary = env!("CARGO_BIN_EXE_stormguard-gateway");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.example.toml");
    let output = std::process::Command::new(binary)
        .args(["check", example])
        .env_clear()
        .env("OPENAI_API_KEY", "sk-never-printed-123")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("sk-never-printed-123"));
    assert!(
        stdout.contains("OPENAI_API_KEY set, OPENAI_API_KEY_2 MISSING"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[[models.\"gpt-4o\".deployments]]"),
        "{stdout}"
    );

    let broken = std::env::temp_dir().join(format!(
        "stormguard-gateway-check-{}.toml",
        std::process::id()
    ));
    std::fs::write(
        &broken,
        format!("{PROVIDER}\n[[models.gpt.deployments]]\nprovider = \"nobody\"\n"),
    )
    .unwrap();
    let output = std::process::Command::new(binary)
        .arg("check")
        .arg(&broken)
        .env_clear()
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&broken);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "{}:6: models.gpt.deployments.provider: no provider `nobody` in [providers]\n",
        broken.display()
    );
    assert_eq!(stderr, expected);
}

#[test]
fn the_drain_grace_is_25_s_unless_the_file_says_and_is_shown() {
    let model = "[[models.gpt.deployments]]\nprovider = \"openai\"\n";
    let plain = Config::parse("gateway.toml", &format!("{PROVIDER}{model}"), &env(&[])).unwrap();
    assert_eq!(plain.server.drain_grace, std::time::Duration::from_secs(25));
    assert!(plain.show().contains("drain_grace = \"25s\"\n"));
    let text = format!("[server]\ndrain_grace = \"1500ms\"\n{PROVIDER}{model}");
    let set = Config::parse("gateway.toml", &text, &env(&[])).unwrap();
    assert_eq!(
        set.server.drain_grace,
        std::time::Duration::from_millis(1500)
    );
    assert!(set.show().contains("drain_grace = \"1.5s\"\n"));
    let (places, _) = errors(&format!(
        "[server]\ndrain_grace = \"0s\"\n{PROVIDER}{model}"
    ));
    assert_eq!(places, [(2, "server.drain_grace".to_owned())]);
}

#[test]
fn log_lines_show_the_engines_spans_only_when_asked_and_check_says_which() {
    let model = "[[models.gpt.deployments]]\nprovider = \"openai\"\n";
    let plain = Config::parse("gateway.toml", &format!("{PROVIDER}{model}"), &env(&[])).unwrap();
    assert!(!plain.log.spans);
    assert!(
        plain
            .show()
            .contains("[log]\nformat = \"text\"\nspans = false\n")
    );
    let text = format!("[log]\nspans = true\n{PROVIDER}{model}");
    let set = Config::parse("gateway.toml", &text, &env(&[])).unwrap();
    assert!(set.log.spans);
    assert!(set.show().contains("spans = true\n"));
    let (places, _) = errors(&format!("[log]\nspans = \"yes\"\n{PROVIDER}{model}"));
    assert_eq!(places.len(), 1, "{places:?}");
    assert_eq!(places[0].0, 2);
}

#[test]
fn a_deployments_concurrency_is_adaptive_or_a_fixed_limit_and_is_shown() {
    let text = format!(
        "{PROVIDER}\n[[models.gpt.deployments]]\nprovider = \"openai\"\nconcurrency = \"adaptive\"\n\n\
         [[models.mini.deployments]]\nprovider = \"openai\"\nconcurrency = 64\n\n\
         [[models.plain.deployments]]\nprovider = \"openai\"\n"
    );
    let config = Config::parse("gateway.toml", &text, &env(&[])).unwrap();
    let concurrency = |model: &str| config.models[model].ranks[0][0].concurrency;
    assert_eq!(concurrency("gpt"), Some(config::Concurrency::Adaptive));
    assert_eq!(concurrency("mini"), Some(config::Concurrency::Fixed(64)));
    assert_eq!(concurrency("plain"), None);
    let shown = config.show();
    assert!(shown.contains("concurrency = \"adaptive\"\n"), "{shown}");
    assert!(shown.contains("concurrency = 64\n"), "{shown}");
    assert_eq!(shown.matches("concurrency = ").count(), 2, "{shown}");
    // A fixed limit never moves; the adaptive one starts at the library's 20.
    let fixed = config::Concurrency::Fixed(64).limit();
    assert_eq!(fixed.config().bounds(), (64, 64));
    assert_eq!(fixed.snapshot().limit, 64);
    assert_eq!(config::Concurrency::Adaptive.limit().snapshot().limit, 20);

    for bad in ["0", "-3", "\"auto\"", "5000000000", "1.5"] {
        let (places, message) = errors(&format!(
            "{PROVIDER}\n[[models.gpt.deployments]]\nprovider = \"openai\"\nconcurrency = {bad}\n"
        ));
        assert_eq!(
            places,
            [(7, "models.gpt.deployments.concurrency".to_owned())],
            "{bad}: {message}"
        );
    }
}
