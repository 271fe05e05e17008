//! [`ResponseFuture`]: the retry state machine of one request.
//!
//! **Decide at the response, commit at send.** When an attempt's outcome asks
//! for a retry, the future keeps that outcome while it sleeps and waits for
//! the service to be ready. The retry is committed only when it really goes
//! out: then the budget is charged, `on_retry` and the stats hear of it, and
//! the kept outcome is discarded. Whatever stops the retry before that (the
//! future is dropped, the service fails to become ready, the time limit
//! passes, the budget refuses, the request can no longer be replayed) returns
//! the kept outcome, attempt *n*'s real response or error, to the caller.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::budget::Budget;
use crate::deadline::{AttemptTimer, NoTimeout};
use crate::jitter::Rng;
use crate::limits::reached_cap;
use crate::policy::{Cause, Decision, Policy};
use crate::schedule::Schedule;
use crate::service::Backoff;
use crate::stats::Event;

pin_project! {
    #[project = ResponseFutureProj]
    /// The response future of [`Backoff`]: the attempts of one request and the
    /// sleeps between them.
    ///
    /// It resolves to the outcome of the last attempt that went out, success
    /// or not, with the inner service's own error type: a retry that is
    /// stopped before it is sent never replaces the outcome it would have
    /// replaced.
    ///
    /// # Holding the outcome during the sleep
    /// The kept outcome is held as it is. For an HTTP/1 response that means
    /// its connection stays busy until the retry is sent (the response body is
    /// not read yet); the retry then goes out on another connection, and once
    /// it is sent the policy's `discard` drains the kept body so its
    /// connection goes back to the pool. Measured in `tests/http.rs`
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
    pub struct ResponseFuture<S, P, Sch, Req, T = NoTimeout>
    where
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
    {
        #[pin]
        state: State<S::Future, T::Timer, Result<S::Response, T::Error>>,
        service: Backoff<S, P, Sch, T>,
        // The request, kept to classify outcomes and to copy for each retry;
        // `None` when the policy would not copy it.
        request: Option<Req>,
        // Attempts sent so far.
        attempts: u32,
        // This request's limit: the layer's, or the caller's override.
        max_attempts: u32,
        // Whether the one transparent retry (`Cause::NotSent`) was used.
        transparent_used: bool,
        // What the pacing gave the attempt in flight when it went out.
        stamp: u16,
        previous_delay: Duration,
        slept: Duration,
        // When the request must end: from `max_elapsed` or the caller.
        deadline: Option<Instant>,
        last_retry: Option<Cause>,
        // Created at the first retry, so the happy path never draws.
        rng: Option<Rng>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Tm, O> {
        // An attempt is in flight, racing its timer.
        Called { #[pin] future: F, #[pin] timer: Tm },
        // Sleeping before a retry, keeping the outcome it would replace.
        Waiting { #[pin] sleep: Sleep, retry: Option<Retry<O>> },
        // Waiting for the service to be ready to send a retry.
        Readying { retry: Option<Retry<O>> },
    }
}

/// A retry decided but not yet sent: the outcome it would replace, kept to be
/// returned if the retry is stopped.
struct Retry<O> {
    outcome: O,
    cause: Cause,
    delay: Duration,
    transparent: bool,
    // When its sleep ends, if the request has a deadline.
    due: Option<Instant>,
}

/// An attempt that went out: its future, the timer it races and its pacing
/// stamp.
pub(crate) struct Attempt<F, Tm> {
    pub(crate) future: F,
    pub(crate) timer: Tm,
    pub(crate) stamp: u16,
}

/// What the future does after a transition.
enum Step<F, Tm, O> {
    Next(State<F, Tm, O>),
    Return(O),
}

impl<S, P, Sch, Req, T> ResponseFuture<S, P, Sch, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    #[inline(always)]
    pub(crate) fn new(
        first: Attempt<S::Future, T::Timer>,
        request: Option<Req>,
        max_attempts: u32,
        deadline: Option<Instant>,
        service: Backoff<S, P, Sch, T>,
    ) -> Self {
        Self {
            state: State::Called {
                future: first.future,
                timer: first.timer,
            },
            service,
            request,
            attempts: 1,
            max_attempts,
            transparent_used: false,
            stamp: first.stamp,
            previous_delay: Duration::ZERO,
            slept: Duration::ZERO,
            deadline,
            last_retry: None,
            rng: None,
        }
    }
}

impl<S, P, Sch, Req, T> Future for ResponseFuture<S, P, Sch, Req, T>
where
    S: Service<Req> + Clone,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    Sch: Schedule,
{
    type Output = Result<S::Response, T::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let step = match this.state.as_mut().project() {
                StateProj::Called { future, timer } => {
                    let outcome = match future.poll(cx) {
                        Poll::Ready(outcome) => outcome.map_err(T::inner),
                        Poll::Pending => Err(ready!(timer.poll(cx))),
                    };
                    this.on_outcome(outcome)
                }
                StateProj::Waiting { sleep, retry } => {
                    ready!(sleep.poll(cx));
                    let retry = take(retry);
                    this.on_wake(retry)
                }
                StateProj::Readying { retry } => {
                    // Zero-delay retries against a ready service would never
                    // yield: spend tokio's task budget like any I/O would.
                    let progress = ready!(tokio::task::coop::poll_proceed(cx));
                    let readiness = ready!(this.service.poll_ready_to_send(cx));
                    progress.made_progress();
                    let retry = take(retry);
                    this.send(readiness, retry)
                }
            };
            match step {
                Step::Next(state) => this.state.set(state),
                Step::Return(outcome) => return Poll::Ready(outcome),
            }
        }
    }
}

