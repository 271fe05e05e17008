//! [`retry`](fn@crate::retry): the same schedules, jitter and limits for a plain async closure,
//! outside tower.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::budget::{Budget, TokenBucket};
use crate::decision::Cause;
use crate::engine::{self, Rules, Session};
use crate::error::{ConfigError, MAX_DURATION};
use crate::events::{OutcomeKind, RetryArgs};
use crate::jitter::{Jitter, Rng};
use crate::limits::{Limits, UNLIMITED_ATTEMPTS};
use crate::schedule::{AnySchedule, Schedule};
use crate::timer::{self, Sleep};

/// Calls `operation` until it succeeds, retrying errors after exponential,
/// jittered sleeps. Awaiting it gives the last attempt's outcome.
///
/// The defaults need no arguments: every error retried, 3 attempts, 100 ms
/// doubling up to 20 s, full jitter. Each setting reads as part of a sentence:
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use tower_backoff::{retry, Exponential};
///
/// let mut calls = 0;
/// let value = retry(|| {
///     calls += 1;
///     let n = calls;
///     async move { if n < 2 { Err(format!("try {n} failed")) } else { Ok(n) } }
/// })
/// .max_attempts(5)
/// .schedule(Exponential::new(Duration::from_millis(10)))
/// .retry_if(|e| e.contains("failed"))
/// .on_retry(|retry, error| println!("{error}; retrying in {:?}", retry.delay()))
/// .await;
/// assert_eq!(value, Ok(2));
/// # }
/// ```
pub fn retry<F>(operation: F) -> RetryCall<F> {
    RetryCall {
        operation,
        schedule: AnySchedule::default(),
        limits: Limits::default(),
        budget: BudgetChoice::Default(Arc::default()),
        retry_if: AnyError,
        on_retry: NoHook,
    }
}

/// The budget of a [`RetryCall`]: unless told otherwise, a default one of its
/// own, made at its first retry and shared by every run of the call and of
/// its clones ([`start`](RetryCall::start)).
#[derive(Clone)]
enum BudgetChoice {
    Default(Arc<OnceLock<Arc<dyn Budget>>>),
    Given(Arc<dyn Budget>),
    None,
}

/// A retried operation, not started yet: `.await` it to run it once, or
/// [`start`](Self::start) it as many times as you like. Made by
/// [`retry`](fn@crate::retry).
///
/// Built once and reused, every run shares one budget, so that together the
/// runs cannot multiply the load of an outage:
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use tower_backoff::retry;
///
/// let fetch = retry(|| async { Ok::<_, std::io::Error>("page") }).max_attempts(5);
/// for _ in 0..3 {
///     // A `Future`, `Send` when the operation's is: ready for `tokio::spawn`.
///     let page = tokio::spawn(fetch.start()).await.unwrap();
///     assert_eq!(page.unwrap(), "page");
/// }
/// # }
/// ```
#[must_use = "nothing runs until it is awaited"]
#[derive(Clone)]
pub struct RetryCall<F, W = AnyError, N = NoHook> {
    operation: F,
    schedule: AnySchedule,
    limits: Limits,
    budget: BudgetChoice,
    retry_if: W,
    on_retry: N,
}

