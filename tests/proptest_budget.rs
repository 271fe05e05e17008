//! The budgets under extreme settings and arbitrary histories: building never
//! panics, using never panics, and the documented bounds hold.

use std::time::Duration;

use proptest::prelude::*;
use tower_backoff::budget::{Budget, Earn, RatioBudget, TokenBucket};
use tower_backoff::Cause;

/// What happens to a budget, one step at a time.
#[derive(Debug, Clone)]
enum Step {
    FirstAttempt,
    Success(Option<Cause>),
    Retry(Cause),
    WouldAllow(Cause),
    Wait(Duration),
}

fn cause() -> impl Strategy<Value = Cause> {
    prop_oneof![
        Just(Cause::Transient),
        Just(Cause::Timeout),
        Just(Cause::Throttled),
        Just(Cause::NotSent),
        Just(Cause::Conflict),
        Just(Cause::Hedge),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::FirstAttempt),
        2 => proptest::option::of(cause()).prop_map(Step::Success),
        4 => cause().prop_map(Step::Retry),
        1 => cause().prop_map(Step::WouldAllow),
        // From a nanosecond to a thousand hours idle.
        1 => (0u64..=3_600_000_000_000_000).prop_map(|n| Step::Wait(Duration::from_nanos(n))),
    ]
}

/// Counts, with extremes overrepresented.
fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(1 << 40),
        Just((1 << 40) + 1),
        Just(u64::MAX),
        0u64..1000,
        any::<u64>(),
    ]
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// What a run of steps was granted and earned.
#[derive(Debug, Default)]
struct Tally {
    first_attempts: u64,
    successes: u64,
    /// Tokens (or retries) the granted retries cost.
    spent: u128,
    granted: u64,
    /// Tokens a token bucket was given back by successes.
    refunded: u128,
    elapsed: Duration,
    /// When each earning (first attempt or success) and each granted retry
    /// happened.
    first_attempts_at: Vec<Duration>,
    successes_at: Vec<Duration>,
    granted_at: Vec<Duration>,
}

fn run(
    budget: &dyn Budget,
    steps: &[Step],
    cost: impl Fn(Cause) -> u64,
    refund: impl Fn(Option<Cause>) -> u64,
) -> Tally {
    let runtime = paused();
    runtime.block_on(async {
        let mut tally = Tally::default();
        for step in steps {
            match *step {
                Step::FirstAttempt => {
                    budget.on_first_attempt();
                    tally.first_attempts += 1;
                    tally.first_attempts_at.push(tally.elapsed);
                }
                Step::Success(last) => {
                    budget.on_success(last);
                    tally.successes += 1;
                    tally.successes_at.push(tally.elapsed);
                    tally.refunded += u128::from(refund(last));
                }
                Step::Retry(cause) => {
                    if budget.try_retry(cause) {
                        tally.granted += 1;
                        tally.granted_at.push(tally.elapsed);
                        tally.spent += u128::from(cost(cause));
                    }
                }
                Step::WouldAllow(cause) => {
                    let _ = budget.would_allow(cause);
                }
                Step::Wait(d) => {
                    tokio::time::advance(d).await;
                    tally.elapsed += d;
                }
            }
        }
        tally
    })
}

