//! Routing by model across two providers and three keys, keys kept where they belong, a 429
//! moving to the other key, and the gateway's own refusals in the caller's format.

#![allow(clippy::unwrap_used)]

mod kit;

use std::sync::Arc;
use std::time::Duration;

use kit::{KEYS, Seen, echo, env, json, mock, post, two_providers};

/// Runs `calls` at once, their answers in order.
async fn futures_join<F>(calls: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = calls.map(tokio::spawn).collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

const CALLER: &str = "sk-caller-5e5e";

async fn two_provider_gateway() -> (kit::Mock, kit::Mock, stormguard_gateway::serve::Running) {
    let openai = mock(echo()).await;
    let anthropic = mock(echo()).await;
    let config = kit::config(&two_providers(&openai.url(), &anthropic.url()), &env(&KEYS));
    let gateway = kit::gateway(&config).await;
    (openai, anthropic, gateway)
}

#[tokio::test]
async fn routes_by_model_across_two_providers_and_three_keys() {
    let openai = kit::slow_mock(echo(), Duration::from_millis(100)).await;
    let anthropic = mock(echo()).await;
    let config = kit::config(&two_providers(&openai.url(), &anthropic.url()), &env(&KEYS));
    let gateway = kit::gateway(&config).await;
    // Twenty at once: the rank's two keys share them (a key with hops in flight costs more).
    let addr = gateway.addr;
    let calls = (0..20).map(|_| async move {
        let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#;
        let bearer = format!("Bearer {CALLER}");
        post(
            addr,
            "/v1/chat/completions",
            body,
            &[("authorization", &bearer)],
        )
        .await
    });
    let mut backends = std::collections::BTreeMap::new();
    for (status, headers, answer) in futures_join(calls).await {
        assert_eq!(status, 200, "{answer}");
        assert_eq!(headers["x-stormguard-attempts"], "1");
        let backend = headers["x-stormguard-backend"].to_str().unwrap().to_owned();
        *backends.entry(backend).or_insert(0usize) += 1;
    }
    let body = r#"{"model":"claude","max_tokens":5,"messages":[]}"#;
    let (status, headers, _) =
        post(gateway.addr, "/v1/messages", body, &[("x-api-key", CALLER)]).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-stormguard-backend"],
        "anthropic/claude-upstream/1"
    );

    // The rank's two keys share the traffic.
    assert_eq!(
        backends.keys().collect::<Vec<_>>(),
        ["openai/gpt-upstream/1", "openai/gpt-upstream/2"]
    );
    assert_eq!(backends.values().sum::<usize>(), 20);
    assert!(backends.values().all(|&n| n >= 1), "{backends:?}");
    let (one, two, three) = (KEYS[0].1, KEYS[1].1, KEYS[2].1);
    assert_eq!(openai.with_key(one) + openai.with_key(two), 20);
    assert_eq!(openai.with_key(one), backends["openai/gpt-upstream/1"]);
    assert!(
        openai
            .seen()
            .iter()
            .all(|seen| seen.model == "gpt-upstream" && seen.path == "/v1/chat/completions")
    );
    // Anthropic got its own key, as x-api-key, with a default version; never a bearer token.
    let seen = anthropic.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-api-key"), Some(three));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen[0].model, "claude-upstream");
    // No provider ever saw another's key, nor the caller's.
    let everything = |seen: Vec<Seen>| format!("{:?}", seen);
    let (openai_saw, anthropic_saw) = (everything(openai.seen()), everything(anthropic.seen()));
    assert!(!openai_saw.contains(three) && !openai_saw.contains(CALLER));
    assert!(
        !anthropic_saw.contains(one)
            && !anthropic_saw.contains(two)
            && !anthropic_saw.contains(CALLER)
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_429_from_one_key_moves_to_the_other() {
    let limited = KEYS[0].1;
    let script: kit::Script = Arc::new(move |seen: &Seen| {
        if seen.key() == Some(limited) {
            let mut answer = json(
                429,
                r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
            );
            // Longer than a request waits for (the hint policy's 60 s): the next key, at once.
            answer
                .headers_mut()
                .insert("retry-after", "120".parse().unwrap());
            answer
        } else {
            json(200, r#"{"id":"ok","choices":[]}"#)
        }
    });
    let openai = mock(script).await;
    // The first key in rank 1, the second in rank 2: every request tries the first key first.
    let ranked = format!(
        r#"
[providers.openai]
format = "openai"
base_url = "{}"
keys_env = ["OPENAI_KEY_1", "OPENAI_KEY_2"]

[[models.gpt.deployments]]
provider = "openai"
model = "gpt-upstream"
keys_env = ["OPENAI_KEY_1"]

[[models.gpt.deployments]]
provider = "openai"
model = "gpt-upstream"
keys_env = ["OPENAI_KEY_2"]
rank = 2
"#,
        openai.url()
    );
    let gateway = kit::gateway(&kit::config(&ranked, &env(&KEYS))).await;
    let mut attempts = 0;
    for _ in 0..10 {
        let (status, headers, answer) = post(
            gateway.addr,
            "/v1/chat/completions",
            r#"{"model":"gpt"}"#,
            &[],
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(headers["x-stormguard-backend"], "openai/gpt-upstream/2");
        attempts += headers["x-stormguard-attempts"]
            .to_str()
            .unwrap()
            .parse::<usize>()
            .unwrap();
    }
    // Every request ended on the second key; the attempts each answer reports are every
    // request the provider saw.
    assert_eq!(openai.with_key(KEYS[1].1), 10);
    assert_eq!(openai.seen().len(), attempts);
    // The first request was asked of the first key, and moved at once; its throttle, having
    // seen only 429s, keeps the next ones off it.
    assert!(openai.with_key(limited) >= 1);
    assert_eq!(openai.with_key(limited) + 10, attempts);
    gateway.stop().await;
}

/// One deployment with two keys (one rank): the provider answers key 1 with 429 (`Retry-After:
/// 30`), key 2 with 200 after 1.5 s. A request the balancer sends to key 1 first goes on to key
/// 2 at once: 200, `x-stormguard-attempts: 2`, key 2's deployment named. Key 1, cooling for its
/// 30 s, is sent nothing more. (A first request sent to key 2 teaches its 1.5 s, more than an
/// unmeasured key's 1 s, so the second goes to key 1 first.)
#[tokio::test(start_paused = true)]
async fn a_429_on_one_key_of_a_rank_is_answered_by_the_other_key_in_two_attempts() {
    let limited = KEYS[0].1;
    let script: kit::Script = Arc::new(move |seen: &Seen| {
        if seen.key() != Some(limited) {
            return json(200, r#"{"id":"ok","choices":[]}"#);
        }
        let mut answer = json(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        answer
            .headers_mut()
            .insert("retry-after", "30".parse().unwrap());
        answer
    });
    let openai = kit::slow_mock(script, Duration::from_millis(1_500)).await;
    let anthropic = mock(echo()).await;
    let config = kit::config(&two_providers(&openai.url(), &anthropic.url()), &env(&KEYS));
    let gateway = kit::gateway(&config).await;
    let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#;
    let mut attempts = Vec::new();
    for _ in 0..6 {
        let (status, headers, answer) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(headers["x-stormguard-backend"], "openai/gpt-upstream/2");
        attempts.push(
            headers["x-stormguard-attempts"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Key 1 was asked once, by the first or the second request, which key 2 answered in 2.
    assert_eq!(openai.with_key(limited), 1);
    assert_eq!(
        attempts.iter().filter(|n| *n == "2").count(),
        1,
        "{attempts:?}"
    );
    assert!(attempts[..2].contains(&"2".to_owned()), "{attempts:?}");
    assert_eq!(openai.with_key(KEYS[1].1), 6);
    gateway.stop().await;
}

/// Two models on one provider: `gpt` with its first key in rank 1 and its second in rank 2,
/// `only-revoked` with the first key alone (`{}`: the provider's address).
const TWO_KEYS_RANKED: &str = r#"
[providers.openai]
format = "openai"
base_url = "{}"
keys_env = ["OPENAI_KEY_1", "OPENAI_KEY_2"]

[[models.gpt.deployments]]
provider = "openai"
keys_env = ["OPENAI_KEY_1"]

[[models.gpt.deployments]]
provider = "openai"
keys_env = ["OPENAI_KEY_2"]
rank = 2

[[models.only-revoked.deployments]]
provider = "openai"
keys_env = ["OPENAI_KEY_1"]
"#;

/// How many of `model`'s deployments `/healthz` shows set aside.
async fn set_aside(gateway: &stormguard_gateway::serve::Running, model: &str) -> usize {
    let (status, health) = kit::get(gateway.addr, "/healthz").await;
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    let deployments = health["deployments"].as_array().unwrap();
    deployments
        .iter()
        .filter(|deployment| deployment["model"] == model)
        .filter(|deployment| deployment["set_aside"] == true)
        .count()
}

/// A key the provider refuses (401) is set aside at its first refusal: that request goes on to
/// the other key at once, no later request is sent with it, and `/healthz` shows it; a model
/// whose every key is set aside is not ready.
#[tokio::test]
async fn a_key_refused_with_401_is_set_aside_and_shown_on_healthz() {
    let revoked = KEYS[0].1;
    let script: kit::Script = Arc::new(move |seen: &Seen| {
        if seen.key() == Some(revoked) {
            json(
                401,
                r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            )
        } else {
            json(200, r#"{"id":"ok","choices":[]}"#)
        }
    });
    let openai = mock(script).await;
    let config = TWO_KEYS_RANKED.replace("{}", &openai.url());
    let gateway = kit::gateway(&kit::config(&config, &env(&KEYS))).await;
    for _ in 0..5 {
        let (status, _, answer) = post(
            gateway.addr,
            "/v1/chat/completions",
            r#"{"model":"gpt"}"#,
            &[],
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(
        (openai.with_key(revoked), openai.with_key(KEYS[1].1)),
        (1, 5)
    );
    assert_eq!(set_aside(&gateway, "gpt").await, 1);
    // The other model's only key is the revoked one, in a failover of its own: asked once, it
    // is set aside there too, and the model is not ready.
    let only = r#"{"model":"only-revoked"}"#;
    let (status, _, _) = post(gateway.addr, "/v1/chat/completions", only, &[]).await;
    assert_eq!(status, 401);
    assert_eq!(set_aside(&gateway, "only-revoked").await, 1);
    let (status, ready) = kit::get(gateway.addr, "/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert!(
        ready.contains("only-revoked") && !ready.contains("\"gpt\""),
        "{ready}"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn an_unknown_model_is_a_404_in_the_callers_format() {
    let (openai, anthropic, gateway) = two_provider_gateway().await;
    let (status, _, body) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"nope"}"#,
        &[],
    )
    .await;
    assert_eq!(status, 404);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`nope`")
    );
    assert!(body["error"].get("param").is_some() && body["error"].get("code").is_some());

    let (status, _, body) = post(gateway.addr, "/v1/messages", r#"{"model":"nope"}"#, &[]).await;
    assert_eq!(status, 404);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "not_found_error");
    // A name of a megabyte is not echoed back whole.
    let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(1 << 20));
    let (status, _, body) = post(gateway.addr, "/v1/chat/completions", &long, &[]).await;
    assert_eq!(status, 404);
    assert!(body.len() < 600, "{} bytes", body.len());
    assert_eq!(openai.seen().len() + anthropic.seen().len(), 0);
    gateway.stop().await;
}

#[tokio::test]
async fn a_model_of_the_other_format_is_a_400_in_the_callers_format() {
    let (openai, anthropic, gateway) = two_provider_gateway().await;
    let (status, _, body) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"claude"}"#,
        &[],
    )
    .await;
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/messages")
    );

    let (status, _, body) = post(gateway.addr, "/v1/messages", r#"{"model":"gpt"}"#, &[]).await;
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/chat/completions")
    );
    assert_eq!(openai.seen().len() + anthropic.seen().len(), 0);
    gateway.stop().await;
}

#[tokio::test]
async fn hostile_bodies_are_400s_and_never_reach_a_provider() {
    let (openai, _anthropic, gateway) = two_provider_gateway().await;
    for body in [
        r#"{"model":17}"#,
        "not json at all",
        r#"{"model":["gpt"]}"#,
        r#"{"messages":[]}"#,
        "",
        &"[".repeat(100_000),
    ] {
        let (status, _, answer) = post(gateway.addr, "/v1/chat/completions", body, &[]).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.starts_with(r#"{"error":"#), "{answer}");
    }
    assert_eq!(openai.seen().len(), 0);
    gateway.stop().await;
}

#[tokio::test]
async fn callers_headers_that_only_the_gateway_may_set_are_stripped() {
    let (openai, _anthropic, gateway) = two_provider_gateway().await;
    let headers = [
        ("authorization", "Bearer sk-from-the-caller"),
        ("x-stormguard-backend", "forged"),
        ("connection", "x-hop"),
        ("x-hop", "1"),
        ("x-custom", "kept"),
    ];
    let (status, _, _) = post(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model":"gpt"}"#,
        &headers,
    )
    .await;
    assert_eq!(status, 200);
    let seen = &openai.seen()[0];
    assert!(seen.key() == Some(KEYS[0].1) || seen.key() == Some(KEYS[1].1));
    assert_eq!(seen.header("x-stormguard-backend"), None);
    assert_eq!(seen.header("x-hop"), None);
    assert_eq!(seen.header("x-custom"), Some("kept"));
    gateway.stop().await;
}

/// On tokio's paused clock: the pacing's waits pass in no real time.
#[tokio::test(start_paused = true)]
async fn a_deployments_rpm_paces_each_of_its_keys() {
    let openai = mock(echo()).await;
    let text = format!(
        r#"
[providers.openai]
format = "openai"
base_url = "{}"
keys_env = ["OPENAI_KEY_1"]

[[models.paced.deployments]]
provider = "openai"
rpm = 60

[[models.free.deployments]]
provider = "openai"
"#,
        openai.url()
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS[..1]))).await;
    let took = |model: &'static str| async move {
        let started = tokio::time::Instant::now();
        for _ in 0..3 {
            let body = format!(r#"{{"model":"{model}"}}"#);
            let (status, _, answer) = post(gateway.addr, "/v1/chat/completions", &body, &[]).await;
            assert_eq!(status, 200, "{answer}");
        }
        started.elapsed()
    };
    // 60 a minute: one at once (a second's burst), then one a second.
    let paced = took("paced").await;
    assert!(
        paced >= Duration::from_millis(1900) && paced < Duration::from_millis(2500),
        "{paced:?}"
    );
    let free = took("free").await;
    assert!(free < Duration::from_millis(100), "{free:?}");
    assert_eq!(openai.seen().len(), 6);
    gateway.stop().await;
}
