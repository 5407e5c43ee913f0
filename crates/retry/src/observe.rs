//! What the engine tells about one request: its `tracing` spans, its log lines (see [`log`]),
//! and, with the `metrics` feature, what it counts and measures (see [`metrics`](crate::metrics)).
//!
//! Spans: `stormguard.request` (fields `backend`, `attempts`, `outcome`, `error.type`), and in it
//! one `stormguard.attempt` per attempt sent (`attempt`, `backend`, `outcome`, `reason`,
//! `status`, and `delay_ms` when a retry follows it). Both are at INFO: an application's
//! subscriber decides whether to keep them; they write no lines of their own, and the engine's
//! events (the retry's WARN, the final ERROR) carry them as their context. The future enters the
//! attempt's span while it polls, so what the service below logs is in it too.
//!
//! [`log`]: crate::log

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use stormguard_classify::LocalAnswer;
use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{Outcome, Reason};
use stormguard_rate_limit::RateLimit;
use tracing::Span;
use tracing::field::Empty;
use tracing::span::EnteredSpan;

use crate::admission::Guards;
use crate::error::{Error, GiveUpCause};
use crate::log::{self, Quiet};

/// One request's spans and, with the `metrics` feature, its meter.
///
/// When no subscriber wants the spans (they are disabled) and without the feature, it costs next
/// to nothing: nothing is recorded, cloned or entered, and no label is worked out. It lives in
/// the response future, which is moved whole, so it holds nothing it can read elsewhere (the
/// backend's name is the configuration's). What it keeps of each attempt is the attempt's own
/// ([`AttemptWatch`]), so that two attempts of a request in flight (a hedge) are watched apart.
pub(crate) struct Watch {
    request: Span,
    #[cfg(feature = "metrics")]
    meter: meter::Meter,
}

/// What the [`Watch`] keeps of one attempt, in the attempt: its span (none before it is sent),
/// whether it is in flight (an attempt is answered once), and, for the metrics, when it was sent.
pub(crate) struct AttemptWatch {
    span: Span,
    in_flight: bool,
    #[cfg(feature = "metrics")]
    started: Option<tokio::time::Instant>,
}

impl Default for AttemptWatch {
    fn default() -> Self {
        Self {
            span: Span::none(),
            in_flight: false,
            #[cfg(feature = "metrics")]
            started: None,
        }
    }
}

impl Watch {
    pub(crate) fn new(name: Option<&Arc<str>>) -> Self {
        let request = tracing::info_span!(
            "stormguard.request",
            backend = name.map(|name| &**name),
            attempts = Empty,
            outcome = Empty,
            error.type = Empty,
        );
        Self {
            request,
            #[cfg(feature = "metrics")]
            meter: meter::Meter::new(name),
        }
    }

    /// The span to be in while the request is polled: its attempt's, or its own before one.
    #[inline]
    pub(crate) fn span<'a>(&'a self, attempt: &'a AttemptWatch) -> &'a Span {
        if attempt.span.is_none() {
            &self.request
        } else {
            &attempt.span
        }
    }

    /// That span, entered for as long as the guard lives (the guard owns a clone of it, so the
    /// request can be worked on meanwhile); `None` when no subscriber takes it. Inlined: the
    /// future calls it at every step, from the caller's crate, where it is a check of one field.
    #[inline]
    pub(crate) fn enter(&self, attempt: &AttemptWatch) -> Option<EnteredSpan> {
        let span = self.span(attempt);
        (!span.is_disabled()).then(|| span.clone().entered())
    }

    /// Attempt number `number` (`hedge`: a hedge) is being sent to the backend named `name`.
    pub(crate) fn sending(
        &mut self,
        attempt: &mut AttemptWatch,
        number: u32,
        name: Option<&str>,
        hedge: bool,
    ) {
        attempt.span = tracing::info_span!(
            parent: &self.request,
            "stormguard.attempt",
            attempt = number,
            backend = name,
            hedge,
            outcome = Empty,
            reason = Empty,
            status = Empty,
            delay_ms = Empty,
        );
        attempt.in_flight = true;
        if hedge {
            let _in = attempt.span.enter();
            tracing::debug!(attempt = number, "hedging request");
        }
        #[cfg(feature = "metrics")]
        {
            attempt.started = Some(tokio::time::Instant::now());
            self.meter.sending(hedge);
        }
    }

