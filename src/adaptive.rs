//! [`AdaptivePacing`]: one pause before every request of every clone, which
//! grows while the server throttles and shrinks back to nothing as it
//! recovers ("responsive exponential backoff").

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use crate::error::{check_duration, ConfigError};
use crate::jitter::Rng;
use crate::policy::{Cause, Decision};

/// A pacing interval shared by every request through every clone of a
/// service, first attempts included, for jobs whose parallel workers write to
/// a rate-limited store.
///
/// Backoff alone only delays the retries of the request that was throttled;
/// the other workers keep sending at full speed. Pacing slows them all down:
/// while the interval is above zero, every request sleeps about that long
/// before it goes out.
///
/// - A throttling outcome (the policy decided [`Cause::Throttled`], or a
///   retry after a server-given delay) raises the interval: to the initial
///   interval from zero, then times the up-multiplier, up to the cap.
///   Responses to requests sent before the last raise do not raise it again,
///   so a burst of workers throttled together raises it once, not once each.
/// - Every `success_threshold` consecutive successes lower it by the
///   down-multiplier, and to zero once it falls below the initial interval.
///   Any other failure restarts the count.
/// - Each pause is randomized by ± the randomization factor (at most
///   `max_spread`), so workers do not wake together.
/// - [`reset`](Self::reset) drops it to zero at once, when you learn the
///   server is fine again.
///
/// Defaults: initial 500 ms, up ×1.5, down ×0.9, threshold 10 successes,
/// randomization 0.3, cap 15 min; the interval is kept to the millisecond.
/// While it is zero, pacing costs a request two atomic loads (before it goes
/// out, and on its outcome): no timer, no clock.
///
/// The handle is cheap to clone; clones share the interval and the metrics.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::{AdaptivePacing, BackoffLayer};
///
/// let pacing = AdaptivePacing::builder()
///     .initial_interval(Duration::from_millis(200))
///     .max_interval(Duration::from_secs(30))
///     .build()?;
/// let layer = BackoffLayer::builder().pacing(pacing.clone()).build()?;
/// assert_eq!(pacing.interval(), Duration::ZERO);
/// // ...later, when an operator knows the store recovered:
/// pacing.reset();
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AdaptivePacing {
    state: Arc<State>,
}

struct State {
    /// The interval in milliseconds (low 40 bits, 34 years), and in the high
    /// 24 bits a generation, bumped by every raise and reset: an
    /// attempt stamped with an older generation was sent before the last
    /// raise, so its throttling must not raise again. One word, so the check
    /// and the raise are one compare-and-swap.
    interval: AtomicU64,
    /// Successes since the last failure or the last lowering.
    streak: AtomicU64,
    raised: AtomicU64,
    lowered: AtomicU64,
    sleeps: AtomicU64,
    slept_nanos: AtomicU64,
    settings: Settings,
}

const GENERATION_SHIFT: u32 = 40;
const MILLIS_MASK: u64 = (1 << GENERATION_SHIFT) - 1;

fn millis(word: u64) -> u64 {
    word & MILLIS_MASK
}

fn generation(word: u64) -> u64 {
    word >> GENERATION_SHIFT
}

/// The same generation, or the next one, with a new interval.
fn with_millis(word: u64, next_generation: bool, ms: u64) -> u64 {
    let generation = (generation(word) + u64::from(next_generation)) << GENERATION_SHIFT;
    generation | ms.min(MILLIS_MASK)
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    /// Milliseconds.
    initial: u64,
    up: f64,
    down: f64,
    threshold: u64,
    randomization: f64,
    /// Milliseconds.
    max_interval: u64,
    /// Nanoseconds.
    max_spread: u64,
}

/// What an [`AdaptivePacing`] has done, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PacingMetrics {
    /// The interval now (before randomization).
    pub interval: Duration,
    /// Times the interval went up.
    pub raised: u64,
    /// Times it went down, the drops to zero included (but not resets).
    pub lowered: u64,
    /// Pauses requests slept before going out.
    pub sleeps: u64,
    /// Total time those pauses lasted.
    pub slept: Duration,
}