impl<F, W, N> RetryCall<F, W, N> {
    /// Attempts in all, the first included (default 3). Zero counts as one.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.limits.max_attempts = attempts;
        self
    }

    /// No limit on attempts: the time limit, the budget or the
    /// [`retry_if`](Self::retry_if) predicate end the retries. Awaiting it with no
    /// time limit ([`max_elapsed`](Self::max_elapsed)) can retry until
    /// success, since a budget bounds a fleet's retries, not one call's;
    /// [`validate`](Self::validate) reports that.
    pub fn unlimited_attempts(mut self) -> Self {
        self.limits.max_attempts = UNLIMITED_ATTEMPTS;
        self
    }

    /// Retries while the schedule's delay is below its cap, then stops after
    /// one last try, as [`BackoffBuilder::stop_at_cap`] does.
    ///
    /// [`BackoffBuilder::stop_at_cap`]: crate::BackoffBuilder::stop_at_cap
    pub fn stop_at_cap(mut self) -> Self {
        self.limits.stop_at_cap = true;
        self
    }

    /// No retry starts whose sleep would end later than `limit` after the first
    /// attempt began.
    pub fn max_elapsed(mut self, limit: Duration) -> Self {
        self.limits.max_elapsed = Some(limit);
        self
    }

    /// Randomizes each delay (default [`Jitter::Full`]).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.limits.jitter = jitter;
        self
    }

    /// Makes the jitter draws reproducible: the same as those of the first
    /// request of a layer [seeded](crate::BackoffBuilder::seed) alike.
    pub fn seed(mut self, seed: u64) -> Self {
        self.limits.seed = Some(seed);
        self
    }

    /// Waits as `schedule` says before each retry.
    pub fn schedule(mut self, schedule: impl Schedule + Send + Sync + 'static) -> Self {
        self.schedule = schedule.into_any();
        self
    }

    /// Retries only the errors for which `predicate` is true; others are
    /// returned at once.
    pub fn retry_if<W2, Fut, T, E>(self, predicate: W2) -> RetryCall<F, W2, N>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        W2: Fn(&E) -> bool,
    {
        RetryCall {
            operation: self.operation,
            schedule: self.schedule,
            limits: self.limits,
            budget: self.budget,
            retry_if: predicate,
            on_retry: self.on_retry,
        }
    }

    /// Calls `hook(&retry, &error)` as each retry starts, after its sleep
    /// and once the budget paid for it (never for a retry that was
    /// stopped), as the layer's [`on_retry`](crate::BackoffBuilder::on_retry)
    /// does. `error` is the operation's own error being retried, typed: no
    /// annotation and no downcast, and asking for another type does not
    /// compile.
    pub fn on_retry<N2, Fut, T, E>(self, hook: N2) -> RetryCall<F, W, N2>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        N2: FnMut(&RetryArgs, &E),
    {
        RetryCall {
            operation: self.operation,
            schedule: self.schedule,
            limits: self.limits,
            budget: self.budget,
            retry_if: self.retry_if,
            on_retry: hook,
        }
    }

    /// Caps retries with `budget` instead of a new default one. Pass the same
    /// `Arc` to every `retry(..)` that talks to one server, so that together
    /// they cannot multiply the load of an outage: a budget of one operation
    /// alone only bounds that operation.
    pub fn budget(mut self, budget: Arc<dyn Budget>) -> Self {
        self.budget = BudgetChoice::Given(budget);
        self
    }

    /// Retries with no budget: only the attempt and time limits bound them.
    pub fn no_budget(mut self) -> Self {
        self.budget = BudgetChoice::None;
        self
    }

    /// Runs the operation: a future of its own, with its own attempts and
    /// delays, sharing this call's budget with every other run. The
    /// operation and the hooks are cloned for it.
    pub fn start<Fut, T, E>(&self) -> RetryFuture<F, Fut, W, N>
    where
        F: FnMut() -> Fut + Clone,
        Fut: Future<Output = Result<T, E>>,
        W: Predicate<E> + Clone,
        N: OnRetry<E> + Clone,
    {
        self.clone().into_future()
    }

    /// Checks the settings the way [`BackoffBuilder::build`] does. Awaiting an
    /// unchecked configuration never panics (delays saturate at the cap), but
    /// this tells you about a mistake at start-up.
    ///
    /// [`BackoffBuilder::build`]: crate::BackoffBuilder::build
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate(&self.schedule)?;
        self.limits.check_bounded()
    }
}

impl<F, W, N> fmt::Debug for RetryCall<F, W, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryCall")
            .field("schedule", &self.schedule)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Which errors [`retry`](fn@crate::retry) retries.
#[doc(hidden)]
pub trait Predicate<E> {
    /// Whether `error` is worth another attempt.
    fn should_retry(&self, error: &E) -> bool;
}

/// Retries every error: [`retry`](fn@crate::retry)'s default.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct AnyError;

impl<E> Predicate<E> for AnyError {
    fn should_retry(&self, _error: &E) -> bool {
        true
    }
}

impl<E, F: Fn(&E) -> bool> Predicate<E> for F {
    fn should_retry(&self, error: &E) -> bool {
        self(error)
    }
}

/// Told of each retry as it starts, after its sleep.
#[doc(hidden)]
pub trait OnRetry<E> {
    /// `error` is being retried as `retry` says.
    fn on_retry(&mut self, retry: &RetryArgs, error: &E);
}

/// Tells no one: [`retry`](fn@crate::retry)'s default.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoHook;

impl<E> OnRetry<E> for NoHook {
    fn on_retry(&mut self, _: &RetryArgs, _: &E) {}
}

impl<E, F: FnMut(&RetryArgs, &E)> OnRetry<E> for F {
    fn on_retry(&mut self, retry: &RetryArgs, error: &E) {
        self(retry, error)
    }
}

impl<F, Fut, T, E, W, N> IntoFuture for RetryCall<F, W, N>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    W: Predicate<E>,
    N: OnRetry<E>,
{
    type Output = Result<T, E>;
    type IntoFuture = RetryFuture<F, Fut, W, N>;

    fn into_future(mut self) -> Self::IntoFuture {
        let deadline = self
            .limits
            .max_elapsed
            .map(|limit| Instant::now() + limit.min(MAX_DURATION));
        let rng = match self.limits.seed {
            Some(seed) => Rng::stream(seed, 0),
            None => Rng::from_entropy(),
        };
        let session = Session::new(self.limits.max_attempts.max(1), deadline).with_rng(rng);
        let budget = match &self.budget {
            BudgetChoice::Given(budget) => Some(Arc::clone(budget)),
            BudgetChoice::Default(made) => made.get().cloned(),
            BudgetChoice::None => None,
        };
        if let Some(budget) = &budget {
            budget.on_first_attempt();
        }
        let attempt = (self.operation)();
        RetryFuture {
            state: RetryState::Running { attempt },
            settings: self,
            budget,
            session,
        }
    }
}

