//! Schedules: how long to wait before each retry, as plain data.
//!
//! A schedule maps a retry number to a delay. It holds no state and allocates
//! nothing, so one value is shared by every request and every clone of a service;
//! the per-request state (which retry this is, what was slept before) lives in the
//! response future. [`Jitter`](crate::Jitter) randomizes the delay on top.
//!
//! Every schedule saturates: growth stops at [`Schedule::cap`] and never
//! overflows or panics, however many retries are asked for.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{check_duration, ConfigError};

mod any;

pub use any::AnySchedule;

/// The delay before each retry, before jitter.
///
/// `retry` counts retries from 1: `delay(1)` is the wait after the first attempt
/// failed. Implementations must saturate at [`cap`](Schedule::cap) and
/// never panic; a custom schedule is a small type (or [`from_fn`]) implementing
/// this trait.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Exponential, Schedule};
///
/// let s = Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_millis(500));
/// let delays: Vec<_> = (1..=5).map(|n| s.delay(n)).collect();
/// assert_eq!(delays, [100, 200, 400, 500, 500].map(Duration::from_millis));
/// ```
pub trait Schedule {
    /// The delay before retry number `retry` (1 for the first retry).
    fn delay(&self, retry: u32) -> Duration;

    /// The longest delay this schedule asks for, jitter included. A delay
    /// the server names (`Retry-After`) is not capped by it: no retry goes
    /// out before the server asked, and the policy decides how long a delay
    /// it accepts.
    fn cap(&self) -> Duration {
        Duration::MAX
    }

    /// Checks the configuration; called by the layer's builder, so a bad value
    /// fails at start-up with the field's name.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// This schedule as an [`AnySchedule`], the value the layer and the other
    /// front-ends store. The default shares it behind an `Arc`; the built-ins
    /// are kept as themselves.
    fn into_any(self) -> AnySchedule
    where
        Self: Sized + Send + Sync + 'static,
    {
        AnySchedule::custom(self)
    }
}

macro_rules! forward {
    ($($pointer:ty),*) => {$(
        impl<S: Schedule + ?Sized> Schedule for $pointer {
            fn delay(&self, retry: u32) -> Duration {
                (**self).delay(retry)
            }
            fn cap(&self) -> Duration {
                (**self).cap()
            }
            fn validate(&self) -> Result<(), ConfigError> {
                (**self).validate()
            }
        }
    )*};
}

forward!(&S, Arc<S>);

/// `initial × factor^(retry − 1)`, capped at `max_delay`.
///
/// Defaults: factor 2, cap 20 s (AWS SDKs' standard-mode cap: long enough to
/// ride out a restart, short enough that a user is still waiting).
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Exponential, Schedule};
///
/// let s = Exponential::new(Duration::from_millis(50)).factor(3.0);
/// assert_eq!(s.delay(3), Duration::from_millis(450));
/// assert_eq!(s.delay(u32::MAX), Duration::from_secs(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exponential {
    initial: Duration,
    factor: f64,
    max: Duration,
}

impl Exponential {
    /// Starts at `initial`, doubling up to 20 s.
    pub const fn new(initial: Duration) -> Self {
        Self {
            initial,
            factor: 2.0,
            max: Duration::from_secs(20),
        }
    }

    /// Multiplies the delay by `factor` after each retry; must be finite and ≥ 1.
    pub const fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Never waits longer than `max` (jitter included).
    pub const fn max_delay(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }
}

impl Default for Exponential {
    /// 100 ms, doubling, capped at 20 s.
    fn default() -> Self {
        Self::new(Duration::from_millis(100))
    }
}

impl Schedule for Exponential {
    fn into_any(self) -> AnySchedule {
        self.into()
    }

    fn delay(&self, retry: u32) -> Duration {
        if self.initial.is_zero() {
            // 0 × ∞ is NaN in floating point; zero times anything is zero here.
            return Duration::ZERO;
        }
        let exponent = retry.saturating_sub(1).min(i32::MAX as u32) as i32;
        let nanos = self.initial.as_nanos() as f64 * self.factor.powi(exponent);
        // Past 2^53 ns (104 days) f64 rounds `initial` itself; never below it.
        nanos_capped(nanos, self.max).max(self.initial.min(self.max))
    }

    fn cap(&self) -> Duration {
        self.max
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(ConfigError::new(
                "factor",
                format!("must be a finite number ≥ 1, got {}", self.factor),
            ));
        }
        check_initial_and_max(self.initial, self.max)
    }
}

/// `initial + step × (retry − 1)`, capped at `max_delay` (default 20 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    initial: Duration,
    step: Duration,
    max: Duration,
}

impl Linear {
    /// Starts at `initial` and adds `step` after each retry, up to 20 s.
    pub const fn new(initial: Duration, step: Duration) -> Self {
        Self {
            initial,
            step,
            max: Duration::from_secs(20),
        }
    }

    /// Never waits longer than `max`.
    pub const fn max_delay(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }
}

