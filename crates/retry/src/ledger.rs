//! [`Ledger`]: the books of one request across its attempts, and what it knows how to do without
//! moving the request: make each attempt from the request, stamp it, tell an attempt's guards and
//! the budget how it ended, ask the policy about a failure, and finish what is handed back. It
//! neither calls the service nor makes the path's states: that is the
//! [future](crate::ResponseFuture)'s, which hands it each attempt it asks about.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode, response};
use http_body::Body;
use stormguard_classify::body::{PartialBody, Prefix, ResponseBody, Tail};
use stormguard_classify::headers::mark_do_not_retry;
use stormguard_classify::usage::TokenCounts;
use stormguard_classify::{BoxError, Classify, Outcome, Reason, is_grpc};
use stormguard_deadline::Deadline;
use stormguard_deadline::clocks::RequestShape;
use stormguard_jitter::Backoff;
use stormguard_rate_limit::Usage;
use stormguard_stream::continuation::{Continuations, Format};
use stormguard_stream::{Continuer, GuardedStream, StreamPolicy, is_event_stream};
use tokio::time::Instant;

use crate::attempt::{Attempt, Due};
use crate::body::ReplayBody;
use crate::config::Config;
use crate::error::{Error, GiveUpCause, deadline_failure, mark_rate_limited};
use crate::headers::{ensure_idempotency_key, is_idempotent};
use crate::observe::{UsageRecorder, Watch};
use crate::policy::{Decision, FailedAttempt, Retries};
use crate::route::Report;
use crate::template::{Now, Origin, Stamp, Template, deadline_of};

/// What the engine hands back.
pub(crate) type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

/// What a request starts with ([`Ledger::begin`]).
pub(crate) enum Begin<B> {
    /// Reading its body up to the replay cap.
    Buffer(Prefix<B>),
    /// Its first attempt.
    Send(Request<B>),
    /// Nothing to send.
    Failed(Error),
}

/// The books of one request across its attempts.
pub(crate) struct Ledger<C, Bk: Backoff> {
    pub(crate) config: Arc<Config<C, Bk>>,
    /// What each attempt is made from.
    pub(crate) origin: Origin,
    /// Attempts handed to the service so far.
    pub(crate) sent: u32,
    pub(crate) deadline: Option<Deadline>,
    grpc: bool,
    /// What the retry policy remembers between attempts.
    retries: Retries<Bk::Schedule>,
    /// Its spans, log lines and metrics.
    pub(crate) watch: Watch,
    /// A router above takes the request elsewhere when an attempt times out (see
    /// [`Route::with_hand_off`](crate::Route::with_hand_off)).
    hand_off: bool,
    /// A router above takes a 429 elsewhere at once (see
    /// [`Route::with_hand_off_429`](crate::Route::with_hand_off_429)).
    hand_off_429: bool,
    /// The request continues another's stream.
    pub(crate) continuation: bool,
    /// The last failure handed back, and why the engine gave up on it: for the [`Report`].
    failed: Option<Outcome>,
    gave_up: Option<GiveUpCause>,
    /// The 429 the server answered before the retry waiting to go (its head, its whole body and
    /// outcome): handed back in place of a guard's refusal of that retry, so that a local
    /// refusal never hides the server's answer and its hint. Set only on the failure path.
    answered_429: Option<Box<(response::Parts, Bytes, Outcome)>>,
}

impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The books of the request with head `head`, made a template until [`begin`](Self::begin)
    /// decides whether the request can be sent again.
    pub(crate) fn new(config: Arc<Config<C, Bk>>, head: Parts) -> Self {
        // The calls come before the struct: a call between its fields, were it to unwind, would
        // leave the fields before it to drop, so those would be built aside and copied in.
        let watch = Watch::new(config.name.as_ref(), &head);
        let grpc = is_grpc(&head.headers);
        Self {
            watch,
            config,
            origin: Origin::Replay(Template::new(head)),
            sent: 0,
            deadline: None,
            grpc,
            retries: Retries::new(),
            hand_off: false,
            hand_off_429: false,
            continuation: false,
            failed: None,
            gave_up: None,
            answered_429: None,
        }
    }

    /// The request is routed (see [`Route`](crate::Route)): a timeout is handed on, a 429 too if
    /// the router says so, and it may be a continuation.
    pub(crate) fn routed(&mut self, route: &crate::route::Route) {
        self.hand_off = route.hand_off;
        self.hand_off_429 = route.hand_off_429;
        self.continuation = route.continuation;
        if let (Some(shape), Origin::Replay(template)) = (&route.body_shape, &mut self.origin) {
            template.body_shape = Some(shape.clone());
        }
    }

    /// The span of `attempt` (the request's before one is sent), entered: see [`Watch::enter`].
    #[inline]
    pub(crate) fn enter(&self, attempt: &Attempt) -> Option<tracing::span::EnteredSpan> {
        self.watch.enter(&attempt.watch)
    }

    /// What the request starts with, its deadline set: reading its body, to buffer what could
    /// be sent again or what the deadline estimate reads, or its first attempt.
    pub(crate) fn begin<B: ReplayBody>(&mut self, body: B, now: &mut Now) -> Begin<B> {
        let cap = self.config.max_replay_body;
        let reads_body = self.config.timeout.as_ref().is_some_and(|s| s.reads_body());
        let buffer = (self.config.policy.may_retry() || reads_body)
            && body.size_hint().lower() <= u64::try_from(cap).unwrap_or(u64::MAX);
        if !buffer {
            return match self.once(true, now) {
                Some(head) => Begin::Send(Request::from_parts(head, body)),
                None => Begin::Failed(Error::unreadable_body("no request head".into())),
            };
        }
        let timeout = self.config.timeout.as_ref();
        let Origin::Replay(template) = &mut self.origin else {
            return Begin::Failed(Error::unreadable_body("no request head".into()));
        };
        if body.is_end_stream() {
            self.deadline = deadline_of(timeout, &mut template.head, Some(&[]), now);
            return Begin::Send(self.seal(Bytes::new(), None, now));
        }
        self.deadline = if reads_body {
            // The layer's own deadline waits for the body; one already on the request holds.
            Deadline::from_extensions(&template.head.extensions)
        } else {
            deadline_of(timeout, &mut template.head, None, now)
        };
        Begin::Buffer(Prefix::new(body, cap))
    }

    /// The request is sent once, as it came: its head, out of the template (`deadline`: with
    /// the deadline its head alone gives, not set yet).
    fn once(&mut self, deadline: bool, now: &mut Now) -> Option<Parts> {
        let Origin::Replay(template) = std::mem::replace(&mut self.origin, Origin::Once(None))
        else {
            return None;
        };
        let mut head = template.head;
        if deadline {
            self.deadline = deadline_of(self.config.timeout.as_ref(), &mut head, None, now);
        }
        // A request sent once keeps its head if a breaker's fallback may have to answer from it.
        if self.config.guards.breaker().is_some() && self.config.fallback.is_some() {
            self.origin = Origin::Once(Some(Box::new(head.clone())));
        }
        Some(head)
    }

    /// The request body was read up to the replay cap: the first attempt, made from it.
    pub(crate) fn buffered<B>(
        &mut self,
        bytes: Bytes,
        tail: Tail<B::Error>,
        rest: B,
        now: &mut Now,
    ) -> Result<Request<B>, Error>
    where
        B: ReplayBody,
        B::Error: Into<BoxError>,
    {
        let read_twice = || Error::unreadable_body("request body read twice".into());
        let reads_body = self.config.timeout.as_ref().is_some_and(|s| s.reads_body());
        let trailers = match tail {
            Tail::Ended => None,
            Tail::Trailers(trailers) => Some(Box::new(trailers)),
            Tail::Failed(error) => return Err(Error::unreadable_body(error.into())),
            // Longer than the cap: sent once, untouched, what was read followed by the rest.
            Tail::Open => {
                let head = self.once(reads_body, now).ok_or_else(read_twice)?;
                let body = B::from_partial(PartialBody::new(bytes, Tail::Open, rest));
                return Ok(Request::from_parts(head, body));
            }
        };
        let timeout = self.config.timeout.as_ref();
        let Origin::Replay(template) = &mut self.origin else {
            return Err(read_twice());
        };
        if reads_body {
            self.deadline = deadline_of(timeout, &mut template.head, Some(&bytes), now);
        }
        Ok(self.seal(bytes, trailers, now))
    }

    /// Completes the template with the buffered body and builds the first attempt from it: a
    /// non-idempotent request that may be sent more than once gets its idempotency key here,
    /// once for all attempts.
    fn seal<B: ReplayBody>(
        &mut self,
        body: Bytes,
        trailers: Option<Box<HeaderMap>>,
        now: &mut Now,
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
        stamp.write(&mut template.head.headers, now);
        self.watch.request_read(&body);
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

    /// Whether the request's deadline has passed.
    pub(crate) fn out_of_time(&self, now: &mut Now) -> bool {
        self.deadline
            .is_some_and(|deadline| now.get() >= deadline.instant())
    }

    /// `attempt` is handed to the service: counted, timed under a deadline, and watched.
    pub(crate) fn sending(&mut self, attempt: &mut Attempt, now: &mut Now) {
        attempt.send(self.deadline.is_some().then(|| now.get()));
        self.sent = self.sent.saturating_add(1);
        let name = self.config.name.as_deref();
        (self.watch).sending(&mut attempt.watch, self.sent, name, attempt.hedge);
    }

    /// Times `attempt`, which just ended (under a deadline), for the retry decision.
    pub(crate) fn timed(&mut self, attempt: &mut Attempt) {
        if let Some(took) = attempt.took() {
            self.retries.attempt_took(took);
        }
    }

    /// Tells `attempt`'s guards and ticket how it ended (and what a rate limit corrects its token
    /// weight from, for a success).
    #[inline]
    pub(crate) fn record(
        &mut self,
        attempt: &mut Attempt,
        outcome: &Outcome,
        headers: &HeaderMap,
        status: Option<StatusCode>,
    ) -> Option<Usage> {
        (self.watch).answered(&mut attempt.watch, outcome, status);
        if !outcome.is_success() {
            self.config.policy.failed(outcome);
        }
        let usage = attempt.settle(outcome, headers);
        self.watch.health(&self.config.guards);
        usage
    }

    /// Asks the policy whether the retryable failure of `attempt`, with `outcome`, is retried:
    /// each retry is logged at WARN with the attempt number and the reason, a give-up as `log`
    /// says.
    pub(crate) fn decide(&mut self, attempt: &Attempt, outcome: &Outcome) -> Decision {
        let failed = FailedAttempt {
            outcome,
            sent: self.sent,
            replayable: self.origin.is_replay(),
            breaker_open: self.config.guards.breaker_open(),
            deadline: self.deadline,
            hand_off: self.hand_off,
            hand_off_429: self.hand_off_429,
        };
        let decision = self.config.policy.decide(&mut self.retries, &failed);
        let reason = outcome.reason();
        let name = self.config.name.as_deref();
        match &decision {
            Decision::Retry { delay, .. } => {
                (self.watch).retrying(&attempt.watch, name, self.sent, reason, *delay);
            }
            Decision::GiveUp(cause) => {
                (self.watch).giving_up(&attempt.watch, name, self.sent, reason, *cause);
                self.gave_up = Some(*cause);
            }
            Decision::NotReplayable => {}
        }
        decision
    }

    /// Whether a request whose attempt's clock fired can go on without it (`racing`: its other
    /// attempt is in flight): see `RetryPolicy::may_go_on`.
    pub(crate) fn may_go_on(&self, racing: bool) -> bool {
        let replayable = self.origin.is_replay();
        (self.config.policy).may_go_on(racing, replayable, self.sent, self.hand_off)
    }

    /// A failed `response` is handed back with `outcome`: marked "do not retry" where this
    /// layer could have retried it (`cause`: why it gave up, if it did), for a layer above.
    pub(crate) fn hand_back_failure<RB>(
        &mut self,
        response: &mut Response<RB>,
        outcome: Outcome,
        cause: Option<GiveUpCause>,
    ) {
        let may_retry = self.origin.is_replay() && self.config.policy.may_retry();
        if cause.is_some() || (!outcome.is_retryable() && may_retry) {
            let grpc = self.grpc || is_grpc(response.headers());
            mark_do_not_retry(response.headers_mut(), grpc);
        }
        if let Some(cause) = cause {
            response.extensions_mut().insert(cause);
        }
        self.failed = Some(outcome);
    }

    /// A retry of the failure `response` (with `outcome`) is to go: a 429 whose body was read
    /// whole is kept until the retry is sent, any other failure forgets the one kept.
    pub(crate) fn retrying<RB: Body>(
        &mut self,
        response: Option<Response<ResponseBody<RB>>>,
        outcome: &Outcome,
    ) {
        self.answered_429 = response
            .filter(|_| outcome.reason() == Reason::RateLimited)
            .and_then(|response| {
                let (head, body) = response.into_parts();
                Some(Box::new((head, body.into_whole()?, *outcome)))
            });
    }

    /// The 429 the server answered before a retry a guard refused, if one is kept: handed back
    /// as the engine hands back a failure it gave up on (marked "do not retry", its own
    /// `Retry-After` kept), in place of the refusal.
    pub(crate) fn answered_429<RB: Body>(&mut self) -> Option<Response<ResponseBody<RB>>> {
        let (head, bytes, outcome) = *self.answered_429.take()?;
        let mut response = Response::from_parts(head, ResponseBody::local(bytes));
        let grpc = self.grpc || is_grpc(response.headers());
        mark_do_not_retry(response.headers_mut(), grpc);
        self.failed = Some(outcome);
        Some(response)
    }

    /// What every ending of the request does to its output, once: the run of 429s told, the
    /// ending observed, and a response's body bounded by the deadline, to its last byte.
    pub(crate) fn finish<RB: Body>(&mut self, output: &mut Output<RB>) {
        // Told only when so: what is handed back says `false` unless marked.
        if self.retries.rate_limited_throughout(self.sent) {
            mark_rate_limited(output, true);
        }
        let failed = self.failed.map(|outcome| outcome.reason());
        let guarded = self.config.streams.is_some();
        let streamed = |response: &Response<_>| guarded && is_event_stream(response.headers());
        self.watch.finished(output, failed, self.sent, streamed);
        if let (Ok(response), Some(deadline)) = (output, self.deadline) {
            response
                .body_mut()
                .set_deadline(deadline.instant(), body_deadline_exceeded);
        }
    }

    /// What the request came to, for a router above, once it ended with `output`.
    pub(crate) fn report<RB: Body>(&self, output: &Output<RB>) -> Report {
        match output {
            Err(error) => Report::of_error(error),
            Ok(_) => Report {
                outcome: self.failed.unwrap_or_else(Outcome::success),
                attempts: self.sent,
                gave_up: self.failed.and(self.gave_up),
                rate_limited_throughout: self.retries.rate_limited_throughout(self.sent),
            },
        }
    }

    /// When `attempt`, in flight, is abandoned for want of its head, worked out once per
    /// attempt, the first time it waits (an answer that comes at once never reads the clock).
    pub(crate) fn head_clock(&mut self, attempt: &mut Attempt) -> Option<Instant> {
        match attempt.head_by {
            Due::At(at) => return Some(at),
            Due::Never => return None,
            Due::Unset => {}
        }
        let at = match &self.config.clocks {
            Some(clocks) => {
                // Sent in this same poll, if no deadline timed it already.
                let started = *attempt.started.get_or_insert_with(Instant::now);
                let shape = self.origin.shape(&clocks.settings().whole);
                clocks
                    .head(shape)
                    .and_then(|wait| started.checked_add(wait))
            }
            None => None,
        };
        attempt.head_by = at.map_or(Due::Never, Due::At);
        at
    }

    /// What the request is, as its clocks read it (without clocks: a whole answer, unsized).
    pub(crate) fn shape(&mut self) -> RequestShape {
        match &self.config.clocks {
            Some(clocks) => self.origin.shape(&clocks.settings().whole),
            None => RequestShape::new(false, Duration::MAX),
        }
    }

    /// Whether the request asks for an event stream, as its clocks read it.
    pub(crate) fn streaming(&mut self) -> bool {
        self.shape().streaming
    }

    /// The head of a healthy answer `attempt` waited for came: its backend's head clock learns
    /// how long it took.
    pub(crate) fn learn_head(&self, attempt: &Attempt, streaming: bool) {
        if let (Some(clocks), Some(took)) = (&self.config.clocks, attempt.in_flight()) {
            clocks.record_head(streaming, took);
        }
    }

    /// `attempt`, which had waited for its first content, lost a race: if it is not a hedge, what
    /// it waited teaches the backend's time to first content as a lower bound (it waited past
    /// the hedge's delay, and would have taken longer still); a hedge's own wait is no such bound.
    pub(crate) fn learn_lost(&mut self, attempt: &Attempt) {
        if attempt.hedge {
            return;
        }
        if let (Some(waited), true) = (attempt.in_flight(), self.config.clocks.is_some()) {
            let streaming = self.streaming();
            if let Some(clocks) = &self.config.clocks {
                clocks.record_to_first_content(streaming, waited);
            }
        }
    }

    /// The stream guard's policy for an attempt's stream: the layer's, with the backend's
    /// learned first-content clock, and its gap clock where it is tighter than the progress
    /// limit; while the gap is not learned, its cold limit if the stream would be continued
    /// (`can`: someone can continue it; `given`: a router above gave the continuer).
    pub(crate) fn stream_policy(
        &mut self,
        policy: StreamPolicy,
        can: bool,
        given: bool,
    ) -> StreamPolicy {
        let resumed = self.config.resume.is_some() && self.origin.is_replay();
        let continued =
            resumed || (can && self.continuable(given).is_some_and(|(_, left)| left > 0));
        let shape = self.shape();
        let Some(clocks) = &self.config.clocks else {
            return policy;
        };
        let first_content = clocks.first_content().or(policy.first_content());
        let progress = match (clocks.gap(shape, continued), policy.progress()) {
            (Some(gap), Some(limit)) => Some(gap.min(limit)),
            (gap, limit) => gap.or(limit),
        };
        policy
            .with_first_content(first_content)
            .with_progress(progress)
    }

    /// Whether a success's usage is recorded when its body is read (a stream's is recorded when
    /// it ends, by its guard).
    pub(crate) fn usage_recorder<RB>(&self, response: &Response<RB>) -> Option<UsageRecorder> {
        if self.watch.counts_usage() && !is_event_stream(response.headers()) {
            self.watch.usage_recorder()
        } else {
            None
        }
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
                recorder.record(counts, bytes);
            }
        })
    })
}

