//! The transitions of a hedged attempt: its copies polled together, the
//! first acceptable outcome winning, the next hedge sent when due, and the
//! attempt's outcome when every copy failed (see [`hedge`](crate::hedge)).

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tower_service::Service;

use crate::config::Config;
use crate::deadline::AttemptTimer;
use crate::decision::Cause;
use crate::engine::{Ending, HedgeAdmission, HedgeGates};
use crate::events::{Event, HedgeArgs, HedgeEvent, OutcomeKind};
use crate::hedge::{
    ask_again, longest, start_hedging, Answered, Copies, CopySent, Failed, Hedger, NextHedge,
};
use crate::policy::Policy;
use crate::send::{pacing_stamp, poll_ready_to_send};
use crate::span::{self, Traced};
use crate::timer;
use crate::transitions::{
    copy_for, take, Flow, HedgedAttempt, HedgedAttemptProj, Outcome, Progress, Transitions, Verdict,
};

/// What a poll of a hedged attempt leaves the retry state machine to do.
pub(crate) enum HedgeStep<O, E> {
    /// Go on in the phase the attempt is in, or return an outcome.
    Flow(Flow<O>),
    /// Every copy failed: `outcome`, the last, asks for a retry after at
    /// least `after` (the longest delay any copy's server named).
    AllFailed {
        outcome: O,
        after: Option<Duration>,
        cause: Cause,
    },
    /// The attempt's time ran out, for every copy of it; `held` is the
    /// longest delay a failed copy's server named.
    TimedOut { error: E, held: Option<Duration> },
}

impl<S, P, Req, T> Transitions<'_, S, P, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    S::Response: 'static,
    T::Error: 'static,
{
    /// Polls the copies of a hedged attempt, its timer and its next hedge.
    #[allow(clippy::type_complexity)]
    pub(crate) fn poll_hedged(
        &mut self,
        progress: &mut Progress,
        kept: &mut Option<Outcome<S, Req, T>>,
        attempt: Pin<&mut HedgedAttempt<Traced<S::Future>, T::Timer>>,
        cx: &mut Context<'_>,
    ) -> Poll<HedgeStep<Outcome<S, Req, T>, T::Error>> {
        let HedgedAttemptProj {
            mut copies,
            timer,
            mut next,
            hedge,
            failed,
        } = attempt.project();
        let answered = copies.as_mut().poll_any(cx, |future, outcome| {
            span::outcome(future, OutcomeKind::of(outcome));
        });
        if let Poll::Ready((outcome, sent)) = answered {
            let copy = Answered {
                outcome: outcome.map_err(T::inner),
                sent,
                first_poll: *hedge == NextHedge::Unpolled,
            };
            return Poll::Ready(self.on_copy(progress, kept, copies, hedge, failed, copy));
        }
        if let Poll::Ready(error) = timer.poll(cx) {
            // The attempt's time is up, for every copy of it.
            self.cancel(copies.as_mut());
            return Poll::Ready(match failed.spent {
                // A real outcome kept back beats our own time-out.
                Some(ending) => HedgeStep::Flow(self.end(progress, take(kept), ending)),
                None => HedgeStep::TimedOut {
                    error,
                    held: failed.held,
                },
            });
        }
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
        Poll::Ready(HedgeStep::Flow(ControlFlow::Continue(())))
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
    ) -> HedgeStep<Outcome<S, Req, T>, T::Error> {
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
        let (after, cause) = match self.judge(&outcome, sent.stamp, sent.paid, false) {
            Verdict::End(ending)
                if ending == Ending::Success
                    || (failed.spent.is_none() && !(pending && self.spent())) =>
            {
                self.cancel(copies);
                if sent.is_hedge() {
                    self.config
                        .emit(|| hedge_event(sent.attempt, HedgeEvent::Won));
                }
                return HedgeStep::Flow(self.end(progress, outcome, ending));
            }
            Verdict::End(ending) => {
                return HedgeStep::Flow(
                    self.keep_spent(progress, kept, hedge, failed, outcome, ending, pending),
                )
            }
            Verdict::Retry { after, cause } => (after, cause),
        };
        failed.held = longest(failed.held, after);
        if failed.spent.is_some() {
            let ending = Ending::NotReplayable;
            return HedgeStep::Flow(
                self.keep_spent(progress, kept, hedge, failed, outcome, ending, pending),
            );
        }
        if !pending {
            return HedgeStep::AllFailed {
                outcome,
                after: failed.held,
                cause,
            };
        }
        // The others may still answer: this failure is returned only if
        // they fail too.
        *kept = Some(outcome);
        *hedge = match (*hedge, after) {
            (NextHedge::Stopped, _) | (_, Some(_)) => NextHedge::Stopped,
            _ => NextHedge::Due,
        };
        HedgeStep::Flow(ControlFlow::Continue(()))
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