    /// The attempt in flight ended with `outcome` (`status`: the answer's, if there was one).
    #[inline]
    pub(crate) fn answered(
        &mut self,
        attempt: &mut AttemptWatch,
        outcome: &Outcome,
        status: Option<StatusCode>,
    ) {
        if !std::mem::take(&mut attempt.in_flight) {
            return;
        }
        let span = &attempt.span;
        if !span.is_disabled() {
            span.record("outcome", outcome.verdict().as_str());
            if !outcome.is_success() {
                span.record("reason", outcome.reason().as_str());
            }
            if let Some(status) = status {
                span.record("status", status.as_u16());
            }
        }
        #[cfg(feature = "metrics")]
        if let Some(started) = attempt.started.take() {
            self.meter.answered(started, outcome, status);
        }
    }

    /// The attempt in flight ended unanswered: cut by the breaker, or out of time.
    pub(crate) fn unanswered(&mut self, attempt: &mut AttemptWatch, reason: Reason) {
        let outcome = Outcome::retryable(reason).with_accepted(false);
        self.answered(attempt, &outcome, None);
    }

    /// The attempt lost a race (to the other attempt of its request, or, under a failover, to
    /// another backend's) and is cancelled, if it is in flight (whether it was): its span says
    /// `cancelled`.
    pub(crate) fn cancelled(&self, attempt: &mut AttemptWatch) -> bool {
        if !std::mem::take(&mut attempt.in_flight) {
            return false;
        }
        attempt.span.record("outcome", "cancelled");
        true
    }

    /// A hedge's race ended with an answer: the hedge's (`won`), or the first attempt's.
    pub(crate) fn hedge_raced(&self, won: bool) {
        #[cfg(feature = "metrics")]
        self.meter.hedge(if won { "won" } else { "cancelled" });
        #[cfg(not(feature = "metrics"))]
        let _ = won;
    }

    /// A hedge failed while the attempt it raced was still in flight: that one goes on alone.
    pub(crate) fn hedge_failed(&self) {
        #[cfg(feature = "metrics")]
        self.meter.hedge("failed");
    }

    /// A hedge was due and not sent: the budget refused it (`reason`: `None`), or a guard
    /// (`reason`: its refusal's).
    pub(crate) fn hedge_refused(&self, attempt: &AttemptWatch, reason: Option<Reason>) {
        let _in = self.span(attempt).enter();
        let why = reason.map_or("budget", Reason::as_str);
        tracing::debug!(reason = why, "hedge not sent");
        #[cfg(feature = "metrics")]
        self.meter.hedge(match reason {
            None => "budget",
            Some(_) => "refused",
        });
    }

