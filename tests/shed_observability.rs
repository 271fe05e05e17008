//! The server half's events and metrics: the limit, admissions, rejections
//! by reason and the queueing time, named like the client's.
#![cfg(all(feature = "shed", feature = "metrics"))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tower_backoff::shed::{Limiter, Priority, Reason, ShedEvent};

/// Fills a limit of 4, turns 3 away, completes the 4 after 50 ms, and lets
/// a window close.
fn exercise(limiter: &Limiter) {
    let now = Instant::now();
    let held: Vec<_> = (0..4)
        .map(|_| limiter.try_acquire(Priority::HIGHEST, now).unwrap())
        .collect();
    for _ in 0..3 {
        limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
    }
    let mut at = now;
    for permit in held {
        at += Duration::from_millis(50);
        permit.complete(at);
    }
    // A second round, past the 100 ms window, closes it.
    let later = now + Duration::from_millis(400);
    let again: Vec<_> = (0..4)
        .map(|_| limiter.try_acquire(Priority::HIGHEST, later).unwrap())
        .collect();
    for permit in again {
        permit.complete(later + Duration::from_millis(50));
    }
}

#[test]
fn every_admission_rejection_and_window_is_an_event() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let limiter = Limiter::builder()
        .initial_limit(4)
        .min_limit(1)
        .seed(1)
        .observer(move |event: &ShedEvent| seen.lock().unwrap().push(*event))
        .build()
        .unwrap();
    exercise(&limiter);
    let events = events.lock().unwrap();
    let admitted = events
        .iter()
        .filter(|e| matches!(e, ShedEvent::Admitted(_)))
        .count();
    let rejected: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ShedEvent::Rejected(r) => Some(r.reason()),
            _ => None,
        })
        .collect();
    assert_eq!(admitted, 8);
    assert_eq!(rejected, [Reason::Limit; 3]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ShedEvent::Limit(_) | ShedEvent::QueueTime(_))),
        "{events:?}"
    );
}

#[test]
fn metrics_are_named_tower_backoff_shed_with_the_reason_as_a_label() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let limiter = Limiter::builder()
            .initial_limit(4)
            .min_limit(1)
            .seed(1)
            .build()
            .unwrap();
        exercise(&limiter);
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let find = |kind: MetricKind, name: &str| {
        snapshot
            .iter()
            .find(|(key, _, _, _)| key.kind() == kind && key.key().name() == name)
            .map(|(key, _, _, value)| (key.clone(), value))
    };
    let (_, admitted) = find(MetricKind::Counter, "tower_backoff.shed.admitted").unwrap();
    assert_eq!(admitted, &DebugValue::Counter(8));
    let (key, rejected) = find(MetricKind::Counter, "tower_backoff.shed.rejected").unwrap();
    assert_eq!(rejected, &DebugValue::Counter(3));
    assert!(key
        .key()
        .labels()
        .any(|l| l.key() == "reason" && l.value() == "limit"));
    assert!(find(MetricKind::Histogram, "tower_backoff.shed.queue_time").is_some());
    assert!(find(MetricKind::Gauge, "tower_backoff.shed.limit").is_some());
}
