//! The token bucket under extreme settings and arbitrary histories: building
//! never panics, using never panics, and the documented bound holds whatever
//! it earns on (successes, first attempts, time) and however its capacity
//! grows or its floor comes back.

use std::time::Duration;

use proptest::prelude::*;
use tower_backoff::budget::{Budget, TokenBucket};
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
    /// Tokens the granted retries cost.
    spent: u128,
    granted: u64,
    /// Tokens successes were to put back (before the capacity cut them).
    refunded: u128,
    elapsed: Duration,
    /// Retries asked for (granted or not, or only weighed) when none had
    /// been for `quiet` before: each may restore the initial tokens.
    woken: u64,
}

/// Runs `steps` on `budget`, built inside `runtime`'s paused clock (entered)
/// at its start, so the clock the bucket reads is the one the steps move.
/// `quiet` is the span after which an ask restores the initial tokens, if
/// any.
fn run(
    runtime: &tokio::runtime::Runtime,
    budget: &dyn Budget,
    steps: &[Step],
    cost: impl Fn(Cause) -> u64,
    refund: impl Fn(Option<Cause>) -> u64,
    quiet: Option<Duration>,
) -> Tally {
    runtime.block_on(async {
        let mut tally = Tally::default();
        // When a retry was last asked for, in the bucket's whole
        // milliseconds since it was built.
        let mut last_asked = 0u128;
        let mut ask = |tally: &mut Tally| {
            let now = tally.elapsed.as_millis();
            if quiet.is_some_and(|quiet| now - last_asked >= quiet.as_millis()) {
                tally.woken += 1;
            }
            last_asked = now;
        };
        for step in steps {
            match *step {
                Step::FirstAttempt => {
                    budget.on_first_attempt();
                    tally.first_attempts += 1;
                }
                Step::Success(last) => {
                    budget.on_success(last);
                    tally.refunded += u128::from(refund(last));
                }
                Step::Retry(cause) => {
                    ask(&mut tally);
                    if budget.try_retry(cause) {
                        tally.granted += 1;
                        tally.spent += u128::from(cost(cause));
                    }
                }
                Step::WouldAllow(cause) => {
                    ask(&mut tally);
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

/// A share of traffic to grow with, extremes included.
fn share() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-0.0),
        Just(0.0),
        Just(1e-9),
        Just(1.0),
        Just(1.000_001),
        any::<f64>(),
        0.0..=1.0,
    ]
}

/// A quiet span, from none at all to forever.
fn quiet() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_millis(1)),
        Just(Duration::from_secs(600)),
        Just(Duration::MAX),
        (0u64..=3_600_000_000_000_000).prop_map(Duration::from_nanos),
    ]
}

