//! `Delays`: a schedule's jittered delays one by one, for loops written by hand.

use crate::common;

use std::time::Duration;

use tower_backoff::{
    schedule, Constant, Delays, Exponential, Jitter, Linear, Rng, Schedule, Table,
};

const ALL_JITTERS: [Jitter; 8] = [
    Jitter::None,
    Jitter::Full,
    Jitter::Equal,
    Jitter::Decorrelated,
    Jitter::Proportional(0.0),
    Jitter::Proportional(0.5),
    Jitter::Proportional(1.0),
    Jitter::Proportional(f64::NAN),
];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn yields_the_schedules_delays_in_order() {
    let delays = Delays::new(Exponential::new(ms(100)).max_delay(ms(1000))).jitter(Jitter::None);
    let first: Vec<_> = delays.take(6).collect();
    assert_eq!(first, [100, 200, 400, 800, 1000, 1000].map(ms));
}

#[test]
fn reset_restarts_at_the_first_delay() {
    let mut delays = Delays::new(Exponential::new(ms(100))).jitter(Jitter::None);
    for _ in 0..5 {
        delays.next_delay();
    }
    assert_eq!(delays.retries(), 5);
    assert_eq!(delays.previous(), Some(ms(1600)));

    delays.reset();
    assert_eq!(delays.retries(), 0);
    assert_eq!(delays.previous(), None);
    let again: Vec<_> = delays.take(3).collect();
    assert_eq!(again, [100, 200, 400].map(ms));
}

#[test]
fn reset_restarts_jittered_delays_within_the_first_delay() {
    // Full jitter draws the first delay from [0, 100 ms]; without a reset the
    // tenth would come from [0, 51.2 s].
    let mut delays = Delays::new(Exponential::new(ms(100)).max_delay(Duration::from_secs(60)))
        .jitter(Jitter::Full)
        .seed(3);
    for round in 0..50 {
        let grown: Vec<_> = delays.by_ref().take(10).collect();
        assert_eq!(grown.len(), 10);
        delays.reset();
        let first = delays.next_delay().unwrap();
        assert!(
            first <= ms(100),
            "round {round}: first delay after reset {first:?}"
        );
        delays.reset();
    }
}

#[test]
fn reset_gives_back_the_whole_limit_of_attempts() {
    let mut delays = Delays::new(Constant::new(ms(10))).max_attempts(3);
    assert_eq!(delays.by_ref().count(), 2);
    assert_eq!(delays.next_delay(), None);
    delays.reset();
    assert_eq!(delays.by_ref().count(), 2);
}

#[test]
fn max_attempts_yields_one_delay_per_retry() {
    for (attempts, delays) in [(0, 0), (1, 0), (2, 1), (5, 4)] {
        let d = Delays::new(Constant::new(ms(1))).max_attempts(attempts);
        assert_eq!(
            d.size_hint(),
            (delays, Some(delays)),
            "max_attempts({attempts})"
        );
        assert_eq!(d.count(), delays, "max_attempts({attempts})");
    }
}

#[test]
fn without_a_limit_delays_never_end() {
    let mut delays = Delays::new(Constant::new(ms(1)))
        .max_attempts(2)
        .unlimited();
    assert_eq!(delays.size_hint(), (usize::MAX, None));
    assert_eq!(delays.by_ref().take(10_000).count(), 10_000);
    assert_eq!(delays.retries(), 10_000);
}

#[test]
fn decorrelated_delays_grow_from_the_previous_delay() {
    let base = ms(100);
    let cap = Duration::from_secs(5);
    for seed in 0..20 {
        let mut delays = Delays::new(Exponential::new(base).max_delay(cap))
            .jitter(Jitter::Decorrelated)
            .seed(seed);
        // The first delay grows from the first delay itself.
        let mut previous = base;
        for retry in 1..=30 {
            let delay = delays.next_delay().unwrap();
            let high = (previous * 3).min(cap);
            assert!(
                delay >= base && delay <= high,
                "seed {seed}, retry {retry}: {delay:?} outside [{base:?}, {high:?}]"
            );
            assert_eq!(delays.previous(), Some(delay));
            previous = delay;
        }
    }
}

