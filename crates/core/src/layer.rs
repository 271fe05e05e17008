//! [`BackoffLayer`], the `tower_layer::Layer` that wraps a service in
//! [`BackoffRetry`], and its builder.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use crate::adaptive::AdaptivePacing;
use crate::breaker::CircuitBreaker;
use crate::budget::{Budget, TokenBucket};
use crate::clone_for_retries::CloneForRetries;
use crate::config::Observers;
use crate::config::{Config, LayerBudget, Streams};
use crate::deadline::{Guarded, IntoGuarded, NoTimeout};
use crate::error::{check_limit, ConfigError};
use crate::events::{Observer, Origin, Outcome, RetryArgs, RetryHook};
use crate::hedge::{Hedger, Hedging};
use crate::jitter::Jitter;
use crate::limits::{Limits, UNLIMITED_ATTEMPTS};
use crate::policy::RetryOnError;
use crate::schedule::{AnySchedule, Schedule};
use crate::service::BackoffRetry;
use crate::stats::Stats;

pub use crate::limits::DEFAULT_MAX_ATTEMPTS;

/// Wraps services in [`BackoffRetry`], which retries transient failures after
/// exponential, jittered sleeps.
///
/// **The service must be `Clone`** ([`CloneForRetries`]): each retry goes
/// through a clone. Clients (hyper-util's, reqwest's, tonic's `Channel`) and
/// `service_fn` over a closure whose captures are `Clone` are; a `RateLimit` or
/// `ConcurrencyLimit` inside this layer, or a service held by value, is not:
/// wrap it in `tower::buffer::Buffer`. Without it the compiler says
/// `the trait bound `S: CloneForRetries` is not satisfied`.
///
/// Defaults: [`RetryOnError`], 3 attempts, [`Exponential`](crate::Exponential) from 100 ms doubling
/// up to 20 s, [`Jitter::Full`], no time limit, no pacing, no stats, and a
/// retry [budget](crate::budget) shared by every service the layer wraps and
/// all their clones, so that retries cannot multiply the load of an outage.
/// Each layer value has its own budget: build the layer once and use it for
/// every client of one server (or pass the same `Arc` budget to several
/// layers); [`no_budget`](BackoffBuilder::no_budget) opts out.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
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
///     async move { if n < 1 { Err("busy") } else { Ok(x * 2) } }
/// });
/// let svc = ServiceBuilder::new().layer(layer).service(flaky);
/// assert_eq!(svc.oneshot(21).await?, 42);
/// # Ok(())
/// # }
/// ```
pub struct BackoffLayer<P = RetryOnError, T = NoTimeout> {
    // Shared, not copied, by every service the layer makes and every
    // response future: one reference count per request instead of a copy of
    // the settings.
    config: Arc<Config<P, T>>,
}

impl<P, T> Clone for BackoffLayer<P, T> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
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
        BackoffBuilder::default()
            .build()
            .expect("the default settings are valid")
    }
}

impl<P, T> BackoffLayer<P, T> {
    /// The policy this layer gives its services.
    pub fn policy(&self) -> &P {
        &self.config.policy
    }

    /// The schedule this layer gives its services.
    pub fn schedule(&self) -> &AnySchedule {
        &self.config.schedule
    }

    /// Attempts per request, the first included, unless a request sets its
    /// own.
    pub fn max_attempts(&self) -> u32 {
        self.config.max_attempts
    }

    /// The counters this layer's services update, if it was given any.
    pub fn stats(&self) -> Option<&Stats> {
        self.config.stats()
    }

    /// The circuit breaker this layer's services share, if it was given one.
    pub fn breaker(&self) -> Option<&CircuitBreaker> {
        self.config.breaker.as_ref()
    }

    /// The pacing this layer's services share, if it was given one.
    pub fn pacing(&self) -> Option<&AdaptivePacing> {
        self.config.pacing.as_ref()
    }

