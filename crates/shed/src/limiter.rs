//! [`Limiter`]: an adaptive concurrency limit found from measured latency,
//! which admits a request at once or rejects it at once.
//!
//! The limit follows the gradient of latency against its **baseline**, the
//! latency the server has at low concurrency, as Netflix's
//! concurrency-limits (`Gradient2Limit`) and Envoy's adaptive concurrency
//! filter do; see the rule in `window.rs` (the limit shrinks only while it
//! is reached and latency passes `tolerance × baseline`; the baseline is a
//! running mean at low concurrency, re-measured by a short probe at half
//! the limit when none runs there). Only successful requests are measured:
//! a failure (a 5xx, an error, a response dropped before its end) frees its
//! place and teaches nothing, so a burst of fast errors is not taken for
//! what healthy service costs.
//!
//! Nothing waits in the limiter: a request it cannot admit is rejected at
//! once, before any work is done. Its "queue" is virtual: the demand it
//! rejected, which will come back as retries. The **queueing time** is how
//! long that demand would take to serve at the measured throughput (what was
//! rejected in about the last second, divided by completions per second).
//! Past [`max_drain`](LimiterBuilder::max_drain) retrying cannot help, and a
//! rejection says not to retry ([`Reason::Drain`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_backoff_core::error::{check_duration, ConfigError};

use crate::config::Config;
use crate::criticality::Priority;
use crate::events::{LimitArgs, ShedEvent, ShedObserver};
use crate::rejection::{Reason, Rejection};
use crate::window::{Sample, Window};

/// The shortest window latency is averaged over.
#[doc(hidden)]
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

/// A shared adaptive concurrency limit. Clones share one limit.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
/// use std::time::{Duration, Instant};
/// use tower_backoff::shed::{Limiter, Priority, Criticality};
///
/// let limiter = Limiter::builder().initial_limit(2).min_limit(1).build()?;
/// let now = Instant::now();
/// let first = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
/// let second = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
/// // The limit is reached: the next is rejected at once, with a delay to come back after.
/// let third = limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
/// assert!(third.retry_after().unwrap() >= Duration::from_secs(1));
/// first.complete(now + Duration::from_millis(50));
/// drop(second);
/// assert!(limiter.try_acquire(Priority::new(Criticality::Default, false), now).is_ok());
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

struct Shared {
    config: Config,
    in_flight: AtomicUsize,
    limit: AtomicUsize,
    /// The most requests in flight each [`Priority`] is admitted beside.
    thresholds: [AtomicUsize; 4],
    /// Rejections since the last rate window closed.
    rejected: AtomicU64,
    /// Requests turned away since the last sample window.
    turned_away: AtomicU64,
    /// Places left in a probe's cohort (zero when none runs).
    cohort: AtomicUsize,
    /// The last queueing-time estimate, in microseconds.
    drain_micros: AtomicU64,
    /// The state of the generator that spreads `Retry-After`.
    spread: AtomicU64,
    window: Mutex<Window>,
    observers: Vec<Arc<dyn ShedObserver>>,
}

/// Builds a [`Limiter`]; every setting is checked at
/// [`build`](Self::build), and an error names it.
#[derive(Clone)]
pub struct LimiterBuilder {
    initial_limit: usize,
    config: Config,
    seed: Option<u64>,
    observers: Vec<Arc<dyn ShedObserver>>,
}

impl std::fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("initial_limit", &self.initial_limit)
            .field("config", &self.config)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl Default for LimiterBuilder {
    fn default() -> Self {
        Self {
            initial_limit: 20,
            config: Config {
                min_limit: 4,
                max_limit: 10_000,
                window: DEFAULT_WINDOW,
                min_samples: 5,
                tolerance: 1.05,
                smoothing: 0.2,
                shares: [0.5, 0.75, 0.9, 1.0],
                max_drain: Duration::from_secs(10),
                retry_after: Duration::from_secs(1),
                max_retry_after: Duration::from_secs(30),
            },
            seed: None,
            observers: Vec::new(),
        }
    }
}