proptest! {
    #[test]
    fn token_bucket_builder_never_panics(
        capacity in amount(),
        retry in amount(),
        timeout in amount(),
        throttled in amount(),
        refund in amount(),
        refill in amount(),
    ) {
        let built = TokenBucket::builder()
            .capacity(capacity)
            .retry_cost(retry)
            .timeout_cost(timeout)
            .throttled_cost(throttled)
            .success_refund(refund)
            .refill_per_second(refill)
            .build();
        if let Ok(bucket) = built {
            prop_assert_eq!(bucket.available(), capacity);
        }
    }

    #[test]
    fn token_bucket_never_exceeds_capacity_nor_spends_more_than_it_was_given(
        capacity in 1u64..=1 << 40,
        costs in (0u64..=1 << 40, 0u64..=1 << 40, 0u64..=1 << 40),
        refund in amount(),
        refill in prop_oneof![Just(0u64), Just(1 << 40), 0u64..100],
        steps in proptest::collection::vec(step(), 0..200),
    ) {
        let (retry, timeout, throttled) = (costs.0 % (capacity + 1), costs.1 % (capacity + 1), costs.2 % (capacity + 1));
        let refund = refund.min(1 << 40);
        let bucket = TokenBucket::builder()
            .capacity(capacity)
            .retry_cost(retry)
            .timeout_cost(timeout)
            .throttled_cost(throttled)
            .success_refund(refund)
            .refill_per_second(refill)
            .build()
            .unwrap();
        let cost = |cause| match cause {
            Cause::Timeout => timeout,
            Cause::Throttled => throttled,
            _ => retry,
        };
        let tally = run(&bucket, &steps, cost, |last| last.map_or(refund, cost));
        prop_assert!(bucket.available() <= capacity);
        // Documented bound: spent ≤ capacity + refunds + refill × time.
        let refilled = u128::from(refill) * tally.elapsed.as_millis() / 1000 + u128::from(refill);
        prop_assert!(
            tally.spent <= u128::from(capacity) + tally.refunded + refilled,
            "{tally:?}"
        );
    }

    #[test]
    fn ratio_budget_builder_never_panics(
        ratio in prop_oneof![
            Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(-0.0),
            Just(0.0), Just(1e-7), Just(1000.0), Just(1_000.000_001), Just(f64::MAX),
            any::<f64>(), 0.0..2.0,
        ],
        window in prop_oneof![
            Just(Duration::ZERO), Just(Duration::from_nanos(1)), Just(Duration::MAX),
            Just(Duration::from_secs(1)), Just(Duration::from_secs(3600)),
            (0u64..=u64::MAX).prop_map(Duration::from_nanos),
        ],
        reserve in any::<u32>(),
    ) {
        let built = RatioBudget::builder().ratio(ratio).window(window).reserve(reserve).build();
        if let Ok(budget) = built {
            prop_assert_eq!(budget.available(), u64::from(reserve));
        }
    }

    #[test]
    fn ratio_budget_never_grants_more_than_its_reserve_plus_its_ratio_of_earnings(
        ratio in prop_oneof![Just(0.0), Just(1e-6), Just(1000.0), 0.0..3.0],
        window_secs in 1u64..=3600,
        reserve in prop_oneof![Just(0u32), Just(u32::MAX), 0u32..50],
        on_successes in any::<bool>(),
        steps in proptest::collection::vec(step(), 0..200),
    ) {
        let window = Duration::from_secs(window_secs);
        // The budget counts the ratio to a millionth, exactly.
        let ratio = (ratio * 1e6_f64).round() / 1e6;
        let earn = if on_successes { Earn::Successes } else { Earn::FirstAttempts };
        let budget = RatioBudget::builder()
            .ratio(ratio)
            .window(window)
            .reserve(reserve)
            .earn(earn)
            .build()
            .unwrap();
        let tally = run(&budget, &steps, |_| 1, |_| 0);
        let (earned, earned_at) = match earn {
            Earn::FirstAttempts => (tally.first_attempts, &tally.first_attempts_at),
            Earn::Successes => (tally.successes, &tally.successes_at),
            other => panic!("an earning this test does not know: {other:?}"),
        };
        // The documented bound, at every retry: the retries of the last nine
        // tenths of a window (all still in the budget's window) are at most
        // the reserve plus the ratio of the earnings of the last window.
        for &t in &tally.granted_at {
            let recent = |at: &Vec<Duration>, span: Duration| {
                at.iter().filter(|&&e| e <= t && t - e < span).count() as f64
            };
            let retries = recent(&tally.granted_at, window.mul_f64(0.9));
            let room = f64::from(reserve) + ratio * recent(earned_at, window) + 1e-6;
            prop_assert!(retries <= room, "{retries} retries by {t:?}, room {room}");
        }
        // Every span of nine tenths of a window lies within the window seen
        // by its last retry, which held that span's retries to the reserve
        // plus the ratio of that window's earnings; an earning falls in the
        // windows of at most three such spans.
        let spans = (tally.elapsed.as_secs_f64() / (0.9 * window.as_secs_f64())).ceil() + 1.0;
        let bound = f64::from(reserve) * spans + 3.0 * ratio * earned as f64;
        prop_assert!(tally.granted as f64 <= bound, "{} granted, bound {bound}: {tally:?}", tally.granted);
    }
}
