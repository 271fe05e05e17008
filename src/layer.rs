//! [`BackoffLayer`], the `tower_layer::Layer` that wraps a service in
//! [`Backoff`], and its builder.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use crate::adaptive::AdaptivePacing;
use crate::budget::Budget;
use crate::error::{check_duration, ConfigError};
use crate::jitter::Jitter;
use crate::policy::{OnRetry, RetryOnError};
use crate::schedule::{Exponential, Schedule};
use crate::service::Backoff;
use crate::stats::{Event, Stats};

/// Default number of attempts, the first included: AWS SDKs' standard mode and
/// the SRE book both settle on 3. One retry rarely rides out a blip; more than
/// two multiplies load on a server that is already failing.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// Wraps services in [`Backoff`], which retries transient failures after
/// exponential, jittered sleeps.
///
/// Defaults: [`RetryOnError`], 3 attempts, [`Exponential`] from 100 ms doubling
/// up to 20 s, [`Jitter::Full`], no time limit, no budget, no pacing, no stats.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// let layer = BackoffLayer::builder()
///     .max_attempts(4)
///     .schedule(Exponential::new(Duration::from_millis(1)))
///     .build()?;
///
/// let calls = std::sync::atomic::AtomicU32::new(0);
/// let flaky = service_fn(|x: u32| {
///     let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     async move { if n < 2 { Err("busy") } else { Ok(x * 2) } }
/// });
/// let svc = ServiceBuilder::new().layer(layer).service(flaky);
/// assert_eq!(svc.oneshot(21).await?, 42);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct BackoffLayer<P = RetryOnError, S = Exponential> {
    config: Config<P, S>,
}

impl BackoffLayer {
    /// A builder starting from the defaults.
    pub fn builder() -> BackoffBuilder {
        BackoffBuilder::default()
    }

    /// A layer with every default.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Default for BackoffLayer {
    fn default() -> Self {
        Self {
            config: Config {
                policy: RetryOnError,
                schedule: Exponential::default(),
                jitter: Jitter::Full,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                max_elapsed: None,
                shared: None,
            },
        }
    }
}

impl<P, S> BackoffLayer<P, S> {
    /// The policy this layer gives its services.
    pub fn policy(&self) -> &P {
        &self.config.policy
    }

    /// The schedule this layer gives its services.
    pub fn schedule(&self) -> &S {
        &self.config.schedule
    }

    /// The counters this layer's services update, if it was given any.
    pub fn stats(&self) -> Option<&Stats> {
        self.config.shared.as_ref()?.stats.as_ref()
    }

    /// The pacing this layer's services share, if it was given one.
    pub fn pacing(&self) -> Option<&AdaptivePacing> {
        self.config.shared.as_ref()?.pacing.as_ref()
    }
}

impl<Svc, P: Clone, S: Clone> Layer<Svc> for BackoffLayer<P, S> {
    type Service = Backoff<Svc, P, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Backoff::from_config(inner, self.config.clone())
    }
}

impl<P, S: fmt::Debug> fmt::Debug for BackoffLayer<P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffLayer")
            .field("config", &self.config)
            .finish()
    }
}

/// Builds a [`BackoffLayer`]; every setting is checked by [`build`](Self::build).
#[must_use]
pub struct BackoffBuilder<P = RetryOnError, S = Exponential> {
    policy: P,
    schedule: S,
    jitter: Jitter,
    max_attempts: u32,
    max_elapsed: Option<Duration>,
    seed: Option<u64>,
    budget: Option<Box<dyn Budget>>,
    pacing: Option<AdaptivePacing>,
    stats: Option<Stats>,
}

impl Default for BackoffBuilder {
    fn default() -> Self {
        Self {
            policy: RetryOnError,
            schedule: Exponential::default(),
            jitter: Jitter::Full,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_elapsed: None,
            seed: None,
            budget: None,
            pacing: None,
            stats: None,
        }
    }
}

impl<P, S> BackoffBuilder<P, S> {
    /// Decides which outcomes are retried (default [`RetryOnError`]).
    pub fn policy<P2>(self, policy: P2) -> BackoffBuilder<P2, S> {
        BackoffBuilder {
            policy,
            schedule: self.schedule,
            jitter: self.jitter,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            seed: self.seed,
            budget: self.budget,
            pacing: self.pacing,
            stats: self.stats,
        }
    }

    /// Decides how long to wait before each retry (default [`Exponential`] from
    /// 100 ms, doubling, capped at 20 s).
    pub fn schedule<S2: Schedule>(self, schedule: S2) -> BackoffBuilder<P, S2> {
        BackoffBuilder {
            policy: self.policy,
            schedule,
            jitter: self.jitter,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            seed: self.seed,
            budget: self.budget,
            pacing: self.pacing,
            stats: self.stats,
        }
    }

