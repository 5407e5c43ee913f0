//! Protection from the first request, through the gateway as the binary runs it: started by
//! `serve::start` on a config that is the defaults (a file with one model and two deployments,
//! ranks 1 and 2, on two providers, nothing else set; or the environment alone, one provider),
//! its deployments' clocks cold (nothing learned: a restart), in front of planned providers on
//! loopback and read by a reqwest caller, on the paused clock. The faults a cold gateway must
//! rescue, each answered whole with its time; and the healthy slow answers it must not lose.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use kit::provider::{
    Plan, Provider, REQUEST, Relayed, Step, WORDS, post_read, resumes_at, send, whole_answer, words,
};
use stormguard_gateway::config;
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

/// The model `m` on `primary` (rank 1) and `backup` (rank 2), every other setting the default.
fn two_ranks(primary: &Provider, backup: &Provider) -> String {
    format!(
        r#"
[providers.primary]
format = "openai"
base_url = "{}"

[providers.backup]
format = "openai"
base_url = "{}"

[[models.m.deployments]]
provider = "primary"
model = "m"

[[models.m.deployments]]
provider = "backup"
model = "m"
rank = 2
"#,
        primary.url(),
        backup.url()
    )
}

/// `request` through a default gateway in front of `primary` and `backup`: what the caller
/// read, and after how long.
async fn through_two(primary: &Provider, backup: &Provider, request: &str) -> (Duration, Relayed) {
    let config = kit::config(&two_ranks(primary, backup), &kit::env(&[]));
    let gateway = kit::gateway(&config).await;
    let started = Instant::now();
    let read = post_read(gateway.addr, request).await;
    let took = started.elapsed();
    gateway.stop().await;
    (took, read)
}

/// `request` through the gateway started from the environment alone, in front of `provider`.
async fn through_one(provider: &Provider, request: &str) -> (Duration, Relayed) {
    let env = kit::env(&[("STORMGUARD_UPSTREAM_URL", &provider.url())]);
    let mut config = config::from_env(&env).unwrap();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    let gateway = kit::gateway(&config).await;
    let started = Instant::now();
    let read = post_read(gateway.addr, request).await;
    let took = started.elapsed();
    gateway.stop().await;
    (took, read)
}

/// A backup that answers every request (a continuation from where it asks) at once.
async fn healthy_backup() -> Provider {
    Provider::spawn(|_, body| Plan::answer(resumes_at(body))).await
}

/// The caller read the whole answer, each word once, with one `[DONE]`.
fn assert_whole(read: &Relayed) {
    assert_eq!(read.status, 200, "{}", read.raw);
    assert_eq!(read.text(), whole_answer(), "{}", read.raw);
    assert_eq!(read.done(), 1, "{}", read.raw);
}

