//! Property tests: every schedule and every jitter mode, fed extreme values
//! (zero, 1 ns, `Duration::MAX`, `u32::MAX` retries, NaN and infinities where a
//! float is taken), never panics and keeps its documented bounds.

use std::time::Duration;

use proptest::prelude::*;
use tower_backoff::{schedule, Constant, Exponential, Jitter, Linear, Rng, Schedule, Table};

/// A year: the longest delay the builders accept.
const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Durations over the whole range, with the edges drawn often.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(YEAR),
        Just(Duration::MAX),
        Just(Duration::from_nanos(u64::MAX)),
        (0u64..=u64::MAX).prop_map(Duration::from_nanos),
        (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Durations the builders accept: at most a year.
fn accepted_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(YEAR),
        (0..=YEAR.as_nanos() as u64).prop_map(Duration::from_nanos),
    ]
}

fn retry() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(2),
        Just(u32::MAX),
        1u32..100,
        any::<u32>()
    ]
}

/// Any float, NaN and infinities included.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(1.0),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        0.0..=1.0,
        any::<f64>(),
    ]
}

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
        float().prop_map(Jitter::Proportional),
    ]
}

/// A custom schedule with a fixed delay and a cap of its own (the trait's
/// default, `Duration::MAX`, when `cap` is `None`), neither checked.
#[derive(Debug, Clone, Copy)]
struct Custom {
    delay: Duration,
    cap: Option<Duration>,
}

impl Schedule for Custom {
    fn delay(&self, _retry: u32) -> Duration {
        self.delay
    }

    fn cap(&self) -> Duration {
        self.cap.unwrap_or(Duration::MAX)
    }
}

/// A schedule proptest can print when a case fails.
trait DebugSchedule: Schedule + std::fmt::Debug {}

impl<S: Schedule + std::fmt::Debug> DebugSchedule for S {}

/// Any built-in schedule, with any values (accepted by `validate` or not).
fn builtin_schedule() -> impl Strategy<Value = Box<dyn DebugSchedule>> {
    prop_oneof![
        (duration(), float(), duration()).prop_map(|(initial, factor, max)| {
            Box::new(Exponential::new(initial).factor(factor).max_delay(max))
                as Box<dyn DebugSchedule>
        }),
        (duration(), duration(), duration()).prop_map(|(initial, step, max)| {
            Box::new(Linear::new(initial, step).max_delay(max)) as Box<dyn DebugSchedule>
        }),
        duration().prop_map(|d| Box::new(Constant::new(d)) as Box<dyn DebugSchedule>),
        prop::collection::vec(duration(), 0..4)
            .prop_map(|delays| Box::new(Table::new(delays)) as Box<dyn DebugSchedule>),
        (duration(), duration()).prop_map(|(max, d)| {
            Box::new(schedule::from_fn(max, move |_| d)) as Box<dyn DebugSchedule>
        }),
    ]
}

/// Any schedule: a built-in one, or a custom one that may even break the
/// trait's contract by asking for more than its cap.
fn any_schedule() -> impl Strategy<Value = Box<dyn DebugSchedule>> {
    prop_oneof![
        builtin_schedule(),
        (duration(), prop::option::of(duration())).prop_map(|(delay, cap)| Box::new(Custom {
            delay,
            cap
        })
            as Box<dyn DebugSchedule>),
    ]
}

/// `a ≥ b` where `b` is a real number of nanoseconds, allowing for rounding
/// to the nanosecond and for f64's 53 bits near `Duration::MAX`.
fn at_least(a: Duration, nanos: f64) -> bool {
    a.as_nanos() as f64 >= nanos * (1.0 - 1e-15) - 1.0
}