    /// A layer with the same settings whose token bucket, circuit breaker and
    /// pacing are its own, as they were when this one was built: what a
    /// per-host stack gives each host, so one host's outage spends only
    /// that host's retries and opens only that host's breaker. The stats and
    /// observers stay shared, so they add every host up. A budget given as
    /// anything but a [`TokenBucket`] (an `Arc` shared on purpose, a budget
    /// of your own) stays shared too: build such a
    /// layer per host yourself, in a [`PerHostLayer`] closure.
    ///
    /// [`PerHostLayer`]: https://docs.rs/tower-backoff/latest/tower_backoff/http/struct.PerHostLayer.html
    pub fn fresh(&self) -> Self
    where
        P: Clone,
        T: Clone,
    {
        let mut config = Config::clone(&self.config);
        config.budget = config.budget.map(|budget| match &*budget {
            LayerBudget::Bucket(bucket) => Arc::new(LayerBudget::Bucket(bucket.fresh())),
            LayerBudget::Given(_) => budget,
        });
        config.breaker = config.breaker.as_ref().map(CircuitBreaker::fresh);
        config.pacing = config.pacing.as_ref().map(AdaptivePacing::fresh);
        config.hedging = config.hedging.as_deref().map(|h| Arc::new(h.fresh()));
        Self {
            config: Arc::new(config),
        }
    }

    /// The same layer, its error made [`Error`](crate::Error) as
    /// [`BackoffBuilder::guarded`] makes it: what an HTTP layer is made
    /// from.
    pub fn guarded(self) -> BackoffLayer<P, Guarded>
    where
        P: Clone,
        T: IntoGuarded + Clone,
    {
        let config = Arc::unwrap_or_clone(self.config).map_timing(IntoGuarded::guarded);
        BackoffLayer {
            config: Arc::new(config),
        }
    }

    /// A [fresh](Self::fresh) copy for the host `authority` (`host:port`):
    /// what a per-host stack gives each host. Its events are told with
    /// that host as their [`Origin`](crate::events::Origin), so its
    /// metrics are a series of their own (label `target`) and its
    /// `tracing` records name it.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use tower_backoff::BackoffLayer;
    ///
    /// let layer = BackoffLayer::builder().name("payments").build()?;
    /// let eu = layer.for_host("eu.example:443");
    /// assert_eq!(eu.host(), Some("eu.example:443"));
    /// assert_eq!(eu.layer_name(), Some("payments"));
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn for_host(&self, authority: &str) -> Self
    where
        P: Clone,
        T: Clone,
    {
        self.fresh().with_host(authority)
    }

    /// The same layer, its budget, breaker and pacing still shared, its
    /// events told as the host `authority`'s: for a per-host stack whose
    /// first host keeps the layer as it was built.
    pub fn with_host(&self, authority: &str) -> Self
    where
        P: Clone,
        T: Clone,
    {
        let mut config = Config::clone(&self.config);
        config.origin.host = Some(authority.into());
        Self {
            config: Arc::new(config),
        }
    }

    /// The host this copy of the layer sends to, if a per-host stack gave it
    /// one ([`for_host`](Self::for_host)).
    pub fn host(&self) -> Option<&str> {
        self.config.origin.host()
    }

    /// The name the layer was built with ([`BackoffBuilder::name`]).
    pub fn layer_name(&self) -> Option<&str> {
        self.config.origin.layer_name()
    }

    /// The retry budget this layer's services share, the default one
    /// included; `None` after [`no_budget`](BackoffBuilder::no_budget).
    /// Read its [`balance`](Budget::balance) beside the [`stats`](Self::stats).
    pub fn budget(&self) -> Option<&dyn Budget> {
        self.config.budget().map(|budget| budget as &dyn Budget)
    }
}

// `CloneForRetries`, not `Clone`: the error a service that is not `Clone`
// gets names the bound and shows where to look (`Buffer`).
impl<Svc: CloneForRetries, P, T> Layer<Svc> for BackoffLayer<P, T> {
    type Service = BackoffRetry<Svc, P, T>;

    fn layer(&self, inner: Svc) -> Self::Service {
        BackoffRetry::from_config(inner, Arc::clone(&self.config))
    }
}

impl<P, T: fmt::Debug> fmt::Debug for BackoffLayer<P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffLayer")
            .field("config", &self.config)
            .finish()
    }
}

