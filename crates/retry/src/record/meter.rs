//! [`MetricsRecorder`]: the engine's figures through the `metrics` facade (feature `metrics`).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use metrics::{Label, SharedString, counter, gauge, histogram};
use stormguard_breaker::State;
use stormguard_classify::usage::{TokenCounts, model_named};
use stormguard_classify::{Outcome, Reason};
use stormguard_rate_limit::RateLimit;
use tokio::time::Instant;

use super::labels::GenAiLabels;
use super::{ChunkGaps, Recorder};
use crate::admission::Guards;
use crate::metrics::{
    ATTEMPT_DURATION, BREAKER_STATE, CONCURRENCY_GROWN, CONCURRENCY_IN_FLIGHT, CONCURRENCY_LIMIT,
    CONCURRENCY_SHRUNK, ERROR_TYPE, HEDGES, INFERENCE_DURATION, INFERENCE_TIME_PER_OUTPUT_CHUNK,
    INFERENCE_TIME_TO_FIRST_CHUNK, OPERATION_DURATION, OPERATION_INPUT_TOKENS,
    OPERATION_OUTPUT_TOKENS, PROVIDER, RATE_LIMIT_HEADROOM, RATE_LIMIT_WAIT, REFUSALS,
    REQUEST_ATTEMPTS, REQUEST_DURATION, RETRIES, STATUS_CODE, STREAMS, THROTTLE_DROP_PROBABILITY,
    TIME_PER_OUTPUT_CHUNK, TIME_TO_FIRST_CHUNK, TOKEN_MODALITY, TOKEN_TYPE, TOKEN_USAGE,
    USAGE_INPUT_TOKENS, USAGE_OUTPUT_TOKENS,
};

/// Records a request's figures through the `metrics` facade, under its provider's label.
pub(crate) struct MetricsRecorder {
    /// The GenAI attributes of its figures (the provider's among them), and when it started.
    gen_ai: GenAiLabels,
    /// The reason of the retry decided and not sent yet: counted when it is sent, so a retry
    /// the throttle, the breaker, the rate limit or the deadline then refuses is not.
    retry: Option<Reason>,
}

impl Recorder for MetricsRecorder {
    const RECORDS: bool = true;
    /// When the attempt was sent.
    type Attempt = Option<Instant>;
    /// The request's GenAI labels (the provider's among them).
    type Label = Arc<GenAiLabels>;

    fn new(name: Option<&Arc<str>>, head: &Parts) -> Self {
        Self {
            gen_ai: GenAiLabels::new(name, head),
            retry: None,
        }
    }

    fn request_read(&mut self, body: &[u8]) {
        self.gen_ai.request_read(body);
    }

    fn label(&self) -> Arc<GenAiLabels> {
        Arc::new(self.gen_ai.clone())
    }

    /// An attempt is sent: a retry, if one was decided, or a hedge.
    fn sending(&mut self, attempt: &mut Option<Instant>, hedge: bool) {
        *attempt = Some(Instant::now());
        if hedge {
            self.hedge("sent");
        } else if let Some(reason) = self.retry.take() {
            counter!(RETRIES, PROVIDER => self.gen_ai.provider.clone(), "reason" => reason.as_str())
                .increment(1);
        }
    }

    fn answered(
        &self,
        attempt: &mut Option<Instant>,
        outcome: &Outcome,
        status: Option<StatusCode>,
    ) {
        let Some(started) = attempt.take() else {
            return;
        };
        let seconds = started.elapsed().as_secs_f64();
        let provider = self.gen_ai.provider.clone();
        let reason = outcome.reason().as_str();
        let duration = match (status, outcome.is_success()) {
            (Some(status), true) => histogram!(
                ATTEMPT_DURATION,
                PROVIDER => provider,
                STATUS_CODE => status_label(status)
            ),
            (Some(status), false) => histogram!(
                ATTEMPT_DURATION,
                PROVIDER => provider,
                STATUS_CODE => status_label(status),
                ERROR_TYPE => reason
            ),
            (None, _) => {
                histogram!(ATTEMPT_DURATION, PROVIDER => provider, ERROR_TYPE => reason)
            }
        };
        duration.record(seconds);
    }

