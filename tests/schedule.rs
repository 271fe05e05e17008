//! Schedules and jitter, used directly as data.

use std::time::Duration;

use tower_backoff::{schedule, Constant, Exponential, Jitter, Linear, Rng, Schedule, Table};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn first<S: Schedule>(schedule: &S, n: u32) -> Vec<Duration> {
    (1..=n).map(|retry| schedule.delay(retry)).collect()
}

#[test]
fn exponential_doubles_then_saturates_at_cap() {
    let s = Exponential::new(ms(100)).max_delay(ms(1000));
    assert_eq!(first(&s, 6), [100, 200, 400, 800, 1000, 1000].map(ms));
}

#[test]
fn exponential_with_fractional_factor_is_exact_to_the_nanosecond() {
    let s = Exponential::new(ms(100))
        .factor(1.5)
        .max_delay(Duration::from_secs(60));
    assert_eq!(
        first(&s, 4),
        [ms(100), ms(150), ms(225), Duration::from_nanos(337_500_000)]
    );
}

#[test]
fn exponential_never_overflows() {
    let s = Exponential::new(Duration::from_secs(3600))
        .factor(1e6)
        .max_delay(Duration::from_secs(365 * 24 * 3600));
    assert_eq!(s.delay(u32::MAX), s.cap());
    assert_eq!(s.delay(40), s.cap());
}

#[test]
fn linear_adds_a_step_then_saturates() {
    let s = Linear::new(ms(100), ms(50)).max_delay(ms(260));
    assert_eq!(first(&s, 5), [100, 150, 200, 250, 260].map(ms));
    assert_eq!(s.delay(u32::MAX), ms(260));
}

#[test]
fn constant_is_constant() {
    let s = Constant::new(ms(70));
    assert_eq!(first(&s, 3), [70, 70, 70].map(ms));
}

#[test]
fn table_saturates_at_its_last_entry() {
    let s = Table::new(vec![ms(10), ms(40), ms(90)]);
    assert_eq!(first(&s, 5), [10, 40, 90, 90, 90].map(ms));
    assert_eq!(s.cap(), ms(90));
}

#[test]
fn custom_schedule_from_a_closure_is_capped() {
    let s = schedule::from_fn(ms(250), |n| ms(100) * n);
    assert_eq!(first(&s, 4), [100, 200, 250, 250].map(ms));
}

#[test]
fn invalid_schedules_name_their_field() {
    let field = |r: Result<(), tower_backoff::ConfigError>| r.unwrap_err().field();
    assert_eq!(
        field(Exponential::new(ms(1)).factor(0.9).validate()),
        "factor"
    );
    assert_eq!(
        field(Exponential::new(ms(1)).factor(f64::NAN).validate()),
        "factor"
    );
    assert_eq!(
        field(Exponential::new(ms(500)).max_delay(ms(100)).validate()),
        "max_delay"
    );
    assert_eq!(
        field(Exponential::new(Duration::MAX).validate()),
        "initial_delay"
    );
    assert_eq!(field(Table::new(Vec::new()).validate()), "table");
    assert_eq!(field(Linear::new(ms(1), Duration::MAX).validate()), "step");
    assert_eq!(field(Jitter::Proportional(1.5).validate()), "jitter");
    assert_eq!(field(Jitter::Proportional(-0.1).validate()), "jitter");
    assert_eq!(field(Jitter::Proportional(f64::NAN).validate()), "jitter");
    assert_eq!(
        field(Jitter::Proportional(f64::INFINITY).validate()),
        "jitter"
    );
    assert_eq!(
        field(Exponential::new(ms(1)).factor(f64::INFINITY).validate()),
        "factor"
    );
}

/// Draws `n` jittered delays for retries 1..=8 of `schedule`, the way the layer
/// does: `previous` is the delay actually drawn before.
fn draws<S: Schedule>(
    schedule: &S,
    jitter: Jitter,
    n: usize,
) -> Vec<(Duration, Duration, Duration)> {
    let mut rng = Rng::seeded(42);
    let mut out = Vec::new();
    for _ in 0..n / 8 {
        let mut previous = Duration::ZERO;
        for retry in 1..=8 {
            let base = schedule.delay(retry);
            let prev = if retry == 1 { base } else { previous };
            let d = jitter.apply(base, prev, schedule, &mut rng);
            out.push((base, prev, d));
            previous = d;
        }
    }
    out
}

