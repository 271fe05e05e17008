//! [`ResponseFuture`]: the retry state machine of one request.
//!
//! **Decide at the response, commit at send.** When an attempt's outcome asks
//! for a retry, the future keeps that outcome while it sleeps and waits for
//! the service to be ready. The retry is committed only when it really goes
//! out: then the budget is charged, the observers hear of it, and the kept
//! outcome goes to the policy's `prepare_retry`, which drops it. Whatever stops the retry before that (the
//! future is dropped, the service fails to become ready, the time limit
//! passes, the budget refuses, the request can no longer be replayed) returns
//! the kept outcome, attempt *n*'s real response or error, to the caller.

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use tower_service::Service;

use crate::adaptive::Gate;
use crate::breaker::{Admission, BreakerState};
use crate::budget::Budget;
use crate::config::Config;
use crate::deadline::{AttemptTimer, NoTimeout};
use crate::decision::{Cause, Decision};
use crate::engine::{Ending, HedgeAdmission, HedgeGates, Retry, Session};
use crate::events::{EndArgs, Event, HedgeArgs, HedgeEvent, OutcomeKind, RejectArgs, RetryArgs};
use crate::hedge::{Copies, CopySent, Hedger};
use crate::policy::{Policy, PrepareRetry};
use crate::send::{pacing_stamp, poll_ready_to_send};
use crate::span::{self, Traced};
use crate::timer::{self, Sleep};

