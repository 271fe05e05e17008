//! [`AnySchedule`]: any schedule as one value, so that the layer, its services
//! and their futures need no type parameter for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Constant, Exponential, Linear, Schedule, Table};
use crate::error::ConfigError;

/// A [`Schedule`] held as a value: one of the built-ins, or any other behind
/// an `Arc`.
///
/// The schedule is read only after a retry was decided, so it needs no place
/// in the types of the layer, the service or its future: every setter that
/// takes a schedule (the layer's builder, [`retry`](fn@crate::retry),
/// [`Delays`](crate::Delays), the poller) stores it as this. A built-in costs
/// no allocation and no dynamic call.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{AnySchedule, Exponential, Schedule};
///
/// let schedule = AnySchedule::new(Exponential::new(Duration::from_millis(100)));
/// assert_eq!(schedule.delay(3), Duration::from_millis(400));
/// let custom = AnySchedule::new(tower_backoff::schedule::from_fn(Duration::from_secs(1), |n| {
///     Duration::from_millis(10 * u64::from(n))
/// }));
/// assert_eq!(custom.delay(2), Duration::from_millis(20));
/// ```
#[derive(Clone)]
pub struct AnySchedule {
    kind: Kind,
    // A built-in's cap, worked out once: every retry decision reads it, and
    // without it each read would first find out which built-in this is
    // (`Table` would scan its delays too). A custom schedule is asked.
    cap: Duration,
}

#[derive(Clone)]
enum Kind {
    Exponential(Exponential),
    Linear(Linear),
    Constant(Constant),
    Table(Table),
    Custom(Arc<dyn Schedule + Send + Sync>),
}

impl AnySchedule {
    /// Holds `schedule`: a built-in as itself, anything else behind an `Arc`.
    pub fn new<S: Schedule + Send + Sync + 'static>(schedule: S) -> Self {
        schedule.into_any()
    }

    /// Holds a schedule of your own behind an `Arc`; [`new`](Self::new) calls
    /// this for every schedule but the built-ins.
    pub fn custom(schedule: impl Schedule + Send + Sync + 'static) -> Self {
        Self::of(Kind::Custom(Arc::new(schedule)))
    }

    fn of(kind: Kind) -> Self {
        let cap = match &kind {
            Kind::Exponential(s) => s.cap(),
            Kind::Linear(s) => s.cap(),
            Kind::Constant(s) => s.cap(),
            Kind::Table(s) => s.cap(),
            // Not read: `cap` asks the schedule itself.
            Kind::Custom(_) => Duration::ZERO,
        };
        Self { kind, cap }
    }
}

impl Schedule for AnySchedule {
    fn delay(&self, retry: u32) -> Duration {
        match &self.kind {
            Kind::Exponential(s) => s.delay(retry),
            Kind::Linear(s) => s.delay(retry),
            Kind::Constant(s) => s.delay(retry),
            Kind::Table(s) => s.delay(retry),
            Kind::Custom(s) => s.delay(retry),
        }
    }

    fn cap(&self) -> Duration {
        match &self.kind {
            Kind::Custom(s) => s.cap(),
            _ => self.cap,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match &self.kind {
            Kind::Exponential(s) => s.validate(),
            Kind::Linear(s) => s.validate(),
            Kind::Constant(s) => s.validate(),
            Kind::Table(s) => s.validate(),
            Kind::Custom(s) => s.validate(),
        }
    }

    fn into_any(self) -> AnySchedule {
        self
    }
}

impl Default for AnySchedule {
    /// [`Exponential::default`]: 100 ms, doubling, capped at 20 s.
    fn default() -> Self {
        Self::of(Kind::Exponential(Exponential::default()))
    }
}

impl fmt::Debug for AnySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Exponential(s) => s.fmt(f),
            Kind::Linear(s) => s.fmt(f),
            Kind::Constant(s) => s.fmt(f),
            Kind::Table(s) => s.fmt(f),
            Kind::Custom(s) => f
                .debug_struct("Custom")
                .field("cap", &s.cap())
                .finish_non_exhaustive(),
        }
    }
}

macro_rules! builtin {
    ($($name:ident),*) => {$(
        impl From<$name> for AnySchedule {
            fn from(schedule: $name) -> Self {
                Self::of(Kind::$name(schedule))
            }
        }
    )*};
}

builtin!(Exponential, Linear, Constant, Table);

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_built_in_held_as_a_value_answers_as_itself() {
        let exponential = Exponential::new(ms(100)).max_delay(ms(1_500));
        let linear = Linear::new(ms(10), ms(20)).max_delay(ms(70));
        let constant = Constant::new(ms(5));
        let table = Table::new([ms(30), ms(90), ms(60)]);
        let pairs: [(&dyn Schedule, AnySchedule); 4] = [
            (&exponential, AnySchedule::new(exponential)),
            (&linear, AnySchedule::new(linear)),
            (&constant, AnySchedule::new(constant)),
            (&table, AnySchedule::new(table.clone())),
        ];
        for (schedule, any) in pairs {
            assert_eq!(any.cap(), schedule.cap());
            for retry in [1, 2, 3, 10, u32::MAX] {
                assert_eq!(any.delay(retry), schedule.delay(retry));
            }
        }
        assert_eq!(AnySchedule::default().cap(), Exponential::default().cap());
    }

    #[test]
    fn a_custom_schedule_is_asked_for_its_cap_every_time() {
        struct Growing(AtomicU64);
        impl Schedule for Growing {
            fn delay(&self, _retry: u32) -> Duration {
                Duration::ZERO
            }
            fn cap(&self) -> Duration {
                ms(self.0.fetch_add(1, Ordering::Relaxed))
            }
        }
        let any = AnySchedule::new(Growing(AtomicU64::new(1)));
        assert_eq!((any.cap(), any.cap()), (ms(1), ms(2)));
    }
}
