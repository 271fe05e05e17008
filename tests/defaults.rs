//! The README's table of defaults, each row checked against what a layer
//! built with no options does.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::{
    classify_fn, retry, BackoffLayer, Cause, Decision, Schedule, DEFAULT_MAX_ATTEMPTS,
};

#[test]
fn three_attempts_100_ms_doubling_to_20_s() {
    let layer = BackoffLayer::new();
    assert_eq!(DEFAULT_MAX_ATTEMPTS, 3);
    assert_eq!(layer.max_attempts(), 3);
    let schedule = layer.schedule();
    // Retries are numbered from 1.
    assert_eq!(schedule.delay(1), Duration::from_millis(100));
    assert_eq!(schedule.delay(2), Duration::from_millis(200));
    assert_eq!(schedule.cap(), Duration::from_secs(20));
}

#[test]
fn the_budget_starts_with_one_requests_retries_a_timeout_costing_one() {
    let layer = BackoffLayer::new();
    let budget = layer.budget().expect("on by default");
    assert_eq!(budget.balance(), Some(2));
    assert!(budget.try_retry(tower_backoff::Cause::Timeout));
    assert!(budget.try_retry(tower_backoff::Cause::Transient));
    assert!(!budget.would_allow(tower_backoff::Cause::Transient));
    let six = BackoffLayer::builder().max_attempts(6).build().unwrap();
    assert_eq!(six.budget().and_then(|b| b.balance()), Some(5));
}

#[test]
fn no_breaker_and_no_pacing_unless_asked() {
    let layer = BackoffLayer::new();
    assert!(layer.breaker().is_none());
    assert!(layer.pacing().is_none());
    assert!(layer.stats().is_none());
}

#[cfg(feature = "hyper")]
#[test]
fn the_http_policy_waits_at_most_a_minute_for_a_server() {
    assert_eq!(
        tower_backoff::http::DEFAULT_MAX_SERVER_DELAY,
        Duration::from_secs(60)
    );
}

// --- A freshly built layer with the default budget ------------------------
//
// The default budget starts with one request's retries (`max_attempts - 1`),
// so the first request through a fresh layer makes every attempt it is
// allowed, whatever its retries are for.

/// How many calls a service has had.
type Calls = Arc<AtomicU32>;

/// A service failing its first `failures` calls with `Err(call number)`, then
/// answering `Ok(call number)`; `u32::MAX` failures is a service that always
/// fails.
fn fails_first(
    failures: u32,
) -> (
    impl Service<(), Response = u32, Error = u32, Future = std::future::Ready<Result<u32, u32>>> + Clone,
    Calls,
) {
    let calls = Calls::default();
    let counter = calls.clone();
    let svc = service_fn(move |()| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(if n <= failures { Err(n) } else { Ok(n) })
    });
    (svc, calls)
}

fn calls(calls: &Calls) -> u32 {
    calls.load(Ordering::SeqCst)
}

#[tokio::test(start_paused = true)]
async fn a_fresh_layer_of_four_attempts_gets_through_three_failures() {
    let layer = BackoffLayer::builder().max_attempts(4).build().unwrap();
    let (svc, made) = fails_first(3);
    let answer = layer.layer(svc).oneshot(()).await;
    assert_eq!(answer, Ok(4));
    assert_eq!(calls(&made), 4);
}

#[tokio::test(start_paused = true)]
async fn a_fresh_layer_of_six_attempts_makes_all_six_against_a_service_that_always_fails() {
    let layer = BackoffLayer::builder().max_attempts(6).build().unwrap();
    let (svc, made) = fails_first(u32::MAX);
    let answer = layer.layer(svc).oneshot(()).await;
    assert_eq!(answer, Err(6), "the last attempt's error");
    assert_eq!(calls(&made), 6);
}

#[tokio::test(start_paused = true)]
async fn a_fresh_layer_retries_attempts_its_policy_calls_timeouts() {
    let timeouts = classify_fn(|_: &(), result: &Result<u32, u32>| match result {
        Ok(_) => Decision::Success,
        Err(_) => Decision::retry().because(Cause::Timeout),
    });
    let layer = BackoffLayer::builder().policy(timeouts).build().unwrap();
    // Both of the default three attempts' retries follow a timeout.
    let (svc, made) = fails_first(2);
    let answer = layer.layer(svc).oneshot(()).await;
    assert_eq!(answer, Ok(3));
    assert_eq!(calls(&made), 3);
}

/// A layer of the default three attempts, each cut after a second, around a
/// service that hangs on its first `hangs` calls and then answers: the
/// answer, the calls made and the time it took.
async fn through_attempt_timeouts(
    hangs: u32,
) -> (
    Result<&'static str, tower_backoff::Error<std::io::Error>>,
    u32,
    Duration,
) {
    let made = Calls::default();
    let counter = made.clone();
    let hangs_first = service_fn(move |()| {
        let hang = counter.fetch_add(1, Ordering::SeqCst) < hangs;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>("answered")
        }
    });
    let layer = BackoffLayer::builder()
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let answer = layer.layer(hangs_first).oneshot(()).await;
    (answer, calls(&made), started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_fresh_layer_retries_an_attempt_cut_by_the_attempt_timeout() {
    let (answer, calls, took) = through_attempt_timeouts(1).await;
    assert_eq!(answer.unwrap(), "answered");
    assert_eq!(calls, 2);
    assert!(took >= Duration::from_secs(1), "the first was cut");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_layer_retries_every_attempt_the_attempt_timeout_cuts() {
    let (answer, calls, took) = through_attempt_timeouts(2).await;
    assert_eq!(answer.unwrap(), "answered");
    assert_eq!(calls, 3);
    assert!(took >= Duration::from_secs(2), "the first two were cut");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_retry_call_of_four_attempts_gets_through_three_failures() {
    let made = Calls::default();
    let answer = retry(|| {
        let n = made.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n <= 3 {
                Err(n)
            } else {
                Ok(n)
            }
        }
    })
    .max_attempts(4)
    .await;
    assert_eq!(answer, Ok(4));
    assert_eq!(calls(&made), 4);
}
