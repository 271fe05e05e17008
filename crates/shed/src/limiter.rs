//! [`Limiter`]: an adaptive concurrency limit found from measured latency,
//! which admits a request at once or rejects it at once.
//!
//! The limit follows the gradient of latency, as Netflix's concurrency-limits
//! (`Gradient2Limit`) and Envoy's adaptive concurrency filter do. Latency is
//! measured as the mean over windows of 100 ms; its **anchor** is the lowest
//! such window mean of the last 10 minutes: what the server does when it is
//! not queueing. After each window the limit moves toward
//! `limit × min(1, tolerance × anchor / mean) + √limit`: it shrinks as soon
//! as latency rises past `tolerance × anchor`, and grows by about `√limit`
//! per window while latency stays near the anchor and the limit is in use.
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

use crate::criticality::Priority;
use crate::events::{LimitArgs, ShedEvent, ShedObserver};
use crate::rejection::{Reason, Rejection};

/// The window latency is averaged over.
#[doc(hidden)]
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);
/// How far back the anchor (the lowest window mean) looks.
#[doc(hidden)]
pub const DEFAULT_ANCHOR_WINDOW: Duration = Duration::from_secs(600);

/// How many slots the anchor's ring keeps: the anchor window in tenths.
const ANCHOR_SLOTS: usize = 10;

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
    /// Rejections since the last window closed.
    rejected: AtomicU64,
    /// The last queueing-time estimate, in microseconds.
    drain_micros: AtomicU64,
    /// The state of the generator that spreads `Retry-After`.
    spread: AtomicU64,
    window: Mutex<Window>,
    observers: Vec<Arc<dyn ShedObserver>>,
}

#[derive(Debug, Clone)]
struct Config {
    min_limit: usize,
    max_limit: usize,
    window: Duration,
    anchor_window: Duration,
    min_samples: u32,
    tolerance: f64,
    smoothing: f64,
    shares: [f64; 4],
    max_drain: Duration,
    retry_after: Duration,
    max_retry_after: Duration,
}

struct Window {
    origin: Option<Instant>,
    start: Option<Instant>,
    sum: f64,
    count: u32,
    peak: usize,
    limit: f64,
    /// Per tenth of the anchor window: (its number, its lowest mean).
    anchors: [(u64, f64); ANCHOR_SLOTS],
    throughput: f64,
    rejections: f64,
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
                anchor_window: DEFAULT_ANCHOR_WINDOW,
                min_samples: 5,
                tolerance: 1.25,
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

    /// The window latency is averaged over (default 100 ms).
    pub fn window(mut self, window: Duration) -> Self {
        self.config.window = window;
        self
    }

    /// How far back the anchor, the lowest window mean, looks (default 10
    /// minutes). Shorter follows a server whose unloaded latency changes;
    /// longer remembers what it can do through a long overload.
    pub fn anchor_window(mut self, window: Duration) -> Self {
        self.config.anchor_window = window;
        self
    }

    /// Latency may rise to `tolerance × anchor` before the limit shrinks
    /// (default 1.25); at least 1.
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
    /// time, if longer) and twice that, so that a fleet told to come back
    /// does not come back at one instant.
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
        for (field, value) in [
            ("window", c.window),
            ("anchor_window", c.anchor_window),
            ("retry_after", c.retry_after),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
            check_duration(field, value)?;
        }
        check_duration("max_drain", c.max_drain)?;
        check_duration("max_retry_after", c.max_retry_after)?;
        if c.anchor_window < c.window {
            return Err(ConfigError::new(
                "anchor_window",
                "must be at least as long as the window",
            ));
        }
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
            drain_micros: AtomicU64::new(0),
            spread: AtomicU64::new(seed),
            window: Mutex::new(Window {
                origin: None,
                start: None,
                sum: 0.0,
                count: 0,
                peak: 0,
                limit: self.initial_limit as f64,
                anchors: [(u64::MAX, f64::INFINITY); ANCHOR_SLOTS],
                throughput: 0.0,
                rejections: 0.0,
            }),
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
        let before = shared.in_flight.fetch_add(1, Ordering::AcqRel);
        if before < threshold {
            for observer in &shared.observers {
                observer.on_event(&ShedEvent::Admitted(priority));
            }
            return Ok(Permit {
                shared: self.shared.clone(),
                started: now,
            });
        }
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        Err(shared.reject(priority, before, now))
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

