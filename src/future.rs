//! [`ResponseFuture`]: the retry state machine of one request.

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::jitter::Rng;
use crate::layer::Config;
use crate::policy::{Cause, Decision, Policy};
use crate::schedule::Schedule;
use crate::service::Backoff;
use crate::stats::Event;

pin_project! {
    /// The response future of [`Backoff`]: the attempts of one request and the
    /// sleeps between them.
    ///
    /// It resolves to the outcome of the last attempt, success or not, with the
    /// inner service's own error type.
    ///
    /// # Cancel safety
    /// Dropping it at any point stops the request: an attempt in flight is
    /// dropped with it, a pending sleep is cancelled, and no further attempt is
    /// made. No task is left behind, and a budget is charged only for attempts
    /// that were sent.
    pub struct ResponseFuture<S, P, Sch, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        service: Backoff<S, P, Sch>,
        // A copy of the request of the attempt in flight, to classify its
        // outcome and to send again; `None` when the policy would not copy it.
        // Before a paced first attempt, the request itself.
        request: Option<Req>,
        // Attempts sent so far.
        attempts: u32,
        // The pacing generation when the attempt in flight went out; with
        // pacing off, always zero.
        paced: u16,
        previous_delay: Duration,
        slept: Duration,
        // Read only when a time limit is configured.
        started: Option<Instant>,
        last_retry: Option<Cause>,
        // Created at the first retry or pacing pause, so the happy path never
        // draws.
        rng: Option<Rng>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is in flight.
        Called { #[pin] future: F },
        // Sleeping before the next attempt: the backoff delay, plus the
        // pacing pause while pacing is on.
        Waiting { #[pin] sleep: Sleep },
        // Waiting for the service to be ready for the next attempt.
        Retrying,
    }
}

impl<S, P, Sch, Req> ResponseFuture<S, P, Sch, Req>
where
    S: Service<Req>,
{
    #[inline(always)]
    pub(crate) fn new(
        future: S::Future,
        request: Option<Req>,
        service: Backoff<S, P, Sch>,
    ) -> Self {
        let started = service.config().max_elapsed.map(|_| Instant::now());
        Self {
            state: State::Called { future },
            service,
            request,
            attempts: 1,
            paced: 0,
            previous_delay: Duration::ZERO,
            slept: Duration::ZERO,
            started,
            last_retry: None,
            rng: None,
        }
    }

    /// A request whose first attempt waits for pacing: it sleeps, readies
    /// its own clone of the service, and only then sends `request`.
    pub(crate) fn paced(request: Req, service: Backoff<S, P, Sch>) -> Self {
        let config = service.config();
        let started = config.max_elapsed.map(|_| Instant::now());
        let mut rng = None;
        let state = send_next(config, Duration::ZERO, &mut rng);
        Self {
            state,
            service,
            request: Some(request),
            attempts: 0,
            paced: 0,
            previous_delay: Duration::ZERO,
            slept: Duration::ZERO,
            started,
            last_retry: None,
            rng,
        }
    }
}

impl<S, P, Sch, Req> Future for ResponseFuture<S, P, Sch, Req>
where
    S: Service<Req> + Clone,
    P: Policy<Req, S::Response, S::Error>,
    Sch: Schedule,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let mut result = ready!(future.poll(cx));
                    let config = this.service.config();
                    let shared = config.shared.as_deref();
                    let next = 'decide: {
                        let Some(request) = this.request.as_ref() else {
                            // Not copyable: it went out once, its outcome goes
                            // back as is.
                            break 'decide ControlFlow::Break(Event::NotClonable);
                        };
                        let decision = config.policy.classify(request, &result);
                        if let Some(pacing) = shared.and_then(|s| s.pacing.as_ref()) {
                            pacing.observe(&decision, *this.paced);
                        }
                        let (after, cause) = match decision {
                            Decision::Success => {
                                if let Some(budget) = shared.and_then(|s| s.budget.as_ref()) {
                                    budget.on_success(*this.last_retry);
                                }
                                break 'decide ControlFlow::Break(Event::Success);
                            }
                            Decision::Fail => break 'decide ControlFlow::Break(Event::Final),
                            Decision::Retry { after, cause } => (after, cause),
                        };
                        match next_delay(
                            config,
                            after,
                            cause,
                            *this.attempts,
                            *this.previous_delay,
                            *this.started,
                            this.rng,
                        ) {
                            Ok(delay) => {
                                #[cfg(feature = "tracing")]
                                tracing::debug!(
                                    attempt = *this.attempts,
                                    ?delay,
                                    reason = ?cause,
                                    "retrying"
                                );
                                config
                                    .policy
                                    .on_retry(request, *this.attempts, delay, &result);
                                *this.last_retry = Some(cause);
                                ControlFlow::Continue(delay)
                            }
                            Err(ending) => {
                                #[cfg(feature = "tracing")]
                                if ending == Event::BudgetRefused {
                                    tracing::warn!(
                                        attempt = *this.attempts,
                                        reason = ?cause,
                                        "retry budget exhausted; returning the last outcome"
                                    );
                                }
                                ControlFlow::Break(ending)
                            }
                        }
                    };
                    let delay = match next {
                        ControlFlow::Continue(delay) => delay,
                        ControlFlow::Break(ending) => {
                            if let Some(shared) = shared {
                                shared.record(ending);
                            }
                            config
                                .policy
                                .finish(&mut result, *this.attempts, *this.slept);
                            return Poll::Ready(result);
                        }
                    };
                    config.policy.discard(result);
                    *this.previous_delay = delay;
                    *this.slept += delay;
                    this.state.set(send_next(config, delay, this.rng));
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    let config = this.service.config();
                    if let Some(stats) = config.shared.as_ref().and_then(|s| s.stats.as_ref()) {
                        // Zero before a paced first attempt: nothing to add.
                        if !this.previous_delay.is_zero() {
                            stats.record_sleep(*this.previous_delay);
                        }
                    }
                    this.state.set(State::Retrying);
                }
                StateProj::Retrying => {
                    if let Err(error) = ready!(this.service.get_mut().poll_ready(cx)) {
                        let mut result = Err(error);
                        let config = this.service.config();
                        if let Some(shared) = config.shared.as_deref() {
                            shared.record(Event::Final);
                        }
                        config
                            .policy
                            .finish(&mut result, *this.attempts, *this.slept);
                        return Poll::Ready(result);
                    }
                    let request = this
                        .request
                        .take()
                        .expect("an attempt is only scheduled while the request is held");
                    let config = this.service.config();
                    *this.request = config.policy.clone_request(&request);
                    *this.attempts += 1;
                    if let Some(shared) = config.shared.as_deref() {
                        shared.on_send(*this.attempts);
                        if let Some(pacing) = &shared.pacing {
                            *this.paced = pacing.now().1;
                        }
                    }
                    let future = this.service.get_mut().call(request);
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}