const CAP: Duration = Duration::from_millis(2_000);

fn capped() -> Exponential {
    Exponential::new(ms(100)).max_delay(CAP)
}

#[test]
fn full_jitter_stays_within_zero_and_the_delay() {
    let all = draws(&capped(), Jitter::Full, 80_000);
    assert!(all.iter().all(|&(base, _, d)| d <= base && d <= CAP));
    // It really spreads: some draws land in the bottom tenth of their range.
    assert!(all.iter().any(|&(base, _, d)| d < base / 10));
}

#[test]
fn equal_jitter_stays_within_half_and_the_whole_delay() {
    let all = draws(&capped(), Jitter::Equal, 80_000);
    assert!(all.iter().all(|&(base, _, d)| d >= base / 2 && d <= base));
}

#[test]
fn decorrelated_jitter_stays_between_base_and_three_times_previous_capped() {
    let base = ms(100);
    let all = draws(&capped(), Jitter::Decorrelated, 80_000);
    assert!(all
        .iter()
        .all(|&(_, prev, d)| d >= base && d <= (prev * 3).min(CAP)));
    assert!(all.iter().any(|&(_, _, d)| d == CAP || d > CAP - ms(50)));
}

#[test]
fn proportional_jitter_stays_within_the_fraction_and_under_the_cap() {
    let all = draws(&capped(), Jitter::Proportional(0.25), 80_000);
    assert!(all
        .iter()
        .all(|&(base, _, d)| d >= base.mul_f64(0.75) && d <= base.mul_f64(1.25).min(CAP)));
    // At the cap, +25% would exceed it: it must be clipped, never above.
    assert!(all.iter().any(|&(base, _, d)| base == CAP && d == CAP));
    // Both ways around the delay, under the cap.
    assert!(all.iter().any(|&(base, _, d)| base < CAP && d > base));
    assert!(all.iter().any(|&(base, _, d)| d < base));
}

#[test]
fn jitter_never_exceeds_the_cap_even_with_huge_previous_delays() {
    let s = capped();
    let mut rng = Rng::seeded(1);
    for jitter in [
        Jitter::None,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
        Jitter::Proportional(1.0),
    ] {
        for _ in 0..1_000 {
            let d = jitter.apply(Duration::MAX, Duration::MAX, &s, &mut rng);
            assert!(d <= CAP, "{jitter:?} gave {d:?}");
        }
    }
}

#[test]
fn same_seed_same_sequence_other_seed_other_sequence() {
    let s = capped();
    let seq = |seed| {
        let mut rng = Rng::seeded(seed);
        (1..=20)
            .map(|n| Jitter::Full.apply(s.delay(n), s.delay(n), &s, &mut rng))
            .collect::<Vec<_>>()
    };
    assert_eq!(seq(7), seq(7));
    assert_ne!(seq(7), seq(8));
}

#[test]
fn streams_of_one_seed_are_independent() {
    let a: Vec<u64> = {
        let mut r = Rng::stream(9, 0);
        (0..8).map(|_| r.next_u64()).collect()
    };
    let b: Vec<u64> = {
        let mut r = Rng::stream(9, 1);
        (0..8).map(|_| r.next_u64()).collect()
    };
    assert_ne!(a, b);
    assert!(a.iter().all(|x| !b.contains(x)));
}

/// A custom schedule that keeps the trait's default cap, `Duration::MAX`.
struct Uncapped(Duration);

impl Schedule for Uncapped {
    fn delay(&self, _retry: u32) -> Duration {
        self.0
    }
}

#[test]
fn every_jitter_of_an_uncapped_custom_schedule_stays_within_its_delay_range() {
    let mut rng = Rng::seeded(3);
    for delay in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let s = Uncapped(delay);
        for jitter in [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Proportional(0.0),
            Jitter::Proportional(0.5),
            Jitter::Proportional(1.0),
        ] {
            for previous in [Duration::ZERO, delay, Duration::MAX] {
                let d = jitter.apply(delay, previous, &s, &mut rng);
                match jitter {
                    Jitter::None => assert_eq!(d, delay),
                    // Decorrelated ignores `delay`: at least its base, which is `delay`.
                    Jitter::Decorrelated => assert!(d >= delay, "{d:?} < {delay:?}"),
                    // `[d(1 − r), d(1 + r)]`, to f64 precision at the top of the range.
                    Jitter::Proportional(r) => {
                        let low = delay.as_nanos() as f64 * (1.0 - r);
                        assert!(d.as_nanos() as f64 >= low * (1.0 - 1e-15) - 1.0);
                    }
                    _ => assert!(d <= delay, "{jitter:?} of {delay:?} gave {d:?}"),
                }
            }
        }
    }
}