/// Builds a [`BackoffLayer`]; every setting is checked by [`build`](Self::build).
#[must_use]
pub struct BackoffBuilder<P = RetryOnError, T = NoTimeout> {
    policy: P,
    schedule: AnySchedule,
    timeouts: T,
    settings: Settings,
}

/// Everything but the policy and the schedule, whose types the builder changes.
#[derive(Default)]
struct Settings {
    limits: Limits,
    attempt_timeout: Option<Duration>,
    budget: BudgetChoice,
    pacing: Option<AdaptivePacing>,
    stats: Option<Stats>,
    observers: Vec<Box<dyn Observer>>,
    hooks: Vec<Box<RetryHook>>,
    name: Option<Arc<str>>,
    breaker: Option<CircuitBreaker>,
    hedging: Option<Hedging>,
}

/// Which budget a layer gets: unless told otherwise, a new default one.
#[derive(Default)]
enum BudgetChoice {
    #[default]
    Default,
    Set(Option<LayerBudget>),
}

impl Default for BackoffBuilder {
    fn default() -> Self {
        Self {
            policy: RetryOnError,
            schedule: AnySchedule::default(),
            timeouts: NoTimeout,
            settings: Settings::default(),
        }
    }
}

impl<P, T> BackoffBuilder<P, T> {
    /// Decides which outcomes are retried (default [`RetryOnError`]).
    pub fn policy<P2>(self, policy: P2) -> BackoffBuilder<P2, T> {
        BackoffBuilder {
            policy,
            schedule: self.schedule,
            timeouts: self.timeouts,
            settings: self.settings,
        }
    }

    /// Decides how long to wait before each retry (default
    /// [`Exponential`](crate::Exponential) from
    /// 100 ms, doubling, capped at 20 s).
    pub fn schedule(mut self, schedule: impl Schedule + Send + Sync + 'static) -> Self {
        self.schedule = schedule.into_any();
        self
    }

    /// Gives every attempt at most `limit`, and no more than the time left
    /// before the request's deadline (its [`max_elapsed`](Self::max_elapsed)
    /// or a per-request [`RetryLimits`](crate::RetryLimits) deadline): a hung
    /// attempt is cut short and, if the policy says so, retried. The layer's
    /// error becomes [`Error`](crate::Error), which holds
    /// the inner service's error as is or the time-out (see [`deadline`](crate::deadline)).
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower::{service_fn, ServiceExt};
    /// use tower_backoff::BackoffLayer;
    ///
    /// let calls = std::sync::atomic::AtomicU32::new(0);
    /// let hangs_once = service_fn(|()| {
    ///     let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
    ///     async move {
    ///         if first {
    ///             std::future::pending::<()>().await;
    ///         }
    ///         Ok::<_, std::io::Error>("done")
    ///     }
    /// });
    /// let layer = BackoffLayer::builder()
    ///     .attempt_timeout(Duration::from_secs(1))
    ///     .max_elapsed(Duration::from_secs(10))
    ///     .build()?;
    /// let svc = tower::Layer::layer(&layer, hangs_once);
    /// assert_eq!(svc.oneshot(()).await?, "done");
    /// # Ok(())
    /// # }
    /// ```
    pub fn attempt_timeout(self, limit: Duration) -> BackoffBuilder<P, Guarded>
    where
        T: IntoGuarded,
    {
        let mut builder = self.map_timing(|_| Guarded::timed(limit));
        builder.settings.attempt_timeout = Some(limit);
        builder
    }

    /// Makes the layer's error [`Error`](crate::Error) now, as an
    /// [attempt timeout](Self::attempt_timeout) or a
    /// [circuit breaker](Self::circuit_breaker) would: for a service type
    /// that stays `BackoffRetry<S, P, Guarded>` whichever of them are set
    /// later, or for a layer that must share one type with layers that have
    /// them.
    pub fn guarded(self) -> BackoffBuilder<P, Guarded>
    where
        T: IntoGuarded,
    {
        self.map_timing(IntoGuarded::guarded)
    }

