//! The retry engine: one synchronous retry session per request, which every
//! front-end (the layer's response future, [`retry`](fn@crate::retry),
//! [`Delays`](crate::Delays) and the poller of `tower-backoff`) asks what
//! next, so that they all decide alike. Public for those front-ends and for
//! anyone writing another; a user of the layer never needs it.
//!
//! A session owns every decision between two attempts: the stop rules
//! (attempts, the schedule's cap, the deadline), the delay (the schedule and
//! its jitter, or the one the server named), the one transparent retry, and
//! the budget: checked when a retry is decided, charged when it is sent. It
//! reads no clock and sleeps nowhere: the front-end passes the time in and
//! does the waiting, so the engine runs, and is tested, without a runtime.
//!
//! The order every front-end follows:
//! 1. an attempt's outcome asks for a retry: [`Session::decide`] gives its
//!    delay, or how the request ends instead;
//! 2. the front-end sleeps the delay ([`Session::slept`]) and readies its
//!    service;
//! 3. [`Session::send`] commits the retry as it goes out, or refuses it
//!    ([`Session::send_through`] asks a circuit breaker first); only then do
//!    hooks hear of the retry (one rule: hooks fire at send);
//! 4. an outcome that ends the request as a success refunds the budget,
//!    told the cause of the last retry ([`Session::last_retry`]).
//!
//! A hedge of the attempt in flight is admitted here too: asked before the
//! service is readied for it, and committed ([`Session::send_hedge`]) as it
//! goes out.

use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::{Admission, CircuitBreaker};
use crate::budget::Budget;
use crate::decision::Cause;
use crate::error::MAX_DURATION;
use crate::hedge::LoadCap;
use crate::jitter::{Jitter, Rng};

pub use crate::limits::UNLIMITED_ATTEMPTS;
use crate::schedule::Schedule;

/// How a request ended: the outcome it returns is the last real one, and this
/// says why no further attempt was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// The policy called the outcome a success.
    Success,
    /// The policy called the outcome final, or the service failed to become
    /// ready for a retry.
    Final,
    /// No attempt left: the limit, or the schedule reached its cap with
    /// stop-at-cap.
    OutOfAttempts,
    /// The retry would end past the request's deadline, or was ready only
    /// after it.
    OutOfTime,
    /// The budget refused the retry.
    BudgetRefused,
    /// The request could not be copied for the retry.
    NotReplayable,
    /// The [circuit breaker](crate::breaker) was open when the retry was to
    /// go out: it stopped the retry before the budget paid for it.
    BreakerOpen,
}

/// The settings one configuration gives every session: read, never written.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a, S: ?Sized, B: ?Sized> {
    /// The delay before each retry, before jitter.
    pub schedule: &'a S,
    /// How each delay is randomized.
    pub jitter: Jitter,
    /// Stop once the schedule's delay reaches its cap (after one last try).
    pub stop_at_cap: bool,
    /// Wait a delay the server named as it is, even below the schedule's
    /// (gRPC's pushback, as gRFC A6 says), instead of raising it to the
    /// schedule's delay for that retry.
    pub exact_server_delays: bool,
    /// The budget retries are checked against when decided and charged to
    /// when sent, if any.
    pub budget: Option<&'a B>,
}

/// A retry decided but not sent yet: the front-end waits `delay`, then asks
/// [`Session::send`] to commit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retry {
    /// Why the attempt before failed: what the budget charges for.
    pub cause: Cause,
    /// How long to wait before sending it.
    pub delay: Duration,
    /// The one free retry of a request that never left (`Cause::NotSent`): no
    /// delay, no attempt counted, no budget.
    pub transparent: bool,
    /// Whether the budget pays for it: every retry but the transparent one
    /// and a conflict's, whoever named its delay. A server's delay
    /// decides when a retry goes, never whether: a `Retry-After` sent to
    /// every client cannot know how many it invites back.
    pub paid: bool,
    /// When its sleep ends, if the request has a deadline.
    pub due: Option<Instant>,
}

impl Retry {
    /// A retry whose time the front-end sets itself, with no delay of the
    /// engine's: the poller's re-probe of a provider it evicted.
    pub fn planned(cause: Cause) -> Self {
        Self {
            cause,
            delay: Duration::ZERO,
            transparent: false,
            paid: Self::pays(cause, false),
            due: None,
        }
    }

    /// Whether the budget pays for a retry for `cause`: every one a server
    /// saw, whoever named its delay, but a conflict's (the server answered
    /// promptly, so it adds no load to an outage, and a racer the budget
    /// refused would only send again at once, without the backoff that
    /// spreads them) and the transparent one.
    fn pays(cause: Cause, transparent: bool) -> bool {
        !transparent && cause != Cause::Conflict
    }
}

/// What a hedge must get through besides the request's own limits: the
/// layer's load cap on hedges, its breaker and its budget.
pub(crate) struct HedgeGates<'a, B: ?Sized> {
    pub(crate) cap: &'a LoadCap,
    pub(crate) breaker: Option<&'a CircuitBreaker>,
    pub(crate) budget: Option<&'a B>,
}

/// Whether a hedge may go out now: [`Session::may_hedge`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HedgeAdmission {
    /// Nothing stands in its way.
    Admitted,
    /// Only the load cap is full: ask again a little later.
    Later,
    /// The attempt limit, the deadline, the breaker or the budget refuse it.
    Refused,
}