/// The state that sends the next attempt after `delay`: a sleep of the delay
/// plus, while the shared pacing interval is above zero, a randomized pause,
/// in one timer. With neither, straight to readiness: no timer, no clock
/// (tokio's timer would round a zero sleep up to its 1 ms tick).
fn send_next<F, P, Sch>(
    config: &Config<P, Sch>,
    delay: Duration,
    rng: &mut Option<Rng>,
) -> State<F> {
    let mut sleep = delay;
    if let Some(pacing) = config.shared.as_ref().and_then(|s| s.pacing.as_ref()) {
        let (interval, _) = pacing.now();
        if interval != 0 {
            let pause = pacing.pause(interval, rng.get_or_insert_with(|| new_rng(config)));
            pacing.record_pause(pause);
            sleep = sleep.saturating_add(pause);
        }
    }
    if sleep.is_zero() {
        State::Retrying
    } else {
        State::Waiting {
            sleep: tokio::time::sleep(sleep),
        }
    }
}

/// The sleep before the next attempt, or how the request ends instead. The budget is
/// asked last, so it is charged only for a retry that will really go out.
fn next_delay<P, Sch: Schedule>(
    config: &Config<P, Sch>,
    after: Option<Duration>,
    cause: Cause,
    attempts: u32,
    previous: Duration,
    started: Option<Instant>,
    rng: &mut Option<Rng>,
) -> Result<Duration, Event> {
    if attempts >= config.max_attempts {
        return Err(Event::OutOfAttempts);
    }
    let schedule = &config.schedule;
    // A server's delay is capped, but it still says when the server expects to
    // be ready: if that is past the time limit, a retry before it is wasted.
    let (delay, wanted) = match after {
        Some(asked) => (asked.min(schedule.cap()), asked),
        None => {
            let rng = rng.get_or_insert_with(|| new_rng(config));
            let delay = config.jitter.delay(schedule, attempts, previous, rng);
            (delay, delay)
        }
    };
    if let (Some(limit), Some(started)) = (config.max_elapsed, started) {
        if started.elapsed().saturating_add(wanted) > limit {
            return Err(Event::OutOfTime);
        }
    }
    if let Some(budget) = config.shared.as_ref().and_then(|s| s.budget.as_ref()) {
        if !budget.try_retry(cause) {
            return Err(Event::BudgetRefused);
        }
    }
    Ok(delay)
}

fn new_rng<P, Sch>(config: &Config<P, Sch>) -> Rng {
    match config.shared.as_deref() {
        Some(shared) => match shared.seed {
            Some(seed) => Rng::stream(seed, shared.streams.fetch_add(1, Ordering::Relaxed)),
            None => Rng::from_entropy(),
        },
        None => Rng::from_entropy(),
    }
}

impl<S, P, Sch, Req> fmt::Debug for ResponseFuture<S, P, Sch, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field("slept", &self.slept)
            .finish_non_exhaustive()
    }
}
