//! The `retry` helper for plain async closures.

use std::cell::Cell;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_backoff::{retry, Constant, Exponential, Jitter, TokenBucket};

#[tokio::test(start_paused = true)]
async fn works_with_no_settings_and_returns_the_success() {
    // The default budget of a fresh call pays for one retry.
    let calls = Cell::new(0);
    let result = retry(|| {
        calls.set(calls.get() + 1);
        let n = calls.get();
        async move {
            if n < 2 {
                Err(n)
            } else {
                Ok(n)
            }
        }
    })
    .await;
    assert_eq!(result, Ok(2));
    assert_eq!(calls.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_max_attempts_with_the_last_error() {
    let calls = Cell::new(0);
    let result: Result<(), u32> = retry(|| {
        calls.set(calls.get() + 1);
        let n = calls.get();
        async move { Err(n) }
    })
    .max_attempts(5)
    .no_budget()
    .await;
    assert_eq!(result, Err(5));
}

#[tokio::test(start_paused = true)]
async fn does_not_retry_errors_the_predicate_rejects() {
    let calls = Cell::new(0);
    let result: Result<(), &str> = retry(|| {
        calls.set(calls.get() + 1);
        async { Err("permission denied") }
    })
    .retry_if(|e: &&str| e.contains("busy"))
    .await;
    assert_eq!(result, Err("permission denied"));
    assert_eq!(calls.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn sleeps_the_schedule_and_notifies_each_retry() {
    let mut seen = Vec::new();
    let start = Instant::now();
    let result: Result<(), ()> = retry(|| async { Err(()) })
        .schedule(Exponential::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .max_attempts(4)
        .no_budget()
        .on_retry(|retry, _| seen.push(retry.delay()))
        .await;
    assert!(result.is_err());
    assert_eq!(seen, [100, 200, 400].map(Duration::from_millis));
    assert_eq!(start.elapsed(), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn honours_max_elapsed() {
    let calls = Cell::new(0);
    let start = Instant::now();
    let result: Result<(), ()> = retry(|| {
        calls.set(calls.get() + 1);
        async { Err(()) }
    })
    .schedule(Constant::new(Duration::from_secs(1)))
    .jitter(Jitter::None)
    .max_attempts(100)
    .max_elapsed(Duration::from_millis(2_500))
    .no_budget()
    .await;
    assert!(result.is_err());
    assert_eq!(calls.get(), 3);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[test]
fn validate_names_the_bad_field() {
    let op = || async { Ok::<(), ()>(()) };
    assert_eq!(
        retry(op).max_attempts(0).validate().unwrap_err().field(),
        "max_attempts"
    );
    assert_eq!(
        retry(op)
            .schedule(Exponential::new(Duration::from_secs(1)).factor(0.0))
            .validate()
            .unwrap_err()
            .field(),
        "factor"
    );
}

#[tokio::test(start_paused = true)]
async fn the_default_budget_bounds_an_operation_with_no_attempt_limit() {
    let calls = Cell::new(0u32);
    let result: Result<(), ()> = retry(|| {
        calls.set(calls.get() + 1);
        async { Err(()) }
    })
    .schedule(Constant::new(Duration::ZERO))
    .max_attempts(u32::MAX)
    .await;
    assert!(result.is_err());
    // The fleet-safe default starts with one request's retries (two, for
    // unlimited attempts), and a failure earns it none: an endless failure
    // ends after three attempts.
    assert_eq!(calls.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn without_a_budget_only_the_attempt_limit_bounds_it() {
    let calls = Cell::new(0u32);
    let result: Result<(), ()> = retry(|| {
        calls.set(calls.get() + 1);
        async { Err(()) }
    })
    .schedule(Constant::new(Duration::ZERO))
    .max_attempts(20_000)
    .no_budget()
    .await;
    assert!(result.is_err());
    assert_eq!(calls.get(), 20_000);
}

#[tokio::test(start_paused = true)]
async fn operations_given_one_budget_share_it_and_pay_only_for_retries_that_start() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let calls = Cell::new(0u32);
    let failing = || {
        calls.set(calls.get() + 1);
        async { Err::<(), ()>(()) }
    };
    // Dropped during its 1 s sleep: its retry never starts and costs nothing.
    let dropped = tokio::time::timeout(
        Duration::from_millis(500),
        retry(failing)
            .schedule(Constant::new(Duration::from_secs(1)))
            .jitter(Jitter::None)
            .budget(bucket.clone())
            .into_future(),
    )
    .await;
    assert!(dropped.is_err());
    assert_eq!(bucket.available(), 10);
    // Two retries of the first operation empty the bucket...
    let first = retry(failing)
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(5)
        .budget(bucket.clone())
        .await;
    assert!(first.is_err());
    assert_eq!(calls.get(), 1 + 3);
    // ...so the second gets none.
    let second = retry(failing)
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(5)
        .budget(bucket.clone())
        .await;
    assert!(second.is_err());
    assert_eq!(calls.get(), 1 + 3 + 1);
}

#[tokio::test(flavor = "current_thread")]
async fn when_and_notify_infer_their_argument_types() {
    let notified = Cell::new(0);
    let result = retry(|| async { Err::<(), _>(std::io::Error::other("busy")) })
        .schedule(Constant::new(Duration::ZERO))
        .retry_if(|e| e.kind() == std::io::ErrorKind::Other)
        .on_retry(|retry, error| {
            // `error` is the operation's `std::io::Error`, typed.
            assert_eq!(error.kind(), std::io::ErrorKind::Other);
            assert_eq!(error.to_string(), "busy");
            assert_eq!(retry.delay(), Duration::ZERO);
            assert_eq!(retry.attempt(), notified.get() + 1);
            notified.set(notified.get() + 1);
        })
        .no_budget()
        .await;
    assert!(result.is_err());
    assert_eq!(notified.get(), 2);
}

/// Issue 27: a `retry(..)` built once and started many times shares one
/// default budget across its runs, and each run is a `Future` that
/// `tokio::spawn` takes.
#[tokio::test(start_paused = true)]
async fn a_reused_retry_shares_one_budget_across_100_runs_spawned() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = calls.clone();
    let down = tower_backoff::retry(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async { Err::<(), _>("down") }
    })
    .max_attempts(3)
    .schedule(tower_backoff::Constant::new(Duration::ZERO));
    for _ in 0..100 {
        let outcome = tokio::spawn(down.start()).await.unwrap();
        assert_eq!(outcome, Err("down"));
    }
    // The fleet-safe default bucket (one run's two retries to start with,
    // none earned by a failure) pays for two retries in all: 100 first
    // attempts and the first run's retries, not the 300 attempts of 100
    // budgets of their own.
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 102);
}
