//! Issue 27: the layer's metrics through the `metrics` facade, read back
//! with `metrics-util`'s debugging recorder after a scripted run.
#![cfg(feature = "metrics")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::{BackoffLayer, Constant, Hedging, Jitter, TokenBucket};

/// One metric of a snapshot: its key, unit, description and value.
type Recorded = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// The histogram samples or the counter value recorded under `name`, with
/// the label `ending` when given.
fn read<'a>(
    snapshot: &'a [Recorded],
    kind: MetricKind,
    name: &str,
    ending: Option<&str>,
) -> Option<&'a DebugValue> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let labels_match = match ending {
            Some(ending) => key
                .key()
                .labels()
                .any(|l| l.key() == "ending" && l.value() == ending),
            None => true,
        };
        (key.kind() == kind && key.key().name() == name && labels_match).then_some(value)
    })
}

#[test]
fn two_failures_then_a_success_record_2_retries_and_3_attempts() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let layer = BackoffLayer::builder()
                .schedule(Constant::new(Duration::from_millis(100)))
                .jitter(Jitter::None)
                .budget(TokenBucket::new())
                .build()
                .unwrap();
            let calls = Arc::new(AtomicU32::new(0));
            let svc = layer.layer(service_fn(move |()| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        Err("busy")
                    } else {
                        Ok(())
                    }
                }
            }));
            assert_eq!(svc.oneshot(()).await, Ok(()));
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let histogram = |name| match read(&snapshot, MetricKind::Histogram, name, None) {
        Some(DebugValue::Histogram(samples)) => {
            samples.iter().map(|s| s.into_inner()).collect::<Vec<_>>()
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(
        histogram("tower_backoff.call.attempts"),
        [3.0],
        "attempts sum 3"
    );
    assert_eq!(histogram("tower_backoff.call.retries"), [2.0]);
    assert_eq!(histogram("tower_backoff.call.retry_delay"), [0.2]);
    assert_eq!(
        read(
            &snapshot,
            MetricKind::Counter,
            "tower_backoff.call.ended",
            Some("success")
        ),
        Some(&DebugValue::Counter(1))
    );
    assert!(read(
        &snapshot,
        MetricKind::Histogram,
        "tower_backoff.call.transparent_retries",
        None
    )
    .is_none());
    assert!(read(
        &snapshot,
        MetricKind::Counter,
        "tower_backoff.budget.refusals",
        None
    )
    .is_none());
}

#[test]
fn a_hedge_that_wins_records_1_hedge_and_no_retry() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let layer = BackoffLayer::builder()
                .hedge(Hedging::after(Duration::from_millis(10)).max_extra_load(1.0))
                .build()
                .unwrap();
            // The first call answers after 1 ms (traffic the load cap grants
            // a hedge from: an answer ready at the first poll is not
            // counted), the second hangs until its hedge, the third,
            // answers.
            let calls = Arc::new(AtomicU32::new(0));
            let svc = layer.layer(service_fn(move |()| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => tokio::time::sleep(Duration::from_millis(1)).await,
                        1 => std::future::pending::<()>().await,
                        _ => {}
                    }
                    Ok::<_, &str>(())
                }
            }));
            assert_eq!(svc.clone().oneshot(()).await, Ok(()));
            tokio::time::advance(Duration::from_millis(100)).await;
            assert_eq!(svc.oneshot(()).await, Ok(()));
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let histogram = |name| match read(&snapshot, MetricKind::Histogram, name, None) {
        Some(DebugValue::Histogram(samples)) => {
            samples.iter().map(|s| s.into_inner()).collect::<Vec<_>>()
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(histogram("tower_backoff.call.attempts"), [1.0, 2.0]);
    assert_eq!(histogram("tower_backoff.call.hedges"), [1.0]);
    assert!(read(
        &snapshot,
        MetricKind::Histogram,
        "tower_backoff.call.retries",
        None
    )
    .is_none());
}
