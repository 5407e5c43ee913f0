//! The GenAI metrics under semantic-conventions-genai v0.1.0's names, as
//! `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` picks them (chosen in code here:
//! a test does not set its process's environment).

#![allow(clippy::unwrap_used)]

mod gen_ai;
mod support;

use gen_ai::checks::{self, Names};
use gen_ai::{ANSWERED_BY, CHAT, labels};
use metrics_util::MetricKind;
use stormguard_retry::metrics::{
    GenAiNames, INFERENCE_DURATION, INFERENCE_TIME_PER_OUTPUT_CHUNK, INFERENCE_TIME_TO_FIRST_CHUNK,
    OPERATION_DURATION, OPERATION_INPUT_TOKENS, OPERATION_OUTPUT_TOKENS, TIME_PER_OUTPUT_CHUNK,
    TIME_TO_FIRST_CHUNK, TOKEN_USAGE, USAGE_INPUT_TOKENS, USAGE_OUTPUT_TOKENS,
};

/// The latest generation's names of an inference's figures.
const LATEST: Names = Names {
    duration: INFERENCE_DURATION,
    first_chunk: INFERENCE_TIME_TO_FIRST_CHUNK,
    per_chunk: INFERENCE_TIME_PER_OUTPUT_CHUNK,
};

/// Every test of this binary records the latest names.
fn latest() {
    assert_eq!(GenAiNames::Latest.choose(), Ok(()));
    assert_eq!(GenAiNames::of_process(), GenAiNames::Latest);
}

/// None of the current generation's names is recorded (for an inference).
fn no_current_names(seen: &gen_ai::Recorded) {
    for name in [
        OPERATION_DURATION,
        TIME_TO_FIRST_CHUNK,
        TIME_PER_OUTPUT_CHUNK,
        TOKEN_USAGE,
    ] {
        assert!(!seen.has(name), "{name}");
    }
}

#[test]
fn the_current_names_are_refused_once_the_latest_ones_hold() {
    latest();
    assert_eq!(GenAiNames::Current.choose(), Err(GenAiNames::Latest));
}

#[test]
fn inference_duration_spans_the_request_s_attempts_with_its_attributes() {
    latest();
    let seen = checks::the_duration_spans_the_attempts(&LATEST);
    no_current_names(&seen);
}

#[test]
fn a_failed_inference_says_its_error_type() {
    latest();
    let seen = checks::a_failure_says_its_error_type(&LATEST);
    no_current_names(&seen);
}

#[test]
fn usage_counters_by_modality_and_per_inference_histograms() {
    latest();
    let seen = gen_ai::a_whole_answer_after_a_retry();
    let mut answer = labels(CHAT);
    answer.insert("gen_ai.response.model".into(), ANSWERED_BY.into());
    answer.insert("stormguard.attempt".into(), "answer".into());
    let mut by_modality = answer.clone();
    by_modality.insert("gen_ai.token.modality".into(), "unknown".into());
    for (counter, histogram, tokens) in [
        (USAGE_INPUT_TOKENS, OPERATION_INPUT_TOKENS, 12.0),
        (USAGE_OUTPUT_TOKENS, OPERATION_OUTPUT_TOKENS, 30.0),
    ] {
        assert_eq!(seen.kind(counter), Some(MetricKind::Counter), "{counter}");
        assert_eq!(
            seen.series(counter),
            [(by_modality.clone(), vec![tokens])],
            "{counter}"
        );
        assert_eq!(
            seen.kind(histogram),
            Some(MetricKind::Histogram),
            "{histogram}"
        );
        assert_eq!(
            seen.series(histogram),
            [(answer.clone(), vec![tokens])],
            "{histogram}"
        );
    }
    no_current_names(&seen);
}

#[test]
fn a_stream_s_time_to_first_chunk_time_per_chunk_and_duration() {
    latest();
    let seen = checks::a_stream_s_timings(&LATEST);
    let input = seen.series(USAGE_INPUT_TOKENS);
    let output = seen.series(USAGE_OUTPUT_TOKENS);
    assert_eq!(
        (input[0].1.as_slice(), output[0].1.as_slice()),
        (&[9.0][..], &[3.0][..])
    );
    no_current_names(&seen);
}

#[test]
fn gemini_s_generate_content_is_an_inference() {
    latest();
    let seen = gen_ai::a_gemini_request();
    let series = seen.series(INFERENCE_DURATION);
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0["gen_ai.operation.name"], "generate_content");
    assert_eq!(series[0].0["gen_ai.request.model"], "gemini-2.0-flash");
    assert_eq!(seen.series(USAGE_INPUT_TOKENS)[0].1, [7.0]);
    assert_eq!(seen.series(OPERATION_OUTPUT_TOKENS)[0].1, [4.0]);
    no_current_names(&seen);
}

/// The latest generation renames the inference metrics only: embeddings keep the current names.
#[test]
fn embeddings_keep_the_current_names() {
    latest();
    let seen = gen_ai::an_embeddings_request();
    let series = seen.series(OPERATION_DURATION);
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0["gen_ai.operation.name"], "embeddings");
    assert_eq!(seen.series(TOKEN_USAGE)[0].1, [8.0]);
    assert!(!seen.has(INFERENCE_DURATION));
    assert!(!seen.has(USAGE_INPUT_TOKENS));
}

#[test]
fn hostile_model_names_are_other() {
    latest();
    checks::hostile_models_are_other(&LATEST);
}

#[test]
fn an_interrupted_stream_s_duration_says_its_interruption() {
    latest();
    checks::an_interrupted_stream_says_so(&LATEST);
}
