//! Model checks of [`RetryThrottle`]: every interleaving of a few threads,
//! with loom's atomics in place of std's. Run like `.ci/loom.sh` with
//! `--features grpc` and the filter `grpc::loom`.

use loom::sync::Arc;
use loom::thread;

use super::RetryThrottle;

#[test]
fn concurrent_failures_each_take_exactly_one_token() {
    loom::model(|| {
        let throttle = Arc::new(RetryThrottle::new(10.0, 0.1).unwrap());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let throttle = throttle.clone();
                thread::spawn(move || throttle.record_failure())
            })
            .collect();
        for thread in threads {
            assert!(thread.join().unwrap(), "7 or more left: above half");
        }
        assert_eq!(throttle.tokens(), 7.0);
    });
}

#[test]
fn failures_never_take_the_count_below_zero() {
    loom::model(|| {
        let throttle = Arc::new(RetryThrottle::new(1.5, 0.1).unwrap());
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let throttle = throttle.clone();
                thread::spawn(move || throttle.record_failure())
            })
            .collect();
        let allowed = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&allowed| allowed)
            .count();
        assert_eq!(allowed, 0, "0.5 and then 0 are both at or below 0.75");
        assert_eq!(throttle.tokens(), 0.0);
    });
}

#[test]
fn a_success_and_a_failure_together_are_both_counted() {
    loom::model(|| {
        let throttle = Arc::new(RetryThrottle::new(10.0, 0.5).unwrap());
        throttle.record_failure(); // 9: below the maximum, so order does not matter
        let success = {
            let throttle = throttle.clone();
            thread::spawn(move || throttle.record_success())
        };
        throttle.record_failure();
        success.join().unwrap();
        assert_eq!(throttle.tokens(), 8.5);
    });
}
