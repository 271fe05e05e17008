//! Issue 40: a per-host stack's events and metrics name the host (the
//! authority) they happened at, and a named layer's carry its name, so two
//! hosts behind one layer show two series, not one sum. Two hyper servers on
//! 127.0.0.1, one dead (503 always) and one healthy, behind one client, read
//! back with `metrics-util`'s debugging recorder and an observer.
#![cfg(all(feature = "hyper", feature = "metrics"))]

use crate::http_server;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_backoff::breaker::{BreakerState, CircuitBreaker};
use tower_backoff::events::{Event, Origin, WithOrigin};
use tower_backoff::http::HttpRetryLayer;
use tower_backoff::BackoffLayer;

use http_server::{status, Server};

/// Requests to each host.
const REQUESTS: usize = 40;

/// One metric of a snapshot: its key, unit, description and value.
type Recorded = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// Every event heard, with the host and layer name it was told with.
type Heard = Arc<Mutex<Vec<(Event, Option<String>, Option<String>)>>>;

fn hearing() -> (Heard, WithOrigin<impl Fn(&Event, &Origin) + Send + Sync>) {
    let heard = Heard::default();
    let record = heard.clone();
    let observer = WithOrigin(move |event: &Event, origin: &Origin| {
        record.lock().unwrap().push((
            *event,
            origin.host().map(str::to_owned),
            origin.layer_name().map(str::to_owned),
        ))
    });
    (heard, observer)
}

/// The value of label `label` of each series named `name`.
fn label_values(snapshot: &[Recorded], kind: MetricKind, name: &str, label: &str) -> Vec<String> {
    snapshot
        .iter()
        .filter(|(key, ..)| key.kind() == kind && key.key().name() == name)
        .map(|(key, ..)| {
            key.key()
                .labels()
                .find(|l| l.key() == label)
                .map_or_else(|| "<none>".to_owned(), |l| l.value().to_owned())
        })
        .collect()
}

/// The value of the series named `name` whose label `target` is `host`.
fn value_at<'a>(
    snapshot: &'a [Recorded],
    kind: MetricKind,
    name: &str,
    host: &str,
) -> Option<&'a DebugValue> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let at = key
            .key()
            .labels()
            .any(|l| l.key() == "target" && l.value() == host);
        (key.kind() == kind && key.key().name() == name && at).then_some(value)
    })
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url("/")).body(Full::default()).unwrap()
}

/// Runs `test` on a paused current-thread runtime with the debugging
/// recorder installed, and returns what it recorded.
fn recorded<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) -> Vec<Recorded> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test())
    });
    snapshotter.snapshot().into_vec()
}

/// The hosts' authorities, as the labels name them.
fn authorities(dead: &Server, healthy: &Server) -> (String, String) {
    (dead.addr.to_string(), healthy.addr.to_string())
}

/// A host that answers 503 to everything and one that answers 200, their
/// authorities written to `seen` for the assertions outside the run.
async fn dead_and_healthy(seen: &Mutex<Option<(String, String)>>) -> (Server, Server) {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    *seen.lock().unwrap() = Some(authorities(&dead, &healthy));
    (dead, healthy)
}

