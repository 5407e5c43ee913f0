//! [`Verdict`]: what comes of each thing an attempt can end with (an answer, an error, a guard's
//! refusal, a cut, a fired clock, a stream opened), as the request's books decide it. The path
//! (the [future](crate::ResponseFuture)) acts on the verdict: a retry waits, an ending is handed
//! back, an attempt out of the race leaves it.

use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, response};
use http_body::Body;
use stormguard_breaker::{BreakerOpen, Rejected};
use stormguard_budget::Ticket;
use stormguard_classify::body::ResponseBody;
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_jitter::Backoff;
use stormguard_stream::{Continuer, Opening};
use tokio::time::Instant;

use crate::admission::Refusal;
use crate::attempt::{Attempt, Due};
use crate::config::Config;
use crate::error::Error;
use crate::ledger::{Ledger, Output, settle_on_usage};
use crate::policy::Decision;
use crate::timed_out::{AttemptTimedOut, attempt_timeout};

/// What comes of an attempt that ended, or was not sent.
pub(crate) enum Verdict<RB: Body> {
    /// The request ends with this (finished: observed, its body bounded by the deadline).
    End(Output<RB>),
    /// A retry goes after this delay, paid for with the budget's ticket (none: a retry an open
    /// breaker is to refuse).
    Retry(Duration, Option<Ticket>),
    /// The attempt leaves the race: it failed while the request's other attempt was in flight,
    /// or it is a hedge that was not sent. The other goes on alone.
    Out,
}

/// Before an attempt is sent: the deadline, a refusal, a service not ready.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The request ends with `output`: every ending goes through here.
    #[inline(always)]
    pub(crate) fn end<RB: Body>(&mut self, mut output: Output<RB>) -> Verdict<RB> {
        self.finish(&mut output);
        Verdict::End(output)
    }

    /// The deadline passed before `attempt` could be sent (a hedge is only not sent).
    pub(crate) fn too_late<RB: Body>(&mut self, attempt: &Attempt) -> Verdict<RB> {
        if attempt.hedge {
            return self.hedge_not_sent(attempt, Reason::DeadlineExceeded);
        }
        self.watch.out_of_time();
        let sent = self.sent;
        self.end(Err(Error::deadline_exceeded(sent)))
    }

    /// A guard refused `attempt` (its request's head: `head`): the request ends with the
    /// breaker's fallback or the error (a hedge is only not sent).
    pub(crate) fn refused<RB: Body>(
        &mut self,
        attempt: &Attempt,
        head: &Parts,
        refusal: Refusal,
    ) -> Verdict<RB> {
        if attempt.hedge {
            return self.hedge_not_sent(attempt, refusal.reason());
        }
        let sent = self.sent;
        self.watch.refused(&attempt.watch, refusal.reason(), sent);
        self.watch.health(&self.config.guards);
        // A refused retry of a 429 hands the 429 back (a breaker's fallback still answers).
        let fallback = matches!(refusal, Refusal::Breaker(_)) && self.config.fallback.is_some();
        if !fallback && let Some(answered) = self.answered_429() {
            return self.end(Ok(answered));
        }
        let output = match refusal {
            Refusal::Breaker(rejected) => self.breaker_answer(head, rejected),
            Refusal::Throttled => Err(Error::throttled(sent)),
            Refusal::RateLimited(limited) => {
                Err(Error::refused(limited.outcome(), Box::new(limited), sent))
            }
            Refusal::Concurrency(full) => Err(Error::refused(full.outcome(), Box::new(full), sent)),
        };
        self.end(output)
    }

    /// A hedge not sent: a guard refused it (`reason`), or the deadline came first. The
    /// request's attempt goes on alone.
    fn hedge_not_sent<RB: Body>(&mut self, attempt: &Attempt, reason: Reason) -> Verdict<RB> {
        self.watch.hedge_refused(&attempt.watch, Some(reason));
        Verdict::Out
    }

    /// The service failed to get ready for `attempt`, which therefore never went out (a hedge is
    /// only not sent).
    pub(crate) fn not_ready<RB: Body>(
        &mut self,
        attempt: &Attempt,
        error: BoxError,
    ) -> Verdict<RB> {
        let outcome = self.config.classifier.classify_error(&*error);
        if attempt.hedge {
            return self.hedge_not_sent(attempt, outcome.reason());
        }
        let sent = self.sent;
        self.end(Err(Error::failed(outcome, error, sent)))
    }

    /// The answer for a request the breaker refused or cut: the fallback's, or the error.
    fn breaker_answer<RB: Body>(&self, head: &Parts, rejected: Rejected) -> Output<RB> {
        match &self.config.fallback {
            Some(fallback) => Ok(fallback.answer(head, &rejected)),
            None => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        }
    }
}