impl AdaptivePacing {
    /// Pacing with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> AdaptivePacingBuilder {
        AdaptivePacingBuilder::default()
    }

    /// The interval now, before randomization; zero when not pacing.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(millis(self.state.interval.load(Ordering::Relaxed)))
    }

    /// Drops the interval to zero now: requests stop pausing from the next
    /// one on, and throttled answers to requests sent before are ignored.
    /// Requests already pausing finish their pause.
    pub fn reset(&self) {
        let s = &*self.state;
        let _ = s
            .interval
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                Some(with_millis(word, true, 0))
            });
        s.streak.store(0, Ordering::Relaxed);
    }

    /// Reads the interval and the counters.
    pub fn metrics(&self) -> PacingMetrics {
        let s = &*self.state;
        PacingMetrics {
            interval: self.interval(),
            raised: s.raised.load(Ordering::Relaxed),
            lowered: s.lowered.load(Ordering::Relaxed),
            sleeps: s.sleeps.load(Ordering::Relaxed),
            slept: Duration::from_nanos(s.slept_nanos.load(Ordering::Relaxed)),
        }
    }

    /// Ready when the service clone owning `gate` may send its next attempt;
    /// it stays ready until [`sent`](Self::sent) consumes the readiness.
    /// Called from `Backoff::poll_ready`, so pacing is backpressure: the
    /// service that was readied is the one that sends, and a caller that never
    /// calls holds nothing back.
    pub(crate) fn poll_send(
        &self,
        gate: &mut Gate,
        cx: &mut Context<'_>,
        new_rng: impl FnOnce() -> Rng,
    ) -> Poll<()> {
        if gate.ready {
            return Poll::Ready(());
        }
        if gate.sleep.is_none() {
            let (interval, _) = self.now();
            if interval == 0 {
                gate.ready = true;
                return Poll::Ready(());
            }
            let rng = gate.rng.get_or_insert_with(new_rng);
            let pause = self.pause(interval, rng);
            self.record_pause(pause);
            gate.sleep = Some(Box::pin(tokio::time::sleep(pause)));
        }
        if let Some(sleep) = gate.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
        }
        gate.sleep = None;
        gate.ready = true;
        Poll::Ready(())
    }

    /// An attempt goes out through the clone owning `gate`: uses up its
    /// readiness, and returns the stamp to hand back to
    /// [`observe`](Self::observe) with the attempt's outcome.
    pub(crate) fn sent(&self, gate: &mut Gate) -> u16 {
        gate.ready = false;
        self.now().1
    }

    /// The interval now in nanoseconds (zero when not pacing), and the stamp
    /// an attempt sent now carries: its generation, in the two bytes a
    /// response future has spare.
    pub(crate) fn now(&self) -> (u64, u16) {
        let word = self.state.interval.load(Ordering::Relaxed);
        (millis(word) * 1_000_000, generation(word) as u16)
    }

    /// The pause before a request, randomized around `interval` nanoseconds.
    pub(crate) fn pause(&self, interval: u64, rng: &mut Rng) -> Duration {
        let s = &self.state.settings;
        let spread = ((interval as f64 * s.randomization) as u64).min(s.max_spread);
        let low = Duration::from_nanos(interval.saturating_sub(spread));
        let pause = low + rng.duration_up_to(Duration::from_nanos(spread.saturating_mul(2)));
        pause.min(Duration::from_millis(s.max_interval))
    }

    pub(crate) fn record_pause(&self, slept: Duration) {
        let nanos = u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX);
        self.state.sleeps.fetch_add(1, Ordering::Relaxed);
        self.state.slept_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Learns from one attempt's outcome; `stamp` is what [`now`](Self::now)
    /// gave when the attempt went out.
    pub(crate) fn observe(&self, decision: &Decision, stamp: u16) {
        match *decision {
            Decision::Retry {
                cause: Cause::Throttled,
                ..
            }
            | Decision::Retry { after: Some(_), .. } => self.throttled(stamp),
            Decision::Success => self.succeeded(),
            _ => self.failed(),
        }
    }

    fn throttled(&self, stamp: u16) {
        let s = &*self.state;
        s.streak.store(0, Ordering::Relaxed);
        let raised = s
            .interval
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                if generation(word) as u16 != stamp {
                    return None; // Raised or reset since this attempt went out.
                }
                let next = match millis(word) {
                    0 => s.settings.initial,
                    ms => ((ms as f64 * s.settings.up) as u64).min(s.settings.max_interval),
                };
                (next != millis(word)).then(|| with_millis(word, true, next))
            });
        if raised.is_ok() {
            s.raised.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn succeeded(&self) {
        let s = &*self.state;
        // At zero there is nothing to lower: stay off the shared cache line.
        if millis(s.interval.load(Ordering::Relaxed)) == 0 {
            return;
        }
        let threshold = s.settings.threshold;
        let streak = s
            .streak
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(if n + 1 >= threshold { 0 } else { n + 1 })
            })
            .unwrap_or_default();
        // Exactly one success in each run of `threshold` completes it.
        if streak + 1 < threshold {
            return;
        }
        let lowered = s
            .interval
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                let next = (millis(word) as f64 * s.settings.down) as u64;
                let next = if next < s.settings.initial { 0 } else { next };
                (millis(word) != 0).then(|| with_millis(word, false, next))
            });
        if lowered.is_ok() {
            s.lowered.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn failed(&self) {
        let s = &*self.state;
        if millis(s.interval.load(Ordering::Relaxed)) != 0 {
            s.streak.store(0, Ordering::Relaxed);
        }
    }
}

/// What one service clone needs to wait for its turn to send: nothing until
/// pacing first makes it wait. Cloning a service gives the clone a fresh gate.
#[derive(Default)]
pub(crate) struct Gate {
    sleep: Option<Pin<Box<Sleep>>>,
    ready: bool,
    rng: Option<Rng>,
}

