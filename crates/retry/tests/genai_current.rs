//! The GenAI metrics under their current names (semantic-conventions v1.41), the default: what
//! each name records and with which attributes.

#![allow(clippy::unwrap_used)]

mod gen_ai;
mod support;

use gen_ai::checks::{self, Names};
use gen_ai::{ANSWERED_BY, CHAT, labels};
use metrics_util::MetricKind;
use stormguard_retry::metrics::{
    GenAiNames, INFERENCE_DURATION, INFERENCE_TIME_PER_OUTPUT_CHUNK, INFERENCE_TIME_TO_FIRST_CHUNK,
    OPERATION_DURATION, OPERATION_INPUT_TOKENS, TIME_PER_OUTPUT_CHUNK, TIME_TO_FIRST_CHUNK,
    TOKEN_USAGE, USAGE_INPUT_TOKENS,
};

/// The current generation's names of an inference's figures.
const CURRENT: Names = Names {
    duration: OPERATION_DURATION,
    first_chunk: TIME_TO_FIRST_CHUNK,
    per_chunk: TIME_PER_OUTPUT_CHUNK,
};

/// Every test of this binary records the current names, whatever the environment says.
fn current() {
    assert_eq!(GenAiNames::Current.choose(), Ok(()));
    assert_eq!(GenAiNames::of_process(), GenAiNames::Current);
}

/// None of the latest generation's names is recorded.
fn no_latest_names(seen: &gen_ai::Recorded) {
    for name in [
        INFERENCE_DURATION,
        INFERENCE_TIME_TO_FIRST_CHUNK,
        INFERENCE_TIME_PER_OUTPUT_CHUNK,
        USAGE_INPUT_TOKENS,
        OPERATION_INPUT_TOKENS,
    ] {
        assert!(!seen.has(name), "{name}");
    }
}

#[test]
fn the_latest_names_are_refused_once_the_current_ones_hold() {
    current();
    assert_eq!(GenAiNames::Latest.choose(), Err(GenAiNames::Current));
}

#[test]
fn operation_duration_spans_the_request_s_attempts_with_its_attributes() {
    current();
    let seen = checks::the_duration_spans_the_attempts(&CURRENT);
    no_latest_names(&seen);
}

#[test]
fn a_failed_operation_says_its_error_type() {
    current();
    let seen = checks::a_failure_says_its_error_type(&CURRENT);
    assert!(!seen.has(TOKEN_USAGE));
}

#[test]
fn token_usage_by_type_with_the_request_s_and_the_answer_s_model() {
    current();
    let seen = gen_ai::a_whole_answer_after_a_retry();
    assert_eq!(seen.kind(TOKEN_USAGE), Some(MetricKind::Histogram));
    let series = seen.series(TOKEN_USAGE);
    assert_eq!(series.len(), 2, "{series:?}");
    for ((labels_seen, values), (kind, tokens)) in
        series.iter().zip([("input", 12.0), ("output", 30.0)])
    {
        let mut expected = labels(CHAT);
        expected.insert("gen_ai.response.model".into(), ANSWERED_BY.into());
        expected.insert("gen_ai.token.type".into(), kind.into());
        expected.insert("stormguard.attempt".into(), "answer".into());
        assert_eq!(*labels_seen, expected);
        assert_eq!(*values, [tokens]);
    }
}

#[test]
fn a_stream_s_time_to_first_chunk_time_per_chunk_and_duration() {
    current();
    let seen = checks::a_stream_s_timings(&CURRENT);
    let usage = seen.series(TOKEN_USAGE);
    let tokens: Vec<(&str, &[f64])> = (usage.iter())
        .map(|(labels, values)| (labels["gen_ai.token.type"].as_str(), values.as_slice()))
        .collect();
    assert!(
        usage
            .iter()
            .all(|(labels, _)| labels["gen_ai.response.model"] == ANSWERED_BY)
    );
    assert_eq!(tokens, [("input", &[9.0][..]), ("output", &[3.0][..])]);
    no_latest_names(&seen);
}

#[test]
fn a_whole_answer_has_no_chunk_timings() {
    current();
    let seen = gen_ai::a_whole_answer_after_a_retry();
    assert!(!seen.has(TIME_TO_FIRST_CHUNK));
    assert!(!seen.has(TIME_PER_OUTPUT_CHUNK));
}

#[test]
fn gemini_s_operation_and_model_come_from_its_path() {
    current();
    let seen = gen_ai::a_gemini_request();
    let expected = labels(&[
        ("gen_ai.provider.name", "gcp.gemini"),
        ("gen_ai.operation.name", "generate_content"),
        ("gen_ai.request.model", "gemini-2.0-flash"),
        ("server.address", "gemini.test"),
        ("server.port", "8080"),
    ]);
    let series = seen.series(OPERATION_DURATION);
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0, expected);
    let usage = seen.series(TOKEN_USAGE);
    let tokens: Vec<f64> = usage
        .iter()
        .flat_map(|(_, values)| values.clone())
        .collect();
    assert_eq!(tokens, [7.0, 4.0]);
    // Gemini's answer names its model as `modelVersion`.
    let models: Vec<&str> = (usage.iter())
        .map(|(labels, _)| labels["gen_ai.response.model"].as_str())
        .collect();
    assert_eq!(models, ["gemini-2.0-flash-001"; 2]);
}

#[test]
fn embeddings_are_their_own_operation() {
    current();
    let seen = gen_ai::an_embeddings_request();
    let series = seen.series(OPERATION_DURATION);
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0["gen_ai.operation.name"], "embeddings");
    assert_eq!(
        series[0].0["gen_ai.request.model"],
        "text-embedding-3-small"
    );
    // HTTPS without a port: 443.
    assert_eq!(series[0].0["server.address"], "api.test");
    assert_eq!(series[0].0["server.port"], "443");
    let usage = seen.series(TOKEN_USAGE);
    assert_eq!(usage[0].0["gen_ai.token.type"], "input");
    assert_eq!(usage[0].1, [8.0]);
}

#[test]
fn hostile_model_names_are_other_and_an_unnamed_model_is_absent() {
    current();
    checks::hostile_models_are_other(&CURRENT);
}

#[test]
fn an_interrupted_stream_s_duration_says_its_interruption() {
    current();
    checks::an_interrupted_stream_says_so(&CURRENT);
}
