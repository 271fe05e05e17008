//! [`PollerBuilder`]: the poller's settings, checked when it is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_backoff_core::budget::Budget;
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::policy::Policy;
use tower_backoff_core::schedule::{Exponential, Schedule};
use tower_backoff_core::Jitter;

use super::config::Config;
use super::registry::Shared;
use super::Poller;

/// Default time between polls of a healthy provider.
#[doc(hidden)]
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Default consecutive failures after which a provider is evicted.
#[doc(hidden)]
pub const DEFAULT_MAX_FAILURES: u32 = 3;
/// Default time a single poll may take.
#[doc(hidden)]
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_EVENTS_CAPACITY: usize = 1024;

/// Builds a [`Poller`]; every setting is checked by [`build`](Self::build).
///
/// Defaults: polls every 5 s, a 5 s timeout per poll, every error a failure,
/// backoff [`Exponential`] from 5 s doubling up to 5 min with
/// [`Jitter::Full`], eviction after 3 failures in a row, no re-probe, no
/// budget, leaders in the order the providers were added.
#[must_use]
pub struct PollerBuilder<K, Req, V, E> {
    config: Config<K, Req, V, E>,
    events_capacity: usize,
}

impl<K, Req, V, E> PollerBuilder<K, Req, V, E> {
    pub(super) fn new(make_request: impl Fn(&K) -> Req + Send + Sync + 'static) -> Self {
        Self {
            config: Config {
                make_request: Box::new(make_request),
                policy: None,
                schedule: Exponential::new(DEFAULT_INTERVAL)
                    .max_delay(Duration::from_secs(300))
                    .into(),
                jitter: Jitter::Full,
                interval: DEFAULT_INTERVAL,
                timeout: Some(DEFAULT_TIMEOUT),
                max_failures: DEFAULT_MAX_FAILURES,
                reprobe_after: None,
                seed: None,
                budget: None,
                rank: None,
            },
            events_capacity: DEFAULT_EVENTS_CAPACITY,
        }
    }