impl Clone for Gate {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("waiting", &self.sleep.is_some())
            .field("ready", &self.ready)
            .finish()
    }
}

impl Default for AdaptivePacing {
    fn default() -> Self {
        AdaptivePacingBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

impl fmt::Debug for AdaptivePacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptivePacing")
            .field("metrics", &self.metrics())
            .field("settings", &self.state.settings)
            .finish()
    }
}

/// Builds an [`AdaptivePacing`]; every setting is checked by
/// [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct AdaptivePacingBuilder {
    initial_interval: Duration,
    up_multiplier: f64,
    down_multiplier: f64,
    success_threshold: u32,
    randomization: f64,
    max_interval: Duration,
    max_spread: Option<Duration>,
}

impl Default for AdaptivePacingBuilder {
    fn default() -> Self {
        Self {
            initial_interval: Duration::from_millis(500),
            up_multiplier: 1.5,
            down_multiplier: 0.9,
            success_threshold: 10,
            randomization: 0.3,
            max_interval: Duration::from_secs(15 * 60),
            max_spread: None,
        }
    }
}

impl AdaptivePacingBuilder {
    /// The interval the first throttling sets, and the floor below which it
    /// drops to zero (default 500 ms).
    pub fn initial_interval(mut self, interval: Duration) -> Self {
        self.initial_interval = interval;
        self
    }

    /// Factor applied on each further throttling (default 1.5, above 1).
    pub fn up_multiplier(mut self, factor: f64) -> Self {
        self.up_multiplier = factor;
        self
    }

    /// Factor applied after each run of consecutive successes (default 0.9,
    /// between 0 and 1).
    pub fn down_multiplier(mut self, factor: f64) -> Self {
        self.down_multiplier = factor;
        self
    }

    /// Consecutive successes that lower the interval one step (default 10).
    pub fn success_threshold(mut self, successes: u32) -> Self {
        self.success_threshold = successes;
        self
    }

    /// Each pause is the interval × a uniform factor in `[1 − r, 1 + r]`
    /// (default 0.3, within `[0, 1]`).
    pub fn randomization(mut self, r: f64) -> Self {
        self.randomization = r;
        self
    }

    /// Caps the interval and every pause (default 15 min).
    pub fn max_interval(mut self, cap: Duration) -> Self {
        self.max_interval = cap;
        self
    }

    /// Caps how far randomization moves a pause from the interval (default:
    /// no cap beyond the factor), so long intervals stay predictable.
    pub fn max_spread(mut self, spread: Duration) -> Self {
        self.max_spread = Some(spread);
        self
    }

    /// Checks every setting and builds the pacing, at zero.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting: a zero interval or cap, an
    /// initial interval above the cap, a multiplier on the wrong side of 1, a
    /// zero threshold, a randomization outside `[0, 1]`, or a duration over a
    /// year.
    pub fn build(self) -> Result<AdaptivePacing, ConfigError> {
        check_duration("initial_interval", self.initial_interval)?;
        check_duration("max_interval", self.max_interval)?;
        if self.initial_interval.is_zero() {
            return Err(ConfigError::new(
                "initial_interval",
                "must be longer than zero",
            ));
        }
        if self.initial_interval > self.max_interval {
            return Err(ConfigError::new(
                "initial_interval",
                format!(
                    "{:?} is above the max_interval of {:?}",
                    self.initial_interval, self.max_interval
                ),
            ));
        }
        if !(self.up_multiplier.is_finite() && self.up_multiplier > 1.0) {
            return Err(ConfigError::new(
                "up_multiplier",
                format!("must be above 1, got {}", self.up_multiplier),
            ));
        }
        if !(self.down_multiplier > 0.0 && self.down_multiplier < 1.0) {
            return Err(ConfigError::new(
                "down_multiplier",
                format!("must be between 0 and 1, got {}", self.down_multiplier),
            ));
        }
        if self.success_threshold == 0 {
            return Err(ConfigError::new("success_threshold", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.randomization) {
            return Err(ConfigError::new(
                "randomization",
                format!("must be within [0, 1], got {}", self.randomization),
            ));
        }
        if let Some(spread) = self.max_spread {
            check_duration("max_spread", spread)?;
        }
        let millis = |d: Duration| d.as_millis() as u64; // a year fits in u64
        Ok(AdaptivePacing {
            state: Arc::new(State {
                interval: AtomicU64::new(0),
                streak: AtomicU64::new(0),
                raised: AtomicU64::new(0),
                lowered: AtomicU64::new(0),
                sleeps: AtomicU64::new(0),
                slept_nanos: AtomicU64::new(0),
                settings: Settings {
                    initial: millis(self.initial_interval),
                    up: self.up_multiplier,
                    down: self.down_multiplier,
                    threshold: u64::from(self.success_threshold),
                    randomization: self.randomization,
                    max_interval: millis(self.max_interval),
                    max_spread: self.max_spread.map_or(u64::MAX, |d| d.as_nanos() as u64),
                },
            }),
        })
    }
}