    /// The failure just recorded is retried after `delay`: one WARN line.
    pub(crate) fn retrying(
        &mut self,
        attempt: &AttemptWatch,
        number: u32,
        reason: Reason,
        delay: Duration,
    ) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        attempt.span.record("delay_ms", delay_ms);
        let _in = attempt.span.enter();
        tracing::warn!(
            retry_attempt = number,
            delay_ms,
            reason = reason.as_str(),
            "retrying request"
        );
        #[cfg(feature = "metrics")]
        self.meter.retrying(reason);
    }

    /// The failure just recorded is not retried, for `cause`: once at ERROR after retries (they
    /// were drawn from the budget, so these lines are bounded too), quietly without.
    pub(crate) fn giving_up(
        &self,
        attempt: &AttemptWatch,
        attempts: u32,
        reason: Reason,
        cause: GiveUpCause,
    ) {
        if attempts > 1 {
            let _in = attempt.span.enter();
            tracing::error!(
                attempts,
                reason = reason.as_str(),
                cause = cause.as_str(),
                "request failed after retrying"
            );
        } else {
            let _in = self.span(attempt).enter();
            log::quiet(Quiet::GaveUp(cause), attempts);
        }
        #[cfg(feature = "metrics")]
        self.meter.refused(Quiet::GaveUp(cause).cause());
    }

    /// An attempt was refused on this side, for `reason` (the throttle, the breaker, the rate
    /// limit), `attempts` having been sent before it.
    pub(crate) fn refused(&self, attempt: &AttemptWatch, reason: Reason, attempts: u32) {
        let _in = self.span(attempt).enter();
        log::quiet(Quiet::Refused(reason), attempts);
        #[cfg(feature = "metrics")]
        self.meter.refused(Quiet::Refused(reason).cause());
    }

    /// The request is out of time before its next attempt could start.
    pub(crate) fn out_of_time(&self) {
        #[cfg(feature = "metrics")]
        self.meter.refused("deadline");
    }

    /// The request ended with `output` (`failed`: a failed answer's reason) after `attempts`
    /// attempts.
    pub(crate) fn finished<B>(
        &self,
        output: &Result<Response<B>, Error>,
        failed: Option<Reason>,
        attempts: u32,
    ) {
        if self.request.is_disabled() && !cfg!(feature = "metrics") {
            return;
        }
        let (outcome, error_type) = match output {
            Ok(response) => {
                if failed.is_some() {
                    ("failure", failed)
                } else if let Some(fallback) = response.extensions().get::<LocalAnswer>() {
                    // The breaker refused or cut an attempt, before or after others were sent.
                    ("fallback", Some(fallback.outcome().reason()))
                } else {
                    ("success", None)
                }
            }
            Err(error) if attempts == 0 => ("refused", Some(error.reason())),
            Err(error) => ("failure", Some(error.reason())),
        };
        let span = &self.request;
        span.record("attempts", attempts);
        span.record("outcome", outcome);
        if let Some(reason) = error_type {
            span.record("error.type", reason.as_str());
        }
        #[cfg(feature = "metrics")]
        self.meter.finished(attempts, outcome, error_type);
    }

    /// The guards' state after an attempt was admitted, refused or answered: the throttle's
    /// drop probability and the breaker's state, for the metrics.
    pub(crate) fn health(&self, guards: &Guards) {
        #[cfg(feature = "metrics")]
        self.meter.health(guards.throttle(), guards.breaker());
        #[cfg(not(feature = "metrics"))]
        let _ = guards;
    }

    /// The rate limit `limit` gave the attempt a slot that starts at `start`.
    pub(crate) fn slot_reserved(&self, start: tokio::time::Instant, limit: &RateLimit) {
        #[cfg(feature = "metrics")]
        {
            let wait = start.saturating_duration_since(tokio::time::Instant::now());
            self.meter.slot_reserved(wait, limit);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (start, limit);
    }

    /// An attempt's event stream failed before its first content.
    pub(crate) fn stream_failed(&self) {
        #[cfg(feature = "metrics")]
        self.meter.stream_failed();
    }

    /// Whether the answers' token usage is recorded (feature `metrics`).
    pub(crate) fn counts_usage(&self) -> bool {
        cfg!(feature = "metrics")
    }

    /// What records the usage of a whole answer handed back, once its reader has read it
    /// (feature `metrics`; `None` without it).
    pub(crate) fn usage_recorder(&self) -> Option<UsageRecorder> {
        #[cfg(feature = "metrics")]
        return Some(UsageRecorder {
            provider: self.meter.provider(),
        });
        #[cfg(not(feature = "metrics"))]
        None
    }

    /// What counts how an event stream handed back ends.
    pub(crate) fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            #[cfg(feature = "metrics")]
            count: self.meter.stream_end(),
        }
    }
}

/// Records the tokens a whole answer said it used (feature `metrics`).
pub(crate) struct UsageRecorder {
    #[cfg(feature = "metrics")]
    provider: metrics::SharedString,
}

impl UsageRecorder {
    /// The answer said it used `counts`.
    pub(crate) fn record(self, counts: TokenCounts) {
        #[cfg(feature = "metrics")]
        meter::record_usage(self.provider, counts, "answer");
        #[cfg(not(feature = "metrics"))]
        let _ = counts;
    }
}

/// Counts how one event stream ends (feature `metrics`; nothing without it).
pub(crate) struct StreamEnd {
    #[cfg(feature = "metrics")]
    count: meter::StreamCount,
}

impl StreamEnd {
    /// Whether there is anything to count.
    pub(crate) fn counts(&self) -> bool {
        cfg!(feature = "metrics")
    }

    /// The stream ended with `outcome`, having said it used `usage` (`continuation`: the
    /// stream of a request that continues another).
    pub(crate) fn ended(self, outcome: &Outcome, usage: Option<TokenCounts>, continuation: bool) {
        #[cfg(feature = "metrics")]
        {
            if let Some(usage) = usage {
                let attempt = match (outcome.is_success(), continuation) {
                    (_, true) => "continuation",
                    (true, false) => "answer",
                    (false, false) => "interrupted",
                };
                meter::record_usage(self.count.provider.clone(), usage, attempt);
            }
            self.count.ended(outcome);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (outcome, usage, continuation);
    }
}

#[cfg(feature = "metrics")]
pub(crate) mod meter {
    //! The `metrics` half of [`Watch`](super::Watch).

    use std::sync::Arc;
    use std::time::Duration;

    use http::StatusCode;
    use metrics::{SharedString, counter, gauge, histogram};
    use stormguard_adaptive_throttle::AdaptiveThrottle;
    use stormguard_breaker::{CircuitBreaker, State};
    use stormguard_classify::usage::TokenCounts;
    use stormguard_classify::{Outcome, Reason};
    use stormguard_rate_limit::RateLimit;
    use tokio::time::Instant;