fn take<O>(retry: &mut Option<Retry<O>>) -> Retry<O> {
    retry
        .take()
        .expect("a retry is held until its state is left")
}

type Outcome<S, Req, T> =
    Result<<S as Service<Req>>::Response, <T as AttemptTimer<<S as Service<Req>>::Error>>::Error>;
type StepOf<S, Req, T> = Step<
    <S as Service<Req>>::Future,
    <T as AttemptTimer<<S as Service<Req>>::Error>>::Timer,
    Outcome<S, Req, T>,
>;

impl<S, P, Sch, Req, T> ResponseFutureProj<'_, S, P, Sch, Req, T>
where
    S: Service<Req> + Clone,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    Sch: Schedule,
{
    /// An attempt's outcome arrived: return it, or keep it and schedule a
    /// retry.
    fn on_outcome(&mut self, outcome: Outcome<S, Req, T>) -> StepOf<S, Req, T> {
        let config = self.service.config();
        let Some(request) = self.request.as_ref() else {
            // Not copyable: it went out once, its outcome goes back as is.
            return self.finish(outcome, Event::NotClonable);
        };
        let decision = config.policy.classify(request, &outcome);
        if let Some(pacing) = config.pacing() {
            pacing.observe(&decision, *self.stamp);
        }
        let (after, cause) = match decision {
            Decision::Success => {
                if let Some(budget) = config.budget() {
                    budget.on_success(*self.last_retry);
                }
                return self.finish(outcome, Event::Success);
            }
            Decision::Final => return self.finish(outcome, Event::Final),
            Decision::Retry { after, cause } => (after, cause),
        };
        match self.schedule(after, cause) {
            Ok((delay, transparent, due)) => {
                *self.previous_delay = delay;
                Step::Next(wait(Retry {
                    outcome,
                    cause,
                    delay,
                    transparent,
                    due,
                }))
            }
            Err(ending) => self.finish(outcome, ending),
        }
    }

    /// The delay before a retry for `cause`, whether it is the transparent
    /// one and when its sleep ends (if there is a deadline), or how the
    /// request ends instead. Charges nothing: the budget pays when the retry
    /// is sent.
    fn schedule(
        &mut self,
        after: Option<Duration>,
        cause: Cause,
    ) -> Result<(Duration, bool, Option<Instant>), Event> {
        let config = self.service.config();
        let transparent = cause == Cause::NotSent && !*self.transparent_used;
        let counted = *self.attempts - u32::from(*self.transparent_used);
        if counted >= *self.max_attempts {
            // `max_attempts(1)` turns every retry off, transparent ones too.
            if !transparent || *self.max_attempts == 1 {
                return Err(Event::OutOfAttempts);
            }
        }
        let capped = config.stop_at_cap && reached_cap(&config.schedule, counted);
        if capped && !transparent && after.is_none() {
            return Err(Event::OutOfAttempts);
        }
        let delay = match (transparent, after) {
            (true, _) => Duration::ZERO,
            // Never before the server asked: its policy bounds what it accepts.
            (false, Some(asked)) => asked,
            (false, None) => {
                let rng = self.rng.get_or_insert_with(|| config.new_rng());
                config
                    .jitter
                    .delay(&config.schedule, counted, *self.previous_delay, rng)
            }
        };
        let mut due = None;
        if let Some(deadline) = *self.deadline {
            match Instant::now().checked_add(delay) {
                Some(at) if at <= deadline => due = Some(at),
                _ => return Err(Event::OutOfTime),
            }
        }
        if !transparent && config.budget().is_some_and(|b| !b.would_allow(cause)) {
            budget_refused(*self.attempts, cause);
            return Err(Event::BudgetRefused);
        }
        Ok((delay, transparent, due))
    }

    /// The sleep before a retry is over.
    fn on_wake(&mut self, retry: Retry<Outcome<S, Req, T>>) -> StepOf<S, Req, T> {
        *self.slept = self.slept.saturating_add(retry.delay);
        if let Some(stats) = self
            .service
            .config()
            .shared
            .as_ref()
            .and_then(|s| s.stats.as_ref())
        {
            stats.record_sleep(retry.delay);
        }
        Step::Next(State::Readying { retry: Some(retry) })
    }

    /// The service answered readiness for a retry: commit it and send it, or
    /// return the outcome it would have replaced.
    fn send(
        &mut self,
        readiness: Result<(), S::Error>,
        retry: Retry<Outcome<S, Req, T>>,
    ) -> StepOf<S, Req, T> {
        if readiness.is_err() {
            // The readiness error says nothing about the request; the kept
            // outcome does.
            return self.finish(retry.outcome, Event::Final);
        }
        let config = self.service.config();
        // No attempt starts once the deadline has passed; but a sleep allowed
        // to end at the deadline wakes up to one timer tick after it, and
        // that alone does not make it late. Waiting for readiness does.
        let late = |deadline: Instant| {
            let now = Instant::now();
            let woke_on_time = retry.due.is_some_and(|due| now <= due + TIMER_RESOLUTION);
            now > deadline && !woke_on_time
        };
        if self.deadline.is_some_and(late) {
            return self.finish(retry.outcome, Event::OutOfTime);
        }
        let request = self
            .request
            .as_ref()
            .expect("a retry is scheduled only for a kept request");
        // Copied now, not when the last attempt went out: a streaming body may
        // have outgrown its replay limit since.
        let Some(mut copy) = config.policy.clone_request(request) else {
            return self.finish(retry.outcome, Event::NotClonable);
        };
        if !retry.transparent && config.budget().is_some_and(|b| !b.try_retry(retry.cause)) {
            budget_refused(*self.attempts, retry.cause);
            return self.finish(retry.outcome, Event::BudgetRefused);
        }
        // Committed: from here on the retry is sent.
        #[cfg(feature = "tracing")]
        tracing::debug!(
            attempt = *self.attempts,
            delay = ?retry.delay,
            reason = ?retry.cause,
            "retrying"
        );
        config
            .policy
            .on_retry(request, *self.attempts, retry.delay, &retry.outcome);
        config.policy.discard(retry.outcome);
        // Saturating: `unlimited_attempts` may count past u32::MAX.
        *self.attempts = self.attempts.saturating_add(1);
        *self.transparent_used |= retry.transparent;
        *self.last_retry = Some(retry.cause);
        config.policy.prepare_retry(&mut copy, *self.attempts);
        let timer = config.timeouts.timer(*self.deadline);
        let (future, stamp) = self.service.send(copy, *self.attempts);
        *self.stamp = stamp;
        Step::Next(State::Called { future, timer })
    }

    /// Ends the request with `outcome`.
    fn finish(&mut self, mut outcome: Outcome<S, Req, T>, ending: Event) -> StepOf<S, Req, T> {
        let config = self.service.config();
        config.record(ending);
        config
            .policy
            .finish(&mut outcome, *self.attempts, *self.slept);
        Step::Return(outcome)
    }
}

/// How late tokio's timer may wake a sleep: it rounds deadlines up to the
/// millisecond.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// The state that waits `delay` before readiness for a retry; a zero delay
/// goes straight to readiness, with no timer and no clock (tokio's timer would
/// round a zero sleep up to its 1 ms tick).
fn wait<F, Tm, O>(retry: Retry<O>) -> State<F, Tm, O> {
    if retry.delay.is_zero() {
        State::Readying { retry: Some(retry) }
    } else {
        State::Waiting {
            sleep: tokio::time::sleep(retry.delay),
            retry: Some(retry),
        }
    }
}

#[inline]
fn budget_refused(attempt: u32, cause: Cause) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        attempt,
        reason = ?cause,
        "retry budget exhausted; returning the last outcome"
    );
    let _ = (attempt, cause);
}

impl<S, P, Sch, Req, T> fmt::Debug for ResponseFuture<S, P, Sch, Req, T>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field("slept", &self.slept)
            .finish_non_exhaustive()
    }
}