    /// The anchor: the lowest window mean latency of the anchor window, once
    /// one was measured.
    pub fn anchor(&self) -> Option<Duration> {
        let window = self.shared.lock();
        let anchor = window.anchor(window.slot_now(&self.shared.config, None));
        anchor.and_then(|a| Duration::try_from_secs_f64(a).ok())
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

    #[cold]
    fn reject(&self, priority: Priority, in_flight: usize, now: Instant) -> Rejection {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        // Rejections alone may close a window: a server that completes
        // nothing still learns its queueing time.
        if let Ok(mut window) = self.window.try_lock() {
            self.maybe_close(&mut window, now);
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
        for observer in &self.observers {
            observer.on_event(&ShedEvent::Rejected(rejection));
        }
        rejection
    }

    /// A delay in `[base, 2 × base)`, `base` the queueing time but at least
    /// `retry_after`; never past `max_retry_after`.
    fn spread(&self, drain: Duration) -> Duration {
        let base = drain
            .min(self.config.max_retry_after / 2)
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
        base.mul_f64(1.0 + unit).min(self.config.max_retry_after)
    }

    fn complete(&self, latency: Duration, now: Instant) {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let mut window = self.lock();
        window.sum += latency.as_secs_f64();
        window.count = window.count.saturating_add(1);
        window.peak = window.peak.max(in_flight);
        self.maybe_close(&mut window, now);
    }

    fn maybe_close(&self, window: &mut Window, now: Instant) {
        let origin = *window.origin.get_or_insert(now);
        let start = *window.start.get_or_insert(origin);
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.config.window {
            return;
        }
        let secs = elapsed.as_secs_f64();
        // Rates smoothed over about a second, whatever the windows' length.
        let alpha = 1.0 - (-secs).exp();
        let rejected = self.rejected.swap(0, Ordering::Relaxed) as f64;
        window.throughput += alpha * (f64::from(window.count) / secs - window.throughput);
        window.rejections += alpha * (rejected / secs - window.rejections);
        let drain = if window.rejections < 1e-9 {
            0.0
        } else if window.throughput < 1e-9 {
            f64::INFINITY
        } else {
            window.rejections / window.throughput
        };
        let drain = Duration::try_from_secs_f64(drain).unwrap_or(Duration::MAX);
        self.drain_micros.store(
            u64::try_from(drain.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let mut change = None;
        if window.count >= self.config.min_samples {
            let mean = window.sum / f64::from(window.count);
            let slot = window.slot_now(&self.config, Some(now));
            let entry = &mut window.anchors[(slot % ANCHOR_SLOTS as u64) as usize];
            if entry.0 != slot {
                *entry = (slot, mean);
            } else {
                entry.1 = entry.1.min(mean);
            }
            let anchor = window.anchor(slot).unwrap_or(mean);
            let old = window.limit;
            let proposed = next_limit(old, anchor, mean, self.config.tolerance, window.peak);
            let limit = (old + self.config.smoothing * (proposed - old))
                .clamp(self.config.min_limit as f64, self.config.max_limit as f64);
            window.limit = limit;
            let rounded = limit.round() as usize;
            if rounded != self.limit.swap(rounded, Ordering::Relaxed) {
                self.set_thresholds(rounded);
                change = Some(LimitArgs {
                    limit: rounded,
                    anchor: Duration::try_from_secs_f64(anchor).unwrap_or(Duration::MAX),
                    mean: Duration::try_from_secs_f64(mean).unwrap_or(Duration::MAX),
                    queue_time: drain,
                });
            }
        }
        window.start = Some(now);
        window.sum = 0.0;
        window.count = 0;
        window.peak = self.in_flight.load(Ordering::Relaxed);
        let event = match change {
            Some(args) => ShedEvent::Limit(args),
            None => ShedEvent::QueueTime(drain),
        };
        for observer in &self.observers {
            observer.on_event(&event);
        }
    }
}

/// The limit the gradient proposes after a window of mean latency `mean`,
/// with the anchor `anchor`, when `peak` requests were in flight at most.
///
/// It shrinks in proportion as latency rises past `tolerance × anchor`
/// (never below half in one step), and grows by `√limit` only when the
/// limit was in use (a server that is not asked for more cannot show it
/// can do more). Finite and positive for any finite positive input.
#[doc(hidden)]
pub fn next_limit(limit: f64, anchor: f64, mean: f64, tolerance: f64, peak: usize) -> f64 {
    let limit = if limit.is_finite() {
        limit.max(1.0)
    } else {
        1.0
    };
    let gradient = if mean > 0.0 && anchor.is_finite() {
        (tolerance * anchor / mean).clamp(0.5, 1.0)
    } else {
        1.0
    };
    let proposed = limit * gradient + limit.sqrt();
    if proposed > limit && (peak as f64) < limit / 2.0 {
        limit
    } else {
        proposed
    }
}

impl Window {
    /// The number of the anchor slot `now` is in (the current one if `now`
    /// is `None`).
    fn slot_now(&self, config: &Config, now: Option<Instant>) -> u64 {
        let slot_len = (config.anchor_window / ANCHOR_SLOTS as u32).max(Duration::from_millis(1));
        let at = now.or(self.start);
        match (self.origin, at) {
            (Some(origin), Some(at)) => {
                (at.saturating_duration_since(origin).as_nanos() / slot_len.as_nanos()) as u64
            }
            _ => 0,
        }
    }

    /// The lowest mean of the slots within the anchor window of `slot`.
    fn anchor(&self, slot: u64) -> Option<f64> {
        self.anchors
            .iter()
            .filter(|(s, _)| *s != u64::MAX && slot.saturating_sub(*s) < ANCHOR_SLOTS as u64)
            .map(|(_, mean)| *mean)
            .min_by(f64::total_cmp)
    }
}

/// A request's place among those in flight: freed when dropped.
#[must_use = "dropping a permit at once frees its place"]
pub struct Permit {
    shared: Arc<Shared>,
    started: Instant,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("started", &self.started)
            .finish()
    }
}

impl Permit {
    /// The work is done at `now`: its latency counts toward the limit, and
    /// the place is freed.
    pub fn complete(self, now: Instant) {
        let latency = now.saturating_duration_since(self.started);
        self.shared.complete(latency, now);
    }

    /// When the request was admitted.
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criticality::Criticality;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs `windows` windows of 100 ms, each completing `per_window`
    /// requests of `latency` while holding as many as the limit allows.
    fn drive(limiter: &Limiter, start: Instant, windows: u32, latency: Duration) -> Instant {
        let mut now = start;
        for _ in 0..windows {
            let mut permits = Vec::new();
            while let Ok(p) = limiter.try_acquire(Priority::HIGHEST, now) {
                permits.push(p);
            }
            for p in permits {
                p.complete(now + latency);
            }
            now += latency.max(ms(100));
        }
        now
    }

    #[test]
    fn the_limit_grows_while_latency_stays_at_the_anchor() {
        let limiter = Limiter::builder().seed(1).build().unwrap();
        drive(&limiter, Instant::now(), 30, ms(50));
        assert!(limiter.limit() > 40, "{}", limiter.limit());
    }

    #[test]
    fn the_limit_shrinks_when_latency_rises_past_the_tolerance() {
        let limiter = Limiter::builder()
            .initial_limit(200)
            .seed(1)
            .build()
            .unwrap();
        let now = drive(&limiter, Instant::now(), 5, ms(50));
        let before = limiter.limit();
        drive(&limiter, now, 20, ms(200));
        assert!(
            limiter.limit() < before / 2,
            "{before} -> {}",
            limiter.limit()
        );
        assert_eq!(limiter.anchor(), Some(ms(50)));
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
    fn retry_after_is_spread_between_one_and_two_seconds() {
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
        assert!(delays.iter().all(|d| *d >= ms(1000) && *d < ms(2000)));
        let early = delays.iter().filter(|d| **d < ms(1500)).count();
        assert!((400..600).contains(&early), "{early}");
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
            .max_drain(Duration::from_secs(2))
            .seed(1)
            .build()
            .unwrap();
        let mut now = Instant::now();
        // Four complete per 100 ms (40/s) while 400 a second are turned away.
        let mut last = None;
        for _ in 0..30 {
            let held: Vec<_> = (0..4)
                .map(|_| limiter.try_acquire(Priority::HIGHEST, now).unwrap())
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
    fn dropped_permits_free_their_place_without_a_measurement() {
        let limiter = Limiter::builder().initial_limit(4).build().unwrap();
        let now = Instant::now();
        let p = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
        assert_eq!(limiter.in_flight(), 1);
        drop(p);
        assert_eq!(limiter.in_flight(), 0);
        assert_eq!(limiter.anchor(), None);
    }

    #[test]
    fn every_bad_setting_is_named() {
        let cases: Vec<(LimiterBuilder, &str)> = vec![
            (Limiter::builder().min_limit(0), "min_limit"),
            (Limiter::builder().max_limit(2), "max_limit"),
            (Limiter::builder().initial_limit(1), "initial_limit"),
            (Limiter::builder().window(Duration::ZERO), "window"),
            (Limiter::builder().anchor_window(ms(10)), "anchor_window"),
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
        fn next_limit_is_finite_positive_and_moves_at_most_by_half_or_its_root(
            limit in 1.0f64..1e6,
            anchor in 1e-6f64..10.0,
            mean in 1e-6f64..100.0,
            tolerance in 1.0f64..4.0,
            peak in 0usize..2_000_000,
        ) {
            let next = next_limit(limit, anchor, mean, tolerance, peak);
            prop_assert!(next.is_finite() && next > 0.0);
            prop_assert!(next >= limit * 0.5);
            prop_assert!(next <= limit + limit.sqrt() + 1e-9);
            if mean > tolerance * anchor * 2.0 {
                // Latency past twice the tolerance: it shrinks (but for the root).
                prop_assert!(next <= limit * 0.5 + limit.sqrt() + 1e-9);
            }
        }

        #[test]
        fn next_limit_never_panics_or_goes_nan(
            limit in proptest::num::f64::ANY,
            anchor in proptest::num::f64::ANY,
            mean in proptest::num::f64::ANY,
            peak in 0usize..usize::MAX,
        ) {
            let next = next_limit(limit, anchor, mean, 1.25, peak);
            prop_assert!(!next.is_nan() && next > 0.0);
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