    use crate::metrics::{
        ATTEMPT_DURATION, BREAKER_STATE, ERROR_TYPE, HEDGES, PROVIDER, RATE_LIMIT_HEADROOM,
        RATE_LIMIT_WAIT, REFUSALS, REQUEST_ATTEMPTS, REQUEST_DURATION, RETRIES, STATUS_CODE,
        STREAMS, THROTTLE_DROP_PROBABILITY, TOKEN_USAGE,
    };

    /// The `gen_ai.provider.name` of a layer with no name.
    const UNKNOWN: &str = "unknown";

    pub(crate) struct Meter {
        provider: SharedString,
        started: Instant,
        /// The reason of the retry decided and not sent yet: counted when it is sent, so a retry
        /// the throttle, the breaker, the rate limit or the deadline then refuses is not.
        retry: Option<Reason>,
    }

    impl Meter {
        pub(super) fn provider(&self) -> SharedString {
            self.provider.clone()
        }

        pub(super) fn new(name: Option<&Arc<str>>) -> Self {
            Self {
                provider: provider(name),
                started: Instant::now(),
                retry: None,
            }
        }

        /// An attempt is sent: a retry, if one was decided, or a hedge.
        pub(super) fn sending(&mut self, hedge: bool) {
            if hedge {
                self.hedge("sent");
            } else if let Some(reason) = self.retry.take() {
                counter!(RETRIES, PROVIDER => self.provider.clone(), "reason" => reason.as_str())
                    .increment(1);
            }
        }

        /// Counts a hedge's `event` (`sent`, `won`, `cancelled`, `failed`, `budget`, `refused`).
        pub(super) fn hedge(&self, event: &'static str) {
            counter!(HEDGES, PROVIDER => self.provider.clone(), "outcome" => event).increment(1);
        }

        pub(super) fn answered(
            &self,
            started: Instant,
            outcome: &Outcome,
            status: Option<StatusCode>,
        ) {
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

        pub(super) fn retrying(&mut self, reason: Reason) {
            self.retry = Some(reason);
        }

        pub(super) fn refused(&self, cause: &'static str) {
            counter!(REFUSALS, PROVIDER => self.provider.clone(), "cause" => cause).increment(1);
        }

        pub(super) fn finished(&self, attempts: u32, outcome: &'static str, error: Option<Reason>) {
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
        pub(super) fn health(
            &self,
            throttle: Option<&AdaptiveThrottle>,
            breaker: Option<&CircuitBreaker>,
        ) {
            if let Some(throttle) = throttle {
                gauge!(THROTTLE_DROP_PROBABILITY, PROVIDER => self.provider.clone())
                    .set(throttle.probability());
            }
            if let Some(breaker) = breaker {
                let state = match breaker.state() {
                    State::Closed => 0.0,
                    State::HalfOpen => 1.0,
                    State::Open => 2.0,
                };
                gauge!(BREAKER_STATE, PROVIDER => self.provider.clone()).set(state);
            }
        }

        /// The rate limit admitted an attempt after `wait`.
        pub(super) fn slot_reserved(&self, wait: Duration, limit: &RateLimit) {
            histogram!(RATE_LIMIT_WAIT, PROVIDER => self.provider.clone())
                .record(wait.as_secs_f64());
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
        pub(super) fn stream_failed(&self) {
            counter!(STREAMS, PROVIDER => self.provider.clone(), "outcome" => "failed_before_content")
                .increment(1);
        }

        /// What counts a stream's end.
        pub(super) fn stream_end(&self) -> StreamCount {
            StreamCount {
                provider: self.provider.clone(),
            }
        }
    }

    /// Records the tokens an attempt's answer said it used (`attempt`: `answer`,
    /// `continuation`, `interrupted`).
    pub(crate) fn record_usage(provider: SharedString, counts: TokenCounts, attempt: &'static str) {
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

    /// Counts one stream's end, under its provider's label.
    pub(crate) struct StreamCount {
        pub(super) provider: SharedString,
    }

    impl StreamCount {
        pub(crate) fn ended(self, outcome: &Outcome) {
            let provider = self.provider;
            if outcome.is_success() {
                counter!(STREAMS, PROVIDER => provider, "outcome" => "complete").increment(1);
            } else {
                counter!(
                    STREAMS,
                    PROVIDER => provider,
                    "outcome" => "interrupted",
                    ERROR_TYPE => outcome.reason().as_str()
                )
                .increment(1);
            }
        }
    }

    pub(super) fn provider(name: Option<&Arc<str>>) -> SharedString {
        match name {
            Some(name) => SharedString::from(Arc::clone(name)),
            None => SharedString::const_str(UNKNOWN),
        }
    }

    /// A status code as a label (`"503"`).
    fn status_label(status: StatusCode) -> SharedString {
        SharedString::from(status.as_str().to_owned())
    }
}