    /// Randomizes each delay (default [`Jitter::Full`]).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Attempts per request, the first included (default 3; 1 disables retries).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Time limit for a whole request, from its first attempt: no retry starts
    /// whose sleep would end past it. Attempts themselves are not cut short; put
    /// a `tower::timeout` outside the layer for that.
    pub fn max_elapsed(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// Makes every jitter draw reproducible: with the same seed and the same
    /// order of requests, every delay is the same. Requests still draw from
    /// independent streams.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Caps retries with a budget shared by every clone of the service. Pass an
    /// `Arc` to share one budget between several layers too.
    pub fn budget(mut self, budget: impl Budget + 'static) -> Self {
        self.budget = Some(Box::new(budget));
        self
    }

    /// Paces every request of every clone, first attempts included, slowing
    /// all of them down while the server throttles. Keep a clone of the handle
    /// to read its metrics or [`reset`](AdaptivePacing::reset) it.
    pub fn pacing(mut self, pacing: AdaptivePacing) -> Self {
        self.pacing = Some(pacing);
        self
    }

    /// Counts requests, attempts, retries and how requests ended into `stats`.
    /// Keep a clone of the handle to read them; give the same handle to
    /// several layers to add their counts up.
    pub fn stats(mut self, stats: Stats) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Calls `hook(&request, attempt, delay, &outcome)` for each retry that
    /// will go out, before its sleep: `attempt` is the number of the attempt
    /// that failed, `delay` the sleep before the retry. It wraps the policy set
    /// so far (see [`OnRetry`]), so call it after [`policy`](Self::policy).
    ///
    /// Like [`retry_if`](crate::retry_if), the closure needs its argument
    /// types written out:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_backoff::BackoffLayer;
    ///
    /// let layer = BackoffLayer::builder()
    ///     .on_retry(|req: &String, attempt: u32, delay: Duration, _: &Result<String, std::io::Error>| {
    ///         eprintln!("{req}: attempt {attempt} failed, retrying in {delay:?}");
    ///     })
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn on_retry<F>(self, hook: F) -> BackoffBuilder<OnRetry<P, F>, S> {
        BackoffBuilder {
            policy: OnRetry::new(self.policy, hook),
            schedule: self.schedule,
            jitter: self.jitter,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            seed: self.seed,
            budget: self.budget,
            pacing: self.pacing,
            stats: self.stats,
        }
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work: zero
    /// attempts, a zero or absurd (over a year) time limit, a proportional jitter
    /// outside `[0, 1]`, or whatever the schedule's own
    /// [`validate`](Schedule::validate) rejects.
    pub fn build(self) -> Result<BackoffLayer<P, S>, ConfigError>
    where
        S: Schedule,
    {
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1 (the first attempt counts)",
            ));
        }
        if let Some(limit) = self.max_elapsed {
            if limit.is_zero() {
                return Err(ConfigError::new("max_elapsed", "must be longer than zero"));
            }
            check_duration("max_elapsed", limit)?;
        }
        self.jitter.validate()?;
        self.schedule.validate()?;

        let shares_something = self.budget.is_some()
            || self.seed.is_some()
            || self.pacing.is_some()
            || self.stats.is_some();
        let shared = shares_something.then(|| {
            Arc::new(Shared {
                budget: self.budget,
                pacing: self.pacing,
                stats: self.stats,
                seed: self.seed,
                streams: AtomicU64::new(0),
            })
        });
        Ok(BackoffLayer {
            config: Config {
                policy: self.policy,
                schedule: self.schedule,
                jitter: self.jitter,
                max_attempts: self.max_attempts,
                max_elapsed: self.max_elapsed,
                shared,
            },
        })
    }
}

impl<P, S: fmt::Debug> fmt::Debug for BackoffBuilder<P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffBuilder")
            .field("schedule", &self.schedule)
            .field("jitter", &self.jitter)
            .field("max_attempts", &self.max_attempts)
            .field("max_elapsed", &self.max_elapsed)
            .field("seed", &self.seed)
            .field("budget", &self.budget.is_some())
            .field("pacing", &self.pacing)
            .field("stats", &self.stats.is_some())
            .finish()
    }
}

/// Everything a [`Backoff`] service and its response futures read: plain data,
/// copied into each clone, plus one optional `Arc` for what clones share.
#[derive(Clone)]
pub(crate) struct Config<P, S> {
    pub(crate) policy: P,
    pub(crate) schedule: S,
    pub(crate) jitter: Jitter,
    pub(crate) max_attempts: u32,
    pub(crate) max_elapsed: Option<Duration>,
    /// `None` unless something shared was configured, so the plain layer's
    /// happy path touches no atomics.
    pub(crate) shared: Option<Arc<Shared>>,
}

impl<P, S: fmt::Debug> fmt::Debug for Config<P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("schedule", &self.schedule)
            .field("jitter", &self.jitter)
            .field("max_attempts", &self.max_attempts)
            .field("max_elapsed", &self.max_elapsed)
            .finish_non_exhaustive()
    }
}

/// State shared by every clone of one layer's services.
pub(crate) struct Shared {
    pub(crate) budget: Option<Box<dyn Budget>>,
    pub(crate) pacing: Option<AdaptivePacing>,
    pub(crate) stats: Option<Stats>,
    pub(crate) seed: Option<u64>,
    /// Hands each retrying request its own jitter stream of a seeded family.
    pub(crate) streams: AtomicU64,
}

impl Shared {
    /// Attempt number `attempt` (from 1) is about to go out.
    pub(crate) fn on_send(&self, attempt: u32) {
        if attempt == 1 {
            if let Some(budget) = &self.budget {
                budget.on_first_attempt();
            }
        }
        self.record(Event::Attempt { retry: attempt > 1 });
    }

    pub(crate) fn record(&self, event: Event) {
        if let Some(stats) = &self.stats {
            stats.record(event);
        }
    }
}
