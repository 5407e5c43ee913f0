//! [`Ledger`]: the bookkeeping of one request across its attempts, and what it knows how to do
//! without moving the request: stamp an attempt, tell the guards and the budget how one ended,
//! ask the policy about a failure, and finish what is handed back. The path that moves the
//! request from state to state is the [future](crate::ResponseFuture)'s.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body;
use stormguard_breaker::Rejected;
use stormguard_classify::body::{PartialBody, Prefix, ResponseBody, Tail};
use stormguard_classify::headers::mark_do_not_retry;
use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{BoxError, Classify, Outcome, Permit, Reason, is_grpc};
use stormguard_deadline::Deadline;
use stormguard_jitter::Backoff;
use stormguard_rate_limit::Usage;
use stormguard_stream::continuation::{Continuations, Format};
use stormguard_stream::{ContinuationRequest, Continuer, GuardedStream};
use tower_service::Service;

use crate::attempt::Attempt;
use crate::body::ReplayBody;
use crate::error::{Error, GiveUpCause, deadline_failure, mark_rate_limited};
use crate::future::{Output, Step};
use crate::headers::{ensure_idempotency_key, is_idempotent};
use crate::layer::Config;
use crate::observe::{UsageRecorder, Watch};
use crate::policy::{Decision, Failed, Retries};
use crate::template::{Clock, Origin, Stamp, Template, deadline_of};

/// What a request starts with ([`Ledger::begin`]).
pub(crate) enum Begin<B> {
    /// Reading its body up to the replay cap.
    Buffer(Prefix<B>),
    /// Its first attempt.
    Send(Request<B>),
    /// Nothing to send.
    Failed(Error),
}

/// The bookkeeping of one request across its attempts.
pub(crate) struct Ledger<C, Bk: Backoff> {
    pub(crate) config: Arc<Config<C, Bk>>,
    /// What each attempt is made from.
    pub(crate) origin: Origin,
    /// Attempts handed to the service so far.
    pub(crate) sent: u32,
    pub(crate) deadline: Option<Deadline>,
    pub(crate) grpc: bool,
    /// What the retry policy remembers between attempts.
    pub(crate) retries: Retries<Bk::Schedule>,
    /// Its spans, log lines and metrics.
    pub(crate) watch: Watch,
    /// The attempt the path steps: its retry grant and rate-limit slot before it goes, its
    /// guards' permits while it is in flight.
    pub(crate) attempt: Attempt,
    /// The request's other attempt while a hedge is out, set aside while the path steps the
    /// one in [`attempt`](Self::attempt): the hedge's while it steps the request's own, the
    /// other way round while it steps the hedge's. Boxed: a request never hedged carries a
    /// pointer, not a second attempt, in a future that is moved whole.
    pub(crate) aside: Option<Box<Attempt>>,
    /// Hedges sent, or granted and on their way.
    pub(crate) hedges: u32,
}

impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The ledger of the request with head `head`, made a template until [`begin`](Self::begin)
    /// decides whether the request can be sent again.
    pub(crate) fn new(config: Arc<Config<C, Bk>>, head: Parts) -> Self {
        // The calls come before the struct: a call between its fields, were it to unwind, would
        // leave the fields before it to drop, so those would be built aside and copied in.
        let watch = Watch::new(config.name.as_ref());
        let grpc = is_grpc(&head.headers);
        Self {
            watch,
            config,
            origin: Origin::Replay(Template::new(head)),
            sent: 0,
            deadline: None,
            grpc,
            retries: Retries::new(),
            attempt: Attempt::default(),
            aside: None,
            hedges: 0,
        }
    }

    /// The span of the attempt the path steps (the request's before one), entered: see
    /// [`Watch::enter`].
    #[inline]
    pub(crate) fn enter(&self) -> Option<tracing::span::EnteredSpan> {
        self.watch.enter(&self.attempt.watch)
    }

    /// What the request starts with, its deadline set: reading its body, to buffer what could
    /// be sent again or what the deadline estimate reads, or its first attempt.
    pub(crate) fn begin<B: ReplayBody>(&mut self, body: B, clock: &mut Clock) -> Begin<B> {
        let cap = self.config.max_replay_body;
        let reads_body = self.config.timeout.as_ref().is_some_and(|s| s.reads_body());
        let buffer = (self.config.policy.may_retry() || reads_body)
            && body.size_hint().lower() <= u64::try_from(cap).unwrap_or(u64::MAX);
        if !buffer {
            return match self.once(true, clock) {
                Some(head) => Begin::Send(Request::from_parts(head, body)),
                None => Begin::Failed(Error::unreadable_body("no request head".into())),
            };
        }
        let timeout = self.config.timeout.as_ref();
        let Origin::Replay(template) = &mut self.origin else {
            return Begin::Failed(Error::unreadable_body("no request head".into()));
        };
        if body.is_end_stream() {
            self.deadline = deadline_of(timeout, &mut template.head, Some(&[]), clock);
            return Begin::Send(self.seal(Bytes::new(), None, clock));
        }
        self.deadline = if reads_body {
            // The layer's own deadline waits for the body; one already on the request holds.
            Deadline::from_extensions(&template.head.extensions)
        } else {
            deadline_of(timeout, &mut template.head, None, clock)
        };
        Begin::Buffer(Prefix::new(body, cap))
    }

    /// The request is sent once, as it came: its head, out of the template (`deadline`: with
    /// the deadline its head alone gives, not set yet).
    fn once(&mut self, deadline: bool, clock: &mut Clock) -> Option<Parts> {
        let Origin::Replay(template) = std::mem::replace(&mut self.origin, Origin::Once(None))
        else {
            return None;
        };
        let mut head = template.head;
        if deadline {
            self.set_deadline(&mut head, None, clock);
        }
        self.keep_head(&head);
        Some(head)
    }

    /// The request body was read up to the replay cap: the first attempt, built from it, goes
    /// out.
    pub(crate) fn buffered<S, B, RB>(
        &mut self,
        service: &mut S,
        bytes: Bytes,
        tail: Tail<B::Error>,
        rest: B,
    ) -> Step<S::Future, B, RB, C>
    where
        S: Service<Request<B>>,
        B: ReplayBody,
        B::Error: Into<BoxError>,
        RB: Body,
    {
        let mut clock = Clock::default();
        let read_twice = || Error::unreadable_body("request body read twice".into());
        let reads_body = self.config.timeout.as_ref().is_some_and(|s| s.reads_body());
        let trailers = match tail {
            Tail::Ended => None,
            Tail::Trailers(trailers) => Some(trailers),
            Tail::Failed(error) => return self.end(Err(Error::unreadable_body(error.into()))),
            // Longer than the cap: sent once, untouched, what was read followed by the rest.
            Tail::Open => {
                let Some(head) = self.once(reads_body, &mut clock) else {
                    return self.end(Err(read_twice()));
                };
                let body = B::from_partial(PartialBody::new(bytes, Tail::Open, rest));
                let request = Request::from_parts(head, body);
                return Step::Next(self.start(service, request, &mut clock));
            }
        };
        let timeout = self.config.timeout.as_ref();
        let Origin::Replay(template) = &mut self.origin else {
            return self.end(Err(read_twice()));
        };
        if reads_body {
            self.deadline = deadline_of(timeout, &mut template.head, Some(&bytes), &mut clock);
        }
        let request = self.seal(bytes, trailers, &mut clock);
        Step::Next(self.start(service, request, &mut clock))
    }

    /// Sets the request's deadline from the layer's timeout (`body`: the buffered body, for a
    /// timeout that reads it); a tighter deadline already on the request wins.
    fn set_deadline(&mut self, head: &mut Parts, body: Option<&[u8]>, clock: &mut Clock) {
        self.deadline = deadline_of(self.config.timeout.as_ref(), head, body, clock);
    }

    /// A request sent once keeps its head if a breaker's fallback may have to answer from it.
    fn keep_head(&mut self, head: &Parts) {
        if self.config.guards.breaker.is_some() && self.config.fallback.is_some() {
            self.origin = Origin::Once(Some(Box::new(head.clone())));
        }
    }

    /// Completes the template with the buffered body and builds the first attempt from it: a
    /// non-idempotent request that may be sent more than once gets its idempotency key here,
    /// once for all attempts.
    fn seal<B: ReplayBody>(
        &mut self,
        body: Bytes,
        trailers: Option<HeaderMap>,
        clock: &mut Clock,
    ) -> Request<B> {
        let may_retry = self.config.policy.may_retry();
        let stamp = self.stamp();
        let Origin::Replay(template) = &mut self.origin else {
            return Request::new(B::from_bytes(body));
        };
        if may_retry && !stamp.grpc && !is_idempotent(&template.head.method) {
            ensure_idempotency_key(&mut template.head.headers);
        }
        // What the first attempt carries goes into the template: every attempt's copy of the
        // headers then has room for it, and a retry replaces it in place (inserting into a copy,
        // which has no spare room, would grow it).
        stamp.write(&mut template.head.headers, clock);
        template.body = body;
        template.trailers = trailers;
        template.request()
    }

    /// What the next attempt carries.
    pub(crate) fn stamp(&self) -> Stamp {
        let propagated = self.deadline.filter(|_| self.config.propagation);
        Stamp {
            sent: self.sent,
            grpc: self.grpc,
            time_left: propagated.map(|deadline| (deadline, self.config.margin)),
        }
    }

    /// Times the attempt that just ended (under a deadline), for the retry decision.
    pub(crate) fn timed(&mut self) {
        if let Some(took) = self.attempt.took() {
            self.retries.attempt_took(took);
        }
    }

    /// Tells the guards and the budget how the attempt ended (and what a rate limit corrects
    /// its token weight from, for a success).
    #[inline]
    pub(crate) fn record(
        &mut self,
        outcome: &Outcome,
        headers: &HeaderMap,
        status: Option<StatusCode>,
    ) -> Option<Usage> {
        (self.watch).answered(&mut self.attempt.watch, outcome, status);
        let usage = self.attempt.permits.record(outcome, headers);
        if let Some(grant) = self.attempt.grant.take() {
            grant.settle(outcome);
        }
        self.watch.health(&self.config.guards);
        usage
    }

    /// Asks the policy whether the retryable failure with `outcome` is retried: each retry is
    /// logged at WARN with the attempt number and the reason, a give-up as `log` says.
    pub(crate) fn decide(&mut self, outcome: &Outcome) -> Decision {
        // Under a failover, an attempt that timed out is not tried again here: the next backend
        // takes the request, at once.
        if self.config.hand_off && outcome.reason() == Reason::Timeout && !outcome.is_accepted() {
            let cause = GiveUpCause::HandedOn;
            let attempt = &self.attempt.watch;
            (self.watch).giving_up(attempt, self.sent, outcome.reason(), cause);
            return Decision::GiveUp(cause);
        }
        let failed = Failed {
            outcome,
            sent: self.sent,
            replayable: self.origin.is_replay(),
            breaker_open: self.config.guards.breaker_open(),
            deadline: self.deadline.map(|deadline| deadline.instant()),
        };
        let mut decision = self.config.policy.decide(&mut self.retries, &failed);
        match &mut decision {
            Decision::Retry { delay, grant } => {
                // The next attempt's, until it is sent or given back. (The failed attempt may
                // have been a hedge; its retry is none.)
                self.attempt.grant = grant.take();
                self.attempt.hedge = false;
                let attempt = &self.attempt.watch;
                (self.watch).retrying(attempt, self.sent, outcome.reason(), *delay);
            }
            Decision::GiveUp(cause) => {
                let attempt = &self.attempt.watch;
                (self.watch).giving_up(attempt, self.sent, outcome.reason(), *cause);
            }
            Decision::NotReplayable => {}
        }
        decision
    }

    pub(crate) fn mark_final<RB>(&self, response: &mut Response<RB>) {
        let grpc = self.grpc || is_grpc(response.headers());
        mark_do_not_retry(response.headers_mut(), grpc);
    }

    /// The answer for a request the breaker refused or cut: the fallback's, or the error.
    pub(crate) fn breaker_answer<RB: Body>(&self, head: &Parts, rejected: Rejected) -> Output<RB> {
        match &self.config.fallback {
            Some(fallback) => Ok(fallback.answer(head, &rejected)),
            None => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        }
    }

    /// The service failed to get ready for a retry, which therefore never went out.
    pub(crate) fn not_ready<F, B, RB: Body>(&mut self, error: BoxError) -> Step<F, B, RB, C> {
        let outcome = self.config.classifier.classify_error(&*error);
        // A hedge is not sent; the attempt it was for goes on.
        if self.attempt.hedge {
            return Step::Next(self.hedge_not_sent(outcome.reason()));
        }
        self.end(Err(Error::failed(outcome, error, self.sent)))
    }

    /// The request ends with `output`: every ending of the path goes through here (a refusal's
    /// on its way into the `Refused` state), so that it is observed once, and a response's body
    /// bounded by the deadline, to its last byte.
    pub(crate) fn end<F, B, RB: Body>(&mut self, mut output: Output<RB>) -> Step<F, B, RB, C> {
        self.finish(&mut output);
        Step::Finish(output)
    }

    /// What [`end`](Self::end) does to the output.
    pub(crate) fn finish<RB: Body>(&mut self, output: &mut Output<RB>) {
        // A retry granted and never sent goes back now, not when the future is dropped.
        self.attempt.grant = None;
        // Told only when so: what is handed back says `false` unless marked.
        if self.retries.rate_limited_throughout(self.sent) {
            mark_rate_limited(output, true);
        }
        self.watch.finished(output, self.sent);
        if let (Ok(response), Some(deadline)) = (output, self.deadline) {
            response
                .body_mut()
                .set_deadline(deadline.instant(), body_deadline_exceeded);
        }
    }

    /// The event stream handed back: the breaker learns how it ends, the metrics count it, and
    /// the resume hook (if any) may continue it from the template.
    pub(crate) fn guard_stream<RB>(
        &mut self,
        mut stream: Box<GuardedStream<RB>>,
        continuer: (bool, impl FnOnce() -> Option<Continuer>),
    ) -> ResponseBody<RB>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let breaker = self.attempt.permits.take_breaker();
        let end = self.watch.stream_end();
        let clocks = self.clocks().cloned();
        let continuation = self
            .origin
            .head()
            .is_some_and(|head| head.extensions.get::<ContinuationRequest>().is_some());
        if breaker.is_some() || end.counts() || clocks.is_some() {
            *stream = (*stream).with_at_end(move |ending| {
                let outcome = ending.outcome();
                if let Some(breaker) = breaker {
                    breaker.record(outcome, &HeaderMap::new());
                }
                // The gap clock learns from streams that ended well.
                if let (Some(clocks), Some(gap), true) =
                    (clocks, ending.longest_gap(), outcome.is_success())
                {
                    clocks.record_gap(gap);
                }
                end.ended(outcome, ending.usage(), continuation);
            });
        }
        if let (Some(resume), Origin::Replay(template)) = (&self.config.resume, &self.origin) {
            if let Some(resume) = resume.make_resume(&template.head, &template.body) {
                *stream = (*stream).with_resume(resume);
            }
        } else if let Some(continuations) = self.continuation(continuer) {
            *stream = (*stream).with_resume(Box::new(continuations));
        }
        ResponseBody::boxed(*stream)
    }

    /// How the stream of a request in a format the engine knows is continued, or at least
    /// ended with its in-band error; none for a continuation request itself (the stream it
    /// continues goes on from its whole transcript) or a request sent once.
    /// `continuer`: whether a layer above continues the request's streams (it knows where a
    /// prefill is taken), and the continuer.
    fn continuation(
        &self,
        (given, continuer): (bool, impl FnOnce() -> Option<Continuer>),
    ) -> Option<Continuations> {
        let Origin::Replay(template) = &self.origin else {
            return None;
        };
        let format = Format::of_request(&template.head)?;
        if template
            .head
            .extensions
            .get::<ContinuationRequest>()
            .is_some()
        {
            return None;
        }
        let config = &self.config;
        let left = match config.continuation && (given || !config.prefill.rejected()) {
            true => config.policy.max_attempts.saturating_sub(1),
            false => 0,
        };
        let continuer = if left > 0 { continuer() } else { None };
        let (head, body) = (template.head.clone(), template.body.clone());
        Some(Continuations::new(format, head, body, continuer, left))
    }
}

/// The error of a body handed back whose deadline passed before its end.
fn body_deadline_exceeded() -> BoxError {
    Box::new(deadline_failure())
}

/// The response, whose body, once its reader has read it, corrects the rate limit's token
/// weight to the usage it reports (`usage`) and records that usage in the metrics (`recorder`).
pub(crate) fn settle_on_usage<RB: Body>(
    response: Response<ResponseBody<RB>>,
    usage: Option<Usage>,
    recorder: Option<UsageRecorder>,
) -> Response<ResponseBody<RB>> {
    response.map(|body| {
        body.watched(stormguard_rate_limit::USAGE_BODY_LIMIT, move |bytes| {
            if let Some(usage) = usage
                && let Some(used) = stormguard_rate_limit::usage_tokens(bytes)
            {
                usage.settle(used);
            }
            if let Some(recorder) = recorder
                && let Some(counts) = TokenCounts::of_json(bytes)
            {
                recorder.record(counts);
            }
        })
    })
}