pin_project! {
    /// The response future of [`BackoffRetry`](crate::BackoffRetry): the attempts of one
    /// request and the sleeps between them.
    ///
    /// It resolves to the outcome of the last attempt that went out, success
    /// or not, with the inner service's own error type: a retry that is
    /// stopped before it is sent never replaces the outcome it would have
    /// replaced.
    ///
    /// # Size and allocations
    /// A first attempt that needs no retry is tracked in place: the future
    /// holds the attempt, the kept copy of the request, a clone of the inner
    /// service and a reference to the layer's settings, and allocates
    /// nothing. Everything a retry needs (the sleep, the outcome kept during
    /// it, counters, jitter state) is allocated once, when the first retry is
    /// decided, or at the call when the request has a time limit, its own
    /// limits or pacing, which the first outcome already needs.
    ///
    /// # Holding the outcome during the sleep
    /// The kept outcome is held as it is. For an HTTP/1 response that means
    /// its connection stays busy until the retry is sent (the response body is
    /// not read yet); the retry then goes out on another connection, and once
    /// it is sent the HTTP policy's `prepare_retry` drains the kept body so
    /// its connection goes back to the pool. Measured in `tests/http.rs`
    /// (`a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained`):
    /// two requests retried once each open 2 connections, against 1 when the
    /// outcome was dropped before the sleep. That is the price of being able
    /// to return the real response when the retry is stopped; a client that
    /// sleeps many retries at once holds that many extra connections (HTTP/2
    /// holds streams, not connections).
    ///
    /// # Cancel safety
    /// Dropping it at any point stops the request: an attempt in flight is
    /// dropped with it, a pending sleep is cancelled, and no further attempt is
    /// made. No task is left behind, and since a retry is paid for only when
    /// it is sent, the budget is charged for nothing that did not go out.
    pub struct ResponseFuture<S, P, Req, T = NoTimeout>
    where
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
    {
        #[pin]
        state: StateOf<S, Req, T>,
        // The request, kept to classify outcomes and to copy for each retry;
        // `None` when the policy would not copy it.
        request: Option<Req>,
        // Sends the retries; dropped when the request ends, so that a
        // service readied for a retry that was then stopped gives back what
        // its readiness reserved (a concurrency permit) at once, not when
        // the caller drops the finished future.
        inner: Option<S>,
        config: Arc<Config<P, T>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F1, F, Tm, O> {
        // The first attempt, and nothing to track beside it: the happy path.
        First { #[pin] future: F1, #[pin] timer: Tm },
        // Everything else, in its own allocation so the happy path's future
        // stays small.
        Tracked { tracked: Pin<Box<Tracked<F, Tm, O>>> },
    }
}

pin_project! {
    /// A request beyond its first attempt: where it is, and how far it went.
    struct Tracked<F, Tm, O> {
        #[pin]
        phase: Phase<F, Tm>,
        // The outcome a decided retry would replace, until it is sent.
        kept: Option<O>,
        progress: Progress,
    }
}

pin_project! {
    #[project = PhaseProj]
    enum Phase<F, Tm> {
        // An attempt is in flight, racing its timer.
        Called { #[pin] future: F, #[pin] timer: Tm },
        // Sleeping before a retry.
        Waiting { #[pin] sleep: Sleep, retry: Retry },
        // Waiting for the service to be ready to send a retry, racing the
        // request's deadline if it has one: a service that never gets ready
        // must not hold the kept outcome past it.
        Readying { retry: Retry, deadline: Option<Instant>, #[pin] alarm: Option<Sleep> },
        // The circuit breaker rejected the first attempt: the kept outcome is
        // its error, returned at the first poll.
        Rejected,
        // An attempt in flight with its hedges, all racing the attempt's
        // timer, with the delay to the next hedge.
        Hedged {
            #[pin] copies: Copies<F>,
            #[pin] timer: Tm,
            #[pin] next: Option<Sleep>,
            hedge: NextHedge,
            failed: Failed,
        },
    }
}

/// Where a hedged attempt stands with its next hedge.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NextHedge {
    /// The first copy has not been polled yet. Its hedging starts at the
    /// first poll that finds it pending: one that answers at once is never
    /// hedged, and counts towards neither the load cap nor the latencies.
    Unpolled,
    /// The first hedge is due after this delay, from the first poll on: a
    /// timer made at the call would need a runtime where the future is
    /// made, not only where it is polled.
    Arm(Duration),
    /// Sent when the delay is over, if `next` is set.
    Waiting,
    /// Due: sent as soon as the service is ready.
    Due,
    /// No further hedge of this attempt: the limit, the cap or the budget
    /// said no, or the server asked for a delay.
    Stopped,
}

/// What the copies of a hedged attempt that failed leave behind for those
/// still pending: the caller gets the last real outcome, and the retry after
/// the attempt honours every delay a server named.
#[derive(Clone, Copy, Default)]
struct Failed {
    /// The longest delay a server named for a failed copy: the retry after
    /// the attempt waits at least that long, whichever copy fails last.
    held: Option<Duration>,
    /// How the request ends with the kept outcome when that is a failure
    /// kept back because the request could no longer be copied: a copy that
    /// fell behind a replay limit fails for a reason of our own, so the
    /// copies still pending are let bring the real outcome.
    spent: Option<Ending>,
}

impl<F1, F, Tm, O> State<F1, F, Tm, O> {
    /// A request tracked from its first retry on, in its own allocation:
    /// `kept` waits for `retry`.
    #[inline(always)]
    fn tracked(retry: Retry, kept: O, progress: Progress) -> Self {
        // Written into its allocation: `Box::pin` would build it on the
        // stack and copy all of it (measured: 73 more instructions per
        // retried request).
        let tracked = Box::write(
            Box::new_uninit(),
            Tracked {
                // Tracked only from its first retry: no deadline to race.
                phase: Phase::Readying {
                    retry,
                    deadline: None,
                    alarm: None,
                },
                kept: Some(kept),
                progress,
            },
        );
        let mut tracked = Box::into_pin(tracked);
        if !retry.delay.is_zero() {
            wait(tracked.as_mut().project().phase, retry, None);
        }
        State::Tracked { tracked }
    }
}

impl<F, Tm, R, E> Tracked<F, Tm, Result<R, E>> {
    /// A request the breaker rejected: `error` is its outcome. Off the
    /// happy path, it allocates.
    #[cold]
    #[inline(never)]
    fn rejected(error: E, max_attempts: u32) -> Pin<Box<Self>> {
        Box::pin(Self {
            phase: Phase::Rejected,
            kept: Some(Err(error)),
            progress: Progress::after_call(max_attempts),
        })
    }
}

/// One request beyond its first attempt: the engine's session, and what
/// pacing gave it.
struct Progress {
    session: Session,
    // What the pacing gave the attempt in flight when it went out.
    stamp: u16,
    // This request's turn under pacing, for its retries.
    gate: Gate,
}

impl Progress {
    fn new(limits: RequestLimits, stamp: u16) -> Self {
        Self {
            session: Session::new(limits.max_attempts, limits.deadline),
            stamp,
            gate: Gate::default(),
        }
    }

    /// A request tracked only after its call (from its first retry, its
    /// first pending poll or its rejection): it has the layer's attempts,
    /// no deadline and no pacing stamp, or it would have been tracked from
    /// its call.
    fn after_call(max_attempts: u32) -> Self {
        let limits = RequestLimits {
            max_attempts,
            deadline: None,
        };
        Self::new(limits, 0)
    }
}

/// The limits of one request, read when it is called.
#[derive(Clone, Copy)]
pub(crate) struct RequestLimits {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Instant>,
}

/// An attempt that went out: its future, the timer it races and its pacing
/// stamp.
pub(crate) struct Attempt<F, Tm> {
    pub(crate) future: F,
    pub(crate) timer: Tm,
    pub(crate) stamp: u16,
}

/// What an outcome means for its request.
enum Verdict {
    End(Ending),
    Retry {
        after: Option<Duration>,
        cause: Cause,
    },
}

/// What the future does after a transition: go on in the phase the
/// transition set, or return an outcome.
type Flow<O> = ControlFlow<O>;

impl<S, P, Req, T> ResponseFuture<S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    /// A request whose first outcome the layer's settings judge alone: the
    /// happy path's future, its attempt in place and nothing allocated.
    #[inline(always)]
    pub(crate) fn untracked(
        future: S::Future,
        timer: T::Timer,
        request: Option<Req>,
        inner: S,
        config: Arc<Config<P, T>>,
    ) -> Self {
        Self {
            state: State::First { future, timer },
            request,
            inner: Some(inner),
            config,
        }
    }

    /// A request tracked from its call: its first outcome needs `limits`,
    /// a pacing stamp or hedges.
    #[inline(always)]
    pub(crate) fn tracked_from_call(
        first: Attempt<S::Future, T::Timer>,
        request: Option<Req>,
        limits: RequestLimits,
        inner: S,
        config: Arc<Config<P, T>>,
    ) -> Self {
        // The first attempt: the caller's span, none of its own.
        let future = span::untraced(first.future);
        let phase = match config.hedger() {
            None => Phase::Called {
                future,
                timer: first.timer,
            },
            Some(_) => hedged(future, first.timer, 1, None, first.stamp),
        };
        // Written into its allocation, as `State::tracked` is: `Box::pin`
        // would build it on the stack and copy all of it.
        let tracked = Box::write(
            Box::new_uninit(),
            Tracked {
                phase,
                kept: None,
                progress: Progress::new(limits, first.stamp),
            },
        );
        Self {
            state: State::Tracked {
                tracked: Box::into_pin(tracked),
            },
            request,
            inner: Some(inner),
            config,
        }
    }
}

impl<S, P, Req, T> ResponseFuture<S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    /// A request whose first attempt the circuit breaker rejected: it
    /// resolves to `error` and sends nothing.
    // Assembled here, inline, as the happy path's future is: made whole in a
    // function of its own, it made LLVM copy every future of a layer with a
    // breaker with one 416-byte `memcpy` (measured: 94 instructions a call).
    #[inline(always)]
    pub(crate) fn rejected(error: T::Error, inner: S, config: Arc<Config<P, T>>) -> Self {
        let tracked = Tracked::rejected(error, config.max_attempts);
        Self {
            state: State::Tracked { tracked },
            request: None,
            inner: Some(inner),
            config,
        }
    }

    /// Attempts sent so far, the first included; once the future resolved,
    /// all of them. A front-end reads it to tell the caller (the HTTP layer's
    /// `RetryInfo`).
    pub fn attempts(&self) -> u32 {
        self.progress().map_or(1, |p| p.session.attempts())
    }

    /// Time slept between attempts so far (backoff delays, not pacing); once
    /// the future resolved, in all.
    pub fn slept(&self) -> Duration {
        self.progress()
            .map_or(Duration::ZERO, |p| p.session.slept())
    }

    fn progress(&self) -> Option<&Progress> {
        match &self.state {
            State::First { .. } => None,
            State::Tracked { tracked } => Some(&tracked.progress),
        }
    }
}

impl<S, P, Req, T> Future for ResponseFuture<S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    S::Response: 'static,
    T::Error: 'static,
{
    type Output = Result<S::Response, T::Error>;

    // Inline: the happy path is a few instructions around the inner
    // future's poll (measured: 24 fewer per request than a call).
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut machine = Transitions {
            request: this.request,
            inner: this.inner,
            config: this.config,
        };
        let mut state = this.state;
        loop {
            match state.as_mut().project() {
                StateProj::First { future, timer } => {
                    let outcome = ready!(poll_attempt::<_, _, T>(future, timer, cx));
                    let (after, cause) = match machine.judge(&outcome, 0, None) {
                        // A success apart, its ending a constant where it is
                        // told: no ending kept in a register across the
                        // budget's refund, none looked up when counted.
                        Verdict::End(Ending::Success) => {
                            let ending = Ending::Success;
                            return Poll::Ready(machine.finish(
                                1,
                                0,
                                0,
                                Duration::ZERO,
                                outcome,
                                ending,
                            ));
                        }
                        Verdict::End(ending) => {
                            return Poll::Ready(machine.finish(
                                1,
                                0,
                                0,
                                Duration::ZERO,
                                outcome,
                                ending,
                            ))
                        }
                        Verdict::Retry { after, cause } => (after, cause),
                    };
                    let mut progress = Progress::after_call(machine.config.max_attempts);
                    match machine.retry(&mut progress.session, after, cause) {
                        Ok(retry) => state.set(State::tracked(retry, outcome, progress)),
                        Err(ending) => {
                            return Poll::Ready(machine.finish(
                                1,
                                0,
                                0,
                                Duration::ZERO,
                                outcome,
                                ending,
                            ))
                        }
                    }
                }
                StateProj::Tracked { tracked } => return machine.drive(tracked.as_mut(), cx),
            }
        }
    }
}

/// An attempt's outcome: its own, or its timer's error if that ends first.
#[inline(always)]
fn poll_attempt<Res, E, T: AttemptTimer<E>>(
    future: Pin<&mut impl Future<Output = Result<Res, E>>>,
    timer: Pin<&mut T::Timer>,
    cx: &mut Context<'_>,
) -> Poll<Result<Res, T::Error>> {
    match future.poll(cx) {
        Poll::Ready(outcome) => Poll::Ready(outcome.map_err(T::inner)),
        Poll::Pending => Poll::Ready(Err(ready!(timer.poll(cx)))),
    }
}

fn take<O>(kept: &mut Option<O>) -> O {
    kept.take().expect(KEPT)
}

const KEPT: &str = "an outcome is kept from a retry's decision until it is sent";

type Outcome<S, Req, T> =
    Result<<S as Service<Req>>::Response, <T as AttemptTimer<<S as Service<Req>>::Error>>::Error>;
type PhaseOf<S, Req, T> = Phase<
    Traced<<S as Service<Req>>::Future>,
    <T as AttemptTimer<<S as Service<Req>>::Error>>::Timer,
>;
type StateOf<S, Req, T> = State<
    <S as Service<Req>>::Future,
    Traced<<S as Service<Req>>::Future>,
    <T as AttemptTimer<<S as Service<Req>>::Error>>::Timer,
    Outcome<S, Req, T>,
>;
type TrackedOf<S, Req, T> = Tracked<
    Traced<<S as Service<Req>>::Future>,
    <T as AttemptTimer<<S as Service<Req>>::Error>>::Timer,
    Outcome<S, Req, T>,
>;

/// What every transition reads: the kept request, the service that sends the
/// retries and the settings that judge the outcomes.
struct Transitions<'a, S, P, Req, T> {
    request: &'a mut Option<Req>,
    inner: &'a mut Option<S>,
    config: &'a Config<P, T>,
}

