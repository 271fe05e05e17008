//! When a request stops retrying: the attempt limit, no limit at all, the
//! schedule's cap, and delays the server asked for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, ServiceExt};
use tower_backoff::{classify_fn, retry, BackoffLayer, Constant, Decision, Exponential, Jitter};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Fails every call, recording when each came in.
fn failing(
    calls: Arc<Mutex<Vec<Instant>>>,
) -> impl tower::Service<(), Response = (), Error = (), Future = std::future::Ready<Result<(), ()>>>
       + Clone {
    service_fn(move |()| {
        calls.lock().unwrap().push(Instant::now());
        std::future::ready(Err(()))
    })
}

fn gaps(calls: &[Instant]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn stop_at_cap_sleeps_1_2_4_8_seconds_then_makes_one_last_try() {
    // The source's `(exponential-backoff 1000 2 10000 f)`.
    let layer = BackoffLayer::builder()
        .schedule(Exponential::new(secs(1)).max_delay(secs(10)))
        .jitter(Jitter::None)
        .max_attempts(10)
        .stop_at_cap()
        .no_budget()
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    assert_eq!(svc.oneshot(()).await, Err(()));
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 5);
    assert_eq!(gaps(&calls), [1, 2, 4, 8].map(secs));
}

#[tokio::test(start_paused = true)]
async fn the_retry_helper_stops_at_the_cap_the_same_way() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let log = calls.clone();
    let result = retry(|| {
        log.lock().unwrap().push(Instant::now());
        async { Err::<(), ()>(()) }
    })
    .schedule(Exponential::new(secs(1)).max_delay(secs(10)))
    .jitter(Jitter::None)
    .unlimited_attempts()
    .stop_at_cap()
    .no_budget()
    .await;
    assert_eq!(result, Err(()));
    assert_eq!(gaps(&calls.lock().unwrap()), [1, 2, 4, 8].map(secs));
}

#[tokio::test(start_paused = true)]
async fn unlimited_attempts_go_on_until_the_time_limit() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(secs(1)))
        .jitter(Jitter::None)
        .unlimited_attempts()
        .max_elapsed(secs(100))
        .no_budget()
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(()));
    assert_eq!(calls.lock().unwrap().len(), 101);
    assert_eq!(started.elapsed(), secs(100));
}

#[tokio::test(start_paused = true)]
async fn unlimited_attempts_are_bounded_by_the_default_budget_within_their_time_limit() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .unlimited_attempts()
        .max_elapsed(secs(60))
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    assert_eq!(svc.oneshot(()).await, Err(()));
    // The fleet-safe default starts with one request's retries, two for
    // unlimited attempts, and nothing earns it another.
    assert_eq!(calls.lock().unwrap().len(), 3);
}

/// The budget bounds a fleet, not one request: unlimited attempts need a
/// time limit, with a budget or without, and the stop at the cap is none
/// (a server's delay restarts the schedule).
#[test]
fn unlimited_attempts_without_a_time_limit_are_refused() {
    for builder in [
        BackoffLayer::builder().unlimited_attempts(),
        BackoffLayer::builder().unlimited_attempts().no_budget(),
        BackoffLayer::builder().unlimited_attempts().stop_at_cap(),
    ] {
        assert_eq!(builder.build().unwrap_err().field(), "max_attempts");
    }
    let op = || async { Ok::<(), ()>(()) };
    for helper in [
        retry(op).unlimited_attempts(),
        retry(op).unlimited_attempts().no_budget(),
    ] {
        assert_eq!(helper.validate().unwrap_err().field(), "max_attempts");
    }
    assert!(
        retry(op)
            .unlimited_attempts()
            .max_elapsed(secs(60))
            .validate()
            .is_ok(),
        "a time limit bounds it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_delay_longer_than_the_cap_is_slept_in_full() {
    // Retry-After: 8 with a 5 s cap: retrying after 5 s would be 3 s early.
    let layer = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &(), outcome: &Result<(), ()>| match outcome {
                Ok(()) => Decision::Success,
                Err(()) => Decision::retry_after(secs(8)),
            },
        ))
        .schedule(Exponential::new(secs(1)).max_delay(secs(5)))
        .max_attempts(2)
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    assert_eq!(svc.oneshot(()).await, Err(()));
    assert_eq!(gaps(&calls.lock().unwrap()), [secs(8)]);
}

#[tokio::test(start_paused = true)]
async fn a_server_delay_past_the_time_limit_ends_the_request_at_once() {
    let layer = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &(), outcome: &Result<(), ()>| match outcome {
                Ok(()) => Decision::Success,
                Err(()) => Decision::retry_after(secs(8)),
            },
        ))
        .max_elapsed(secs(5))
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(()));
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
}
