//! [`MetricsRecorder`]: the engine's figures through the `metrics` facade (feature `metrics`).

use std::sync::Arc;

use http::StatusCode;
use metrics::{SharedString, counter, gauge, histogram};
use stormguard_breaker::State;
use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{Outcome, Reason};
use stormguard_rate_limit::RateLimit;
use tokio::time::Instant;

use super::Recorder;
use crate::admission::Guards;
use crate::metrics::{
    ATTEMPT_DURATION, BREAKER_STATE, CONCURRENCY_GROWN, CONCURRENCY_IN_FLIGHT, CONCURRENCY_LIMIT,
    CONCURRENCY_SHRUNK, ERROR_TYPE, HEDGES, PROVIDER, RATE_LIMIT_HEADROOM, RATE_LIMIT_WAIT,
    REFUSALS, REQUEST_ATTEMPTS, REQUEST_DURATION, RETRIES, STATUS_CODE, STREAMS,
    THROTTLE_DROP_PROBABILITY, TOKEN_USAGE,
};

/// The `gen_ai.provider.name` of a layer with no name.
const UNKNOWN: &str = "unknown";

/// Records a request's figures through the `metrics` facade, under its provider's label.
pub(crate) struct MetricsRecorder {
    provider: SharedString,
    started: Instant,
    /// The reason of the retry decided and not sent yet: counted when it is sent, so a retry
    /// the throttle, the breaker, the rate limit or the deadline then refuses is not.
    retry: Option<Reason>,
}

impl Recorder for MetricsRecorder {
    const RECORDS: bool = true;
    /// When the attempt was sent.
    type Attempt = Option<Instant>;
    /// The provider's label.
    type Label = SharedString;

    fn new(name: Option<&Arc<str>>) -> Self {
        Self {
            provider: provider(name),
            started: Instant::now(),
            retry: None,
        }
    }

    fn label(&self) -> SharedString {
        self.provider.clone()
    }

    /// An attempt is sent: a retry, if one was decided, or a hedge.
    fn sending(&mut self, attempt: &mut Option<Instant>, hedge: bool) {
        *attempt = Some(Instant::now());
        if hedge {
            self.hedge("sent");
        } else if let Some(reason) = self.retry.take() {
            counter!(RETRIES, PROVIDER => self.provider.clone(), "reason" => reason.as_str())
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
        let provider = self.provider.clone();
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
        counter!(HEDGES, PROVIDER => self.provider.clone(), "outcome" => event).increment(1);
    }

    fn retrying(&mut self, reason: Reason) {
        self.retry = Some(reason);
    }

    fn refused(&self, cause: &'static str) {
        counter!(REFUSALS, PROVIDER => self.provider.clone(), "cause" => cause).increment(1);
    }

    fn finished(&self, attempts: u32, outcome: &'static str, error: Option<Reason>) {
        let seconds = self.started.elapsed().as_secs_f64();
        histogram!(REQUEST_ATTEMPTS, PROVIDER => self.provider.clone(), "outcome" => outcome)
            .record(f64::from(attempts));
        match error {
            None => histogram!(
                REQUEST_DURATION,
                PROVIDER => self.provider.clone(),
                "outcome" => outcome
            )
            .record(seconds),
            Some(reason) => histogram!(
                REQUEST_DURATION,
                PROVIDER => self.provider.clone(),
                "outcome" => outcome,
                ERROR_TYPE => reason.as_str()
            )
            .record(seconds),
        }
    }

    /// The throttle's and the breaker's state, as of now.
    fn health(&self, guards: &Guards) {
        if let Some(throttle) = guards.throttle() {
            gauge!(THROTTLE_DROP_PROBABILITY, PROVIDER => self.provider.clone())
                .set(throttle.probability());
        }
        if let Some(breaker) = guards.breaker() {
            let state = match breaker.state() {
                State::Closed => 0.0,
                State::HalfOpen => 1.0,
                State::Open => 2.0,
            };
            gauge!(BREAKER_STATE, PROVIDER => self.provider.clone()).set(state);
        }
        if let Some(limit) = guards.concurrency() {
            let snapshot = limit.snapshot();
            gauge!(CONCURRENCY_LIMIT, PROVIDER => self.provider.clone())
                .set(f64::from(snapshot.limit));
            gauge!(CONCURRENCY_IN_FLIGHT, PROVIDER => self.provider.clone())
                .set(f64::from(snapshot.in_flight));
            counter!(CONCURRENCY_SHRUNK, PROVIDER => self.provider.clone())
                .absolute(snapshot.shrunk);
            counter!(CONCURRENCY_GROWN, PROVIDER => self.provider.clone()).absolute(snapshot.grown);
        }
    }

    /// The rate limit admitted an attempt after a wait until `start`.
    fn slot_reserved(&self, start: Instant, limit: &RateLimit) {
        let wait = start.saturating_duration_since(Instant::now());
        histogram!(RATE_LIMIT_WAIT, PROVIDER => self.provider.clone()).record(wait.as_secs_f64());
        let snapshot = limit.snapshot();
        for (dimension, available) in [
            ("requests", snapshot.requests_available),
            ("tokens", snapshot.tokens_available),
        ] {
            if let Some(available) = available {
                gauge!(
                    RATE_LIMIT_HEADROOM,
                    PROVIDER => self.provider.clone(),
                    "dimension" => dimension
                )
                .set(available as f64);
            }
        }
    }

    /// An attempt's stream failed before its first content.
    fn stream_failed(&self) {
        counter!(STREAMS, PROVIDER => self.provider.clone(), "outcome" => "failed_before_content")
            .increment(1);
    }

    fn answer_used(label: SharedString, counts: TokenCounts) {
        record_usage(label, counts, "answer");
    }

    fn stream_ended(
        label: SharedString,
        outcome: &Outcome,
        usage: Option<TokenCounts>,
        continuation: bool,
    ) {
        if let Some(usage) = usage {
            let attempt = match (outcome.is_success(), continuation) {
                (_, true) => "continuation",
                (true, false) => "answer",
                (false, false) => "interrupted",
            };
            record_usage(label.clone(), usage, attempt);
        }
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

/// Records the tokens an attempt's answer said it used (`attempt`: `answer`,
/// `continuation`, `interrupted`).
fn record_usage(provider: SharedString, counts: TokenCounts, attempt: &'static str) {
    for (kind, tokens) in [("input", counts.input), ("output", counts.output)] {
        histogram!(
            TOKEN_USAGE,
            PROVIDER => provider.clone(),
            "gen_ai.token.type" => kind,
            "stormguard.attempt" => attempt
        )
        .record(tokens as f64);
    }
}

fn provider(name: Option<&Arc<str>>) -> SharedString {
    match name {
        Some(name) => SharedString::from(Arc::clone(name)),
        None => SharedString::const_str(UNKNOWN),
    }
}

/// A status code as a label (`"503"`).
fn status_label(status: StatusCode) -> SharedString {
    SharedString::from(status.as_str().to_owned())
}