impl<S, P, Req, T> Transitions<'_, S, P, Req, T> {
    /// The service that sends the retries, until the request ends.
    fn service(&mut self) -> &mut S {
        self.inner
            .as_mut()
            .expect("a request sends nothing once it has ended")
    }
}

impl<S, P, Req, T> Transitions<'_, S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    S::Response: 'static,
    T::Error: 'static,
{
    /// Runs a tracked request until it ends or has to wait.
    // Out of line: the happy path's `poll` stays small.
    #[inline(never)]
    fn drive(
        &mut self,
        mut tracked: Pin<&mut TrackedOf<S, Req, T>>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<S, Req, T>> {
        loop {
            let this = tracked.as_mut().project();
            let (progress, kept) = (this.progress, this.kept);
            let mut phase = this.phase;
            let flow = match phase.as_mut().project() {
                PhaseProj::Called { mut future, timer } => {
                    let outcome = ready!(poll_attempt::<_, _, T>(future.as_mut(), timer, cx));
                    span::outcome(&*future, OutcomeKind::of(&outcome));
                    self.on_outcome(progress, kept, phase, outcome, None)
                }
                PhaseProj::Waiting { sleep, retry } => {
                    ready!(sleep.poll(cx));
                    let retry = *retry;
                    self.on_wake(progress, phase, retry)
                }
                PhaseProj::Readying {
                    retry,
                    deadline,
                    mut alarm,
                } => {
                    let retry = *retry;
                    // Zero-delay retries against a ready service would never
                    // yield: spend tokio's task budget like any I/O would.
                    let coop = ready!(tokio::task::coop::poll_proceed(cx));
                    let config = self.config;
                    let ready = poll_ready_to_send(self.service(), &mut progress.gate, config, cx);
                    match ready {
                        Poll::Ready(readiness) => {
                            coop.made_progress();
                            self.send(progress, readiness, kept, phase, retry)
                        }
                        Poll::Pending => {
                            let Some(at) = *deadline else {
                                return Poll::Pending;
                            };
                            // Armed only once readiness keeps the retry
                            // waiting: a service ready at once costs no timer.
                            if alarm.is_none() {
                                alarm.set(Some(timer::sleep_until(at)));
                            }
                            ready!(alarm.as_pin_mut().map_or(Poll::Pending, |a| a.poll(cx)));
                            self.end(progress, take(kept), Ending::OutOfTime)
                        }
                    }
                }
                // Nothing was sent: no `Ended`, as no `Called`.
                PhaseProj::Rejected => return Poll::Ready(take(kept)),
                PhaseProj::Hedged {
                    mut copies,
                    timer,
                    mut next,
                    hedge,
                    failed,
                } => {
                    let answered = copies.as_mut().poll_any(cx, |future, outcome| {
                        span::outcome(future, OutcomeKind::of(outcome));
                    });
                    if let Poll::Ready((outcome, sent)) = answered {
                        let outcome = outcome.map_err(T::inner);
                        let copy = Answered {
                            outcome,
                            sent,
                            first_poll: *hedge == NextHedge::Unpolled,
                        };
                        match self.on_copy(progress, kept, copies, hedge, failed, copy) {
                            Ok(flow) => flow,
                            Err((outcome, after, cause)) => {
                                self.after_failure(progress, kept, phase, outcome, after, cause)
                            }
                        }
                    } else if let Poll::Ready(error) = timer.poll(cx) {
                        // The attempt's time is up, for every copy of it.
                        self.cancel(copies.as_mut());
                        let failed = *failed;
                        match failed.spent {
                            // A real outcome kept back beats our own time-out.
                            Some(ending) => self.end(progress, take(kept), ending),
                            None => self.on_outcome(progress, kept, phase, Err(error), failed.held),
                        }
                    } else {
                        if *hedge == NextHedge::Unpolled {
                            let now = Instant::now();
                            let attempt = copies.as_mut().start(now);
                            *hedge = start_hedging(hedger(self.config), attempt, now);
                        }
                        if let NextHedge::Arm(delay) = *hedge {
                            next.set(Some(timer::sleep(delay)));
                            *hedge = NextHedge::Waiting;
                        }
                        if *hedge == NextHedge::Waiting {
                            match next.as_mut().as_pin_mut() {
                                Some(sleep) => ready!(sleep.poll(cx)),
                                None => return Poll::Pending,
                            }
                            next.set(None);
                            *hedge = NextHedge::Due;
                        }
                        if *hedge == NextHedge::Stopped {
                            return Poll::Pending;
                        }
                        let sent = ready!(self.hedge(progress, copies.as_mut(), cx));
                        let full = copies.len() >= hedger(self.config).max_copies();
                        *hedge = match sent {
                            None => NextHedge::Stopped,
                            // The next hedge waits for a copy to fail.
                            Some(_) if full => NextHedge::Waiting,
                            // Zero: every copy at once, as gRPC's hedging does.
                            Some(delay) if delay.is_zero() => NextHedge::Due,
                            Some(delay) => {
                                next.set(Some(timer::sleep(delay)));
                                NextHedge::Waiting
                            }
                        };
                        ControlFlow::Continue(())
                    }
                }
            };
            if let ControlFlow::Break(outcome) = flow {
                return Poll::Ready(outcome);
            }
        }
    }

    /// An attempt's outcome arrived: return it, or keep it and wait for the
    /// retry it asks for, at least `held` (a delay a server named for a
    /// hedge of the attempt) if so.
    // Inline: the outcome is moved once, into `kept` or out of the future.
    #[inline(always)]
    fn on_outcome(
        &mut self,
        progress: &mut Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        phase: Pin<&mut PhaseOf<S, Req, T>>,
        outcome: Outcome<S, Req, T>,
        held: Option<Duration>,
    ) -> Flow<Outcome<S, Req, T>> {
        let last_retry = progress.session.last_retry();
        match self.judge(&outcome, progress.stamp, last_retry) {
            Verdict::End(ending) => self.end(progress, outcome, ending),
            Verdict::Retry { after, cause } => {
                let after = longest(after, held);
                self.after_failure(progress, kept, phase, outcome, after, cause)
            }
        }
    }

    /// An attempt failed with `outcome`, which asks for a retry: keep it and
    /// wait for the retry, or return it.
    #[inline(always)]
    fn after_failure(
        &mut self,
        progress: &mut Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        phase: Pin<&mut PhaseOf<S, Req, T>>,
        outcome: Outcome<S, Req, T>,
        after: Option<Duration>,
        cause: Cause,
    ) -> Flow<Outcome<S, Req, T>> {
        match self.retry(&mut progress.session, after, cause) {
            Ok(retry) => {
                *kept = Some(outcome);
                wait(phase, retry, progress.session.deadline());
                ControlFlow::Continue(())
            }
            Err(ending) => self.end(progress, outcome, ending),
        }
    }

    /// What an attempt's outcome means: the policy's decision, heard by the
    /// pacing and, for a success, the budget. `stamp` is the attempt's pacing
    /// stamp, `last_retry` the cause of the retry it was.
    #[inline(always)]
    fn judge(
        &self,
        outcome: &Outcome<S, Req, T>,
        stamp: u16,
        last_retry: Option<Cause>,
    ) -> Verdict {
        let config = self.config;
        let decision = match self.request.as_ref() {
            Some(request) => config.policy.classify(request, outcome),
            // Not copyable: it went out once, its outcome goes back as is.
            None => return Verdict::End(Ending::NotReplayable),
        };
        if let Some(pacing) = config.pacing() {
            pacing.observe(&decision, stamp);
        }
        if let Some(breaker) = config.breaker() {
            if let Some(state) = breaker.record(decision.is_retry()) {
                config.emit(|| Event::Breaker(state));
            }
        }
        match decision {
            Decision::Success => {
                if let Some(budget) = config.budget() {
                    budget.on_success(last_retry);
                }
                Verdict::End(Ending::Success)
            }
            Decision::Final => Verdict::End(Ending::Final),
            Decision::Retry { after, cause } => Verdict::Retry { after, cause },
        }
    }

    /// Decides the retry an outcome asks for: its delay, or how the request
    /// ends instead. The caller keeps the outcome until the retry is sent.
    // Out of line: the happy path's `poll` stays small.
    #[inline(never)]
    fn retry(
        &mut self,
        session: &mut Session,
        after: Option<Duration>,
        cause: Cause,
    ) -> Result<Retry, Ending> {
        let config = self.config;
        let decided = session.decide(
            &config.rules(),
            after,
            cause,
            self.request.is_some(),
            Instant::now,
            || config.new_rng(),
        );
        // An open breaker would stop the retry when it is to go out: end now
        // with the outcome, rather than after the sleep.
        let stopped = |retry: &Retry| {
            config
                .breaker()
                .is_some_and(|b| !b.would_admit(retry.delay))
        };
        if decided.as_ref().is_ok_and(stopped) {
            let attempt = session.attempts() + 1;
            config.emit(|| Event::Rejected(RejectArgs { attempt }));
            return Err(Ending::BreakerOpen);
        }
        decided
    }

    /// The sleep before a retry is over.
    fn on_wake(
        &mut self,
        progress: &mut Progress,
        mut phase: Pin<&mut PhaseOf<S, Req, T>>,
        retry: Retry,
    ) -> Flow<Outcome<S, Req, T>> {
        progress.session.slept_for(&retry);
        self.config.emit(|| Event::Slept(retry.delay));
        phase.set(readying(retry, progress.session.deadline()));
        ControlFlow::Continue(())
    }

    /// The service answered readiness for a retry: commit it and send it, or
    /// return the outcome it would have replaced.
    fn send(
        &mut self,
        progress: &mut Progress,
        readiness: Result<(), S::Error>,
        kept: &mut Option<Outcome<S, Req, T>>,
        mut phase: Pin<&mut PhaseOf<S, Req, T>>,
        retry: Retry,
    ) -> Flow<Outcome<S, Req, T>> {
        if readiness.is_err() {
            // The readiness error says nothing about the request; the kept
            // outcome does.
            return self.end(progress, take(kept), Ending::Final);
        }
        let config = self.config;
        let request = &*self.request;
        // The copy stays where it is made until it is sent: returned through
        // the engine, it would be moved into and out of its result (measured:
        // 38 instructions per retry).
        let mut copy = None;
        let sent = progress.session.send_through(
            &retry,
            config.breaker(),
            config.budget(),
            Instant::now,
            || {
                copy = copy_for(&config.policy, request);
                copy.is_some().then_some(())
            },
        );
        let admission = match sent {
            Ok(((), admission)) => admission,
            Err(ending) => {
                if ending == Ending::BreakerOpen {
                    let attempt = progress.session.attempts() + 1;
                    config.emit(|| Event::Rejected(RejectArgs { attempt }));
                }
                return self.end(progress, take(kept), ending);
            }
        };
        let Some(mut copy) = copy else {
            unreachable!("the engine sends only a request it could copy");
        };
        if let Admission::Probe(probe) = admission {
            if probe.opened_half() {
                config.emit(|| Event::Breaker(BreakerState::HalfOpen));
            }
        }
        // Committed: from here on the retry is sent. `attempt` is the number
        // of the attempt that failed.
        let attempt = progress.session.attempts() - 1;
        // Read where it is kept, before the closure: moved out first, the
        // outcome would be copied to the stack to be dropped, and read in the
        // closure, it is copied too (measured: one memcpy, 32 instructions,
        // per retry). Not checked here: without a kept outcome `take` below
        // panics.
        let replaced = kept.as_ref().map_or(OutcomeKind::Error, OutcomeKind::of);
        let args = RetryArgs {
            attempt,
            delay: retry.delay,
            cause: retry.cause,
            transparent: retry.transparent,
            replaced,
        };
        config.tell_retry(args, kept.as_ref().expect(KEPT));
        let replaced = take(kept);
        config
            .policy
            .prepare_retry(PrepareRetry::new(&mut copy, replaced, args));
        let timer = config.timeouts.timer(progress.session.deadline());
        progress.stamp = pacing_stamp(config, &mut progress.gate);
        // The attempt's future is built where it will be polled: returned
        // first, it would be copied once more (measured: 36 instructions per
        // retry).
        let future = span::retry(
            self.service().call(copy),
            attempt + 1,
            &retry,
            &config.origin,
        );
        match config.hedger() {
            None => phase.set(Phase::Called { future, timer }),
            Some(_) => phase.set(hedged(
                future,
                timer,
                attempt + 1,
                progress.session.last_retry(),
                progress.stamp,
            )),
        }
        ControlFlow::Continue(())
    }

    /// A copy of a hedged attempt answered: the first acceptable outcome
    /// wins and cancels the other copies; a failure waits for them, and
    /// sends the next hedge at once unless the server asked for a delay.
    /// Once every copy failed, the last failure is the attempt's outcome,
    /// returned as `Err` with what it asks for: the longest delay any copy's
    /// server named.
    ///
    /// A final failure that comes once the request can no longer be copied
    /// does not win while another copy is pending: a copy behind a replay
    /// limit fails for want of bytes the recording dropped, a failure of our
    /// own, while the copy sending the whole body goes on. Of such failures
    /// the last is returned, but a response (the server's) over an error
    /// (which may be ours).
    #[allow(clippy::type_complexity)]
    fn on_copy(
        &mut self,
        progress: &mut Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        copies: Pin<&mut Copies<Traced<S::Future>>>,
        hedge: &mut NextHedge,
        failed: &mut Failed,
        copy: Answered<Outcome<S, Req, T>>,
    ) -> Result<Flow<Outcome<S, Req, T>>, (Outcome<S, Req, T>, Option<Duration>, Cause)> {
        let Answered {
            outcome,
            sent,
            first_poll,
        } = copy;
        // An answer at the first poll is not a latency the hedging follows.
        if !first_poll {
            hedger(self.config).on_copy_end(&sent, Instant::now);
        }
        let pending = copies.len() > 0;
        let (after, cause) = match self.judge(&outcome, sent.stamp, sent.paid) {
            Verdict::End(ending)
                if ending == Ending::Success
                    || (failed.spent.is_none() && !(pending && self.spent())) =>
            {
                self.cancel(copies);
                if sent.is_hedge() {
                    self.config
                        .emit(|| hedge_event(sent.attempt, HedgeEvent::Won));
                }
                return Ok(self.end(progress, outcome, ending));
            }
            Verdict::End(ending) => {
                return Ok(self.keep_spent(progress, kept, hedge, failed, outcome, ending, pending))
            }
            Verdict::Retry { after, cause } => (after, cause),
        };
        failed.held = longest(failed.held, after);
        if failed.spent.is_some() {
            let ending = Ending::NotReplayable;
            return Ok(self.keep_spent(progress, kept, hedge, failed, outcome, ending, pending));
        }
        if !pending {
            return Err((outcome, failed.held, cause));
        }
        // The others may still answer: this failure is returned only if
        // they fail too.
        *kept = Some(outcome);
        *hedge = match (*hedge, after) {
            (NextHedge::Stopped, _) | (_, Some(_)) => NextHedge::Stopped,
            _ => NextHedge::Due,
        };
        Ok(ControlFlow::Continue(()))
    }

    /// A copy failed once the request could no longer be copied: keeps its
    /// `outcome` (ending the request as `ending`) unless the one kept is a
    /// response and this an error, and ends the request with the one kept
    /// once no copy is `pending`.
    #[allow(clippy::too_many_arguments)]
    fn keep_spent(
        &mut self,
        progress: &Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        hedge: &mut NextHedge,
        failed: &mut Failed,
        outcome: Outcome<S, Req, T>,
        ending: Ending,
        pending: bool,
    ) -> Flow<Outcome<S, Req, T>> {
        // No copy can be made for a further hedge.
        *hedge = NextHedge::Stopped;
        let response_kept = matches!(kept, Some(Ok(_)));
        if !(response_kept && outcome.is_err()) {
            *kept = Some(outcome);
            failed.spent = Some(ending);
        }
        if pending {
            return ControlFlow::Continue(());
        }
        let ending = failed.spent.unwrap_or(ending);
        self.end(progress, take(kept), ending)
    }

    /// Whether the request can no longer be copied: a streaming body that
    /// outgrew its replay limit, or whose source failed. Asked only when a
    /// copy fails for good while another is pending, at the price of a copy
    /// made and dropped.
    fn spent(&self) -> bool {
        copy_for(&self.config.policy, self.request).is_none()
    }

    /// Sends a hedge of the attempt in flight once the service is ready:
    /// the delay to the next one, or `None` if none may go out. Whether one
    /// may is the engine's to say, and the policy's, before readiness: a
    /// hedge that will not go out must not hold what readiness reserves (a
    /// concurrency permit) until the request ends.
    fn hedge(
        &mut self,
        progress: &mut Progress,
        copies: Pin<&mut Copies<Traced<S::Future>>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Duration>> {
        let config = self.config;
        let hedger = hedger(config);
        let Some(delay) = hedger.delay() else {
            return Poll::Ready(None);
        };
        if copies.len() >= hedger.max_copies() {
            return Poll::Ready(Some(delay));
        }
        let gates = HedgeGates {
            cap: hedger.cap(),
            breaker: config.breaker(),
            budget: config.budget(),
        };
        let now = Instant::now();
        match progress.session.may_hedge(&gates, now) {
            HedgeAdmission::Admitted => {}
            HedgeAdmission::Refused => return Poll::Ready(None),
            HedgeAdmission::Later => {
                return Poll::Ready(Some(ask_again(delay, copies.started(), now)))
            }
        }
        let attempt = progress.session.attempts() + 1;
        // Made before readiness, to ask the policy; made again at the next
        // poll if the service is not ready yet.
        let Some(mut copy) = copy_for(&config.policy, self.request) else {
            return Poll::Ready(None);
        };
        if !config.policy.prepare_hedge(&mut copy, attempt) {
            return Poll::Ready(None);
        }
        if ready!(poll_ready_to_send(
            self.service(),
            &mut progress.gate,
            config,
            cx
        ))
        .is_err()
        {
            return Poll::Ready(None);
        }
        let Some(copy) = progress
            .session
            .send_hedge_through(&gates, now, || Some(copy))
        else {
            return Poll::Ready(None);
        };
        config.emit(|| hedge_event(attempt, HedgeEvent::Sent));
        let sent = CopySent {
            at: now,
            attempt,
            paid: Some(Cause::Hedge),
            // Its own: the pacing hears each copy's outcome with the stamp
            // it went out with.
            stamp: pacing_stamp(config, &mut progress.gate),
        };
        copies.push(
            span::hedge(self.service().call(copy), attempt, &config.origin),
            sent,
        );
        Poll::Ready(Some(delay))
    }

    /// Drops the copies still pending: another outcome won, or the
    /// attempt's time is up.
    fn cancel(&self, copies: Pin<&mut Copies<Traced<S::Future>>>) {
        if copies.len() == 0 {
            return;
        }
        let hedger = hedger(self.config);
        let now = Instant::now();
        copies.cancel(|sent| {
            hedger.on_copy_end(&sent, || now);
            self.config
                .emit(|| hedge_event(sent.attempt, HedgeEvent::Cancelled));
        });
    }

    /// Ends a tracked request with `outcome`.
    fn end(
        &mut self,
        progress: &Progress,
        outcome: Outcome<S, Req, T>,
        ending: Ending,
    ) -> Flow<Outcome<S, Req, T>> {
        // Nothing more goes out: a service readied for a retry or a hedge
        // that was stopped at send releases what it reserved now.
        *self.inner = None;
        let session = &progress.session;
        let (attempts, transparent) = (session.attempts(), session.transparent_retries());
        let (hedges, slept) = (session.hedges(), session.slept());
        ControlFlow::Break(self.finish(attempts, transparent, hedges, slept, outcome, ending))
    }

    /// The outcome to return after `attempts` attempts (`transparent` of the
    /// retries free, `hedges` of them hedges) and `slept` asleep.
    #[inline(always)]
    fn finish(
        &self,
        attempts: u32,
        transparent: u32,
        hedges: u32,
        slept: Duration,
        outcome: Outcome<S, Req, T>,
        ending: Ending,
    ) -> Outcome<S, Req, T> {
        let config = self.config;
        config.emit(|| {
            Event::Ended(EndArgs {
                attempts,
                transparent_retries: transparent,
                hedges,
                slept,
                ending,
                outcome: OutcomeKind::of(&outcome),
            })
        });
        outcome
    }
}

/// The request to send as the retry: a copy of the kept one, made now, not
/// when the last attempt went out: a streaming body may have outgrown its
/// replay limit since.
fn copy_for<Req, Res, E, P: Policy<Req, Res, E>>(policy: &P, request: &Option<Req>) -> Option<Req> {
    policy.clone_request(request.as_ref()?)
}

/// When a hedge the load cap turned away asks again: soon after a short
/// wait, when the cap may have room for it (each request that comes adds
/// some), and less often the longer the attempt has been pending. A hedge
/// that goes out a little late still cuts the tail that one never sent
/// leaves in place, and an attempt pending for long asks only a few times.
fn ask_again(delay: Duration, started: Instant, now: Instant) -> Duration {
    let pending = now.saturating_duration_since(started);
    (delay.max(pending) / 4).max(Duration::from_millis(1))
}

/// The longer of two delays a server may have named.
fn longest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// A copy of a hedged attempt that answered: its outcome, how it went
/// out, and whether it answered at its first poll.
struct Answered<O> {
    outcome: O,
    sent: CopySent,
    first_poll: bool,
}

/// Waits `retry`'s delay before readiness for it; a zero delay goes straight
/// to readiness, with no timer and no clock (tokio's timer would round a zero
/// sleep up to its 1 ms tick).
fn wait<F, Tm>(mut phase: Pin<&mut Phase<F, Tm>>, retry: Retry, deadline: Option<Instant>) {
    if retry.delay.is_zero() {
        phase.set(readying(retry, deadline));
    } else {
        phase.set(Phase::Waiting {
            sleep: timer::sleep(retry.delay),
            retry,
        });
    }
}

/// Attempt number `attempt` hedged: `future`, its first copy, and the timer
/// it races. Its hedging starts at the first poll that finds that copy
/// pending. `paid` is what the budget was paid to send it, `stamp` what the
/// pacing gave it.
// Inline: out of line, the attempt's future is moved once more on its way
// into `Copies`.
#[inline(always)]
fn hedged<F: Future, Tm>(
    future: F,
    timer: Tm,
    attempt: u32,
    paid: Option<Cause>,
    stamp: u16,
) -> Phase<F, Tm> {
    let sent = CopySent {
        // Set again when the copy is found pending.
        at: Instant::now(),
        attempt,
        paid,
        stamp,
    };
    Phase::Hedged {
        copies: Copies::new(future, sent),
        timer,
        next: None,
        hedge: NextHedge::Unpolled,
        failed: Failed::default(),
    }
}

/// The hedging of an attempt whose first copy, attempt `attempt`, was found
/// pending at `now`: counted towards the load cap if it is a request's
/// first, and its first hedge due after the hedging delay.
fn start_hedging(hedger: &Hedger, attempt: u32, now: Instant) -> NextHedge {
    if attempt == 1 {
        hedger.on_request(now);
    }
    match hedger.delay() {
        // Zero: every copy at once, as gRPC's hedging does.
        Some(delay) if delay.is_zero() => NextHedge::Due,
        Some(delay) => NextHedge::Arm(delay),
        // No percentile yet to go by.
        None => NextHedge::Stopped,
    }
}

/// The hedging of a layer whose attempts are hedged.
fn hedger<P, T>(config: &Config<P, T>) -> &Hedger {
    config
        .hedger()
        .expect("a hedged attempt comes from a layer that hedges")
}

fn hedge_event(attempt: u32, event: HedgeEvent) -> Event {
    Event::Hedge(HedgeArgs { attempt, event })
}

/// Waiting for readiness to send `retry`, until `deadline` at the latest.
fn readying<F, Tm>(retry: Retry, deadline: Option<Instant>) -> Phase<F, Tm> {
    Phase::Readying {
        retry,
        deadline,
        alarm: None,
    }
}

impl<S, P, Req, T> fmt::Debug for ResponseFuture<S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts())
            .field("slept", &self.slept())
            .finish_non_exhaustive()
    }
}