impl LimiterBuilder {
    /// The limit to start from, before any latency is measured (default 20).
    pub fn initial_limit(mut self, limit: usize) -> Self {
        self.initial_limit = limit;
        self
    }

    /// The limit never falls below this (default 4).
    pub fn min_limit(mut self, limit: usize) -> Self {
        self.config.min_limit = limit;
        self
    }

    /// The limit never rises above this (default 10,000).
    pub fn max_limit(mut self, limit: usize) -> Self {
        self.config.max_limit = limit;
        self
    }

    /// The shortest window latency is averaged over (default 100 ms). A
    /// window closes once it lasted this long and measured at least five
    /// successful requests, so a server of a few slow requests a second
    /// adapts too.
    pub fn window(mut self, window: Duration) -> Self {
        self.config.window = window;
        self
    }

    /// Latency may rise to `tolerance × baseline` before the limit shrinks
    /// (default 1.05); at least 1. The limit settles where queueing adds
    /// this much to the latency at low concurrency: just past the knee.
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.config.tolerance = tolerance;
        self
    }

    /// How far the limit moves toward its new value after each window
    /// (default 0.2), within `(0, 1]`.
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.config.smoothing = smoothing;
        self
    }

    /// The share of the limit each [`Priority`] may fill, from the lowest
    /// (a retry of sheddable work) to the highest (the first attempt of
    /// critical work). Default `[0.5, 0.75, 0.9, 1.0]`: under overload the
    /// lowest are shed first. Each within `(0, 1]`, in increasing order.
    pub fn shares(mut self, shares: [f64; 4]) -> Self {
        self.config.shares = shares;
        self
    }

    /// The longest queueing time retries are invited for (default 10 s).
    /// Past it a rejection says not to retry: the server could not serve
    /// the retries in time anyway.
    pub fn max_drain(mut self, max: Duration) -> Self {
        self.config.max_drain = max;
        self
    }

    /// The shortest delay a rejection asks for (default 1 s). Each
    /// rejection asks for a random delay between this (or the queueing
    /// time, if longer) and three times that, so that a fleet told to come
    /// back does not come back at one instant; `Retry-After` carries it in
    /// whole seconds (1 or 2 at the default), `retry-after-ms` exactly.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.config.retry_after = delay;
        self
    }

    /// The longest delay a rejection asks for (default 30 s).
    pub fn max_retry_after(mut self, delay: Duration) -> Self {
        self.config.max_retry_after = delay;
        self
    }

    /// Seeds the spread of `Retry-After` values, for reproducible runs.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Tells `observer` of every admission, rejection and change of limit.
    pub fn observer(mut self, observer: impl ShedObserver) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Checks every setting and builds the limiter.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        let c = &self.config;
        if c.min_limit == 0 {
            return Err(ConfigError::new("min_limit", "must be at least 1"));
        }
        if c.max_limit < c.min_limit {
            return Err(ConfigError::new(
                "max_limit",
                format!("must be at least min_limit ({})", c.min_limit),
            ));
        }
        if !(c.min_limit..=c.max_limit).contains(&self.initial_limit) {
            return Err(ConfigError::new(
                "initial_limit",
                format!(
                    "must be within min_limit..=max_limit ({}..={}), got {}",
                    c.min_limit, c.max_limit, self.initial_limit
                ),
            ));
        }
        for (field, value) in [("window", c.window), ("retry_after", c.retry_after)] {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
            check_duration(field, value)?;
        }
        check_duration("max_drain", c.max_drain)?;
        check_duration("max_retry_after", c.max_retry_after)?;
        if c.max_retry_after < c.retry_after {
            return Err(ConfigError::new(
                "max_retry_after",
                "must be at least retry_after",
            ));
        }
        if !c.tolerance.is_finite() || c.tolerance < 1.0 {
            return Err(ConfigError::new(
                "tolerance",
                format!("must be a finite number ≥ 1, got {}", c.tolerance),
            ));
        }
        if !(c.smoothing > 0.0 && c.smoothing <= 1.0) {
            return Err(ConfigError::new(
                "smoothing",
                format!("must be within (0, 1], got {}", c.smoothing),
            ));
        }
        let ordered = c.shares.windows(2).all(|w| w[0] <= w[1]);
        if !ordered || !c.shares.iter().all(|s| *s > 0.0 && *s <= 1.0) {
            return Err(ConfigError::new(
                "shares",
                "each must be within (0, 1], lowest priority first, in increasing order",
            ));
        }
        let seed = self
            .seed
            .unwrap_or_else(|| tower_backoff_core::Rng::from_entropy().next_u64());
        #[allow(unused_mut)]
        let mut observers = self.observers;
        #[cfg(feature = "metrics")]
        observers.push(Arc::new(crate::metrics::ShedMetrics));
        let shared = Shared {
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(self.initial_limit),
            thresholds: Default::default(),
            rejected: AtomicU64::new(0),
            turned_away: AtomicU64::new(0),
            cohort: AtomicUsize::new(0),
            drain_micros: AtomicU64::new(0),
            spread: AtomicU64::new(seed),
            window: Mutex::new(Window::new(self.initial_limit)),
            config: self.config,
            observers,
        };
        shared.set_thresholds(self.initial_limit);
        // The gauge shows the limit from the start, not from its first change.
        #[cfg(feature = "metrics")]
        metrics::gauge!("tower_backoff.shed.limit").set(self.initial_limit as f64);
        Ok(Limiter {
            shared: Arc::new(shared),
        })
    }
}

