//! Tracing events (the `tracing` feature). Alone in its binary: tracing caches
//! per call site whether anyone listens, and other tests emitting the same
//! events at the same time without a subscriber would race that cache.
#![cfg(feature = "tracing")]

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::budget::Budget;
use tower_backoff::{BackoffLayer, Cause, Constant, Jitter};
use tracing::field::Field;
use tracing::{span, Event, Level, Metadata, Subscriber};

/// Collects every event's level and fields.
struct Collect(Arc<Mutex<Vec<(Level, String)>>>);

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = String::new();
        event.record(&mut |field: &Field, value: &dyn std::fmt::Debug| {
            let _ = write!(fields, "{}={:?} ", field.name(), value);
        });
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields));
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Allows one retry in all.
struct AllowOne(Mutex<bool>);

impl Budget for AllowOne {
    fn try_retry(&self, _: Cause) -> bool {
        std::mem::replace(&mut *self.0.lock().unwrap(), false)
    }
}

#[tokio::test(start_paused = true)]
async fn each_retry_logs_a_debug_event_and_a_refusal_a_warning() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let _guard = tracing::subscriber::set_default(Collect(events.clone()));
    let layer = BackoffLayer::builder()
        .max_attempts(5)
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .budget(AllowOne(Mutex::new(true)))
        .build()
        .unwrap();
    let down = service_fn(|_: ()| async { Err::<(), _>("down") });
    assert_eq!(layer.layer(down).oneshot(()).await, Err("down"));

    let events = events.lock().unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    let (level, fields) = &events[0];
    assert_eq!(*level, Level::DEBUG);
    for field in ["attempt=1", "delay=100ms", "reason=Transient"] {
        assert!(fields.contains(field), "{field} in {fields}");
    }
    let (level, fields) = &events[1];
    assert_eq!(*level, Level::WARN);
    assert!(fields.contains("attempt=2"), "{fields}");
}