#[test]
fn two_hosts_record_a_series_each_and_the_breaker_event_names_the_dead_host() {
    let (heard, observer) = hearing();
    let hosts = Arc::new(Mutex::new(None));
    let seen_hosts = hosts.clone();
    let snapshot = recorded(|| async move {
        let (dead, healthy) = dead_and_healthy(&seen_hosts).await;
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .circuit_breaker(CircuitBreaker::new())
                    .observer(observer)
                    .build()
                    .unwrap(),
            )
            .service(client());
        for _ in 0..REQUESTS {
            let _ = svc.clone().oneshot(get(&dead)).await;
            let response = svc.clone().oneshot(get(&healthy)).await.unwrap();
            assert_eq!(response.status(), 200);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (dead, healthy) = hosts.lock().unwrap().clone().unwrap();

    let attempts = label_values(
        &snapshot,
        MetricKind::Histogram,
        "tower_backoff.call.attempts",
        "target",
    );
    assert_eq!(
        attempts.iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([&dead, &healthy]),
        "one series per authority"
    );
    match value_at(
        &snapshot,
        MetricKind::Gauge,
        "tower_backoff.breaker.state",
        &dead,
    ) {
        Some(DebugValue::Gauge(state)) => assert_ne!(state.into_inner(), 0.0),
        other => panic!("the dead host's breaker state: {other:?}"),
    }
    assert!(value_at(
        &snapshot,
        MetricKind::Counter,
        "tower_backoff.breaker.rejections",
        &dead
    )
    .is_some());
    assert!(
        value_at(
            &snapshot,
            MetricKind::Gauge,
            "tower_backoff.breaker.state",
            &healthy
        )
        .is_none(),
        "the healthy host's breaker never moved"
    );

    let heard = heard.lock().unwrap();
    let breaker_hosts: BTreeSet<_> = heard
        .iter()
        .filter(|(event, ..)| matches!(event, Event::Breaker(BreakerState::Open)))
        .map(|(_, host, _)| host.clone())
        .collect();
    assert_eq!(breaker_hosts, BTreeSet::from([Some(dead.clone())]));
    let called_hosts: BTreeSet<_> = heard
        .iter()
        .filter(|(event, ..)| matches!(event, Event::Called))
        .map(|(_, host, _)| host.clone())
        .collect();
    assert_eq!(called_hosts, BTreeSet::from([Some(dead), Some(healthy)]));
}

#[test]
fn a_per_host_layer_records_a_series_per_authority() {
    let (heard, observer) = hearing();
    let hosts = Arc::new(Mutex::new(None));
    let seen_hosts = hosts.clone();
    let snapshot = recorded(|| async move {
        let (dead, healthy) = dead_and_healthy(&seen_hosts).await;
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .observer(observer)
                    .build_per_host()
                    .unwrap(),
            )
            .service(client());
        for _ in 0..3 {
            let _ = svc.clone().oneshot(get(&dead)).await;
            let _ = svc.clone().oneshot(get(&healthy)).await.unwrap();
        }
    });
    let (dead, healthy) = hosts.lock().unwrap().clone().unwrap();
    let ended = |host: &str, ending: &str| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let labels: Vec<_> = key.key().labels().collect();
            let has = |k: &str, v: &str| labels.iter().any(|l| l.key() == k && l.value() == v);
            (key.key().name() == "tower_backoff.call.ended"
                && has("target", host)
                && has("ending", ending))
            .then_some(value)
        })
    };
    assert_eq!(ended(&healthy, "success"), Some(&DebugValue::Counter(3)));
    assert!(ended(&dead, "success").is_none());
    assert!(ended(&dead, "out_of_attempts").is_some() || ended(&dead, "budget_refused").is_some());
    let retried_hosts: BTreeSet<_> = heard
        .lock()
        .unwrap()
        .iter()
        .filter(|(event, ..)| matches!(event, Event::Retry(_)))
        .map(|(_, host, _)| host.clone())
        .collect();
    assert_eq!(retried_hosts, BTreeSet::from([Some(dead)]));
}

#[test]
fn a_named_layer_labels_its_series_with_its_name_and_no_target() {
    let (heard, observer) = hearing();
    let snapshot = recorded(|| async move {
        let layer = BackoffLayer::builder()
            .name("payments")
            .observer(observer)
            .build()
            .unwrap();
        let svc = layer.layer(service_fn(|()| async { Ok::<_, &str>(()) }));
        svc.oneshot(()).await.unwrap();
    });
    assert_eq!(
        label_values(
            &snapshot,
            MetricKind::Histogram,
            "tower_backoff.call.attempts",
            "layer"
        ),
        ["payments"]
    );
    assert_eq!(
        label_values(
            &snapshot,
            MetricKind::Histogram,
            "tower_backoff.call.attempts",
            "target"
        ),
        ["<none>"]
    );
    let heard = heard.lock().unwrap();
    assert!(heard
        .iter()
        .all(|(_, host, name)| host.is_none() && name.as_deref() == Some("payments")));
}

#[test]
fn an_unnamed_layer_records_series_without_labels() {
    let snapshot = recorded(|| async {
        let layer = BackoffLayer::builder().build().unwrap();
        let svc = layer.layer(service_fn(|()| async { Ok::<_, &str>(()) }));
        svc.oneshot(()).await.unwrap();
    });
    let attempts: Vec<_> = snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == "tower_backoff.call.attempts")
        .collect();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].0.key().labels().count(), 0);
}

#[test]
fn for_host_gives_a_fresh_copy_named_for_its_host() {
    let breaker = CircuitBreaker::new();
    let layer = BackoffLayer::builder()
        .name("payments")
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let eu = layer.for_host("eu.example:443");
    assert_eq!(eu.host(), Some("eu.example:443"));
    assert_eq!(eu.layer_name(), Some("payments"));
    assert_eq!(layer.host(), None);
    for _ in 0..40 {
        breaker.record(true);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(
        eu.breaker().unwrap().state(),
        BreakerState::Closed,
        "a breaker of its own"
    );
    let same = layer.with_host("us.example:443");
    assert_eq!(same.host(), Some("us.example:443"));
    assert_eq!(same.breaker().unwrap().state(), BreakerState::Open);
}