proptest! {
    #[test]
    fn token_bucket_builder_never_panics(
        capacity in amount(),
        initial in proptest::option::of(amount()),
        retry in amount(),
        timeout in amount(),
        throttled in amount(),
        refunds in (amount(), amount()),
        deposit in amount(),
        refill in amount(),
        growth in proptest::option::of(share()),
        quiet in proptest::option::of(quiet()),
    ) {
        let mut builder = TokenBucket::builder()
            .capacity(capacity)
            .retry_cost(retry)
            .timeout_cost(timeout)
            .throttled_cost(throttled)
            .success_refund(refunds.0)
            .retried_success_refund(refunds.1)
            .request_deposit(deposit)
            .refill_per_second(refill);
        if let Some(initial) = initial {
            builder = builder.initial_tokens(initial);
        }
        if let Some(share) = growth {
            builder = builder.grow_with_traffic(share);
        }
        if let Some(quiet) = quiet {
            builder = builder.restore_after_quiet(quiet);
        }
        if let Ok(bucket) = builder.build() {
            prop_assert_eq!(bucket.available(), initial.unwrap_or(capacity));
            prop_assert_eq!(bucket.capacity(), capacity);
        }
    }

    /// The documented bound, with every way a bucket earns: the tokens
    /// granted retries took are at most what it started with (again each
    /// time a quiet span restored it), plus what successes put back, what
    /// first attempts deposited and what the refill added. And it never
    /// holds more than its capacity, which never falls below the one set.
    #[test]
    fn token_bucket_never_exceeds_capacity_nor_spends_more_than_it_was_given(
        capacity in 1u64..=1 << 40,
        start in any::<u64>(),
        costs in (0u64..=1 << 40, 0u64..=1 << 40, 0u64..=1 << 40),
        refunds in (amount(), amount()),
        deposit in amount(),
        refill in prop_oneof![Just(0u64), Just(1 << 40), 0u64..100],
        growth in proptest::option::of(prop_oneof![Just(1.0), Just(1e-9), 0.01..=1.0]),
        quiet in proptest::option::of(quiet()),
        steps in proptest::collection::vec(step(), 0..200),
    ) {
        let (retry, timeout, throttled) = (costs.0 % (capacity + 1), costs.1 % (capacity + 1), costs.2 % (capacity + 1));
        let initial = start % (capacity + 1);
        let (refund, retried_refund) = (refunds.0.min(1 << 40), refunds.1.min(1 << 40));
        let deposit = deposit.min(1 << 40);
        let runtime = paused();
        let _clock = runtime.enter();
        let mut builder = TokenBucket::builder()
            .capacity(capacity)
            .initial_tokens(initial)
            .retry_cost(retry)
            .timeout_cost(timeout)
            .throttled_cost(throttled)
            .success_refund(refund)
            .retried_success_refund(retried_refund)
            .request_deposit(deposit)
            .refill_per_second(refill);
        if let Some(share) = growth {
            builder = builder.grow_with_traffic(share);
        }
        if let Some(quiet) = quiet {
            builder = builder.restore_after_quiet(quiet);
        }
        let bucket = builder.build().unwrap();
        let cost = |cause| match cause {
            Cause::Timeout => timeout,
            Cause::Throttled => throttled,
            _ => retry,
        };
        let refunded = |last: Option<Cause>| last.map_or(refund, |cause| cost(cause) + retried_refund);
        let tally = run(&runtime, &bucket, &steps, cost, refunded, quiet);
        let grown = bucket.capacity();
        prop_assert!(grown >= capacity, "{grown} below the {capacity} set");
        prop_assert!(grown <= 1 << 40, "{grown} above 2^40");
        prop_assert!(bucket.available() <= grown, "{bucket:?}");
        let started = u128::from(initial) * u128::from(1 + tally.woken);
        let deposited = u128::from(deposit) * u128::from(tally.first_attempts);
        let refilled = u128::from(refill) * tally.elapsed.as_millis() / 1000 + u128::from(refill);
        prop_assert!(
            tally.spent <= started + tally.refunded + deposited + refilled,
            "{tally:?}"
        );
    }

    /// A bucket that earns only on first attempts (Finagle's budget: a
    /// deposit of one token each, a retry costing `1 / share`) never grants
    /// more than its reserve plus its share of first attempts while no retry
    /// succeeds, however they interleave.
    #[test]
    fn a_bucket_earning_on_requests_never_grants_more_than_its_reserve_plus_its_share(
        per_retry in 1u64..=100,
        reserve in 0u64..=50,
        steps in proptest::collection::vec(step(), 0..300),
    ) {
        let runtime = paused();
        let _clock = runtime.enter();
        let bucket = TokenBucket::builder()
            .capacity((reserve + 300) * per_retry)
            .initial_tokens(reserve * per_retry)
            .retry_cost(per_retry)
            .timeout_cost(per_retry)
            .request_deposit(1)
            .success_refund(0)
            .build()
            .unwrap();
        // No retry succeeds: successes are first-try ones, and earn nothing.
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|step| match step {
                Step::Success(_) => Step::Success(None),
                other => other,
            })
            .collect();
        let tally = run(&runtime, &bucket, &steps, |_| per_retry, |_| 0, None);
        // Whole retries only: the room is rounded down.
        let room = reserve + tally.first_attempts / per_retry;
        prop_assert!(tally.granted <= room, "{} granted, room {room}: {tally:?}", tally.granted);
        // And every whole retry earned and not taken is still there.
        prop_assert_eq!(bucket.available() / per_retry, room - tally.granted);
    }
}
