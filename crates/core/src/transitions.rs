//! The transitions of a tracked request's retry state machine: what the
//! [`ResponseFuture`](crate::ResponseFuture) does when an attempt's outcome
//! arrives, a sleep ends, or the service is ready to send a retry. Each is a
//! small function of [`Transitions`], which holds what every one of them
//! reads; the future's `poll` dispatches to them.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use tower_service::Service;

use crate::adaptive::Gate;
use crate::breaker::{Admission, BreakerState};
use crate::budget::Budget;
use crate::config::Config;
use crate::deadline::AttemptTimer;
use crate::decision::{Cause, Decision};
use crate::engine::{Ending, Retry, Session};
use crate::events::{EndArgs, Event, OutcomeKind, RejectArgs, RetryArgs};
use crate::hedge::{longest, Copies, CopySent, Failed, NextHedge};
use crate::policy::{Policy, PrepareRetry};
use crate::send::pacing_stamp;
use crate::span::{self, Traced};
use crate::timer::{self, Sleep};

pin_project! {
    #[project = PhaseProj]
    pub(crate) enum Phase<F, Tm> {
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
        Hedged { #[pin] attempt: HedgedAttempt<F, Tm> },
    }
}

pin_project! {
    /// An attempt in flight with its hedges: [`Phase::Hedged`].
    #[project = HedgedAttemptProj]
    pub(crate) struct HedgedAttempt<F, Tm> {
        #[pin]
        pub(crate) copies: Copies<F>,
        // Every copy races the attempt's timer.
        #[pin]
        pub(crate) timer: Tm,
        // The delay to the next hedge.
        #[pin]
        pub(crate) next: Option<Sleep>,
        pub(crate) hedge: NextHedge,
        pub(crate) failed: Failed,
    }
}

/// One request beyond its first attempt: the engine's session, and what
/// pacing gave it.
pub(crate) struct Progress {
    pub(crate) session: Session,
    // What the pacing gave the attempt in flight when it went out.
    pub(crate) stamp: u16,
    // This request's turn under pacing, for its retries.
    pub(crate) gate: Gate,
}

impl Progress {
    pub(crate) fn new(limits: RequestLimits, stamp: u16) -> Self {
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
    pub(crate) fn after_call(max_attempts: u32) -> Self {
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
pub(crate) enum Verdict {
    End(Ending),
    Retry {
        after: Option<Duration>,
        cause: Cause,
    },
}

/// What the future does after a transition: go on in the phase the
/// transition set, or return an outcome.
pub(crate) type Flow<O> = ControlFlow<O>;

/// An attempt's outcome: its own, or its timer's error if that ends first.
#[inline(always)]
pub(crate) fn poll_attempt<Res, E, T: AttemptTimer<E>>(
    future: Pin<&mut impl Future<Output = Result<Res, E>>>,
    timer: Pin<&mut T::Timer>,
    cx: &mut Context<'_>,
) -> Poll<Result<Res, T::Error>> {
    match future.poll(cx) {
        Poll::Ready(outcome) => Poll::Ready(outcome.map_err(T::inner)),
        Poll::Pending => Poll::Ready(Err(ready!(timer.poll(cx)))),
    }
}

pub(crate) fn take<O>(kept: &mut Option<O>) -> O {
    kept.take().expect(KEPT)
}

pub(crate) const KEPT: &str = "an outcome is kept from a retry's decision until it is sent";

pub(crate) type Outcome<S, Req, T> =
    Result<<S as Service<Req>>::Response, <T as AttemptTimer<<S as Service<Req>>::Error>>::Error>;
pub(crate) type PhaseOf<S, Req, T> = Phase<
    Traced<<S as Service<Req>>::Future>,
    <T as AttemptTimer<<S as Service<Req>>::Error>>::Timer,
>;

/// What every transition reads: the kept request, the service that sends the
/// retries and the settings that judge the outcomes.
pub(crate) struct Transitions<'a, S, P, Req, T> {
    pub(crate) request: &'a mut Option<Req>,
    pub(crate) inner: &'a mut Option<S>,
    pub(crate) config: &'a Config<P, T>,
}

impl<S, P, Req, T> Transitions<'_, S, P, Req, T> {
    /// The service that sends the retries, until the request ends.
    pub(crate) fn service(&mut self) -> &mut S {
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
    /// An attempt's outcome arrived: return it, or keep it and wait for the
    /// retry it asks for, at least `held` (a delay a server named for a
    /// hedge of the attempt) if so.
    #[inline(always)]
    pub(crate) fn on_outcome(
        &mut self,
        progress: &mut Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        phase: Pin<&mut PhaseOf<S, Req, T>>,
        outcome: Outcome<S, Req, T>,
        held: Option<Duration>,
    ) -> Flow<Outcome<S, Req, T>> {
        let last_retry = progress.session.last_retry();
        let retried = progress.session.attempts() > 1;
        match self.judge(&outcome, progress.stamp, last_retry, retried) {
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
    pub(crate) fn after_failure(
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
    /// stamp, `last_retry` the cause of the retry it was; `retried` says
    /// whether a retry went out.
    #[inline(always)]
    pub(crate) fn judge(
        &self,
        outcome: &Outcome<S, Req, T>,
        stamp: u16,
        last_retry: Option<Cause>,
        retried: bool,
    ) -> Verdict {
        let config = self.config;
        let decision = match self.request.as_ref() {
            Some(request) => config.policy.classify(request, outcome),
            // The kept request itself went out as the last attempt.
            None if retried && !config.policy.needs_request() => {
                config.policy.classify_outcome(outcome)
            }
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
    pub(crate) fn retry(
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
    pub(crate) fn on_wake(
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
    pub(crate) fn send(
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
        // The last attempt allowed needs no copy when the policy classifies
        // without the request: the kept one goes out. Not with hedging,
        // whose copies are made while an attempt is pending.
        let last = !config.policy.needs_request()
            && config.hedger().is_none()
            && progress.session.is_last(&retry);
        let request = &mut *self.request;
        // The copy stays where it is made until it is sent: returned through
        // the engine, it would be moved into and out of its result.
        let mut copy = None;
        let sent = progress.session.send_through(
            &retry,
            config.breaker(),
            config.budget(),
            Instant::now,
            || {
                copy = match last {
                    true => request.take(),
                    false => copy_for(&config.policy, request),
                };
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
        // Stamped where it was made, and moved out only into the call.
        let Some(stamped) = copy.as_mut() else {
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
            .prepare_retry(PrepareRetry::new(stamped, replaced, args));
        let timer = config.timeouts.timer(progress.session.deadline());
        progress.stamp = pacing_stamp(config, &mut progress.gate);
        // The attempt's future is built where it will be polled: returned
        // first, it would be copied once more (measured: 36 instructions per
        // retry).
        let future = span::retry(
            self.service().call(copy.expect("made above")),
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

    /// Ends a tracked request with `outcome`.
    pub(crate) fn end(
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
    pub(crate) fn finish(
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
pub(crate) fn copy_for<Req, Res, E, P: Policy<Req, Res, E>>(
    policy: &P,
    request: &Option<Req>,
) -> Option<Req> {
    policy.clone_request(request.as_ref()?)
}

/// Waits `retry`'s delay before readiness for it; a zero delay goes straight
/// to readiness, with no timer and no clock (tokio's timer would round a zero
/// sleep up to its 1 ms tick).
pub(crate) fn wait<F, Tm>(
    mut phase: Pin<&mut Phase<F, Tm>>,
    retry: Retry,
    deadline: Option<Instant>,
) {
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
pub(crate) fn hedged<F: Future, Tm>(
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
        attempt: HedgedAttempt {
            copies: Copies::new(future, sent),
            timer,
            next: None,
            hedge: NextHedge::Unpolled,
            failed: Failed::default(),
        },
    }
}

/// Waiting for readiness to send `retry`, until `deadline` at the latest.
pub(crate) fn readying<F, Tm>(retry: Retry, deadline: Option<Instant>) -> Phase<F, Tm> {
    Phase::Readying {
        retry,
        deadline,
        alarm: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryOnError;

    type TestPhase = Phase<std::future::Ready<()>, std::future::Pending<()>>;

    fn retry_after(delay: Duration) -> Retry {
        Retry {
            delay,
            ..Retry::planned(Cause::Transient)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_delay_goes_straight_to_readiness_and_others_sleep_first() {
        let mut phase: Pin<Box<TestPhase>> = Box::pin(readying(retry_after(Duration::ZERO), None));
        let deadline = Some(Instant::now() + Duration::from_secs(1));
        wait(phase.as_mut(), retry_after(Duration::ZERO), deadline);
        assert!(
            matches!(&*phase, Phase::Readying { deadline: d, alarm: None, .. } if *d == deadline)
        );
        wait(
            phase.as_mut(),
            retry_after(Duration::from_millis(5)),
            deadline,
        );
        assert!(
            matches!(&*phase, Phase::Waiting { retry, .. } if retry.delay == Duration::from_millis(5))
        );
    }

    #[test]
    fn a_request_that_was_not_kept_has_no_copy_to_send() {
        let policy = RetryOnError;
        let copy = copy_for::<u32, (), (), _>(&policy, &None);
        assert_eq!(copy, None);
        assert_eq!(copy_for::<u32, (), (), _>(&policy, &Some(7)), Some(7));
    }

    #[test]
    fn the_kept_outcome_is_taken_once() {
        let mut kept = Some(Ok::<u8, ()>(1));
        assert_eq!(take(&mut kept), Ok(1));
        assert!(kept.is_none());
    }
}
