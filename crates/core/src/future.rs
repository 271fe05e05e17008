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

use tower_service::Service;

use crate::config::Config;
use crate::deadline::{AttemptTimer, NoTimeout};
use crate::engine::{Ending, Retry};
use crate::events::OutcomeKind;
use crate::hedged::HedgeStep;
use crate::policy::Policy;
use crate::send::poll_ready_to_send;
use crate::span::{self, Traced};
use crate::timer;
use crate::transitions::{
    hedged, poll_attempt, take, wait, Attempt, Outcome, Phase, PhaseProj, Progress, RequestLimits,
    Transitions, Verdict,
};

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
    fn rejected(error: E, max_attempts: u32) -> Pin<Box<Self>> {
        Box::pin(Self {
            phase: Phase::Rejected,
            kept: Some(Err(error)),
            progress: Progress::after_call(max_attempts),
        })
    }
}

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
                    let (after, cause) = match machine.judge(&outcome, 0, None, false) {
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
                PhaseProj::Hedged { attempt } => {
                    match ready!(self.poll_hedged(progress, kept, attempt, cx)) {
                        HedgeStep::Flow(flow) => flow,
                        HedgeStep::AllFailed {
                            outcome,
                            after,
                            cause,
                        } => self.after_failure(progress, kept, phase, outcome, after, cause),
                        HedgeStep::TimedOut { error, held } => {
                            self.on_outcome(progress, kept, phase, Err(error), held)
                        }
                    }
                }
            };
            if let ControlFlow::Break(outcome) = flow {
                return Poll::Ready(outcome);
            }
        }
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