#[test]
fn proportional_jitter_of_the_longest_delay_spreads_below_it() {
    let s = Uncapped(Duration::MAX);
    let mut rng = Rng::seeded(5);
    let draws: Vec<_> = (0..64)
        .map(|_| Jitter::Proportional(1.0).apply(Duration::MAX, Duration::MAX, &s, &mut rng))
        .collect();
    // Capped at `Duration::MAX` from above, uniform from zero below it.
    assert!(draws.iter().any(|&d| d < Duration::MAX / 2));
}

#[test]
fn full_jitter_spreads_delays_longer_than_u64_nanoseconds() {
    // 2^64 ns is about 584 years; a draw up to `Duration::MAX` must reach past it.
    let mut rng = Rng::seeded(11);
    let limit = Duration::from_nanos(u64::MAX);
    let draws: Vec<_> = (0..64).map(|_| rng.duration_up_to(Duration::MAX)).collect();
    assert!(draws.iter().any(|&d| d > limit * 1000));
    assert!(draws.iter().all(|&d| d <= Duration::MAX));
}

#[test]
fn exponential_from_zero_stays_zero_whatever_the_factor() {
    let s = Exponential::new(Duration::ZERO).factor(1e300);
    assert_eq!(s.delay(1), Duration::ZERO);
    assert_eq!(s.delay(3), Duration::ZERO);
    assert_eq!(s.delay(u32::MAX), Duration::ZERO);
}

#[test]
fn exponential_with_an_unvalidated_huge_cap_grows_past_u64_nanoseconds() {
    // Not accepted by the builder (over a year), but `delay` must still saturate
    // exactly, not at 2^64 ns.
    let s = Exponential::new(Duration::from_secs(1 << 40)).max_delay(Duration::MAX);
    assert_eq!(s.delay(2), Duration::from_secs(1 << 41));
    assert_eq!(s.delay(u32::MAX), Duration::MAX);
}

#[test]
fn exponential_starts_exactly_at_a_long_initial_delay() {
    // 2^53 ns is about 104 days: past it f64 cannot hold every nanosecond.
    let initial = Duration::new(11_227_536, 947_935_257);
    let s = Exponential::new(initial)
        .factor(1.0)
        .max_delay(Duration::from_secs(365 * 24 * 3600));
    assert_eq!(s.delay(1), initial);
    assert_eq!(s.delay(1_000), initial);
}

#[test]
fn rng_is_splitmix64_with_its_reference_outputs() {
    // The first outputs of Vigna's splitmix64.c for seeds 0 and 1234567.
    let mut rng = Rng::seeded(0);
    assert_eq!(
        [rng.next_u64(), rng.next_u64(), rng.next_u64()],
        [
            0xE220_A839_7B1D_CDAF,
            0x6E78_9E6A_A1B9_65F4,
            0x06C4_5D18_8009_454F
        ]
    );
    let mut rng = Rng::seeded(1_234_567);
    assert_eq!(
        [rng.next_u64(), rng.next_u64()],
        [6_457_827_717_110_365_317, 3_203_168_211_198_807_973]
    );
}

#[test]
fn streams_of_the_extreme_seeds_are_independent_too() {
    for seed in [0, u64::MAX] {
        let firsts: Vec<u64> = (0..4).map(|i| Rng::stream(seed, i).next_u64()).collect();
        assert!(
            firsts
                .iter()
                .enumerate()
                .all(|(i, x)| !firsts[..i].contains(x)),
            "seed {seed}: {firsts:x?}"
        );
    }
    assert_ne!(
        Rng::stream(0, 0).next_u64(),
        Rng::stream(u64::MAX, 0).next_u64()
    );
}