/// One request's retries: how many attempts went out, what was slept, and
/// where the schedule stands.
#[derive(Debug, Clone)]
pub struct Session {
    /// Attempts sent so far, the first included.
    attempts: u32,
    max_attempts: u32,
    transparent_used: bool,
    previous_delay: Duration,
    /// The count of attempts at which the schedule last restarted: after a
    /// delay the server named, the next delay the schedule picks is its first
    /// (as gRPC's clients do after a pushback).
    restart: u32,
    slept: Duration,
    deadline: Option<Instant>,
    last_retry: Option<Cause>,
    /// Hedges sent, among `attempts`.
    hedges: u32,
    /// Made at the first jittered delay, so a request that never retries
    /// never draws.
    rng: Option<Rng>,
}

/// How late tokio's timer may wake a sleep: it rounds deadlines up to the
/// millisecond.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

impl Session {
    /// A request whose first attempt went out, allowed `max_attempts` in all
    /// and bound to end by `deadline`, if any.
    pub fn new(max_attempts: u32, deadline: Option<Instant>) -> Self {
        Self {
            attempts: 1,
            max_attempts,
            transparent_used: false,
            previous_delay: Duration::ZERO,
            restart: 0,
            slept: Duration::ZERO,
            deadline,
            last_retry: None,
            hedges: 0,
            rng: None,
        }
    }

    /// Draws this session's jitter from `rng` rather than one made at its
    /// first delay.
    pub fn with_rng(mut self, rng: Rng) -> Self {
        self.rng = Some(rng);
        self
    }

    /// The same session, allowed `max_attempts` in all.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Attempts allowed in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Starts over from the first attempt, as a loop written by hand does
    /// once it got through: the whole limit is available again and the
    /// schedule starts from its first delay; the random stream goes on.
    pub fn reset(&mut self) {
        let rng = self.rng.take();
        *self = Self {
            rng,
            ..Self::new(self.max_attempts, self.deadline)
        };
    }

    /// The delay before the last retry decided, or zero before the first.
    pub fn previous_delay(&self) -> Duration {
        self.previous_delay
    }

    /// Attempts sent so far, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The time slept before retries so far.
    pub fn slept(&self) -> Duration {
        self.slept
    }

    /// When the request must end, if it must.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The cause of the last retry sent, if the budget paid for it: what a
    /// budget's refund on success depends on. `None` before any retry and
    /// after a free one (the transparent retry, a conflict's): its success
    /// earns the plain refund, not the return of a cost never paid.
    pub fn last_retry(&self) -> Option<Cause> {
        self.last_retry
    }

    /// Hedges sent, among the attempts.
    pub fn hedges(&self) -> u32 {
        self.hedges
    }

    /// Transparent retries sent: 0, or 1 once the one free retry of a
    /// request that never left went out.
    pub fn transparent_retries(&self) -> u32 {
        u32::from(self.transparent_used)
    }

    /// Attempts that count against `max_attempts`: the transparent retry
    /// does not.
    fn counted(&self) -> u32 {
        self.attempts - u32::from(self.transparent_used)
    }

    /// An attempt's outcome asked for a retry for `cause`, after `after` if
    /// the server named a delay: the retry to wait for, or how the request
    /// ends instead. `replayable` says whether the front-end can still send
    /// the request again; `now` is read only when the request has a deadline.
    /// Charges nothing: the budget pays in [`send`](Self::send).
    pub fn decide<S, B>(
        &mut self,
        rules: &Rules<'_, S, B>,
        after: Option<Duration>,
        cause: Cause,
        replayable: bool,
        now: impl FnOnce() -> Instant,
        new_rng: impl FnOnce() -> Rng,
    ) -> Result<Retry, Ending>
    where
        S: Schedule + ?Sized,
        B: Budget + ?Sized,
    {
        let transparent = cause == Cause::NotSent && !self.transparent_used;
        if self.counted() >= self.max_attempts && self.max_attempts != UNLIMITED_ATTEMPTS {
            // `max_attempts(1)` turns every retry off, transparent ones too.
            if !transparent || self.max_attempts == 1 {
                return Err(Ending::OutOfAttempts);
            }
        }
        if !replayable {
            return Err(Ending::NotReplayable);
        }
        let capped = rules.stop_at_cap && rules.schedule.delay(self.step()) >= rules.schedule.cap();
        if capped && !transparent && after.is_none() {
            return Err(Ending::OutOfAttempts);
        }
        let delay = match (transparent, after) {
            (true, _) => Duration::ZERO,
            // Never before the server asked (the policy bounds what it
            // accepts), nor sooner than the schedule would: a server that
            // names 1 ms does not turn the backoff into a tight loop.
            (false, Some(asked)) if rules.exact_server_delays => asked.min(MAX_DURATION),
            (false, Some(asked)) => {
                asked
                    .min(MAX_DURATION)
                    .max(self.next_delay(rules.schedule, rules.jitter, new_rng))
            }
            (false, None) => self.next_delay(rules.schedule, rules.jitter, new_rng),
        };
        let mut due = None;
        if let Some(deadline) = self.deadline {
            match now().checked_add(delay) {
                Some(at) if at <= deadline => due = Some(at),
                _ => return Err(Ending::OutOfTime),
            }
        }
        let paid = Retry::pays(cause, transparent);
        // A retry the budget would refuse ends at once, unless the server is
        // up and asked to wait (a throttle, or a delay it named): then the
        // request waits its delay out and the budget is asked again at send,
        // so that a caller who sends again as soon as a request ends does
        // not turn the server's "later" into a tight loop. An outage's
        // failures still fail fast.
        let waits = after.is_some() || cause == Cause::Throttled;
        if paid && rules.budget.is_some_and(|b| !b.would_allow(cause)) && !waits {
            return Err(Ending::BudgetRefused);
        }
        self.previous_delay = delay;
        if after.is_some() && !transparent {
            self.restart = self.counted();
        }
        Ok(Retry {
            cause,
            delay,
            transparent,
            paid,
            due,
        })
    }

