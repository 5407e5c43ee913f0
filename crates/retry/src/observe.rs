//! What the engine tells about one request: its `tracing` spans, its log lines (see [`log`]),
//! and what its [`Recorder`] counts and measures (with the `metrics` feature, see
//! [`metrics`](crate::metrics); nothing without it).
//!
//! Spans: `stormguard.request` (fields `backend`, `attempts`, `outcome`, `error.type`), and in it
//! one `stormguard.attempt` per attempt sent (`attempt`, `backend`, `outcome`, `reason`,
//! `status`, `delay_ms` when a retry follows it, and `http.request.resend_count` from the second
//! attempt on: how many times the request was sent before it, as OpenTelemetry's HTTP conventions
//! define it). Both are at INFO: an application's
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
use crate::record::{ChunkGaps, EngineRecorder, Recorder};

/// One request's spans and its [`Recorder`].
///
/// When no subscriber wants the spans (they are disabled) and without the `metrics` feature (the
/// recorder then records nothing), it costs next to nothing: nothing is recorded, cloned or entered, and no label is worked out. It lives in
/// the response future, which is moved whole, so it holds nothing it can read elsewhere (the
/// backend's name is the configuration's). What it keeps of each attempt is the attempt's own
/// ([`AttemptWatch`]), so that two attempts of a request in flight (a hedge) are watched apart.
pub(crate) struct Watch {
    request: Span,
    recorder: EngineRecorder,
}

/// What the [`Watch`] keeps of one attempt, in the attempt: its span (none before it is sent),
/// whether it is in flight (an attempt is answered once), and what the recorder keeps of it.
pub(crate) struct AttemptWatch {
    span: Span,
    in_flight: bool,
    recorded: <EngineRecorder as Recorder>::Attempt,
}

impl Default for AttemptWatch {
    fn default() -> Self {
        Self {
            span: Span::none(),
            in_flight: false,
            recorded: Default::default(),
        }
    }
}

impl Watch {
    /// The watch of a request to the backend named `name`, with head `head`.
    pub(crate) fn new(name: Option<&Arc<str>>, head: &http::request::Parts) -> Self {
        let request = tracing::info_span!(
            "stormguard.request",
            backend = name.map(|name| &**name),
            attempts = Empty,
            outcome = Empty,
            error.type = Empty,
        );
        Self {
            request,
            recorder: EngineRecorder::new(name, head),
        }
    }

    /// The request's body was read whole (to be sent again if need be): `body`.
    #[inline]
    pub(crate) fn request_read(&mut self, body: &[u8]) {
        if EngineRecorder::RECORDS {
            self.recorder.request_read(body);
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
    /// Its span carries OpenTelemetry's `http.request.resend_count` from the second attempt on:
    /// how many times the request was sent before it (HTTP's semantic conventions: absent on
    /// the first sending).
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
            http.request.resend_count = Empty,
        );
        if number > 1 {
            attempt.span.record("http.request.resend_count", number - 1);
        }
        attempt.in_flight = true;
        if hedge {
            let _in = attempt.span.enter();
            tracing::debug!(attempt = number, "hedging request");
        }
        self.recorder.sending(&mut attempt.recorded, hedge);
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
        self.recorder
            .answered(&mut attempt.recorded, outcome, status);
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
        self.recorder.hedge(if won { "won" } else { "cancelled" });
    }

    /// A hedge failed while the attempt it raced was still in flight: that one goes on alone.
    pub(crate) fn hedge_failed(&self) {
        self.recorder.hedge("failed");
    }

    /// A hedge was due and not sent: the budget refused it (`reason`: `None`), or a guard
    /// (`reason`: its refusal's).
    pub(crate) fn hedge_refused(&self, attempt: &AttemptWatch, reason: Option<Reason>) {
        let _in = self.span(attempt).enter();
        let why = reason.map_or("budget", Reason::as_str);
        tracing::debug!(reason = why, "hedge not sent");
        self.recorder.hedge(match reason {
            None => "budget",
            Some(_) => "refused",
        });
    }