pin_project! {
    /// The future of an awaited [`RetryCall`].
    ///
    /// A retry is paid for (its budget charged) and
    /// told to [`on_retry`](RetryCall::on_retry) only when it starts, after its sleep; a
    /// budget that refuses then returns the error of the attempt before, as
    /// does anything else that ends the operation early.
    ///
    /// # Cancel safety
    /// Dropping it drops the attempt in flight or the pending sleep; no further
    /// attempt is made, and nothing is charged for it.
    pub struct RetryFuture<F, Fut, W, N>
    where
        Fut: Future,
    {
        #[pin]
        state: RetryState<Fut, Fut::Output>,
        settings: RetryCall<F, W, N>,
        // Made at the first retry when the default budget applies.
        budget: Option<Arc<dyn Budget>>,
        session: Session,
    }
}

pin_project! {
    #[project = RetryStateProj]
    enum RetryState<Fut, O> {
        Running { #[pin] attempt: Fut },
        // Sleeping before a retry, keeping the error it would replace.
        Waiting { #[pin] sleep: Sleep, retry: engine::Retry, kept: Option<O> },
        // About to start a retry, once the budget pays for it.
        Starting { retry: engine::Retry, kept: Option<O> },
    }
}

impl<F, Fut, T, E, W, N> Future for RetryFuture<F, Fut, W, N>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    W: Predicate<E>,
    N: OnRetry<E>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                RetryStateProj::Running { attempt } => {
                    let error = match ready!(attempt.poll(cx)) {
                        Ok(value) => {
                            if let Some(budget) = this.budget {
                                budget.on_success(this.session.last_retry());
                            }
                            return Poll::Ready(Ok(value));
                        }
                        Err(error) => error,
                    };
                    let settings = &*this.settings;
                    if !settings.retry_if.should_retry(&error) {
                        return Poll::Ready(Err(error));
                    }
                    if let (BudgetChoice::Default(made), None) = (&settings.budget, &this.budget) {
                        let budget = made.get_or_init(|| {
                            Arc::new(TokenBucket::fleet_safe(settings.limits.max_attempts))
                        });
                        // This run's first attempt, told late: the budget did
                        // not exist yet when it went out.
                        budget.on_first_attempt();
                        *this.budget = Some(Arc::clone(budget));
                    }
                    let rules = Rules {
                        schedule: &settings.schedule,
                        jitter: settings.limits.jitter,
                        stop_at_cap: settings.limits.stop_at_cap,
                        exact_server_delays: settings.limits.exact_server_delays,
                        budget: this.budget.as_deref(),
                    };
                    let decided = this.session.decide(
                        &rules,
                        None,
                        Cause::Transient,
                        true,
                        Instant::now,
                        Rng::from_entropy,
                    );
                    let Ok(retry) = decided else {
                        return Poll::Ready(Err(error));
                    };
                    let kept = Some(Err(error));
                    // A zero delay skips the timer, which would round it up
                    // to its 1 ms tick.
                    this.state.set(if retry.delay.is_zero() {
                        RetryState::Starting { retry, kept }
                    } else {
                        RetryState::Waiting {
                            sleep: timer::sleep(retry.delay),
                            retry,
                            kept,
                        }
                    });
                }
                RetryStateProj::Waiting { sleep, retry, kept } => {
                    ready!(sleep.poll(cx));
                    let (retry, kept) = (*retry, kept.take());
                    this.session.slept_for(&retry);
                    this.state.set(RetryState::Starting { retry, kept });
                }
                RetryStateProj::Starting { retry, kept } => {
                    // Back-to-back zero-delay retries must still give way.
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    let retry = *retry;
                    let kept = kept.take().expect("kept until the retry starts");
                    let sent = this.session.send(
                        &retry,
                        this.budget.as_deref(),
                        Instant::now,
                        || Some(()),
                    );
                    if sent.is_err() {
                        return Poll::Ready(kept);
                    }
                    let args = RetryArgs::new(
                        this.session.attempts() - 1,
                        retry.delay,
                        retry.cause,
                        OutcomeKind::of(&kept),
                    );
                    // Only errors are retried here (`retry_if` sees errors).
                    if let Err(error) = &kept {
                        this.settings.on_retry.on_retry(&args, error);
                    }
                    drop(kept);
                    let attempt = (this.settings.operation)();
                    this.state.set(RetryState::Running { attempt });
                }
            }
        }
    }
}

impl<F, Fut: Future, W, N> fmt::Debug for RetryFuture<F, Fut, W, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryFuture")
            .field("settings", &self.settings)
            .field("attempts", &self.session.attempts())
            .finish_non_exhaustive()
    }
}