    /// The schedule's next delay, jittered, without deciding a retry: what a
    /// loop waits when the budget refused the retry it decided (the poller
    /// polls again later instead of giving up).
    pub fn next_delay<S: Schedule + ?Sized>(
        &mut self,
        schedule: &S,
        jitter: Jitter,
        new_rng: impl FnOnce() -> Rng,
    ) -> Duration {
        // A schedule capped at zero never sleeps, whatever the jitter.
        if schedule.cap().is_zero() {
            return Duration::ZERO;
        }
        let step = self.step();
        let rng = self.rng.get_or_insert_with(new_rng);
        let delay = jitter.delay(schedule, step, self.previous_delay, rng);
        self.previous_delay = delay;
        delay
    }

    /// The schedule's step: retries since it last restarted.
    fn step(&self) -> u32 {
        self.counted().saturating_sub(self.restart)
    }

    /// The sleep before `retry` is over.
    pub fn slept_for(&mut self, retry: &Retry) {
        self.slept = self.slept.saturating_add(retry.delay);
    }

    /// `retry` is about to go out: commits it and returns what `copy` makes of
    /// the request, or how the request ends instead. In this order: a retry
    /// ready only after the deadline is late; a request that cannot be copied
    /// any more is not replayable; then the budget pays, and only then is the
    /// retry counted. `now` is read only when the request has a deadline.
    pub fn send<B, R>(
        &mut self,
        retry: &Retry,
        budget: Option<&B>,
        now: impl FnOnce() -> Instant,
        copy: impl FnOnce() -> Option<R>,
    ) -> Result<R, Ending>
    where
        B: Budget + ?Sized,
    {
        self.send_through(retry, None, budget, now, copy)
            .map(|(copy, _)| copy)
    }

    /// [`send`](Self::send), through `breaker` if there is one: after the
    /// request is copied and before the budget pays, the breaker admits the
    /// retry, or the request ends with [`Ending::BreakerOpen`], charging
    /// nothing. A probe the budget then refuses is given back to the breaker.
    /// Returns the copy and what the breaker said, so that the front-end can
    /// tell its observers of a breaker that went half-open.
    #[inline(always)]
    pub fn send_through<B, R>(
        &mut self,
        retry: &Retry,
        breaker: Option<&CircuitBreaker>,
        budget: Option<&B>,
        now: impl FnOnce() -> Instant,
        copy: impl FnOnce() -> Option<R>,
    ) -> Result<(R, Admission), Ending>
    where
        B: Budget + ?Sized,
    {
        if let Some(deadline) = self.deadline {
            // No attempt starts once the deadline has passed; but a sleep
            // allowed to end at the deadline wakes up to one timer tick after
            // it, and that alone does not make it late. Waiting for readiness
            // does.
            let now = now();
            let woke_on_time = retry.due.is_some_and(|due| now <= due + TIMER_RESOLUTION);
            if now > deadline && !woke_on_time {
                return Err(Ending::OutOfTime);
            }
        }
        // The copy is moved once, into the result: taken out of its `Option`
        // first, it would be moved twice.
        let Some(copy) = copy() else {
            return Err(Ending::NotReplayable);
        };
        let admission = match breaker {
            None => Admission::Closed,
            Some(breaker) => match breaker.admit() {
                Admission::Rejected => return Err(Ending::BreakerOpen),
                admitted => admitted,
            },
        };
        if retry.paid && budget.is_some_and(|b| !b.try_retry(retry.cause)) {
            if let Some(breaker) = breaker {
                breaker.cancel(admission);
            }
            return Err(Ending::BudgetRefused);
        }
        // Saturating: unlimited attempts may count past u32::MAX.
        self.attempts = self.attempts.saturating_add(1);
        self.transparent_used |= retry.transparent;
        self.last_retry = retry.paid.then_some(retry.cause);
        Ok((copy, admission))
    }

    /// Whether `retry`, once sent, is the last attempt the limit allows.
    pub fn is_last(&self, retry: &Retry) -> bool {
        let counted = self.counted() + u32::from(!retry.transparent);
        self.max_attempts != UNLIMITED_ATTEMPTS && counted >= self.max_attempts
    }

    /// Whether the attempt limit leaves room for one more copy: what
    /// [`send_hedge`](Self::send_hedge) checks first (the transparent retry
    /// does not count, unlimited attempts always leave room).
    pub fn has_room_for_hedge(&self) -> bool {
        self.counted() < self.max_attempts || self.max_attempts == UNLIMITED_ATTEMPTS
    }