impl Limiter {
    /// A builder with the defaults: see each setting.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Admits a request of `priority` arriving at `now`, or rejects it at
    /// once. Hold the [`Permit`] while the request is worked on and
    /// [`complete`](Permit::complete) it when the work is done; dropping it
    /// instead frees its place without measuring its latency.
    ///
    /// # Errors
    /// The [`Rejection`] to answer with, when the request is not admitted.
    pub fn try_acquire(&self, priority: Priority, now: Instant) -> Result<Permit, Rejection> {
        let shared = &self.shared;
        let threshold = shared.thresholds[usize::from(priority.level())].load(Ordering::Relaxed);
        // Counted only when it fits: a burst of rejections never makes a
        // request that fits look like one too many.
        let mut before = shared.in_flight.load(Ordering::Relaxed);
        loop {
            if before >= threshold {
                return Err(shared.reject(priority, before, now));
            }
            match shared.in_flight.compare_exchange_weak(
                before,
                before + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => before = actual,
            }
        }
        let cohort = shared.cohort.load(Ordering::Relaxed) > 0 && shared.join_cohort();
        for observer in &shared.observers {
            observer.on_event(&ShedEvent::Admitted(priority));
        }
        Ok(Permit {
            shared: self.shared.clone(),
            started: now,
            beside: before + 1,
            cohort,
        })
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Relaxed)
    }

    /// Requests admitted and not yet completed or dropped.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The last estimate of the queueing time: how long the demand rejected
    /// in about the last second would take to serve at the measured
    /// throughput.
    pub fn queue_time(&self) -> Duration {
        Duration::from_micros(self.shared.drain_micros.load(Ordering::Relaxed))
    }

    /// The baseline: the mean latency of successful requests at low
    /// concurrency, once one was measured.
    pub fn baseline(&self) -> Option<Duration> {
        let baseline = self.shared.lock().baseline;
        baseline.and_then(|b| Duration::try_from_secs_f64(b).ok())
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // A panic while holding it leaves plain numbers: keep going.
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_thresholds(&self, limit: usize) {
        for (threshold, share) in self.thresholds.iter().zip(self.config.shares) {
            let admitted = ((limit as f64) * share).ceil() as usize;
            threshold.store(admitted.clamp(1, limit.max(1)), Ordering::Relaxed);
        }
    }

    /// Takes a place in a probe's cohort, if one is left. The last place
    /// taken restores the limit: what is admitted behind the cohort waits
    /// behind it, so the probe need not turn it away.
    #[cold]
    fn join_cohort(&self) -> bool {
        match self
            .cohort
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        {
            Ok(1) => {
                self.set_thresholds(self.limit.load(Ordering::Relaxed));
                true
            }
            Ok(_) => true,
            Err(_) => false,
        }
    }

    fn tell(&self, event: &ShedEvent) {
        for observer in &self.observers {
            observer.on_event(event);
        }
    }

    #[cold]
    fn reject(&self, priority: Priority, in_flight: usize, now: Instant) -> Rejection {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.turned_away.fetch_add(1, Ordering::Relaxed);
        // Rejections alone may close a window: a server that completes
        // nothing still learns its queueing time.
        let event = match self.window.try_lock() {
            Ok(mut window) => self.close(&mut window, now),
            Err(_) => None,
        };
        if let Some(event) = event {
            self.tell(&event);
        }
        let limit = self.limit.load(Ordering::Relaxed);
        let drain = Duration::from_micros(self.drain_micros.load(Ordering::Relaxed));
        let (reason, retry_after) = if drain > self.config.max_drain {
            (Reason::Drain, None)
        } else {
            let reason = if in_flight < limit {
                Reason::Priority
            } else {
                Reason::Limit
            };
            (reason, Some(self.spread(drain)))
        };
        let rejection = Rejection {
            reason,
            priority,
            retry_after,
            limit,
            queue_time: drain,
        };
        self.tell(&ShedEvent::Rejected(rejection));
        rejection
    }

    /// A delay in `[base, 3 × base)`, `base` the queueing time but at least
    /// `retry_after`; never past `max_retry_after`.
    fn spread(&self, drain: Duration) -> Duration {
        let base = drain
            .min(self.config.max_retry_after / 3)
            .max(self.config.retry_after);
        let state = self
            .spread
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(1.0 + 2.0 * unit)
            .min(self.config.max_retry_after)
    }

    fn complete(&self, sample: Sample, now: Instant) {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let event = {
            let mut window = self.lock();
            window.record(sample, in_flight, now);
            self.close(&mut window, now)
        };
        // Observers run with the lock released.
        if let Some(event) = event {
            self.tell(&event);
        }
    }

    /// Closes what is due in `window` and applies it; the event to tell.
    fn close(&self, window: &mut Window, now: Instant) -> Option<ShedEvent> {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let closed = window.close(
            &self.config,
            now,
            in_flight,
            || self.rejected.swap(0, Ordering::Relaxed),
            || self.turned_away.swap(0, Ordering::Relaxed),
        );
        if let Some(admit) = closed.admit {
            self.set_thresholds(admit);
        }
        if let Some(cohort) = closed.cohort {
            self.cohort.store(cohort as usize, Ordering::Relaxed);
        }
        let drain = closed.drain.map(|drain| {
            let drain = Duration::try_from_secs_f64(drain).unwrap_or(Duration::MAX);
            self.drain_micros.store(
                u64::try_from(drain.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            drain
        });
        let rounded = window.rounded();
        let changed = rounded != self.limit.swap(rounded, Ordering::Relaxed);
        let secs = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
        match (changed, closed.mean) {
            (true, Some(mean)) => Some(ShedEvent::Limit(LimitArgs {
                limit: rounded,
                baseline: window.baseline.map_or(Duration::ZERO, secs),
                mean: secs(mean),
                queue_time: self.queue_time(),
            })),
            _ => drain.map(ShedEvent::QueueTime),
        }
    }

    fn queue_time(&self) -> Duration {
        Duration::from_micros(self.drain_micros.load(Ordering::Relaxed))
    }
}

/// A request's place among those in flight: freed when dropped.
#[must_use = "dropping a permit at once frees its place"]
pub struct Permit {
    shared: Arc<Shared>,
    started: Instant,
    beside: usize,
    cohort: bool,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("started", &self.started)
            .field("beside", &self.beside)
            .finish()
    }
}

impl Permit {
    /// The work succeeded and ended at `now`: its latency counts toward the
    /// limit, and the place is freed. A failure should be dropped instead:
    /// what a failure costs says nothing of what healthy service costs.
    pub fn complete(mut self, now: Instant) {
        let sample = Sample {
            latency: now.saturating_duration_since(self.started),
            beside: self.beside,
            cohort: std::mem::take(&mut self.cohort),
        };
        self.shared.complete(sample, now);
    }

    /// When the request was admitted.
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        if self.cohort {
            self.shared.lock().cohort_failed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criticality::Criticality;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs `rounds` rounds of at least 100 ms, each admitting as many as
    /// the limit allows at once, the `n`-th of them taking `latency(n)`.
    fn drive(
        limiter: &Limiter,
        start: Instant,
        rounds: u32,
        latency: impl Fn(usize) -> Duration,
    ) -> Instant {
        let mut now = start;
        for _ in 0..rounds {
            let mut permits = Vec::new();
            while let Ok(p) = limiter.try_acquire(Priority::HIGHEST, now) {
                permits.push(p);
            }
            let mut longest = ms(100);
            for (i, p) in permits.into_iter().enumerate() {
                let latency = latency(i + 1);
                longest = longest.max(latency);
                p.complete(now + latency);
            }
            now += longest;
        }
        now
    }

    #[test]
    fn the_limit_grows_while_latency_stays_at_the_baseline() {
        let limiter = Limiter::builder().seed(1).build().unwrap();
        drive(&limiter, Instant::now(), 30, |_| ms(50));
        assert!(limiter.limit() > 40, "{}", limiter.limit());
    }

    #[test]
    fn latency_that_rises_for_every_concurrency_alike_is_not_overload() {
        let limiter = Limiter::builder()
            .initial_limit(40)
            .seed(1)
            .build()
            .unwrap();
        let now = drive(&limiter, Instant::now(), 20, |_| ms(50));
        let before = limiter.limit();
        drive(&limiter, now, 80, |_| ms(250));
        assert!(limiter.limit() >= before, "{before} -> {}", limiter.limit());
        assert_eq!(limiter.baseline(), Some(ms(250)));
    }

    #[test]
    fn low_priorities_are_shed_before_high_ones() {
        let limiter = Limiter::builder()
            .initial_limit(10)
            .seed(1)
            .build()
            .unwrap();
        let now = Instant::now();
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(limiter.try_acquire(Priority::HIGHEST, now).unwrap());
        }
        // Half the limit is in use: a sheddable retry gets no more.
        let lowest = limiter.try_acquire(Priority::LOWEST, now).unwrap_err();
        assert_eq!(lowest.reason(), Reason::Priority);
        let default = Priority::new(Criticality::Default, false);
        for _ in 0..4 {
            held.push(limiter.try_acquire(default, now).unwrap());
        }
        assert_eq!(
            limiter.try_acquire(default, now).unwrap_err().reason(),
            Reason::Priority
        );
        held.push(limiter.try_acquire(Priority::HIGHEST, now).unwrap());
        let full = limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
        assert_eq!(full.reason(), Reason::Limit);
        assert!(full.should_retry());
    }

    #[test]
    fn retry_after_is_spread_between_one_and_three_seconds() {
        let limiter = Limiter::builder().initial_limit(4).seed(7).build().unwrap();
        let now = Instant::now();
        let _held: Vec<_> = (0..4)
            .map(|_| limiter.try_acquire(Priority::HIGHEST, now).unwrap())
            .collect();
        let delays: Vec<Duration> = (0..1000)
            .map(|_| {
                limiter
                    .try_acquire(Priority::HIGHEST, now)
                    .unwrap_err()
                    .retry_after()
                    .unwrap()
            })
            .collect();
        assert!(delays.iter().all(|d| *d >= ms(1000) && *d < ms(3000)));
        // Whole seconds differ: half say 1, half 2.
        let early = delays.iter().filter(|d| **d < ms(2000)).count();
        assert!((430..570).contains(&early), "{early}");
    }

    #[test]
    fn retry_after_stays_within_its_bounds_however_close_they_are() {
        let limiter = Limiter::builder()
            .initial_limit(4)
            .retry_after(ms(1_000))
            .max_retry_after(ms(1_200))
            .seed(3)
            .build()
            .unwrap();
        let now = Instant::now();
        let _held: Vec<_> = (0..4)
            .map(|_| limiter.try_acquire(Priority::HIGHEST, now).unwrap())
            .collect();
        for _ in 0..200 {
            let rejection = limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
            let delay = rejection.retry_after().unwrap();
            assert!(delay >= ms(1_000) && delay <= ms(1_200), "{delay:?}");
        }
    }

    #[test]
    fn a_backlog_that_cannot_drain_in_time_says_do_not_retry() {
        let limiter = Limiter::builder()
            .initial_limit(4)
            .max_limit(4)
            .max_drain(Duration::from_secs(2))
            .seed(1)
            .build()
            .unwrap();
        let mut now = Instant::now();
        // Four complete per 100 ms (40/s) while 400 a second are turned away.
        let mut last = None;
        for _ in 0..30 {
            // As many as it admits: a probe may hold it at half.
            let held: Vec<_> = (0..4)
                .filter_map(|_| limiter.try_acquire(Priority::HIGHEST, now).ok())
                .collect();
            for _ in 0..40 {
                last = Some(limiter.try_acquire(Priority::HIGHEST, now).unwrap_err());
            }
            now += ms(100);
            for p in held {
                p.complete(now);
            }
        }
        assert!(
            limiter.queue_time() > Duration::from_secs(2),
            "{:?}",
            limiter.queue_time()
        );
        let last = last.unwrap();
        assert_eq!(last.reason(), Reason::Drain);
        assert!(!last.should_retry());
        assert_eq!(last.retry_after(), None);
    }

    #[test]
    fn a_request_that_fits_is_admitted_however_many_are_rejected_beside_it() {
        let limiter = Limiter::builder()
            .initial_limit(8)
            .max_limit(8)
            .seed(1)
            .build()
            .unwrap();
        let now = Instant::now();
        for _ in 0..2_000 {
            let held: Vec<_> = (0..7)
                .map(|_| limiter.try_acquire(Priority::HIGHEST, now).unwrap())
                .collect();
            // Four race for the one place left: exactly one gets it, never
            // none because the others' rejections counted for a moment.
            let start = std::sync::Barrier::new(4);
            let admitted: usize = std::thread::scope(|scope| {
                let racers: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            limiter.try_acquire(Priority::HIGHEST, now).ok()
                        })
                    })
                    .collect();
                // Every permit is kept until all four have tried.
                let permits: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
                permits.iter().filter(|p| p.is_some()).count()
            });
            assert_eq!(admitted, 1);
            drop(held);
            assert_eq!(limiter.in_flight(), 0);
        }
    }

    #[test]
    fn an_observer_may_ask_the_limiter_while_it_is_told() {
        // Observers run with the window's lock released: one that reads
        // the baseline (which takes it) does not deadlock.
        let handle = Arc::new(std::sync::OnceLock::<Limiter>::new());
        let seen = handle.clone();
        let told = Arc::new(AtomicUsize::new(0));
        let count = told.clone();
        let limiter = Limiter::builder()
            .initial_limit(4)
            .seed(1)
            .observer(move |_: &ShedEvent| {
                if let Some(limiter) = seen.get() {
                    let _ = limiter.baseline();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build()
            .unwrap();
        handle.set(limiter.clone()).unwrap();
        let now = drive(&limiter, Instant::now(), 10, |_| ms(50));
        drive(&limiter, now, 10, |_| ms(500));
        assert!(told.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn dropped_permits_free_their_place_without_a_measurement() {
        let limiter = Limiter::builder().initial_limit(4).build().unwrap();
        let now = Instant::now();
        let p = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
        assert_eq!(limiter.in_flight(), 1);
        drop(p);
        assert_eq!(limiter.in_flight(), 0);
        assert_eq!(limiter.baseline(), None);
    }

    #[test]
    fn every_bad_setting_is_named() {
        let cases: Vec<(LimiterBuilder, &str)> = vec![
            (Limiter::builder().min_limit(0), "min_limit"),
            (Limiter::builder().max_limit(2), "max_limit"),
            (Limiter::builder().initial_limit(1), "initial_limit"),
            (Limiter::builder().window(Duration::ZERO), "window"),
            (Limiter::builder().tolerance(0.9), "tolerance"),
            (Limiter::builder().tolerance(f64::NAN), "tolerance"),
            (Limiter::builder().smoothing(0.0), "smoothing"),
            (Limiter::builder().shares([1.0, 0.5, 0.9, 1.0]), "shares"),
            (
                Limiter::builder().retry_after(Duration::ZERO),
                "retry_after",
            ),
            (
                Limiter::builder().max_retry_after(ms(10)),
                "max_retry_after",
            ),
        ];
        for (builder, field) in cases {
            assert_eq!(builder.build().unwrap_err().field(), field);
        }
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_limit_stays_within_its_bounds_whatever_the_latencies(
            ops in proptest::collection::vec((0u64..5_000, 0u64..50, any::<bool>()), 1..400),
        ) {
            let limiter = Limiter::builder()
                .initial_limit(8)
                .min_limit(2)
                .max_limit(64)
                .seed(1)
                .build()
                .unwrap();
            let mut now = Instant::now();
            let mut held = std::collections::VecDeque::new();
            for (latency, gap, admit) in ops {
                now += Duration::from_millis(gap);
                if admit {
                    if let Ok(p) = limiter.try_acquire(Priority::HIGHEST, now) {
                        held.push_back((p, latency));
                    }
                } else if let Some((p, latency)) = held.pop_front() {
                    p.complete(now + Duration::from_millis(latency));
                }
                prop_assert!((2..=64).contains(&limiter.limit()));
                prop_assert!(limiter.in_flight() <= 64);
                if let Some(b) = limiter.baseline() {
                    prop_assert!(b <= Duration::from_secs(6));
                }
            }
        }

        #[test]
        fn in_flight_returns_to_zero_whatever_the_order(
            ops in proptest::collection::vec((0u8..4, any::<bool>(), 0u64..500), 1..200),
        ) {
            let limiter = Limiter::builder().initial_limit(8).min_limit(1).seed(1).build().unwrap();
            let start = Instant::now();
            let mut held = Vec::new();
            for (level, complete, ms) in ops {
                let now = start + Duration::from_millis(ms);
                let priorities = [
                    Priority::LOWEST,
                    Priority::new(crate::Criticality::Sheddable, false),
                    Priority::new(crate::Criticality::Default, false),
                    Priority::HIGHEST,
                ];
                if let Ok(p) = limiter.try_acquire(priorities[usize::from(level)], now) {
                    held.push(p);
                } else if let Some(p) = held.pop() {
                    if complete { p.complete(now) } else { drop(p) }
                }
                prop_assert!(limiter.in_flight() <= limiter.limit().max(8) + 1);
            }
            drop(held);
            prop_assert_eq!(limiter.in_flight(), 0);
        }
    }
}
