//! The checks both generations share: the same figures and attributes under each generation's
//! names of the inference figures ([`Names`]).

use metrics_util::MetricKind;

use super::{ANSWERED_BY, CHAT, Recorded, close, labels};

/// One generation's names of an inference's duration and chunk timings.
pub struct Names {
    pub duration: &'static str,
    pub first_chunk: &'static str,
    pub per_chunk: &'static str,
}

/// A whole answer after one retry: one duration over both attempts and the backoff between them
/// (1 s, 250 ms, 1 s), with the request's attributes, no error and no response model (it is
/// recorded when the answer's head comes).
pub fn the_duration_spans_the_attempts(names: &Names) -> Recorded {
    let seen = super::a_whole_answer_after_a_retry();
    assert_eq!(seen.kind(names.duration), Some(MetricKind::Histogram));
    let series = seen.series(names.duration);
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0, labels(CHAT));
    assert!(close(&series[0].1, &[2.25]), "{series:?}");
    seen
}

/// A request that failed: its duration (1.5 s) says its error type.
pub fn a_failure_says_its_error_type(names: &Names) -> Recorded {
    let seen = super::a_failure();
    let series = seen.series(names.duration);
    let mut expected = labels(CHAT);
    expected.insert("error.type".into(), "unavailable".into());
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].0, expected);
    assert!(close(&series[0].1, &[1.5]), "{series:?}");
    seen
}

/// A stream: its first content 750 ms after the request (the head after 500 ms, the content
/// 250 ms later), one figure per content event after the first (the wait since the one before),
/// and a duration until its end that has read the model its usage event named.
pub fn a_stream_s_timings(names: &Names) -> Recorded {
    let seen = super::a_stream();
    assert_eq!(seen.kind(names.first_chunk), Some(MetricKind::Histogram));
    let first = seen.series(names.first_chunk);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].0, labels(CHAT));
    assert!(close(&first[0].1, &[0.75]), "{first:?}");
    let per_chunk = seen.series(names.per_chunk);
    assert_eq!(per_chunk.len(), 1, "{per_chunk:?}");
    assert_eq!(per_chunk[0].0, labels(CHAT));
    assert!(close(&per_chunk[0].1, &[0.1, 0.3]), "{per_chunk:?}");
    let duration = seen.series(names.duration);
    assert_eq!(duration.len(), 1, "{duration:?}");
    let mut answered = labels(CHAT);
    answered.insert("gen_ai.response.model".into(), ANSWERED_BY.into());
    assert_eq!(duration[0].0, answered);
    assert!(close(&duration[0].1, &[1.15]), "{duration:?}");
    seen
}

/// Three requests naming models unfit for a label are `_OTHER`; one naming none has no model.
pub fn hostile_models_are_other(names: &Names) {
    let seen = super::hostile_models();
    let series = seen.series(names.duration);
    let mut models: Vec<(Option<&str>, usize)> = (series.iter())
        .map(|(labels, values)| {
            let model = labels.get("gen_ai.request.model").map(String::as_str);
            (model, values.len())
        })
        .collect();
    models.sort();
    assert_eq!(models, [(None, 1), (Some("_OTHER"), 3)], "{series:?}");
}

/// A stream cut after its first content: its duration (its head after 500 ms, its end 300 ms
/// later) says the interruption, and its first content came at 700 ms.
pub fn an_interrupted_stream_says_so(names: &Names) {
    let seen = super::an_interrupted_stream();
    let duration = seen.series(names.duration);
    assert_eq!(duration.len(), 1, "{duration:?}");
    let mut expected = labels(CHAT);
    expected.insert("error.type".into(), "server_error".into());
    assert_eq!(duration[0].0, expected);
    assert!(close(&duration[0].1, &[0.8]), "{duration:?}");
    assert!(close(&seen.series(names.first_chunk)[0].1, &[0.7]));
}