    /// Whether a hedge of the attempt in flight may go out at `now`, as far
    /// as `gates` know now, taking nothing: the attempt limit, the deadline,
    /// the load cap, a closed breaker and the budget. Asked before the
    /// service is readied for the hedge, so that a hedge that will not go
    /// out never holds what readiness reserves (a concurrency permit) until
    /// the request ends; [`send_hedge_through`](Self::send_hedge_through)
    /// then commits it. The one place a hedge is admitted, as
    /// [`decide`](Self::decide) is for a retry; the policy's say on the copy
    /// is asked in between.
    ///
    /// Only the load cap says [`Later`](HedgeAdmission::Later): its room
    /// grows with every request that comes, so a hedge it turns away now
    /// may go out a little later, while the attempt is still pending.
    pub(crate) fn may_hedge<B>(&self, gates: &HedgeGates<'_, B>, now: Instant) -> HedgeAdmission
    where
        B: Budget + ?Sized,
    {
        let admitted = self.has_room_for_hedge()
            && self.deadline.is_none_or(|deadline| now < deadline)
            && gates
                .breaker
                .is_none_or(|b| b.state() == crate::breaker::BreakerState::Closed)
            && gates.budget.is_none_or(|b| b.would_allow(Cause::Hedge));
        if !admitted {
            HedgeAdmission::Refused
        } else if gates.cap.would_take(now) {
            HedgeAdmission::Admitted
        } else {
            HedgeAdmission::Later
        }
    }

    /// [`send_hedge`](Self::send_hedge) at `now`, within the load cap of
    /// `gates`: the cap is taken after the deadline and before the copy,
    /// and given back if the breaker or the budget then refuse. Between
    /// [`may_hedge`](Self::may_hedge) and this, another request may have
    /// taken what was left: then `None`, as from `send_hedge`.
    pub(crate) fn send_hedge_through<B, R>(
        &mut self,
        gates: &HedgeGates<'_, B>,
        now: Instant,
        copy: impl FnOnce() -> Option<R>,
    ) -> Option<R>
    where
        B: Budget + ?Sized,
    {
        let mut taken = false;
        let sent = self.send_hedge(
            gates.breaker,
            gates.budget,
            || now,
            || {
                taken = gates.cap.try_take(now);
                if taken {
                    copy()
                } else {
                    None
                }
            },
        );
        if sent.is_none() && taken {
            gates.cap.give_back(now);
        }
        sent
    }

    /// A hedge of the attempt in flight is due: commits it and returns what
    /// `copy` makes of the request, or `None` when no hedge may go out. In
    /// this order: the attempt limit (a hedge counts against it), the
    /// deadline, the copy, a breaker that is not closed (a hedge is never
    /// its probe), and the budget, which pays it as a retry for
    /// [`Cause::Hedge`]. `now` is read only when the request has a deadline.
    pub fn send_hedge<B, R>(
        &mut self,
        breaker: Option<&CircuitBreaker>,
        budget: Option<&B>,
        now: impl FnOnce() -> Instant,
        copy: impl FnOnce() -> Option<R>,
    ) -> Option<R>
    where
        B: Budget + ?Sized,
    {
        if !self.has_room_for_hedge() {
            return None;
        }
        if self.deadline.is_some_and(|deadline| now() >= deadline) {
            return None;
        }
        let copy = copy()?;
        if let Some(breaker) = breaker {
            match breaker.admit() {
                Admission::Closed => {}
                admitted => {
                    breaker.cancel(admitted);
                    return None;
                }
            }
        }
        if budget.is_some_and(|b| !b.try_retry(Cause::Hedge)) {
            return None;
        }
        self.attempts = self.attempts.saturating_add(1);
        self.hedges = self.hedges.saturating_add(1);
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Constant, Exponential};
    use crate::TokenBucket;

    const NO_BUDGET: Option<&TokenBucket> = None;

    fn rules<S: Schedule>(schedule: &S) -> Rules<'_, S, TokenBucket> {
        Rules {
            schedule,
            jitter: Jitter::None,
            stop_at_cap: false,
            exact_server_delays: false,
            budget: NO_BUDGET,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn never() -> Instant {
        unreachable!("no deadline: the clock is not read")
    }

    fn rng() -> Rng {
        Rng::seeded(1)
    }

    /// A bucket that pays exactly one retry, whatever its cause.
    fn one_retry_bucket() -> TokenBucket {
        TokenBucket::builder()
            .capacity(5)
            .retry_cost(5)
            .timeout_cost(5)
            .build()
            .unwrap()
    }

    /// A bucket of one retry, spent: any retry the budget pays is refused.
    fn emptied_bucket() -> TokenBucket {
        let bucket = one_retry_bucket();
        assert!(bucket.try_retry(Cause::Transient), "empties the bucket");
        bucket
    }

    /// Decides and sends a plain retry, returning its delay.
    fn retry_once<S: Schedule>(
        session: &mut Session,
        rules: &Rules<'_, S, TokenBucket>,
    ) -> Result<Duration, Ending> {
        let retry = session.decide(rules, None, Cause::Transient, true, never, rng)?;
        session.slept_for(&retry);
        session.send(&retry, rules.budget, never, || Some(()))?;
        Ok(retry.delay)
    }

    /// Decides and sends the retry of an attempt that never left (the
    /// transparent one, while it is free), returning it.
    fn send_not_sent<S: Schedule>(
        session: &mut Session,
        rules: &Rules<'_, S, TokenBucket>,
    ) -> Retry {
        let retry = session
            .decide(rules, None, Cause::NotSent, true, never, rng)
            .unwrap();
        session.send(&retry, NO_BUDGET, never, || Some(())).unwrap();
        retry
    }

    #[test]
    fn delays_follow_the_schedule_until_the_attempts_are_spent() {
        let schedule = Exponential::new(ms(100));
        let rules = rules(&schedule);
        let mut session = Session::new(4, None);
        let delays: Vec<_> = (0..4).map(|_| retry_once(&mut session, &rules)).collect();
        assert_eq!(
            delays,
            [
                Ok(ms(100)),
                Ok(ms(200)),
                Ok(ms(400)),
                Err(Ending::OutOfAttempts)
            ]
        );
        assert_eq!(session.attempts(), 4);
        assert_eq!(session.slept(), ms(700));
    }

    #[test]
    fn a_server_delay_is_used_as_asked_and_restarts_the_schedule() {
        let schedule = Exponential::new(ms(100)).max_delay(ms(400));
        let rules = rules(&schedule);
        let mut session = Session::new(10, None);
        assert_eq!(retry_once(&mut session, &rules), Ok(ms(100)));
        let asked = session
            .decide(
                &rules,
                Some(Duration::from_secs(30)),
                Cause::Throttled,
                true,
                never,
                rng,
            )
            .unwrap();
        // Past the schedule's cap: never before the server asked.
        assert_eq!(asked.delay, Duration::from_secs(30));
        session.send(&asked, NO_BUDGET, never, || Some(())).unwrap();
        assert_eq!(retry_once(&mut session, &rules), Ok(ms(100)));
        assert_eq!(retry_once(&mut session, &rules), Ok(ms(200)));
    }

    #[test]
    fn one_transparent_retry_is_free_and_immediate_then_counts() {
        let schedule = Constant::new(ms(50));
        let rules = rules(&schedule);
        let mut session = Session::new(2, None);
        let free = send_not_sent(&mut session, &rules);
        assert!(free.transparent);
        assert_eq!(free.delay, Duration::ZERO);
        // The free one did not count: one ordinary retry is left.
        let second = session
            .decide(&rules, None, Cause::NotSent, true, never, rng)
            .unwrap();
        assert!(!second.transparent);
        assert_eq!(second.delay, ms(50));
        session
            .send(&second, NO_BUDGET, never, || Some(()))
            .unwrap();
        assert_eq!(
            session.decide(&rules, None, Cause::NotSent, true, never, rng),
            Err(Ending::OutOfAttempts)
        );
    }

    #[test]
    fn one_attempt_allows_no_retry_at_all_not_even_a_transparent_one() {
        let schedule = Constant::new(ms(50));
        let mut session = Session::new(1, None);
        assert_eq!(
            session.decide(&rules(&schedule), None, Cause::NotSent, true, never, rng),
            Err(Ending::OutOfAttempts)
        );
    }

    #[test]
    fn stop_at_cap_makes_the_attempt_after_the_last_delay_below_the_cap_the_last() {
        let schedule = Exponential::new(ms(1_000)).max_delay(ms(10_000));
        let rules = Rules {
            stop_at_cap: true,
            ..rules(&schedule)
        };
        let mut session = Session::new(UNLIMITED_ATTEMPTS, None);
        let mut delays = Vec::new();
        // Bounded: a rule that never stops fails here instead of hanging.
        let ending = (0..10).find_map(|_| match retry_once(&mut session, &rules) {
            Ok(delay) => {
                delays.push(delay);
                None
            }
            Err(ending) => Some(ending),
        });
        assert_eq!(delays, [1_000, 2_000, 4_000, 8_000].map(ms));
        assert_eq!(ending, Some(Ending::OutOfAttempts));
        assert_eq!(session.attempts(), 5);
    }

    #[test]
    fn a_retry_whose_sleep_would_pass_the_deadline_is_not_decided() {
        let start = Instant::now();
        let schedule = Constant::new(ms(1_000));
        let rules = rules(&schedule);
        let mut session = Session::new(100, Some(start + ms(2_500)));
        let at = |offset| move || start + ms(offset);
        let first = session
            .decide(&rules, None, Cause::Transient, true, at(0), rng)
            .unwrap();
        assert_eq!(first.due, Some(start + ms(1_000)));
        session
            .send(&first, NO_BUDGET, at(1_000), || Some(()))
            .unwrap();
        let second = session
            .decide(&rules, None, Cause::Transient, true, at(1_000), rng)
            .unwrap();
        session
            .send(&second, NO_BUDGET, at(2_000), || Some(()))
            .unwrap();
        assert_eq!(
            session.decide(&rules, None, Cause::Transient, true, at(2_000), rng),
            Err(Ending::OutOfTime)
        );
    }

    #[test]
    fn a_retry_ready_only_after_the_deadline_is_late_but_a_timer_tick_is_not() {
        let start = Instant::now();
        let schedule = Constant::new(ms(1_000));
        let rules = rules(&schedule);
        let mut session = Session::new(3, Some(start + ms(1_000)));
        let retry = session
            .decide(&rules, None, Cause::Transient, true, || start, rng)
            .unwrap();
        let mut on_time = session.clone();
        assert_eq!(
            on_time.send(&retry, NO_BUDGET, || start + ms(1_001), || Some(())),
            Ok(())
        );
        assert_eq!(
            session.send(&retry, NO_BUDGET, || start + ms(1_002), || Some(())),
            Err(Ending::OutOfTime)
        );
        assert_eq!(session.attempts(), 1);
    }

    #[test]
    fn the_budget_is_checked_at_decision_and_charged_only_at_send() {
        let bucket = TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        let mut session = Session::new(10, None);
        let first = session
            .decide(&rules, None, Cause::Transient, true, never, rng)
            .unwrap();
        // Decided, not sent: nothing spent, so a second decision is allowed too.
        assert!(bucket.would_allow(Cause::Transient));
        session
            .send(&first, rules.budget, never, || Some(()))
            .unwrap();
        assert_eq!(retry_once(&mut session, &rules), Ok(ms(10)));
        assert_eq!(retry_once(&mut session, &rules), Err(Ending::BudgetRefused));
        assert_eq!(session.attempts(), 3);
    }

    #[test]
    fn a_request_that_cannot_be_copied_ends_before_the_budget_pays() {
        let bucket = one_retry_bucket();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        let mut session = Session::new(3, None);
        assert_eq!(
            session.decide(&rules, None, Cause::Transient, false, never, rng),
            Err(Ending::NotReplayable)
        );
        let retry = session
            .decide(&rules, None, Cause::Transient, true, never, rng)
            .unwrap();
        assert_eq!(
            session.send(&retry, rules.budget, never, || None::<()>),
            Err(Ending::NotReplayable)
        );
        assert!(bucket.would_allow(Cause::Transient), "nothing was charged");
    }

    #[test]
    fn a_schedule_capped_at_zero_never_sleeps_whatever_the_jitter() {
        let schedule = Constant::new(Duration::ZERO);
        let rules = Rules {
            jitter: Jitter::Decorrelated,
            ..rules(&schedule)
        };
        let mut session = Session::new(3, None);
        assert_eq!(retry_once(&mut session, &rules), Ok(Duration::ZERO));
    }

    #[test]
    fn the_last_retry_is_none_until_a_retry_is_sent_then_its_cause() {
        let schedule = Constant::new(ms(10));
        let rules = rules(&schedule);
        let mut session = Session::new(3, None);
        assert_eq!(session.last_retry(), None);
        let retry = session
            .decide(&rules, None, Cause::Timeout, true, never, rng)
            .unwrap();
        assert_eq!(session.last_retry(), None, "decided, not sent yet");
        session.send(&retry, NO_BUDGET, never, || Some(())).unwrap();
        assert_eq!(session.last_retry(), Some(Cause::Timeout));
    }

    #[test]
    fn a_transparent_retry_sent_leaves_no_paid_retry_to_refund() {
        let schedule = Constant::new(ms(10));
        let rules = rules(&schedule);
        let mut session = Session::new(3, None);
        let free = send_not_sent(&mut session, &rules);
        assert!(free.transparent);
        assert_eq!(session.last_retry(), None, "the free retry was not paid");
        let paid = session
            .decide(&rules, None, Cause::Timeout, true, never, rng)
            .unwrap();
        session.send(&paid, NO_BUDGET, never, || Some(())).unwrap();
        assert_eq!(session.last_retry(), Some(Cause::Timeout));
    }

    /// Every retry a server saw pays, whatever named its delay: a server's
    /// delay decides when, never whether.
    #[test]
    fn an_empty_budget_refuses_every_retry_whatever_its_cause_or_server_delay() {
        let bucket = emptied_bucket();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        for cause in [Cause::Transient, Cause::Timeout, Cause::Throttled] {
            if cause != Cause::Throttled {
                assert_eq!(
                    Session::new(3, None).decide(&rules, None, cause, true, never, rng),
                    Err(Ending::BudgetRefused),
                    "{cause:?}, at once"
                );
            }
            // A server's delay (a throttle's own too) is waited out first,
            // then the send refuses.
            let throttle = (cause == Cause::Throttled).then_some(None);
            for after in [Some(Duration::ZERO), Some(ms(1)), Some(ms(500))]
                .into_iter()
                .chain(throttle)
            {
                let mut session = Session::new(3, None);
                let retry = session
                    .decide(&rules, after, cause, true, never, rng)
                    .unwrap();
                assert!(retry.paid, "{cause:?} after {after:?}");
                assert_eq!(retry.delay, after.unwrap_or_default().max(ms(10)));
                assert_eq!(
                    session.send(&retry, rules.budget, never, || Some(())),
                    Err(Ending::BudgetRefused),
                    "{cause:?} after {after:?}"
                );
                assert_eq!(session.attempts(), 1, "nothing went out");
            }
        }
        // Only the retry of a request the server never saw is free (and a
        // conflict's: below).
        let mut session = Session::new(3, None);
        let free = send_not_sent(&mut session, &rules);
        assert!(!free.paid);
        assert_eq!(session.last_retry(), None, "nothing to refund");
    }

    #[test]
    fn a_conflict_is_retried_with_its_delay_and_an_empty_budget_charging_nothing() {
        let bucket = emptied_bucket();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        let mut session = Session::new(3, None);
        let conflict = session
            .decide(&rules, None, Cause::Conflict, true, never, rng)
            .unwrap();
        assert!(!conflict.paid);
        assert_eq!(conflict.delay, ms(10), "a conflict waits like any retry");
        session
            .send(&conflict, rules.budget, never, || Some(()))
            .unwrap();
        assert_eq!(session.last_retry(), None, "nothing to refund");
        assert_eq!(session.attempts(), 2, "it counts as an attempt");
        assert_eq!(
            session.decide(&rules, None, Cause::Transient, true, never, rng),
            Err(Ending::BudgetRefused),
            "other causes still pay"
        );
    }

    /// With exact server delays (gRPC's pushback), a delay below the
    /// schedule's is waited as named.
    #[test]
    fn exact_server_delays_are_waited_as_named() {
        let schedule = Exponential::new(ms(100));
        let rules = Rules {
            exact_server_delays: true,
            ..rules(&schedule)
        };
        for after in [Duration::ZERO, ms(1), ms(99), ms(500)] {
            let retry = Session::new(5, None)
                .decide(&rules, Some(after), Cause::Throttled, true, never, rng)
                .unwrap();
            assert_eq!(retry.delay, after);
        }
    }

    /// A throttled retry the budget refuses waits its delay only when the
    /// request's deadline leaves the time: past it, the request ends at
    /// once, out of time, and nothing is charged.
    #[test]
    fn a_refused_throttle_whose_delay_passes_the_deadline_ends_at_once() {
        let bucket = emptied_bucket();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        let start = Instant::now();
        let mut session = Session::new(3, Some(start + ms(500)));
        assert_eq!(
            session.decide(
                &rules,
                Some(ms(1000)),
                Cause::Throttled,
                true,
                || start,
                rng
            ),
            Err(Ending::OutOfTime)
        );
        let waits = session
            .decide(&rules, Some(ms(400)), Cause::Throttled, true, || start, rng)
            .unwrap();
        assert_eq!(waits.due, Some(start + ms(400)));
        assert_eq!(bucket.available(), 0, "nothing charged");
    }

    /// A planned retry (the poller's re-probe) pays as a decided one does:
    /// a conflict's is free, every other cause's paid.
    #[test]
    fn a_planned_retry_pays_as_a_decided_one_does() {
        assert!(!Retry::planned(Cause::Conflict).paid);
        for cause in [Cause::Transient, Cause::Timeout, Cause::Throttled] {
            assert!(Retry::planned(cause).paid, "{cause:?}");
        }
    }

    /// A paid retry that goes out leaves its cause for the refund of a
    /// success, a throttled one after a server's delay too.
    #[test]
    fn a_throttled_retry_after_a_server_delay_pays_and_is_refunded_on_success() {
        let bucket = one_retry_bucket();
        let schedule = Constant::new(ms(10));
        let rules = Rules {
            budget: Some(&bucket),
            ..rules(&schedule)
        };
        let mut session = Session::new(3, None);
        let retry = session
            .decide(&rules, Some(ms(500)), Cause::Throttled, true, never, rng)
            .unwrap();
        assert!(retry.paid);
        assert_eq!(retry.delay, ms(500));
        session
            .send(&retry, rules.budget, never, || Some(()))
            .unwrap();
        assert_eq!(bucket.available(), 0);
        assert_eq!(session.last_retry(), Some(Cause::Throttled));
        bucket.on_success(session.last_retry());
        assert_eq!(bucket.available(), 5, "its cost back");
    }

    /// A server delay shorter than the schedule's is raised to it: 1 ms or
    /// "retry now" wait as long as no header would.
    #[test]
    fn a_server_delay_shorter_than_the_schedule_is_raised_to_it() {
        let schedule = Exponential::new(ms(100));
        let rules = rules(&schedule);
        for after in [Duration::ZERO, ms(1), ms(99)] {
            let mut session = Session::new(5, None);
            let first = session
                .decide(&rules, Some(after), Cause::Throttled, true, never, rng)
                .unwrap();
            assert_eq!(first.delay, ms(100), "after {after:?}");
        }
        let mut session = Session::new(5, None);
        assert_eq!(retry_once(&mut session, &rules), Ok(ms(100)));
        let second = session
            .decide(&rules, Some(ms(1)), Cause::Throttled, true, never, rng)
            .unwrap();
        assert_eq!(second.delay, ms(200), "the schedule's delay for that retry");
    }

    #[test]
    fn a_hedge_counts_as_an_attempt_and_none_goes_out_past_the_limit() {
        let mut session = Session::new(3, None);
        assert_eq!(
            session.send_hedge(None, NO_BUDGET, never, || Some(2)),
            Some(2)
        );
        assert_eq!((session.attempts(), session.hedges()), (2, 1));
        assert_eq!(
            session.send_hedge(None, NO_BUDGET, never, || Some(3)),
            Some(3)
        );
        assert_eq!((session.attempts(), session.hedges()), (3, 2));
        assert_eq!(
            session.send_hedge(None, NO_BUDGET, never, || Some(4)),
            None,
            "three attempts in all"
        );
        assert_eq!((session.attempts(), session.hedges()), (3, 2));
        let mut unlimited = Session::new(UNLIMITED_ATTEMPTS, None);
        for _ in 0..4 {
            assert_eq!(
                unlimited.send_hedge(None, NO_BUDGET, never, || Some(())),
                Some(())
            );
        }
        assert_eq!((unlimited.attempts(), unlimited.hedges()), (5, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_is_admitted_before_readiness_on_what_would_refuse_it_at_send() {
        use HedgeAdmission::{Admitted, Later, Refused};
        let cap = LoadCap::new(1.0);
        let bucket = emptied_bucket();
        let gates = |budget| HedgeGates {
            cap: &cap,
            breaker: None,
            budget,
        };
        let session = Session::new(3, None);
        let now = Instant::now();
        assert_eq!(
            session.may_hedge(&gates(NO_BUDGET), now),
            Later,
            "no traffic yet"
        );
        cap.on_request(now);
        tokio::time::advance(Duration::from_millis(200)).await;
        let now = Instant::now();
        assert_eq!(session.may_hedge(&gates(NO_BUDGET), now), Admitted);
        assert_eq!(
            session.may_hedge(&gates(Some(&bucket)), now),
            Refused,
            "no budget"
        );
        // Refused at send after all: the cap's hedge is given back.
        let mut refused = session.clone();
        assert_eq!(
            refused.send_hedge_through(&gates(Some(&bucket)), now, || Some(())),
            None
        );
        assert!(cap.would_take(now), "given back");
        let mut sent = session.clone();
        assert_eq!(
            sent.send_hedge_through(&gates(NO_BUDGET), now, || Some(())),
            Some(())
        );
        // The cap is spent, and it alone: a hedge may go out later.
        assert_eq!(sent.may_hedge(&gates(NO_BUDGET), now), Later);
        // With the budget refusing too, no hedge will.
        assert_eq!(sent.may_hedge(&gates(Some(&bucket)), now), Refused);
        let late = Session::new(3, Some(now));
        assert_eq!(
            late.may_hedge(&gates(NO_BUDGET), now),
            Refused,
            "at the deadline"
        );
        let mut full = Session::new(2, None);
        assert_eq!(
            full.send_hedge(None, NO_BUDGET, || now, || Some(())),
            Some(())
        );
        assert_eq!(
            full.may_hedge(&gates(NO_BUDGET), now),
            Refused,
            "no attempt left"
        );
    }

    #[test]
    fn the_transparent_retry_leaves_room_for_a_hedge() {
        let schedule = Constant::new(ms(10));
        let rules = rules(&schedule);
        let mut session = Session::new(2, None);
        send_not_sent(&mut session, &rules);
        // Two attempts sent, one of them free: a hedge is the second counted.
        assert_eq!(
            session.send_hedge(None, NO_BUDGET, never, || Some(())),
            Some(())
        );
        assert_eq!(
            session.send_hedge(None, NO_BUDGET, never, || Some(())),
            None
        );
        assert_eq!((session.attempts(), session.hedges()), (3, 1));
    }

    #[test]
    fn no_hedge_goes_out_once_the_deadline_is_reached() {
        let start = Instant::now();
        let mut session = Session::new(5, Some(start + ms(100)));
        let hedge = |session: &mut Session, at: u64| {
            session.send_hedge(None, NO_BUDGET, || start + ms(at), || Some(()))
        };
        assert_eq!(hedge(&mut session, 99), Some(()));
        assert_eq!(hedge(&mut session, 100), None, "at the deadline");
        assert_eq!(hedge(&mut session, 101), None, "after it");
        assert_eq!((session.attempts(), session.hedges()), (2, 1));
    }

    #[test]
    fn a_hedge_the_policy_does_not_copy_charges_nothing() {
        let bucket = one_retry_bucket();
        let mut session = Session::new(3, None);
        assert_eq!(
            session.send_hedge(None, Some(&bucket), never, || None::<()>),
            None
        );
        assert_eq!((session.attempts(), session.hedges()), (1, 0));
        assert!(bucket.would_allow(Cause::Hedge), "nothing was charged");
    }

    #[test]
    fn the_budget_pays_for_each_hedge_and_refuses_when_empty() {
        let bucket = one_retry_bucket();
        let mut session = Session::new(5, None);
        assert_eq!(
            session.send_hedge(None, Some(&bucket), never, || Some(())),
            Some(())
        );
        assert!(!bucket.would_allow(Cause::Hedge), "the hedge was paid");
        assert_eq!(
            session.send_hedge(None, Some(&bucket), never, || Some(())),
            None
        );
        assert_eq!((session.attempts(), session.hedges()), (2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_goes_through_a_closed_breaker_only_and_is_never_its_probe() {
        let breaker = CircuitBreaker::builder()
            .min_throughput(1)
            .break_duration(Duration::from_secs(5))
            .break_jitter(0.0)
            .build()
            .unwrap();
        let mut session = Session::new(5, None);
        let hedge = |session: &mut Session| {
            session.send_hedge(Some(&breaker), NO_BUDGET, never, || Some(()))
        };
        assert_eq!(hedge(&mut session), Some(()), "closed");
        breaker.record(true);
        assert_eq!(hedge(&mut session), None, "open");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            hedge(&mut session),
            None,
            "half-open: the probe is a retry's"
        );
        assert!(
            breaker.admit().admitted(),
            "the probe the hedge was offered is given back"
        );
        assert_eq!((session.attempts(), session.hedges()), (2, 1));
    }
}