fn at_most(a: Duration, nanos: f64) -> bool {
    a.as_nanos() as f64 <= nanos * (1.0 + 1e-15) + 1.0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_schedule_saturates_at_its_cap(s in builtin_schedule(), retry in retry()) {
        let delay = s.delay(retry);
        prop_assert!(delay <= s.cap(), "{delay:?} over {:?}", s.cap());
    }

    #[test]
    fn exponential_grows_from_initial_to_the_cap(
        initial in accepted_duration(),
        factor in float(),
        max in accepted_duration(),
        retry in retry(),
    ) {
        let s = Exponential::new(initial).factor(factor).max_delay(max);
        let delay = s.delay(retry);
        prop_assert!(delay <= max);
        if s.validate().is_ok() {
            // Accepted: never shorter than the first delay, and never shrinking.
            prop_assert!(delay >= initial);
            prop_assert!(s.delay(retry.saturating_add(1)) >= delay);
            let growth = factor.powi(retry.saturating_sub(1).min(i32::MAX as u32) as i32);
            let exact = if initial.is_zero() { 0.0 } else { initial.as_nanos() as f64 * growth };
            prop_assert!(delay == max || (at_least(delay, exact) && at_most(delay, exact)),
                "{delay:?} is not {exact} ns");
        }
    }

    #[test]
    fn exponential_rejects_factors_that_cannot_grow(factor in float()) {
        let result = Exponential::new(Duration::from_millis(1)).factor(factor).validate();
        if factor.is_finite() && factor >= 1.0 {
            prop_assert!(result.is_ok());
        } else {
            prop_assert_eq!(result.unwrap_err().field(), "factor");
        }
    }

    #[test]
    fn linear_adds_steps_up_to_the_cap(
        initial in duration(),
        step in duration(),
        max in duration(),
        retry in retry(),
    ) {
        let s = Linear::new(initial, step).max_delay(max);
        let delay = s.delay(retry);
        let exact = step.as_nanos().saturating_mul(u128::from(retry.saturating_sub(1)))
            .saturating_add(initial.as_nanos());
        prop_assert_eq!(delay.as_nanos(), exact.min(max.as_nanos()));
        prop_assert!(s.delay(retry.saturating_add(1)) >= delay);
    }

    #[test]
    fn table_repeats_its_last_entry(delays in prop::collection::vec(duration(), 0..5), retry in retry()) {
        let s = Table::new(delays.clone());
        let delay = s.delay(retry);
        match delays.len() {
            0 => {
                prop_assert_eq!(delay, Duration::ZERO);
                prop_assert_eq!(s.validate().unwrap_err().field(), "table");
            }
            n => {
                let index = (retry.max(1) as usize - 1).min(n - 1);
                prop_assert_eq!(delay, delays[index]);
                prop_assert_eq!(s.cap(), *delays.iter().max().unwrap());
            }
        }
    }

    #[test]
    fn accepted_schedules_never_exceed_a_year(s in builtin_schedule(), retry in retry()) {
        if s.validate().is_ok() {
            prop_assert!(s.cap() <= YEAR);
            prop_assert!(s.delay(retry) <= s.cap());
        }
    }

    #[test]
    fn jitter_never_exceeds_the_cap(
        s in any_schedule(),
        jitter in jitter(),
        delay in duration(),
        previous in duration(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::seeded(seed);
        let d = jitter.apply(delay, previous, &*s, &mut rng);
        prop_assert!(d <= s.cap(), "{jitter:?} gave {d:?} over {:?}", s.cap());
    }

    #[test]
    fn each_jitter_mode_keeps_its_documented_range(
        s in any_schedule(),
        jitter in jitter(),
        delay in duration(),
        previous in duration(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::seeded(seed);
        let got = jitter.apply(delay, previous, &*s, &mut rng);
        let cap = s.cap();
        let d = delay.min(cap);
        match jitter {
            Jitter::None => prop_assert_eq!(got, d),
            Jitter::Full => prop_assert!(got <= d),
            Jitter::Equal => prop_assert!(got >= d / 2 && got <= d),
            Jitter::Decorrelated => {
                let base = s.delay(1).min(cap);
                let high = previous.saturating_mul(3).max(base).min(cap);
                prop_assert!(got >= base && got <= high, "{got:?} outside [{base:?}, {high:?}]");
            }
            Jitter::Proportional(r) => {
                if jitter.validate().is_ok() {
                    let n = d.as_nanos() as f64;
                    prop_assert!(at_least(got, n * (1.0 - r)), "{got:?} under {d:?} × (1 − {r})");
                    prop_assert!(at_most(got, n * (1.0 + r)), "{got:?} over {d:?} × (1 + {r})");
                } else {
                    prop_assert!(!(0.0..=1.0).contains(&r));
                    prop_assert_eq!(jitter.validate().unwrap_err().field(), "jitter");
                }
            }
            other => prop_assert!(false, "a jitter this test does not know: {other:?}"),
        }
    }

    #[test]
    fn jittered_sequences_of_a_thousand_retries_stay_capped(
        s in any_schedule(),
        jitter in jitter(),
        first in retry(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::seeded(seed);
        let mut previous = Duration::ZERO;
        for retry in (first..=first.saturating_add(1_000)).take(1_000) {
            previous = jitter.delay(&*s, retry, previous, &mut rng);
            prop_assert!(previous <= s.cap());
        }
    }

    #[test]
    fn random_durations_stay_within_their_bound(max in duration(), seed in any::<u64>()) {
        let mut rng = Rng::seeded(seed);
        for _ in 0..16 {
            prop_assert!(rng.duration_up_to(max) <= max);
        }
        prop_assert!((0.0..1.0).contains(&rng.next_f64()));
    }
}
