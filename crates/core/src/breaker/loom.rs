//! Model checks of the breaker's shared state: every interleaving of a few
//! threads, with loom's atomics in place of std's. Run by `.ci/loom.sh`.

use loom::sync::Arc;
use loom::thread;

use super::{Admission, BreakerState, CircuitBreaker};

fn breaker(min: u32) -> CircuitBreaker {
    CircuitBreaker::builder()
        .min_throughput(min)
        .break_jitter(0.0)
        .build()
        .unwrap()
}

#[test]
fn breaker_half_open_lets_exactly_one_probe_out() {
    loom::model(|| {
        let b = Arc::new(breaker(1));
        assert_eq!(b.record_at(0, true), Some(BreakerState::Open));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.admit_at(5_000).admitted())
            })
            .collect();
        let mine = b.admit_at(5_000).admitted();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .chain([mine])
            .filter(|&a| a)
            .count();
        assert_eq!(admitted, 1);
    });
}

#[test]
fn breaker_concurrent_outcomes_are_all_counted() {
    loom::model(|| {
        let b = Arc::new(breaker(100));
        let other = {
            let b = b.clone();
            thread::spawn(move || b.record_at(10, true))
        };
        b.record_at(10, false);
        other.join().unwrap();
        b.shared.window.place(10);
        let counts = b.shared.window.counts(10);
        assert_eq!((counts.attempts, counts.failures), (2, 1));
    });
}

#[test]
fn breaker_opens_once_when_two_failures_trip_it_together() {
    loom::model(|| {
        let b = Arc::new(breaker(2));
        let other = {
            let b = b.clone();
            thread::spawn(move || b.record_at(10, true))
        };
        let mine = b.record_at(10, true);
        let theirs = other.join().unwrap();
        // Both may see the window full, but only one moves the state.
        let opened = [mine, theirs]
            .iter()
            .filter(|s| **s == Some(BreakerState::Open))
            .count();
        assert_eq!(opened, 1);
        assert_eq!(b.state(), BreakerState::Open);
    });
}

#[test]
fn breaker_probe_outcome_racing_a_new_probe_leaves_one_consistent_state() {
    loom::model(|| {
        let b = Arc::new(breaker(1));
        b.record_at(0, true);
        assert!(b.admit_at(5_000).admitted());
        let outcome = {
            let b = b.clone();
            thread::spawn(move || b.record_at(5_010, false))
        };
        // The probe is not lost yet: nobody else gets in before 10 s.
        let late = b.admit_at(5_020);
        let closed = outcome.join().unwrap();
        assert_eq!(closed, Some(BreakerState::Closed));
        assert!(matches!(late, Admission::Rejected | Admission::Closed));
        assert_eq!(b.state(), BreakerState::Closed);
    });
}