impl Schedule for Linear {
    fn into_any(self) -> AnySchedule {
        self.into()
    }

    fn delay(&self, retry: u32) -> Duration {
        self.step
            .saturating_mul(retry.saturating_sub(1))
            .saturating_add(self.initial)
            .min(self.max)
    }

    fn cap(&self) -> Duration {
        self.max
    }

    fn validate(&self) -> Result<(), ConfigError> {
        check_duration("step", self.step)?;
        check_initial_and_max(self.initial, self.max)
    }
}

/// The same delay before every retry.
///
/// Fixed intervals make clients that failed together retry together; pair it
/// with [`Jitter`](crate::Jitter) or use it only for a single client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constant {
    delay: Duration,
}

impl Constant {
    /// Waits `delay` before every retry.
    pub const fn new(delay: Duration) -> Self {
        Self { delay }
    }
}

impl Schedule for Constant {
    fn into_any(self) -> AnySchedule {
        self.into()
    }

    fn delay(&self, _retry: u32) -> Duration {
        self.delay
    }

    fn cap(&self) -> Duration {
        self.delay
    }

    fn validate(&self) -> Result<(), ConfigError> {
        check_duration("delay", self.delay)
    }
}

/// An explicit list of delays; retries past its end repeat the last entry.
///
/// The list is shared (an `Arc`), so cloning the schedule copies a pointer.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Schedule, Table};
///
/// let s = Table::new([1, 5, 30].map(Duration::from_secs));
/// assert_eq!(s.delay(2), Duration::from_secs(5));
/// assert_eq!(s.delay(9), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    delays: Arc<[Duration]>,
}

impl Table {
    /// A table of `delays`, in retry order. Must not be empty.
    pub fn new(delays: impl Into<Arc<[Duration]>>) -> Self {
        Self {
            delays: delays.into(),
        }
    }
}

impl Schedule for Table {
    fn into_any(self) -> AnySchedule {
        self.into()
    }

    fn delay(&self, retry: u32) -> Duration {
        let index = (retry.max(1) as usize - 1).min(self.delays.len().saturating_sub(1));
        self.delays.get(index).copied().unwrap_or_default()
    }

    fn cap(&self) -> Duration {
        self.delays.iter().copied().max().unwrap_or_default()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.delays.is_empty() {
            return Err(ConfigError::new("table", "needs at least one delay"));
        }
        self.delays
            .iter()
            .try_for_each(|&delay| check_duration("table", delay))
    }
}

/// A schedule from a closure mapping the retry number to a delay, capped at `max`.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{schedule, Schedule};
///
/// let fibonacci = schedule::from_fn(Duration::from_secs(10), |n| {
///     let (mut a, mut b) = (0u64, 1u64);
///     for _ in 0..n { (a, b) = (b, a.saturating_add(b)); }
///     Duration::from_millis(100).saturating_mul(a as u32)
/// });
/// assert_eq!(fibonacci.delay(5), Duration::from_millis(500));
/// ```
pub fn from_fn<F: Fn(u32) -> Duration>(max: Duration, f: F) -> FromFn<F> {
    FromFn { f, max }
}

/// A schedule made by [`from_fn`].
#[derive(Clone, Copy)]
pub struct FromFn<F> {
    f: F,
    max: Duration,
}

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromFn").field("max", &self.max).finish()
    }
}

impl<F: Fn(u32) -> Duration> Schedule for FromFn<F> {
    fn delay(&self, retry: u32) -> Duration {
        (self.f)(retry).min(self.max)
    }

    fn cap(&self) -> Duration {
        self.max
    }

    fn validate(&self) -> Result<(), ConfigError> {
        check_duration("max_delay", self.max)
    }
}

fn check_initial_and_max(initial: Duration, max: Duration) -> Result<(), ConfigError> {
    check_duration("initial_delay", initial)?;
    check_duration("max_delay", max)?;
    if max < initial {
        return Err(ConfigError::new(
            "max_delay",
            format!("{max:?} is shorter than the initial delay {initial:?}"),
        ));
    }
    Ok(())
}

/// Rounds a delay computed in floating point to whole nanoseconds, saturating
/// at `max` (NaN and infinities included) and at zero, over the whole range of
/// `Duration`, not only the 584 years `u64` nanoseconds hold. Never panics,
/// unlike `Duration::from_secs_f64` and `mul_f64`.
pub(crate) fn nanos_capped(nanos: f64, max: Duration) -> Duration {
    if nanos.is_nan() || nanos >= max.as_nanos() as f64 {
        return max;
    }
    if nanos <= 0.0 {
        return Duration::ZERO;
    }
    // Below `max`, so within u128 (`as` saturates in any case).
    let nanos = nanos.round() as u128;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    let subsec = (nanos % NANOS_PER_SEC) as u32;
    Duration::new(secs, subsec).min(max)
}

const NANOS_PER_SEC: u128 = 1_000_000_000;