    /// Counts a hedge's `event` (`sent`, `won`, `cancelled`, `failed`, `budget`, `refused`).
    fn hedge(&self, event: &'static str) {
        counter!(HEDGES, PROVIDER => self.gen_ai.provider.clone(), "outcome" => event).increment(1);
    }

    fn retrying(&mut self, reason: Reason) {
        self.retry = Some(reason);
    }

    fn refused(&self, cause: &'static str) {
        counter!(REFUSALS, PROVIDER => self.gen_ai.provider.clone(), "cause" => cause).increment(1);
    }

    fn finished(
        &self,
        attempts: u32,
        outcome: &'static str,
        error: Option<Reason>,
        streamed: bool,
    ) {
        let seconds = self.gen_ai.started.elapsed().as_secs_f64();
        // A stream's operation lasts until its end, recorded by its guard.
        if !streamed {
            operation_duration(&self.gen_ai, seconds, error.map(Reason::as_str), None);
        }
        histogram!(REQUEST_ATTEMPTS, PROVIDER => self.gen_ai.provider.clone(), "outcome" => outcome)
            .record(f64::from(attempts));
        match error {
            None => histogram!(
                REQUEST_DURATION,
                PROVIDER => self.gen_ai.provider.clone(),
                "outcome" => outcome
            )
            .record(seconds),
            Some(reason) => histogram!(
                REQUEST_DURATION,
                PROVIDER => self.gen_ai.provider.clone(),
                "outcome" => outcome,
                ERROR_TYPE => reason.as_str()
            )
            .record(seconds),
        }
    }

    /// The throttle's and the breaker's state, as of now.
    fn health(&self, guards: &Guards) {
        if let Some(throttle) = guards.throttle() {
            gauge!(THROTTLE_DROP_PROBABILITY, PROVIDER => self.gen_ai.provider.clone())
                .set(throttle.probability());
        }
        if let Some(breaker) = guards.breaker() {
            let state = match breaker.state() {
                State::Closed => 0.0,
                State::HalfOpen => 1.0,
                State::Open => 2.0,
            };
            gauge!(BREAKER_STATE, PROVIDER => self.gen_ai.provider.clone()).set(state);
        }
        if let Some(limit) = guards.concurrency() {
            let snapshot = limit.snapshot();
            gauge!(CONCURRENCY_LIMIT, PROVIDER => self.gen_ai.provider.clone())
                .set(f64::from(snapshot.limit));
            gauge!(CONCURRENCY_IN_FLIGHT, PROVIDER => self.gen_ai.provider.clone())
                .set(f64::from(snapshot.in_flight));
            counter!(CONCURRENCY_SHRUNK, PROVIDER => self.gen_ai.provider.clone())
                .absolute(snapshot.shrunk);
            counter!(CONCURRENCY_GROWN, PROVIDER => self.gen_ai.provider.clone())
                .absolute(snapshot.grown);
        }
    }

    /// The rate limit admitted an attempt after a wait until `start`.
    fn slot_reserved(&self, start: Instant, limit: &RateLimit) {
        let wait = start.saturating_duration_since(Instant::now());
        histogram!(RATE_LIMIT_WAIT, PROVIDER => self.gen_ai.provider.clone())
            .record(wait.as_secs_f64());
        let snapshot = limit.snapshot();
        for (dimension, available) in [
            ("requests", snapshot.requests_available),
            ("tokens", snapshot.tokens_available),
        ] {
            if let Some(available) = available {
                gauge!(
                    RATE_LIMIT_HEADROOM,
                    PROVIDER => self.gen_ai.provider.clone(),
                    "dimension" => dimension
                )
                .set(available as f64);
            }
        }
    }

    /// An attempt's stream failed before its first content.
    fn stream_failed(&self) {
        counter!(STREAMS, PROVIDER => self.gen_ai.provider.clone(), "outcome" => "failed_before_content")
            .increment(1);
    }

    fn first_chunk(&self) {
        let seconds = self.gen_ai.started.elapsed().as_secs_f64();
        let name = if self.gen_ai.latest_inference() {
            INFERENCE_TIME_TO_FIRST_CHUNK
        } else {
            TIME_TO_FIRST_CHUNK
        };
        histogram!(name, self.gen_ai.labels(None)).record(seconds);
    }