    /// Checks `breaker` before every attempt goes out and tells it every
    /// attempt's outcome, so a host that keeps failing is not called for a
    /// while; [`breaker`](crate::breaker#with-retries) says what a rejected
    /// request or retry returns. The layer's error becomes
    /// [`Error`](crate::Error), as with an attempt timeout. Keep a clone of
    /// the handle to read its [`state`](CircuitBreaker::state); give the same
    /// handle to the layers of one host only.
    pub fn circuit_breaker(self, breaker: CircuitBreaker) -> BackoffBuilder<P, Guarded>
    where
        T: IntoGuarded,
    {
        let mut builder = self.map_timing(IntoGuarded::guarded);
        builder.settings.breaker = Some(breaker);
        builder
    }

    /// Randomizes each delay (default [`Jitter::Full`]).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.settings.limits.jitter = jitter;
        self
    }

    /// Attempts per request, the first included (default 3; 1 disables retries).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.limits.max_attempts = attempts;
        self
    }

    /// No limit on attempts: retries go on until the time limit
    /// ([`max_elapsed`](Self::max_elapsed)), the budget, or the policy ends
    /// them. [`build`](Self::build) refuses it without a time limit: the
    /// budget bounds a fleet's retries, not one request's, which successes
    /// of other requests can keep paying for.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use std::time::Duration;
    /// use tower_backoff::BackoffLayer;
    ///
    /// // Bounded by the default budget and one minute per request.
    /// let layer = BackoffLayer::builder()
    ///     .unlimited_attempts()
    ///     .max_elapsed(Duration::from_secs(60))
    ///     .build()?;
    /// # drop(layer);
    /// let endless = BackoffLayer::builder().unlimited_attempts().build();
    /// assert_eq!(endless.unwrap_err().field(), "max_attempts");
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn unlimited_attempts(mut self) -> Self {
        self.settings.limits.max_attempts = UNLIMITED_ATTEMPTS;
        self
    }

    /// Retries while the schedule's delay is below its cap, then tries once
    /// more and returns that outcome: from 1 s doubling to a 10 s cap, the
    /// sleeps are 1, 2, 4 and 8 s, and the fifth attempt is the last. The
    /// attempt limit still applies. A delay a server asks for restarts the
    /// schedule, so the cap alone does not end a request a server keeps
    /// asking to wait: [`unlimited_attempts`](Self::unlimited_attempts)
    /// still needs [`max_elapsed`](Self::max_elapsed).
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use std::time::Duration;
    /// use tower_backoff::{BackoffLayer, Exponential};
    ///
    /// let layer = BackoffLayer::builder()
    ///     .schedule(Exponential::new(Duration::from_secs(1)).max_delay(Duration::from_secs(10)))
    ///     .max_attempts(10)
    ///     .stop_at_cap()
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn stop_at_cap(mut self) -> Self {
        self.settings.limits.stop_at_cap = true;
        self
    }

    /// Waits a delay the server names as it is, even when shorter than the
    /// schedule's delay for that retry: what gRPC's retry design (gRFC A6)
    /// says of a pushback, and what `tower_backoff::grpc`'s layer sets. By
    /// default a shorter one is raised to the schedule's, so that a server
    /// naming 1 ms (or "retry now") does not make a tight loop. Either way
    /// the budget pays for the retry.
    pub fn exact_server_delays(mut self) -> Self {
        self.settings.limits.exact_server_delays = true;
        self
    }

    /// Time limit for a whole request, from its first attempt: no retry starts
    /// whose sleep would end past it, and the caller gets the last real
    /// outcome. Attempts themselves are cut short only with an
    /// [`attempt_timeout`](Self::attempt_timeout), which is shortened to the
    /// time left.
    pub fn max_elapsed(mut self, limit: Duration) -> Self {
        self.settings.limits.max_elapsed = Some(limit);
        self
    }

    /// Makes every jitter draw reproducible: with the same seed and the same
    /// order of requests, every delay is the same. Requests still draw from
    /// independent streams.
    pub fn seed(mut self, seed: u64) -> Self {
        self.settings.limits.seed = Some(seed);
        self
    }

    /// Caps retries with `budget` instead of the default one; it is shared by
    /// every service the layer wraps and all their clones. Pass an `Arc` to
    /// share one budget between several layers too.
    pub fn budget(mut self, budget: impl Budget + 'static) -> Self {
        let mut slot = Some(budget);
        let bucket = (&mut slot as &mut dyn Any)
            .downcast_mut::<Option<TokenBucket>>()
            .and_then(Option::take);
        self.settings.budget = match (bucket, slot) {
            // A token bucket is kept by value, like the default one: no
            // dynamic call.
            (Some(bucket), _) => BudgetChoice::Set(Some(LayerBudget::Bucket(bucket))),
            (None, Some(given)) => BudgetChoice::Set(Some(LayerBudget::Given(Box::new(given)))),
            // Only a bucket is taken out of the slot.
            (None, None) => BudgetChoice::Default,
        };
        self
    }

    /// Retries with no budget: only the attempt and time limits bound them.
    ///
    /// In a full outage every request then makes all its attempts, multiplying
    /// the load on the server by `max_attempts`. Opt out only where that
    /// cannot hurt: a single client of a server nobody else uses, a test, or a
    /// service that is already budgeted further out.
    pub fn no_budget(mut self) -> Self {
        self.settings.budget = BudgetChoice::Set(None);
        self
    }

    /// Hedges slow attempts: a copy of an attempt still pending after the
    /// delay `hedging` sets, paid from the retry budget and capped in extra
    /// load every second. The first acceptable outcome wins and the other
    /// copies are cancelled; see [`hedge`](crate::hedge). The layer's type
    /// stays the same; each request is tracked (one allocation) from its
    /// call.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use tower_backoff::{BackoffLayer, Hedging};
    ///
    /// let layer = BackoffLayer::builder()
    ///     .hedge(Hedging::at_percentile(95.0).max_extra_load(0.05))
    ///     .build()?;
    /// # Ok::<(), tower_backoff::ConfigError>(())
    /// ```
    pub fn hedge(mut self, hedging: Hedging) -> Self {
        self.settings.hedging = Some(hedging);
        self
    }

    /// The same settings with the timing type `change` makes of this one.
    fn map_timing<U>(self, change: impl FnOnce(T) -> U) -> BackoffBuilder<P, U> {
        BackoffBuilder {
            policy: self.policy,
            schedule: self.schedule,
            timeouts: change(self.timeouts),
            settings: self.settings,
        }
    }

    /// Paces every request of every clone, first attempts included, slowing
    /// all of them down while the server throttles. Keep a clone of the handle
    /// to read its metrics or [`reset`](AdaptivePacing::reset) it.
    pub fn pacing(mut self, pacing: AdaptivePacing) -> Self {
        self.settings.pacing = Some(pacing);
        self
    }

    /// Counts requests, attempts, retries and how requests ended into `stats`.
    /// Keep a clone of the handle to read them; give the same handle to
    /// several layers to add their counts up.
    pub fn stats(mut self, stats: Stats) -> Self {
        self.settings.stats = Some(stats);
        self
    }

    /// Names the layer: its events are told with the name in their
    /// [`Origin`](crate::events::Origin), its metrics carry the label
    /// `layer`, and its `tracing` records the field `layer`, so two layers of
    /// one process (a payments client, a search client) can be told apart;
    /// see [`BackoffLayer::for_host`] for an example.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.settings.name = Some(name.into());
        self
    }

    /// Tells `observer` of every [`Event`](crate::events::Event) of the
    /// layer's requests: each call, each retry as it goes out, each sleep,
    /// how each request ended. Any `Fn(&Event) + Send + Sync` closure is an
    /// observer (see [`Observer`]); several can be added, and adding one
    /// changes no type. Under the `tracing` feature every layer has
    /// [`events::Tracing`](crate::events) among its observers, and under
    /// `metrics` the `metrics::Metrics` observer.
    pub fn observer(mut self, observer: impl Observer + 'static) -> Self {
        self.settings.observers.push(Box::new(observer));
        self
    }

    /// Calls `hook(&retry, outcome)` as each retry goes out (never for a
    /// retry that was stopped): [`RetryArgs`] say the number of the attempt
    /// that failed, the delay slept before the retry and its cause, and
    /// [`Outcome`] is a reference to the response or error it replaces.
    /// The same closure shape as on every other front-end (the HTTP
    /// builder, [`retry`](crate::retry())); it changes no type, and needs no
    /// annotation.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use tower_backoff::BackoffLayer;
    ///
    /// let layer = BackoffLayer::builder()
    ///     .on_retry(|retry, outcome| {
    ///         if let Some(error) = outcome.error::<std::io::Error>() {
    ///             eprintln!("attempt {} failed: {error}", retry.attempt());
    ///         }
    ///         eprintln!("retrying in {:?} ({:?})", retry.delay(), retry.cause());
    ///     })
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn on_retry<F>(mut self, hook: F) -> Self
    where
        F: Fn(&RetryArgs, Outcome<'_>) + Send + Sync + 'static,
    {
        self.settings.hooks.push(Box::new(hook));
        self
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work: zero
    /// attempts, a zero or absurd (over a year) time limit, a proportional jitter
    /// outside `[0, 1]`, or whatever the schedule's own
    /// [`validate`](Schedule::validate) rejects.
    pub fn build(self) -> Result<BackoffLayer<P, T>, ConfigError> {
        let Settings {
            limits,
            attempt_timeout,
            budget,
            pacing,
            stats,
            #[allow(unused_mut)] // pushed to under the `tracing` feature only
            mut observers,
            hooks,
            name,
            breaker,
            hedging,
        } = self.settings;
        limits.validate(&self.schedule)?;
        if let Some(limit) = attempt_timeout {
            check_limit("attempt_timeout", limit)?;
        }
        limits.check_bounded()?;
        if let Some(hedging) = &hedging {
            hedging.validate()?;
        }
        let budget = match budget {
            BudgetChoice::Default => Some(LayerBudget::Bucket(TokenBucket::fleet_safe(
                limits.max_attempts,
            ))),
            BudgetChoice::Set(budget) => budget,
        };
        let pacing_set = pacing.is_some();
        let budget_counts_calls = match &budget {
            Some(LayerBudget::Bucket(bucket)) => bucket.earns_on_requests(),
            Some(LayerBudget::Given(_)) => true,
            None => false,
        };
        #[cfg(feature = "tracing")]
        observers.push(Box::new(crate::events::Tracing));
        #[cfg(feature = "metrics")]
        observers.push(Box::new(crate::metrics::Metrics));
        Ok(BackoffLayer {
            config: Arc::new(Config {
                policy: self.policy,
                schedule: self.schedule,
                jitter: limits.jitter,
                max_attempts: limits.max_attempts,
                max_elapsed: limits.max_elapsed,
                stop_at_cap: limits.stop_at_cap,
                exact_server_delays: limits.exact_server_delays,
                timeouts: self.timeouts,
                budget: budget.map(Arc::new),
                pacing,
                observers: Observers::new(stats, observers, hooks),
                origin: Origin {
                    host: None,
                    layer_name: name,
                },
                streams: limits.seed.map(|seed| Arc::new(Streams::new(seed))),
                breaker,
                hedging: hedging.as_ref().map(|h| Arc::new(Hedger::new(h))),
                track_from_call: limits.max_elapsed.is_some() || pacing_set || hedging.is_some(),
                budget_counts_calls,
            }),
        })
    }
}

impl<P, T> fmt::Debug for BackoffBuilder<P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffBuilder")
            .field("schedule", &self.schedule)
            .field("limits", &self.settings.limits)
            .field("attempt_timeout", &self.settings.attempt_timeout)
            .field(
                "budget",
                &match self.settings.budget {
                    BudgetChoice::Default => "default",
                    BudgetChoice::Set(Some(_)) => "given",
                    BudgetChoice::Set(None) => "none",
                },
            )
            .field("pacing", &self.settings.pacing)
            .field("stats", &self.settings.stats.is_some())
            .field("observers", &self.settings.observers.len())
            .field("name", &self.settings.name)
            .field("breaker", &self.settings.breaker)
            .field("hedging", &self.settings.hedging)
            .finish()
    }
}
