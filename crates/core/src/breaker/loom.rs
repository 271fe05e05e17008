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

#[test]
fn breaker_successes_placing_their_batches_race_a_failure_and_each_is_counted_once() {
    loom::model(|| {
        // A fresh window's batches are one success: each places itself.
        let b = Arc::new(breaker(100));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.record_at(10, false))
            })
            .collect();
        b.record_at(10, true);
        for t in threads {
            t.join().unwrap();
        }
        assert!(b.shared.window.is_armed(), "every full batch was placed");
        b.shared.window.place(10);
        let counts = b.shared.window.counts(10);
        assert_eq!((counts.attempts, counts.failures), (3, 1));
    });
}

#[test]
fn breaker_the_success_that_fills_a_batch_places_all_of_it() {
    loom::model(|| {
        let b = Arc::new(breaker(100));
        // 16 attempts in the bucket: batches of two.
        for _ in 0..16 {
            b.record_at(10, false);
        }
        let other = {
            let b = b.clone();
            thread::spawn(move || b.record_at(20, false))
        };
        b.record_at(20, false);
        other.join().unwrap();
        // Placed by whichever came second, with no failure or read.
        let counts = b.shared.window.counts(20);
        assert_eq!((counts.attempts, counts.failures), (18, 0));
        assert!(b.shared.window.is_armed());
    });
}

#[test]
fn breaker_a_success_taken_by_a_later_placing_is_counted_from_then_not_before() {
    loom::model(|| {
        let b = Arc::new(breaker(100));
        let early = {
            let b = b.clone();
            thread::spawn(move || b.record_at(10, false))
        };
        // A second later: the next bucket.
        b.record_at(1_500, true);
        early.join().unwrap();
        b.shared.window.place(1_500);
        let counts = b.shared.window.counts(1_500);
        assert_eq!((counts.attempts, counts.failures), (2, 1));
        // Placed in its own second or the failure's, never in neither.
        let later = b.shared.window.counts(10_999);
        assert_eq!(later.failures, 1);
        assert!((1..=2).contains(&later.attempts), "{later:?}");
        let gone = b.shared.window.counts(11_000);
        assert_eq!((gone.attempts, gone.failures), (0, 0));
    });
}
