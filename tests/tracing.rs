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

/// Every span opened and every value recorded on it, by span.
#[derive(Default)]
struct Spans {
    next: std::sync::atomic::AtomicU64,
    fields: Mutex<Vec<(String, String)>>,
}

struct CollectSpans(Arc<Spans>);

impl Subscriber for CollectSpans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attributes: &span::Attributes<'_>) -> span::Id {
        let id = self
            .0
            .next
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let mut fields = format!("{} ", attributes.metadata().name());
        attributes.record(&mut |field: &Field, value: &dyn std::fmt::Debug| {
            let _ = write!(fields, "{}={:?} ", field.name(), value);
        });
        self.0.fields.lock().unwrap().push((id.to_string(), fields));
        span::Id::from_u64(id)
    }
    fn record(&self, id: &span::Id, values: &span::Record<'_>) {
        let mut spans = self.0.fields.lock().unwrap();
        let Some((_, fields)) = spans
            .iter_mut()
            .find(|(s, _)| *s == id.into_u64().to_string())
        else {
            return;
        };
        values.record(&mut |field: &Field, value: &dyn std::fmt::Debug| {
            let _ = write!(fields, "{}={:?} ", field.name(), value);
        });
    }
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Issue 27: a span per retry, with its attempt number, OpenTelemetry's
/// `http.request.resend_count` (set on resends), the delay, the cause and the
/// outcome. The first attempt runs in the caller's span.
#[tokio::test(start_paused = true)]
async fn each_retry_has_a_span_with_its_number_resend_count_and_outcome() {
    let spans = Arc::new(Spans::default());
    let _guard = tracing::subscriber::set_default(CollectSpans(spans.clone()));
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .no_budget()
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(0));
    let svc = layer.layer(service_fn(move |()| {
        let n = {
            let mut calls = calls.lock().unwrap();
            *calls += 1;
            *calls
        };
        async move {
            if n < 3 {
                Err("busy")
            } else {
                Ok(())
            }
        }
    }));
    assert_eq!(svc.oneshot(()).await, Ok(()));
    let attempts: Vec<String> = spans
        .fields
        .lock()
        .unwrap()
        .iter()
        .map(|(_, fields)| fields.clone())
        .filter(|fields| fields.starts_with("attempt "))
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    for (i, expected) in [
        [
            "attempt=2 ",
            "http.request.resend_count=1 ",
            "outcome=\"error\"",
        ],
        [
            "attempt=3 ",
            "http.request.resend_count=2 ",
            "outcome=\"response\"",
        ],
    ]
    .iter()
    .enumerate()
    {
        for part in expected {
            assert!(attempts[i].contains(part), "{part} in {}", attempts[i]);
        }
    }
    assert!(
        attempts[1].contains("delay=100ms") && attempts[1].contains("cause=Transient"),
        "{}",
        attempts[1]
    );
}

/// A service that fails its first call and answers every other.
fn fails_once() -> impl tower::Service<(), Response = (), Error = &'static str> + Clone {
    let calls = Arc::new(Mutex::new(0));
    service_fn(move |()| {
        let first = std::mem::replace(&mut *calls.lock().unwrap(), 1) == 0;
        async move {
            if first {
                Err("busy")
            } else {
                Ok(())
            }
        }
    })
}

/// Issue 40: a per-host copy's retry log and span name its host, and a named
/// layer's its name, so the hosts of one stack can be told apart.
#[tokio::test(start_paused = true)]
async fn a_host_copy_names_its_host_and_layer_in_its_logs_and_spans() {
    let layer = BackoffLayer::builder()
        .name("payments")
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .no_budget()
        .build()
        .unwrap()
        .for_host("eu.example:443");
    let events = Arc::new(Mutex::new(Vec::new()));
    {
        let _guard = tracing::subscriber::set_default(Collect(events.clone()));
        assert_eq!(layer.layer(fails_once()).oneshot(()).await, Ok(()));
    }
    let (_, fields) = events.lock().unwrap()[0].clone();
    for field in ["host=\"eu.example:443\"", "layer=\"payments\"", "attempt=1"] {
        assert!(fields.contains(field), "{field} in {fields}");
    }

    let spans = Arc::new(Spans::default());
    let _guard = tracing::subscriber::set_default(CollectSpans(spans.clone()));
    assert_eq!(layer.layer(fails_once()).oneshot(()).await, Ok(()));
    let fields = spans.fields.lock().unwrap();
    let attempt = fields
        .iter()
        .map(|(_, fields)| fields)
        .find(|fields| fields.starts_with("attempt "))
        .expect("the retry's span");
    for field in ["host=\"eu.example:443\"", "layer=\"payments\"", "attempt=2"] {
        assert!(attempt.contains(field), "{field} in {attempt}");
    }
}