    /// The failure just recorded (at backend `name`) is retried after `delay`: one WARN line,
    /// which names its backend itself, so that it reads whole in a log that shows no spans.
    pub(crate) fn retrying(
        &mut self,
        attempt: &AttemptWatch,
        name: Option<&str>,
        number: u32,
        reason: Reason,
        delay: Duration,
    ) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        attempt.span.record("delay_ms", delay_ms);
        let _in = attempt.span.enter();
        tracing::warn!(
            backend = name,
            retry_attempt = number,
            delay_ms,
            reason = reason.as_str(),
            "retrying request"
        );
        self.recorder.retrying(reason);
    }

    /// The failure just recorded (at backend `name`) is not retried, for `cause`: once at ERROR
    /// after retries (they were drawn from the budget, so these lines are bounded too), naming
    /// its backend, quietly without.
    pub(crate) fn giving_up(
        &self,
        attempt: &AttemptWatch,
        name: Option<&str>,
        attempts: u32,
        reason: Reason,
        cause: GiveUpCause,
    ) {
        if attempts > 1 {
            let _in = attempt.span.enter();
            tracing::error!(
                backend = name,
                attempts,
                reason = reason.as_str(),
                cause = cause.as_str(),
                "request failed after retrying"
            );
        } else {
            let _in = self.span(attempt).enter();
            log::quiet(Quiet::GaveUp(cause), attempts);
        }
        self.recorder.refused(Quiet::GaveUp(cause).cause());
    }

    /// An attempt was refused on this side, for `reason` (the throttle, the breaker, the rate
    /// limit), `attempts` having been sent before it.
    pub(crate) fn refused(&self, attempt: &AttemptWatch, reason: Reason, attempts: u32) {
        let _in = self.span(attempt).enter();
        log::quiet(Quiet::Refused(reason), attempts);
        self.recorder.refused(Quiet::Refused(reason).cause());
    }

    /// The request is out of time before its next attempt could start.
    pub(crate) fn out_of_time(&self) {
        self.recorder.refused("deadline");
    }

    /// The request ended with `output` (`failed`: a failed answer's reason) after `attempts`
    /// attempts.
    /// `streamed`: a success is an event stream whose guard tells how it ends.
    pub(crate) fn finished<B>(
        &self,
        output: &Result<Response<B>, Error>,
        failed: Option<Reason>,
        attempts: u32,
        streamed: impl FnOnce(&Response<B>) -> bool,
    ) {
        if self.request.is_disabled() && !EngineRecorder::RECORDS {
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
        let streamed = match output {
            Ok(response) => EngineRecorder::RECORDS && streamed(response),
            Err(_) => false,
        };
        let span = &self.request;
        span.record("attempts", attempts);
        span.record("outcome", outcome);
        if let Some(reason) = error_type {
            span.record("error.type", reason.as_str());
        }
        self.recorder.finished(
            attempts,
            outcome,
            error_type,
            streamed && error_type.is_none(),
        );
    }

    /// The guards' state after an attempt was admitted, refused or answered: the throttle's
    /// drop probability and the breaker's state, for the metrics.
    pub(crate) fn health(&self, guards: &Guards) {
        self.recorder.health(guards);
    }

    /// The rate limit `limit` gave the attempt a slot that starts at `start`.
    pub(crate) fn slot_reserved(&self, start: tokio::time::Instant, limit: &RateLimit) {
        self.recorder.slot_reserved(start, limit);
    }

    /// An attempt's event stream failed before its first content.
    pub(crate) fn stream_failed(&self) {
        self.recorder.stream_failed();
    }

    /// An attempt's event stream delivered its first content.
    pub(crate) fn first_chunk(&self) {
        self.recorder.first_chunk();
    }

    /// What a stream's guard tells the wait between two of its content events, if anything
    /// records it.
    pub(crate) fn chunk_gaps(&self) -> Option<ChunkGaps> {
        self.recorder.chunk_gaps()
    }

    /// Whether the answers' token usage is recorded (feature `metrics`).
    pub(crate) fn counts_usage(&self) -> bool {
        EngineRecorder::RECORDS
    }

    /// What records the usage of a whole answer handed back, once its reader has read it
    /// (feature `metrics`; `None` without it).
    pub(crate) fn usage_recorder(&self) -> Option<UsageRecorder> {
        EngineRecorder::RECORDS.then(|| UsageRecorder {
            label: self.recorder.label(),
        })
    }

    /// What counts how an event stream handed back ends.
    pub(crate) fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            label: self.recorder.label(),
        }
    }
}

/// Records the tokens a whole answer said it used (feature `metrics`).
pub(crate) struct UsageRecorder {
    label: <EngineRecorder as Recorder>::Label,
}

impl UsageRecorder {
    /// The answer, `body`, said it used `counts`.
    pub(crate) fn record(self, counts: TokenCounts, body: &[u8]) {
        EngineRecorder::answer_used(self.label, counts, body);
    }
}

/// Counts how one event stream ends (feature `metrics`; nothing without it).
pub(crate) struct StreamEnd {
    label: <EngineRecorder as Recorder>::Label,
}

impl StreamEnd {
    /// Whether there is anything to count.
    pub(crate) fn counts(&self) -> bool {
        EngineRecorder::RECORDS
    }

    /// The stream ended with `outcome`, having said it used `usage` (`continuation`: the
    /// stream of a request that continues another) and named `model`.
    pub(crate) fn ended(
        self,
        outcome: &Outcome,
        usage: Option<TokenCounts>,
        continuation: bool,
        model: Option<&str>,
    ) {
        EngineRecorder::stream_ended(self.label, outcome, usage, continuation, model);
    }
}