/// The provider accepts the request and never answers (its head after 120 s). Cold, the
/// stream's first content is hedged at 10 s to the backup, which answers whole.
#[tokio::test(start_paused = true)]
async fn a_silent_provider_is_answered_by_the_backup_at_the_cold_first_content_clock() {
    let primary = Provider::spawn(|_, _| Plan {
        head_after: 120 * SECOND,
        ..Plan::answer(1)
    })
    .await;
    let backup = healthy_backup().await;
    let (took, read) = through_two(&primary, &backup, REQUEST).await;
    assert_whole(&read);
    assert_eq!(read.backend.as_deref(), Some("backup/m"));
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

/// The head and the role chunk at once, the first token after 20 s: hedged at 10 s, answered
/// whole by the backup.
#[tokio::test(start_paused = true)]
async fn a_first_token_after_20_s_is_answered_by_the_backup_at_10_s() {
    let primary = Provider::spawn(|_, _| {
        let mut plan = Plan::answer(1);
        plan.steps.insert(1, Step::Wait(20 * SECOND));
        plan
    })
    .await;
    let backup = healthy_backup().await;
    let (took, read) = through_two(&primary, &backup, REQUEST).await;
    assert_whole(&read);
    assert_eq!(read.backend.as_deref(), Some("backup/m"));
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

/// After 20 tokens the stream stalls for 30 s, then closes. Cold, a 10 s gap cuts it and the
/// backup continues it from the 20 tokens it was sent as a prefill: each word once.
#[tokio::test(start_paused = true)]
async fn a_stream_stalled_after_20_tokens_is_continued_by_the_backup_at_the_cold_gap() {
    let primary = Provider::spawn(|_, _| {
        let mut steps = words(1, 20, false);
        steps.push(Step::Wait(30 * SECOND));
        Plan::stream(steps)
    })
    .await;
    let backup = healthy_backup().await;
    let (took, read) = through_two(&primary, &backup, REQUEST).await;
    assert_whole(&read);
    assert_eq!(read.backend.as_deref(), Some("primary/m"));
    // 20 words 10 ms apart, the 10 s gap, the backup's 40 words.
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
    assert_eq!(resumes_at(&backup.bodies()[0]), 21);
}

/// A model thinking for 90 s, a keep-alive comment every 5 s, then its answer.
fn thinking(_: usize, _: &str) -> Plan {
    let mut steps = vec![];
    for _ in 0..18 {
        steps.push(Step::Wait(5 * SECOND));
        steps.push(send(": keep-alive\n\n"));
    }
    steps.extend(words(1, WORDS, true));
    Plan::stream(steps)
}

/// A reasoning model thinking for 90 s, keep-alives flowing, both providers alike. Cold, with
/// reasoning asked for, the hedge goes at 60 s and the primary, still running, answers first
/// at 90 s: delivered whole, never cut.
#[tokio::test(start_paused = true)]
async fn a_healthy_stream_after_90_s_of_keep_alives_is_delivered_whole_by_the_primary() {
    let (primary, backup) = (
        Provider::spawn(thinking).await,
        Provider::spawn(thinking).await,
    );
    let request = REQUEST.replace(
        r#""stream":true"#,
        r#""stream":true,"reasoning_effort":"high""#,
    );
    let (took, read) = through_two(&primary, &backup, &request).await;
    assert_whole(&read);
    assert_eq!(read.backend.as_deref(), Some("primary/m"));
    assert!((90 * SECOND..91 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

/// The same thinking with no reasoning asked for: hedged at 10 s, and the primary still
/// answers first, whole.
#[tokio::test(start_paused = true)]
async fn a_model_thinking_unasked_still_answers_first_and_whole() {
    let (primary, backup) = (
        Provider::spawn(thinking).await,
        Provider::spawn(thinking).await,
    );
    let (took, read) = through_two(&primary, &backup, REQUEST).await;
    assert_whole(&read);
    assert_eq!(read.backend.as_deref(), Some("primary/m"));
    assert!((90 * SECOND..91 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

/// The whole (non-streaming) answer of a 4,000-token request.
const LONG_ANSWER: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#;

/// A whole answer of 4,000 tokens that takes 100 s: its cold head clock is sized by the request,
/// so it is neither cut nor hedged, and the primary's answer is the caller's, byte for byte.
#[tokio::test(start_paused = true)]
async fn a_whole_answer_of_4000_tokens_taking_100_s_is_delivered_uncut() {
    let slow = |_: usize, _: &str| Plan {
        head_after: 100 * SECOND,
        content_type: "application/json",
        ..Plan::stream(vec![send(LONG_ANSWER)])
    };
    let (primary, backup) = (Provider::spawn(slow).await, Provider::spawn(slow).await);
    let request =
        r#"{"model":"m","max_tokens":4000,"messages":[{"role":"user","content":"write"}]}"#;
    let (took, read) = through_two(&primary, &backup, request).await;
    assert_eq!((read.status, read.raw.as_str()), (200, LONG_ANSWER));
    assert_eq!(read.backend.as_deref(), Some("primary/m"));
    assert_eq!(read.attempts.as_deref(), Some("1"));
    assert!((100 * SECOND..101 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 0));
}

/// Started from the environment alone (one provider), the cold hedge goes to the same provider:
/// its first attempt silent, its second answers at once.
#[tokio::test(start_paused = true)]
async fn from_the_environment_a_silent_first_attempt_is_hedged_to_the_same_provider() {
    let provider = Provider::spawn(|n, _| Plan {
        head_after: if n == 0 { 120 * SECOND } else { Duration::ZERO },
        ..Plan::answer(1)
    })
    .await;
    let (took, read) = through_one(&provider, REQUEST).await;
    assert_whole(&read);
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!(provider.hits(), 2);
}

/// From the environment alone, a stream stalled after 20 tokens is cut at the cold gap and
/// continued through the same provider, each word once.
#[tokio::test(start_paused = true)]
async fn from_the_environment_a_stalled_stream_is_continued_by_the_same_provider() {
    let provider = Provider::spawn(|n, body| match n {
        0 => {
            let mut steps = words(1, 20, false);
            steps.push(Step::Stall);
            Plan::stream(steps)
        }
        _ => Plan::answer(resumes_at(body)),
    })
    .await;
    let (took, read) = through_one(&provider, REQUEST).await;
    assert_whole(&read);
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!(provider.hits(), 2);
}

/// A healthy stream that pauses 15 s after 20 tokens, for a request that asks for reasoning
/// (its thinking cannot be a prefill, so a cut would lose it): the cold gap does not cut it,
/// and its one attempt delivers it whole.
#[tokio::test(start_paused = true)]
async fn from_the_environment_a_pause_is_never_cut_where_the_stream_would_not_be_continued() {
    let provider = Provider::spawn(|_, _| {
        let mut steps = words(1, 20, false);
        steps.push(Step::Wait(15 * SECOND));
        steps.extend(words(21, WORDS, true).into_iter().skip(1));
        Plan::stream(steps)
    })
    .await;
    let reasoning = REQUEST.replace(
        r#""stream":true"#,
        r#""stream":true,"reasoning_effort":"low""#,
    );
    let (took, read) = through_one(&provider, &reasoning).await;
    assert_whole(&read);
    assert!((15 * SECOND..16 * SECOND).contains(&took), "{took:?}");
    assert_eq!(provider.hits(), 1);
}