/// After an attempt is sent: its answer, its failure, a cut, its clock.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// `attempt` failed without a response, with `outcome`: fatal, given up on, or retried (out
    /// of the race, while the other attempt is in flight: `racing`).
    pub(crate) fn failed<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        outcome: Outcome,
        error: BoxError,
    ) -> Verdict<RB> {
        self.timed(attempt);
        self.record(attempt, &outcome, &HeaderMap::new(), None);
        if racing {
            return self.out(attempt);
        }
        let sent = self.sent;
        if !outcome.is_retryable() {
            return self.end(Err(Error::failed(outcome, error, sent)));
        }
        match self.decide(attempt, &outcome) {
            Decision::Retry { delay, ticket } => {
                self.retrying::<RB>(None, &outcome);
                Verdict::Retry(delay, ticket)
            }
            Decision::NotReplayable => self.end(Err(Error::failed(outcome, error, sent))),
            Decision::GiveUp(cause) => self.end(Err(Error::given_up(outcome, error, sent, cause))),
        }
    }

    /// A response to `attempt` was classified: handed back, or retried.
    pub(crate) fn judged<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        mut response: Response<ResponseBody<RB>>,
        outcome: Outcome,
    ) -> Verdict<RB> {
        if outcome.is_success() {
            let response = self.succeeded(attempt, response, &outcome);
            return self.end(Ok(response));
        }
        self.record(
            attempt,
            &outcome,
            response.headers(),
            Some(response.status()),
        );
        self.timed(attempt);
        if racing {
            return self.out(attempt);
        }
        let cause = match outcome.is_retryable() {
            false => None,
            true => match self.decide(attempt, &outcome) {
                // The retry answers instead: this response is dropped, or kept if a 429.
                Decision::Retry { delay, ticket } => {
                    self.retrying(Some(response), &outcome);
                    return Verdict::Retry(delay, ticket);
                }
                Decision::NotReplayable => None,
                Decision::GiveUp(cause) => Some(cause),
            },
        };
        self.hand_back_failure(&mut response, outcome, cause);
        self.end(Ok(response))
    }

    /// A `response` to `attempt` that is a success (`outcome`): the request ends with it, settled
    /// on the usage it reports. (How long it took matters only before a retry.)
    #[inline(always)]
    pub(crate) fn succeeded<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        response: Response<ResponseBody<RB>>,
        outcome: &Outcome,
    ) -> Response<ResponseBody<RB>> {
        // The concurrency limit learns from the head, but the answer keeps its place until its
        // body is read (a stream's was taken to be told at its end already).
        let place = attempt.permits.take_place();
        let usage = self.record(
            attempt,
            outcome,
            response.headers(),
            Some(response.status()),
        );
        self.config.policy.succeeded();
        let recorder = self.usage_recorder(&response);
        let settles = usage.is_some() || recorder.is_some();
        // The common answer, nothing to settle or hold, is returned as it came: each move of a
        // response is a copy of its head.
        if !settles && place.is_none() {
            return response;
        }
        let response = if settles {
            settle_on_usage(response, usage, recorder)
        } else {
            response
        };
        match place {
            None => response,
            Some(mut place) => {
                place.learn(outcome);
                response.map(|body| body.holding(place))
            }
        }
    }

    /// An event stream was read up to its first content event (handed back, its guards told how
    /// it ends when it ends), or failed before it (judged like a failed response). `continuer`:
    /// who continues it (`given`: a router above, which knows where a prefill is taken).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn opened<RB>(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        head: response::Parts,
        opening: Opening<RB>,
        since: Instant,
        continuer: impl FnOnce(&std::sync::Arc<Config<C, Bk>>) -> Option<Continuer>,
        given: bool,
    ) -> Verdict<RB>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let stream = match opening {
            Opening::Open(stream) => stream,
            Opening::Failed {
                outcome,
                read,
                rest,
            } => {
                self.watch.stream_failed();
                let response = Response::from_parts(head, ResponseBody::from_read(read, rest));
                return self.judged(attempt, racing, response, outcome);
            }
        };
        if stream.events() > 0 {
            self.watch.first_chunk();
        }
        if let Some(clocks) = &self.config.clocks
            && stream.events() > 0
        {
            clocks.record_first_content(since.elapsed());
            if let Some(took) = attempt.in_flight() {
                clocks.record_to_first_content(true, took);
            }
        }
        let body = self.guard_stream(attempt, stream, continuer, given);
        let response = Response::from_parts(head, body);
        self.judged(attempt, racing, response, Outcome::success())
    }

    /// `attempt` failed while the other attempt of the request was in flight: it leaves the
    /// race, and the other goes on alone.
    fn out<RB: Body>(&mut self, attempt: &Attempt) -> Verdict<RB> {
        if attempt.hedge {
            self.watch.hedge_failed();
        }
        Verdict::Out
    }

    /// A stall opened the breaker and cut `attempt` in flight (waiting for its answer, or for
    /// the error body it is read to be classified by): the request ends as if refused.
    pub(crate) fn cut<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        open: BreakerOpen,
    ) -> Verdict<RB> {
        (self.watch).unanswered(&mut attempt.watch, Reason::BreakerOpen);
        let rejected = Rejected::Open(open);
        let output = match (self.origin.head(), &self.config.fallback) {
            (Some(head), Some(_)) => self.breaker_answer(head, rejected),
            _ => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        };
        self.end(output)
    }

    /// `attempt`'s head clock fired while it waited for its answer: if the request can go on
    /// (see `RetryPolicy::may_go_on`), the attempt is abandoned (dropped with the state the
    /// verdict replaces), a timeout for its guards, and the request goes on as after any failure
    /// of its attempt; if not (`None`), it keeps the attempt, which may still answer within the
    /// deadline.
    pub(crate) fn clock_fired<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
    ) -> Option<Verdict<RB>> {
        if !self.may_go_on(racing) {
            attempt.head_by = Due::Never;
            return None;
        }
        let after = attempt.in_flight().unwrap_or_default();
        let error = Box::new(AttemptTimedOut::new(after));
        Some(self.failed(attempt, racing, attempt_timeout(), error))
    }

    /// The deadline passed with `attempt` in flight, if it is (a pass told already is gone): a
    /// timeout, which the breaker counts as a health failure.
    pub(crate) fn expire(&mut self, attempt: &mut Attempt) {
        attempt.permits.time_out();
        (self.watch).unanswered(&mut attempt.watch, Reason::DeadlineExceeded);
    }
}