    fn chunk_gaps(&self) -> Option<ChunkGaps> {
        let name = if self.gen_ai.latest_inference() {
            INFERENCE_TIME_PER_OUTPUT_CHUNK
        } else {
            TIME_PER_OUTPUT_CHUNK
        };
        // Registered once per stream: each content event then costs one `record`.
        let histogram = histogram!(name, self.gen_ai.labels(None));
        Some(Box::new(move |gap: Duration| {
            histogram.record(gap.as_secs_f64());
        }))
    }

    fn answer_used(label: Arc<GenAiLabels>, counts: TokenCounts, body: &[u8]) {
        record_usage(&label, counts, "answer", model_named(body));
    }

    fn stream_ended(
        label: Arc<GenAiLabels>,
        outcome: &Outcome,
        usage: Option<TokenCounts>,
        continuation: bool,
        model: Option<&str>,
    ) {
        let error = (!outcome.is_success()).then(|| outcome.reason().as_str());
        let seconds = label.started.elapsed().as_secs_f64();
        operation_duration(&label, seconds, error, model);
        if let Some(usage) = usage {
            let attempt = match (outcome.is_success(), continuation) {
                (_, true) => "continuation",
                (true, false) => "answer",
                (false, false) => "interrupted",
            };
            record_usage(&label, usage, attempt, model);
        }
        let label = label.provider.clone();
        if outcome.is_success() {
            counter!(STREAMS, PROVIDER => label, "outcome" => "complete").increment(1);
        } else {
            counter!(
                STREAMS,
                PROVIDER => label,
                "outcome" => "interrupted",
                ERROR_TYPE => outcome.reason().as_str()
            )
            .increment(1);
        }
    }
}

/// Records the duration of the operation `gen_ai` labels, `seconds` long (`error`: what it
/// failed with; `response_model`: what its answer named), under the generation's name.
fn operation_duration(
    gen_ai: &GenAiLabels,
    seconds: f64,
    error: Option<&'static str>,
    response_model: Option<&str>,
) {
    let name = if gen_ai.latest_inference() {
        INFERENCE_DURATION
    } else {
        OPERATION_DURATION
    };
    let mut labels = gen_ai.labels(response_model);
    if let Some(error) = error {
        labels.push(Label::from_static_parts(ERROR_TYPE, error));
    }
    histogram!(name, labels).record(seconds);
}

/// Records the tokens an attempt's answer said it used (`attempt`: `answer`, `continuation`,
/// `interrupted`; `response_model`: what the answer named), under the generation's names: the
/// current generation's histogram by `gen_ai.token.type`, or the latest's counters (by
/// `gen_ai.token.modality`: `unknown`, the providers' totals say no more) and per-inference
/// histograms.
fn record_usage(
    gen_ai: &GenAiLabels,
    counts: TokenCounts,
    attempt: &'static str,
    response_model: Option<&str>,
) {
    let mut labels = gen_ai.labels(response_model);
    labels.push(Label::from_static_parts("stormguard.attempt", attempt));
    if gen_ai.latest_inference() {
        for (counter, histogram, tokens) in [
            (USAGE_INPUT_TOKENS, OPERATION_INPUT_TOKENS, counts.input),
            (USAGE_OUTPUT_TOKENS, OPERATION_OUTPUT_TOKENS, counts.output),
        ] {
            histogram!(histogram, labels.clone()).record(tokens as f64);
            let mut labels = labels.clone();
            labels.push(Label::from_static_parts(TOKEN_MODALITY, "unknown"));
            counter!(counter, labels).increment(tokens);
        }
        return;
    }
    for (kind, tokens) in [("input", counts.input), ("output", counts.output)] {
        let mut labels = labels.clone();
        labels.push(Label::from_static_parts(TOKEN_TYPE, kind));
        histogram!(TOKEN_USAGE, labels).record(tokens as f64);
    }
}

/// A status code as a label (`"503"`).
fn status_label(status: StatusCode) -> SharedString {
    SharedString::from(status.as_str().to_owned())
}