#[test]
fn random_durations_reach_both_ends_of_their_range() {
    let mut rng = Rng::seeded(13);
    let draws: Vec<u128> = (0..400)
        .map(|_| rng.duration_up_to(Duration::from_nanos(3)).as_nanos())
        .collect();
    for nanos in 0..=3 {
        assert!(draws.contains(&nanos), "{nanos} ns never drawn");
    }
    assert_eq!(rng.duration_up_to(Duration::ZERO), Duration::ZERO);
}

#[test]
fn every_schedule_reports_its_longest_delay_as_its_cap() {
    assert_eq!(Exponential::new(ms(1)).max_delay(ms(70)).cap(), ms(70));
    assert_eq!(Linear::new(ms(1), ms(1)).max_delay(ms(80)).cap(), ms(80));
    assert_eq!(Constant::new(ms(90)).cap(), ms(90));
    assert_eq!(Table::new([ms(5), ms(95), ms(20)]).cap(), ms(95));
    assert_eq!(schedule::from_fn(ms(99), |_| ms(1)).cap(), ms(99));
    assert_eq!(Uncapped(ms(1)).cap(), Duration::MAX);
}

/// What the layer reads of a schedule, through the generic bound it uses.
fn seen_by_the_layer<S: Schedule>(s: S) -> (Duration, Duration, Option<&'static str>) {
    (s.delay(3), s.cap(), s.validate().err().map(|e| e.field()))
}

#[test]
fn a_schedule_shared_by_reference_or_arc_keeps_its_delays_cap_and_checks() {
    let s = Linear::new(ms(10), ms(5)).max_delay(ms(30));
    let bad = Linear::new(ms(10), Duration::MAX);
    assert_eq!(seen_by_the_layer::<&Linear>(&s), (ms(20), ms(30), None));
    assert_eq!(
        seen_by_the_layer(std::sync::Arc::new(s)),
        (ms(20), ms(30), None)
    );
    assert_eq!(seen_by_the_layer::<&Linear>(&bad).2, Some("step"));
    assert_eq!(seen_by_the_layer(std::sync::Arc::new(bad)).2, Some("step"));
}

#[test]
fn the_default_exponential_starts_at_100ms_doubling_up_to_20s() {
    let s = Exponential::default();
    assert_eq!(first(&s, 3), [100, 200, 400].map(ms));
    assert_eq!(s.cap(), Duration::from_secs(20));
    assert_eq!(s.delay(100), Duration::from_secs(20));
}

#[test]
fn an_unchecked_nan_or_infinite_factor_saturates_at_the_cap() {
    for factor in [f64::NAN, f64::INFINITY] {
        let s = Exponential::new(ms(1)).factor(factor).max_delay(ms(500));
        assert_eq!(s.delay(2), ms(500), "{factor}");
    }
}

#[test]
fn a_cap_of_a_year_is_accepted_and_one_past_it_is_not() {
    let year = Duration::from_secs(365 * 24 * 3600);
    assert!(schedule::from_fn(year, |_| ms(1)).validate().is_ok());
    let over = year + Duration::from_nanos(1);
    assert_eq!(
        schedule::from_fn(over, |_| ms(1))
            .validate()
            .unwrap_err()
            .field(),
        "max_delay"
    );
    // A cap equal to the first delay is a constant schedule, not a mistake.
    assert!(Exponential::new(ms(5)).max_delay(ms(5)).validate().is_ok());
    assert!(Linear::new(ms(5), ms(1))
        .max_delay(ms(5))
        .validate()
        .is_ok());
}

#[test]
fn decorrelated_jitter_draws_the_first_retry_up_to_three_times_the_base() {
    let s = capped();
    let mut rng = Rng::seeded(21);
    let firsts: Vec<_> = (0..200)
        .map(|_| Jitter::Decorrelated.delay(&s, 1, Duration::ZERO, &mut rng))
        .collect();
    assert!(firsts.iter().all(|&d| d >= ms(100) && d <= ms(300)));
    assert!(firsts.iter().any(|&d| d > ms(200)));
}

#[test]
fn a_closure_schedule_prints_its_cap() {
    let s = schedule::from_fn(ms(250), |n| ms(100) * n);
    assert_eq!(format!("{s:?}"), "FromFn { max: 250ms }");
}