/// An event stream handed back: how it ends is told to the guards that wait for a body's end, to
/// the metrics and to the clocks, and it is continued or resumed if it may be.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The guarded event stream of `attempt`, as the body handed back (`continue_by`: who
    /// continues it, if anyone does; `given`: a router above, which knows where a prefill is
    /// taken).
    pub(crate) fn guard_stream<RB>(
        &mut self,
        attempt: &mut Attempt,
        mut stream: Box<GuardedStream<RB>>,
        continuer: impl FnOnce(&Arc<Config<C, Bk>>) -> Option<Continuer>,
        given: bool,
    ) -> ResponseBody<RB>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let mut body_end = attempt.permits.take_body_end();
        let end = self.watch.stream_end();
        let clocks = self.config.clocks.clone();
        let continuation = self.continuation;
        if !body_end.is_empty() || end.counts() || clocks.is_some() {
            *stream = (*stream).with_at_end(move |ending| {
                let outcome = ending.outcome();
                body_end.record(outcome, &HeaderMap::new());
                // The gap clock learns from streams that ended well.
                if let (Some(clocks), Some(gap), true) =
                    (clocks, ending.longest_gap(), outcome.is_success())
                {
                    clocks.record_gap(gap);
                }
                end.ended(outcome, ending.usage(), continuation, ending.model());
            });
        }
        if let (Some(resume), Origin::Replay(template)) = (&self.config.resume, &self.origin) {
            if let Some(resume) = resume.make_resume(&template.head, &template.body) {
                *stream = (*stream).with_resume(resume);
            }
        } else if let Some(continuations) = self.continuation(continuer, given) {
            *stream = (*stream).with_resume(Box::new(continuations));
        }
        ResponseBody::boxed(*stream)
    }

    /// How the stream of a request in a format the engine knows is continued, or at least
    /// ended with its in-band error; none for a continuation itself (the stream it continues
    /// goes on from its whole transcript) or a request sent once.
    fn continuation(
        &self,
        continuer: impl FnOnce(&Arc<Config<C, Bk>>) -> Option<Continuer>,
        given: bool,
    ) -> Option<Continuations> {
        let (format, left) = self.continuable(given)?;
        let continuer = if left > 0 {
            continuer(&self.config)
        } else {
            None
        };
        let left = if continuer.is_some() { left } else { 0 };
        let Origin::Replay(template) = &self.origin else {
            return None;
        };
        let (head, body) = (template.head.clone(), template.body.clone());
        Some(Continuations::new(format, head, body, continuer, left))
    }

    /// The format of the request's streams and the continuations left to them, if they can be
    /// continued at all: not for a continuation itself, a request sent once or a format the
    /// engine does not know (`given`: a router above, which knows where a prefill is taken).
    fn continuable(&self, given: bool) -> Option<(Format, u32)> {
        let Origin::Replay(template) = &self.origin else {
            return None;
        };
        let format = Format::of_request(&template.head)?;
        if self.continuation {
            return None;
        }
        let prefill = given || !self.config.prefill.rejected();
        Some((format, self.config.policy.continuations(true, prefill)))
    }
}
