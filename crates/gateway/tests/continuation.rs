//! A stream cut on one deployment is continued on the next one with that deployment's own path
//! and key: never the first one's key, never its path prefix.

#![allow(clippy::unwrap_used)]

mod kit;

#[tokio::test(start_paused = true)]
async fn a_continuation_carries_its_own_deployments_path_and_no_other_key() {
    // The demo's flaky provider cuts the first stream it serves after four words.
    let demo = stormguard_gateway::demo::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let keyless = kit::mock(kit::echo()).await;
    let text = format!(
        r#"
[providers.first]
format = "openai"
base_url = "http://{}/first-prefix/v1"
keys_env = ["FIRST_KEY"]

[providers.local]
format = "openai"
base_url = "{}/local-prefix"

[[models.m.deployments]]
provider = "first"
model = "mock"

[[models.m.deployments]]
provider = "local"
model = "mock"
rank = 2
"#,
        demo.flaky,
        keyless.url()
    );
    let env = kit::env(&[("FIRST_KEY", "sk-first-only-5e5e")]);
    let gateway = kit::gateway(&kit::config(&text, &env)).await;
    let response = kit::client()
        .post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Count"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // The mock's JSON is no event stream: the continuation fails, and so does the answer's end.
    let _ = response.text().await;
    assert_eq!(demo.injected().cuts, 1);
    let seen = keyless.seen();
    assert_eq!(
        seen.len(),
        1,
        "the continuation reached the next deployment"
    );
    assert_eq!(seen[0].path, "/local-prefix/v1/chat/completions");
    assert_eq!(
        seen[0].key(),
        None,
        "another deployment's key: {:?}",
        seen[0].key()
    );
    assert!(
        seen[0].body.contains(r#""content":"1 2 3 4""#),
        "{}",
        seen[0].body
    );
}