#[test]
fn decorrelated_delays_match_the_hand_written_bookkeeping() {
    let schedule = Exponential::new(ms(50)).max_delay(Duration::from_secs(2));
    let from_delays: Vec<_> = Delays::new(schedule)
        .jitter(Jitter::Decorrelated)
        .seed(11)
        .take(40)
        .collect();

    // `seed(s)` draws from the first stream of the seed's family, as the
    // first request of a layer seeded alike.
    let mut rng = Rng::stream(11, 0);
    let mut previous = Duration::ZERO;
    let by_hand: Vec<_> = (1..=40)
        .map(|retry| {
            previous = Jitter::Decorrelated.delay(&schedule, retry, previous, &mut rng);
            previous
        })
        .collect();

    assert_eq!(from_delays, by_hand);
    // Not a constant sequence: the previous delay really feeds the next.
    assert!(from_delays.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn decorrelated_after_reset_grows_from_the_base_again() {
    let base = ms(100);
    let mut delays = Delays::new(Exponential::new(base).max_delay(Duration::from_secs(100)))
        .jitter(Jitter::Decorrelated)
        .seed(5);
    for _ in 0..20 {
        delays.next_delay();
    }
    assert!(
        delays.previous().unwrap() > base * 3,
        "grown well past the base"
    );
    for _ in 0..100 {
        delays.reset();
        let first = delays.next_delay().unwrap();
        assert!(first >= base && first <= base * 3, "{first:?}");
    }
}

#[test]
fn seeded_delays_are_reproducible() {
    let make = |seed| {
        Delays::new(Exponential::new(ms(100)))
            .jitter(Jitter::Full)
            .seed(seed)
    };
    let a: Vec<_> = make(1).take(20).collect();
    let b: Vec<_> = make(1).take(20).collect();
    let c: Vec<_> = make(2).take(20).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn delays_saturate_at_the_cap() {
    let cap = Duration::from_secs(1);
    for jitter in ALL_JITTERS {
        let delays = Delays::new(Exponential::new(ms(10)).max_delay(cap))
            .jitter(jitter)
            .seed(9);
        for (n, delay) in delays.take(10_000).enumerate() {
            assert!(delay <= cap, "{jitter:?}, delay {n}: {delay:?}");
        }
    }
    let mut unjittered = Delays::new(Exponential::new(ms(10)).max_delay(cap)).jitter(Jitter::None);
    assert_eq!(unjittered.nth(9_999), Some(cap));
}

#[test]
fn extreme_settings_do_not_panic() {
    // What a builder accepts: delays up to a year, any finite factor ≥ 1.
    let year = Duration::from_secs(365 * 24 * 60 * 60);
    check_extremes(Exponential::new(year).max_delay(year));
    check_extremes(
        Exponential::new(Duration::from_nanos(1))
            .factor(f64::MAX)
            .max_delay(year),
    );
    check_extremes(Linear::new(year, year).max_delay(year));
    check_extremes(Constant::new(Duration::ZERO));
    check_extremes(Constant::new(year));
    check_extremes(Table::new([Duration::ZERO, year, Duration::from_nanos(1)]));

    // And what only a hand-written loop can pass: no validation at all.
    check_extremes(Exponential::new(Duration::MAX).max_delay(Duration::MAX));
    check_extremes(Exponential::new(ms(1)).factor(0.0));
    check_extremes(Exponential::new(ms(1)).factor(f64::NAN));
    check_extremes(Linear::new(Duration::MAX, Duration::MAX).max_delay(Duration::MAX));
    check_extremes(Table::new([]));
    check_extremes(schedule::from_fn(Duration::MAX, |_| Duration::MAX));
}

fn check_extremes<S: Schedule + Clone + Send + Sync + 'static>(schedule: S) {
    for jitter in ALL_JITTERS {
        let mut delays = Delays::new(schedule.clone()).jitter(jitter).seed(1);
        for _ in 0..200 {
            let delay = delays.next_delay().unwrap();
            assert!(delay <= schedule.cap(), "{jitter:?}: {delay:?}");
        }
        delays.reset();
        assert!(delays.next_delay().unwrap() <= schedule.cap());
    }
}

use common::allocations;

#[test]
fn delays_allocate_nothing() {
    let table = Table::new([ms(1), ms(5), ms(30)]);
    let before = allocations();
    let mut delays = Delays::new(Exponential::new(ms(100))).jitter(Jitter::Decorrelated);
    // A table shares its delays: a clone is a reference count, not a copy.
    let mut from_table = Delays::new(table.clone())
        .jitter(Jitter::Full)
        .max_attempts(100);
    let mut total = Duration::ZERO;
    for _ in 0..1_000 {
        total += delays.next_delay().unwrap();
        total += from_table.next_delay().unwrap_or_default();
        if total > Duration::from_secs(3600) {
            delays.reset();
            from_table.reset();
            total = Duration::ZERO;
        }
    }
    let after = allocations();
    assert_eq!(
        after - before,
        0,
        "allocations while making and using Delays"
    );
}