    /// Time from the end of a successful poll to the start of the next one
    /// (default 5 s). Measured from the end, so a slow provider never has two
    /// polls in flight.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.config.interval = interval;
        self
    }

    /// How long one poll (readiness and call) may take before it counts as a
    /// failure with [`Cause::Timeout`](tower_backoff_core::Cause::Timeout) (default 5 s).
    /// The poll's future is dropped, cancelling the call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// Lets polls take as long as the service does. A provider that never
    /// answers then stays in its poll until it is removed or the poller shuts
    /// down.
    pub fn no_timeout(mut self) -> Self {
        self.config.timeout = None;
        self
    }

    /// Classifies each poll's outcome, as for the [`BackoffRetry`](tower_backoff_core::BackoffRetry)
    /// layer: [`Decision::Success`](tower_backoff_core::Decision::Success) on an `Ok` is a
    /// healthy poll, anything else a failure, and a
    /// [`Decision::Retry`](tower_backoff_core::Decision::Retry) with a delay sets the next
    /// poll instead of the schedule, as asked (never sooner: the policy is
    /// what bounds a delay it accepts), and the schedule starts over after it,
    /// as the layer's does.
    ///
    /// An `Err` is always a failure, whatever the policy says: there is no
    /// value to show. Without a policy (or when its `clone_request` declines to
    /// copy the request), every `Ok` is a success and every `Err` a failure.
    pub fn policy(mut self, policy: impl Policy<Req, V, E> + Send + Sync + 'static) -> Self {
        self.config.policy = Some(Box::new(policy));
        self
    }

    /// Delays before re-polling a quarantined provider: the `n`-th failure in
    /// a row waits `schedule.delay(n)`, jittered.
    pub fn schedule(mut self, schedule: impl Schedule + Send + Sync + 'static) -> Self {
        self.config.schedule = schedule.into_any();
        self
    }

    /// Randomizes each backoff delay (default [`Jitter::Full`]), so providers
    /// that failed together are not re-polled together. The healthy interval
    /// is not jittered.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.config.jitter = jitter;
        self
    }

    /// Consecutive failed polls after which a provider is evicted (default 3;
    /// 1 evicts at the first failure).
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.config.max_failures = failures;
        self
    }

    /// Polls an evicted provider once every `interval`, in case it came back:
    /// a success makes it healthy again. Off by default.
    pub fn reprobe_after(mut self, interval: Duration) -> Self {
        self.config.reprobe_after = Some(interval);
        self
    }

    /// Makes every jitter draw reproducible: the `n`-th provider added draws
    /// from stream `n` of this seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// Limits polls of quarantined and evicted providers: each one counts as a
    /// retry and needs the budget's consent, each healthy poll as a first
    /// attempt. A refused poll is skipped, not failed (see
    /// [`Event::Deferred`](super::Event::Deferred)). Pass an `Arc` to share one
    /// budget with other pollers or layers.
    pub fn budget(mut self, budget: impl Budget + 'static) -> Self {
        self.config.budget = Some(Box::new(budget));
        self
    }

    /// Sorts the board's leaders by `key(value)`, smallest first; wrap the key
    /// in [`std::cmp::Reverse`] for largest first.
    ///
    /// The board is kept sorted as values come in: each successful poll calls
    /// `key` a few times (about twice the log of the number of healthy
    /// providers), under the poller's lock, so keep it cheap.
    ///
    /// # Panics
    /// A panic in `key` unwinds the task of the provider whose poll called it,
    /// which evicts that provider like a panicking service.
    pub fn rank_by<R: Ord>(mut self, key: impl Fn(&V) -> R + Send + Sync + 'static) -> Self {
        self.config.rank = Some(Box::new(move |a: &V, b: &V| key(a).cmp(&key(b))));
        self
    }

    /// How many events a slow [`subscribe`](Poller::subscribe)r may fall
    /// behind before it misses some (default 1024). Pollers never wait for
    /// subscribers.
    pub fn events_capacity(mut self, capacity: usize) -> Self {
        self.events_capacity = capacity;
        self
    }

    /// Checks every setting and builds the poller. Call it inside a tokio
    /// runtime: providers are polled on that runtime.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work: a zero or
    /// absurd (over a year) interval, timeout or re-probe interval, zero
    /// `max_failures` or `events_capacity`, a bad jitter or schedule, or no
    /// tokio runtime (`runtime`).
    pub fn build(self) -> Result<Poller<K, Req, V, E>, ConfigError>
    where
        K: Clone,
    {
        let config = &self.config;
        check_positive("interval", config.interval)?;
        if let Some(timeout) = config.timeout {
            check_positive("timeout", timeout)?;
        }
        if let Some(reprobe) = config.reprobe_after {
            check_positive("reprobe_after", reprobe)?;
        }
        if config.max_failures == 0 {
            return Err(ConfigError::new(
                "max_failures",
                "must be at least 1 (1 evicts at the first failure)",
            ));
        }
        if self.events_capacity == 0 || self.events_capacity > usize::MAX / 2 {
            return Err(ConfigError::new(
                "events_capacity",
                format!(
                    "must be between 1 and {}, got {}",
                    usize::MAX / 2,
                    self.events_capacity
                ),
            ));
        }
        config.jitter.validate()?;
        config.schedule.validate()?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ConfigError::new("runtime", "build the poller inside a tokio runtime"))?;
        Ok(Poller::from_shared(Arc::new(Shared::new(
            self.config,
            runtime,
            self.events_capacity,
        ))))
    }
}

fn check_positive(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(field, "must be longer than zero"));
    }
    check_duration(field, value)
}

impl<K, Req, V, E> fmt::Debug for PollerBuilder<K, Req, V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollerBuilder")
            .field("config", &self.config)
            .field("events_capacity", &self.events_capacity)
            .finish()
    }
}

impl<K, Req, V, E> fmt::Debug for Config<K, Req, V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("jitter", &self.jitter)
            .field("max_failures", &self.max_failures)
            .field("reprobe_after", &self.reprobe_after)
            .field("seed", &self.seed)
            .field("policy", &self.policy.is_some())
            .field("budget", &self.budget.is_some())
            .finish_non_exhaustive()
    }
}
