//! The README's table of defaults, each row checked against what a layer
//! built with no options does.

use std::time::Duration;

use tower_backoff::{BackoffLayer, Schedule, DEFAULT_MAX_ATTEMPTS};

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

#[cfg(feature = "http")]
#[test]
fn the_http_policy_waits_at_most_a_minute_for_a_server() {
    assert_eq!(
        tower_backoff::http::DEFAULT_MAX_SERVER_DELAY,
        Duration::from_secs(60)
    );
}
