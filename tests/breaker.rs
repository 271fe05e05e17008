//! The circuit breaker composed with retries, on tokio's paused clock: it
//! counts attempts, opens at its failure ratio over its minimum throughput,
//! rejects without calling the inner service or charging the budget, never
//! hides a real outcome behind its own error, probes once when half-open,
//! and is per host under a `PerHostLayer`.

#[cfg(feature = "hyper")]
use crate::http_server;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::breaker::{BreakerState, CircuitBreaker};
use tower_backoff::events::{Ending, Event};
use tower_backoff::{BackoffLayer, Constant, Decision, Jitter, Stats, TokenBucket};

const STEP: Duration = Duration::from_millis(100);
const BREAK: Duration = Duration::from_secs(5);

/// A host whose answers the test switches, counting the calls it gets; a
/// call takes `latency`.
#[derive(Clone, Default)]
struct Host {
    calls: Arc<AtomicU32>,
    down: Arc<AtomicBool>,
    latency: Duration,
}

impl Host {
    fn down() -> Self {
        let host = Self::default();
        host.down.store(true, Ordering::SeqCst);
        host
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn service(
        &self,
    ) -> impl Service<u32, Response = u32, Error = io::Error, Future = impl Send> + Clone {
        let host = self.clone();
        service_fn(move |n: u32| {
            let host = host.clone();
            host.calls.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(host.latency).await;
                if host.down.load(Ordering::SeqCst) {
                    Err(io::Error::other(format!("down, attempt for {n}")))
                } else {
                    Ok(n)
                }
            }
        })
    }
}

/// A breaker with no jitter, opening at half of `min` attempts.
fn breaker(min: u32) -> CircuitBreaker {
    CircuitBreaker::builder()
        .min_throughput(min)
        .break_duration(BREAK)
        .break_jitter(0.0)
        .build()
        .unwrap()
}

/// Every event the layer tells, in order.
fn recorder() -> (
    Arc<Mutex<Vec<Event>>>,
    impl Fn(&Event) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    (events, move |event: &Event| {
        seen.lock().unwrap().push(*event)
    })
}

fn breaker_events(events: &Mutex<Vec<Event>>) -> Vec<BreakerState> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| match event {
            Event::Breaker(state) => Some(*state),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn opens_at_the_failure_ratio_once_the_minimum_throughput_is_reached() {
    let host = Host::default();
    let breaker = breaker(20);
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    for n in 0..10 {
        svc.clone().oneshot(n).await.unwrap();
    }
    host.set_down(true);
    for n in 0..9 {
        assert!(svc
            .clone()
            .oneshot(n)
            .await
            .unwrap_err()
            .get_ref()
            .is_some());
        assert_eq!(breaker.state(), BreakerState::Closed, "{} of 20", 11 + n);
    }
    // The 20th attempt, the 10th failure: half of the minimum.
    let error = svc.clone().oneshot(9).await.unwrap_err();
    assert!(
        error.get_ref().is_some(),
        "the attempt that opened it is real"
    );
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.window(), (20, 10));
}

#[tokio::test(start_paused = true)]
async fn counts_attempts_not_requests() {
    let host = Host::down();
    let breaker = breaker(20);
    let layer = BackoffLayer::builder()
        .max_attempts(4)
        .schedule(Constant::new(STEP))
        .no_budget()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    for n in 0..4 {
        svc.clone().oneshot(n).await.unwrap_err();
    }
    assert_eq!(
        breaker.window(),
        (16, 16),
        "four requests, four attempts each"
    );
    svc.clone().oneshot(4).await.unwrap_err();
    assert_eq!(breaker.state(), BreakerState::Open, "at the 20th attempt");
    assert_eq!(host.calls(), 20);
}

#[tokio::test(start_paused = true)]
async fn below_the_minimum_throughput_it_never_opens() {
    let host = Host::down();
    let breaker = breaker(20);
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    // Every attempt fails, but at 19 attempts per 10 s window (one per 550
    // ms), never 20, for ten minutes.
    for n in 0..1_100 {
        svc.clone().oneshot(n).await.unwrap_err();
        tokio::time::sleep(Duration::from_millis(550)).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(host.calls(), 1_100);
}

#[tokio::test(start_paused = true)]
async fn final_outcomes_count_as_successes() {
    // A 400 is the caller's fault: the host is fine.
    let host = Host::down();
    let breaker = breaker(5);
    let layer = BackoffLayer::builder()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer
        .layer(host.service())
        .classify(|_, outcome| match outcome {
            Ok(_) => Decision::Success,
            Err(_) => Decision::Final,
        });
    for n in 0..50 {
        svc.clone().oneshot(n).await.unwrap_err();
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.window(), (50, 0));
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_rejects_without_calling_the_inner_service_or_the_budget() {
    let host = Host::down();
    let stats = Stats::new();
    let (events, observer) = recorder();
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .stats(stats.clone())
        .observer(observer)
        .circuit_breaker(breaker(2))
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    svc.clone().oneshot(0).await.unwrap_err();
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(layer.breaker().unwrap().state(), BreakerState::Open);
    let balance = layer.budget().unwrap().balance();
    let before = stats.snapshot();

    let error = svc.clone().oneshot(2).await.unwrap_err();
    assert!(error.is_breaker_open(), "{error}");
    assert!(error.get_ref().is_none());
    assert_eq!(host.calls(), 2, "the inner service was not called");
    assert_eq!(layer.budget().unwrap().balance(), balance);
    let after = stats.snapshot();
    assert_eq!(after.breaker_rejections, 1);
    assert_eq!(after.requests, before.requests, "nothing was sent");
    assert_eq!(after.attempts, before.attempts);
    let events = events.lock().unwrap();
    assert!(matches!(events.last(), Some(Event::Rejected(r)) if r.attempt() == 1));
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_breaker_opened_for_during_its_sleep_returns_the_real_error_and_charges_nothing(
) {
    // Request A fails and sleeps before its retry; request B's failure opens
    // the breaker meanwhile. A's retry is stopped when it is to go out.
    let host = Host::down();
    let bucket = Arc::new(TokenBucket::builder().capacity(100).build().unwrap());
    let stats = Stats::new();
    let (events, observer) = recorder();
    let layer = BackoffLayer::builder()
        .max_attempts(3)
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .budget(bucket.clone())
        .stats(stats.clone())
        .observer(observer)
        .circuit_breaker(breaker(2))
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    let a = tokio::spawn(svc.clone().oneshot(1));
    tokio::time::sleep(STEP / 2).await;
    let b = svc.clone().oneshot(2).await.unwrap_err();
    assert!(b.get_ref().is_some(), "B's own failure, real");
    let a = a.await.unwrap().unwrap_err();
    assert_eq!(
        a.get_ref().map(ToString::to_string).as_deref(),
        Some("down, attempt for 1"),
        "the previous attempt's real error, not the breaker's: {a}"
    );
    assert_eq!(host.calls(), 2, "no retry went out");
    assert_eq!(bucket.available(), 100, "no retry was paid for");
    let seen = stats.snapshot();
    assert_eq!(seen.retries, 0);
    assert_eq!(seen.gave_up_breaker, 2, "A at send, B at its decision");
    assert_eq!(seen.breaker_rejections, 2);
    let rejected: Vec<u32> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| match event {
            Event::Rejected(rejected) => Some(rejected.attempt()),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, [2, 2], "each stopped retry was to be attempt 2");
}

#[tokio::test(start_paused = true)]
async fn a_retry_stopped_by_an_open_breaker_returns_the_previous_response() {
    // Responses, not errors: a 503-like answer the policy retries.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let busy = service_fn(move |_: ()| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, io::Error>(503u16) }
    });
    let layer = BackoffLayer::builder()
        .max_attempts(3)
        .circuit_breaker(breaker(1))
        .build()
        .unwrap();
    let svc = layer
        .layer(busy)
        .retry_if(|outcome| matches!(outcome, Ok(503)));
    let balance = layer.budget().unwrap().balance();
    assert_eq!(svc.clone().oneshot(()).await.unwrap(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.budget().unwrap().balance(), balance);
    // The next request is rejected outright: nothing before it to return.
    assert!(svc.oneshot(()).await.unwrap_err().is_breaker_open());
}

/// Opens `breaker` behind `svc`'s host with two failures.
async fn open<S>(svc: &S, host: &Host, breaker: &CircuitBreaker)
where
    S: Service<u32, Response = u32> + Clone,
    S::Error: std::fmt::Debug,
{
    host.set_down(true);
    for n in 0..2 {
        svc.clone().oneshot(n).await.unwrap_err();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn half_open_lets_exactly_one_probe_out() {
    let host = Host {
        latency: Duration::from_millis(200),
        ..Host::default()
    };
    let breaker = breaker(2);
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    open(&svc, &host, &breaker).await;
    host.set_down(false);
    tokio::time::sleep(BREAK).await;
    let calls = host.calls();
    let outcomes = futures::future::join_all((0..5).map(|n| svc.clone().oneshot(n))).await;
    assert_eq!(host.calls(), calls + 1, "one probe");
    let rejected = outcomes
        .iter()
        .filter(|o| o.as_ref().is_err_and(|e| e.is_breaker_open()))
        .count();
    assert_eq!(rejected, 4);
    assert!(outcomes[0].is_ok(), "the probe got the host's answer");
}

#[tokio::test(start_paused = true)]
async fn a_probes_success_closes_it_and_a_failure_opens_it_again() {
    let host = Host::default();
    let breaker = breaker(2);
    let (events, observer) = recorder();
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .observer(observer)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    open(&svc, &host, &breaker).await;
    assert!(svc.clone().oneshot(9).await.unwrap_err().is_breaker_open());

    // Still down at the probe: open for another whole break.
    tokio::time::sleep(BREAK).await;
    assert!(svc
        .clone()
        .oneshot(10)
        .await
        .unwrap_err()
        .get_ref()
        .is_some());
    assert_eq!(breaker.state(), BreakerState::Open);
    tokio::time::sleep(BREAK - Duration::from_millis(1)).await;
    assert!(svc.clone().oneshot(11).await.unwrap_err().is_breaker_open());

    // Back up at the next probe: closed, and everything goes out again.
    host.set_down(false);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(svc.clone().oneshot(12).await.unwrap(), 12);
    assert_eq!(breaker.state(), BreakerState::Closed);
    for n in 0..10 {
        assert_eq!(svc.clone().oneshot(n).await.unwrap(), n);
    }
    use BreakerState::*;
    assert_eq!(
        breaker_events(&events),
        [Open, HalfOpen, Open, HalfOpen, Closed]
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_can_be_the_probe_and_its_success_closes_the_breaker() {
    let host = Host::default();
    let breaker = breaker(2);
    let layer = BackoffLayer::builder()
        .max_attempts(2)
        .schedule(Constant::new(BREAK + 2 * STEP))
        .jitter(Jitter::None)
        .no_budget()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    let svc = layer.layer(host.service());
    host.set_down(true);
    // One request: its first attempt fails (1 of 2), retried after 5.2 s.
    let first = tokio::spawn(svc.clone().oneshot(1));
    tokio::time::sleep(STEP).await;
    // Another's failure opens it, until 5.1 s.
    let second = tokio::spawn(svc.clone().oneshot(2));
    tokio::time::sleep(STEP).await;
    assert_eq!(breaker.state(), BreakerState::Open);
    host.set_down(false);
    // The first request's retry goes out past the break, at 5.2 s: the
    // probe, whose success closes the breaker for the second's at 5.3 s.
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(second.await.unwrap().unwrap(), 2);
    assert_eq!(host.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn the_standalone_layer_breaks_without_retrying() {
    let host = Host::down();
    let breaker = breaker(3);
    let svc = breaker
        .layer(tower_backoff::RetryOnError)
        .layer(host.service());
    for n in 0..3 {
        svc.clone().oneshot(n).await.unwrap_err();
    }
    assert_eq!(host.calls(), 3, "one attempt each");
    assert!(svc.oneshot(3).await.unwrap_err().is_breaker_open());
}

#[tokio::test(start_paused = true)]
async fn every_clone_of_the_layer_shares_one_breaker() {
    let host = Host::down();
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .circuit_breaker(breaker(2))
        .build()
        .unwrap();
    let one = layer.clone().layer(host.service());
    let other = layer.layer(host.service());
    one.oneshot(0).await.unwrap_err();
    other.clone().oneshot(1).await.unwrap_err();
    assert!(other.oneshot(2).await.unwrap_err().is_breaker_open());
}

#[tokio::test(start_paused = true)]
async fn a_layer_without_a_breaker_keeps_the_inner_error_type() {
    let layer = BackoffLayer::builder().max_attempts(1).build().unwrap();
    let svc = layer.layer(Host::down().service());
    let error: io::Error = svc.oneshot(0).await.unwrap_err();
    assert_eq!(error.to_string(), "down, attempt for 0");
    // And with an attempt timeout set after the breaker, the breaker stays.
    let breaker = breaker(1);
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .circuit_breaker(breaker.clone())
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let svc = layer.layer(Host::down().service());
    svc.clone().oneshot(0).await.unwrap_err();
    assert!(svc.oneshot(1).await.unwrap_err().is_breaker_open());
}

#[tokio::test(start_paused = true)]
async fn a_request_stopped_by_the_breaker_ends_as_breaker_open() {
    let (events, observer) = recorder();
    let layer = BackoffLayer::builder()
        .max_attempts(3)
        .observer(observer)
        .circuit_breaker(breaker(1))
        .build()
        .unwrap();
    layer
        .layer(Host::down().service())
        .oneshot(0)
        .await
        .unwrap_err();
    let ended = events.lock().unwrap().iter().find_map(|e| match e {
        Event::Ended(end) => Some(end.ending()),
        _ => None,
    });
    assert_eq!(ended, Some(Ending::BreakerOpen));
}

/// Real hyper servers on 127.0.0.1, through hyper-util's client and the
/// HTTP layer's own builder option, one breaker per host.
#[cfg(feature = "hyper")]
mod per_host {
    use super::*;
    use bytes::Bytes;
    use http::{Request, StatusCode};
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::ServiceBuilder;
    use tower_backoff::http::{HttpRetryLayer, PerHostLayer};

    use super::http_server::{status, Server};

    fn get(server: &Server) -> Request<Full<Bytes>> {
        Request::get(server.url("/")).body(Full::default()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_host_is_never_rejected_while_another_hosts_breaker_is_open() {
        let down = Server::start(|_, _| status(503)).await;
        let up = Server::start(|_, _| status(200)).await;
        let breakers = Arc::new(Mutex::new(Vec::new()));
        let made = breakers.clone();
        let svc = ServiceBuilder::new()
            .layer(PerHostLayer::new(move || {
                // Made per host: so is the breaker.
                let breaker = breaker(6);
                made.lock().unwrap().push(breaker.clone());
                HttpRetryLayer::builder()
                    .schedule(Constant::new(STEP))
                    .jitter(Jitter::None)
                    .max_attempts(3)
                    .no_budget()
                    .circuit_breaker(breaker)
                    .build()
                    .unwrap()
            }))
            .service(Client::builder(TokioExecutor::new()).build_http());

        // Two requests of three 503s each open the down host's breaker.
        for _ in 0..2 {
            let response = svc.clone().oneshot(get(&down)).await.unwrap();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(down.requests(), 6);
        let error = svc.clone().oneshot(get(&down)).await.unwrap_err();
        assert!(error.is::<tower_backoff::error::BreakerOpen>(), "{error}");
        assert_eq!(down.requests(), 6, "rejected without a call");

        for _ in 0..50 {
            let response = svc.clone().oneshot(get(&up)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        assert_eq!(up.requests(), 50);
        let breakers = breakers.lock().unwrap();
        assert_eq!(breakers.len(), 2, "one breaker per host");
        assert_eq!(breakers[0].state(), BreakerState::Open);
        assert_eq!(breakers[1].state(), BreakerState::Closed);
    }
}

/// The `metrics` observer's breaker state and rejections.
#[cfg(feature = "metrics")]
#[test]
fn metrics_record_the_breaker_state_and_its_rejections() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;

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
                .max_attempts(1)
                .circuit_breaker(breaker(1))
                .build()
                .unwrap();
            let svc = layer.layer(Host::down().service());
            svc.clone().oneshot(0).await.unwrap_err();
            svc.clone().oneshot(1).await.unwrap_err();
            svc.oneshot(2).await.unwrap_err();
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let read = |kind: MetricKind, name: &str| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            (key.kind() == kind && key.key().name() == name).then_some(value)
        })
    };
    assert_eq!(
        read(MetricKind::Gauge, "tower_backoff.breaker.state"),
        Some(&DebugValue::Gauge(1.0.into())),
        "open"
    );
    assert_eq!(
        read(MetricKind::Counter, "tower_backoff.breaker.rejections"),
        Some(&DebugValue::Counter(2))
    );
}

/// Requests one at a time through a one-attempt layer with a breaker of its
/// own, each answered at once by a host that fails it or not as told: how
/// the breaker's window counts is all that is tested.
struct Scripted {
    host: Host,
    breaker: CircuitBreaker,
    svc: BoxCloneService<u32, u32, tower_backoff::Error<io::Error>>,
}

impl Scripted {
    fn new(min_throughput: u32) -> Self {
        let host = Host::default();
        let breaker = breaker(min_throughput);
        let layer = BackoffLayer::builder()
            .max_attempts(1)
            .circuit_breaker(breaker.clone())
            .build()
            .unwrap();
        let svc = BoxCloneService::new(layer.layer(host.service()));
        Self { host, breaker, svc }
    }

    /// Sends one request per outcome (`true`: the host fails it), `every`
    /// apart, the first at once. Returns the failure, counted from 1, at
    /// which the breaker opened, if it did; it then stops.
    async fn send(&self, outcomes: &[bool], every: Duration) -> Option<usize> {
        let mut failures = 0;
        for (n, &fail) in outcomes.iter().enumerate() {
            if n > 0 {
                tokio::time::sleep(every).await;
            }
            self.host.set_down(fail);
            let result = self.svc.clone().oneshot(n as u32).await;
            assert_eq!(result.is_err(), fail, "request {n} went out");
            failures += usize::from(fail);
            if self.breaker.state() == BreakerState::Open {
                return Some(failures);
            }
        }
        None
    }
}

/// `successes` successes, then `failures` failures.
fn successes_then_failures(successes: usize, failures: usize) -> Vec<bool> {
    let mut outcomes = vec![false; successes];
    outcomes.extend(std::iter::repeat_n(true, failures));
    outcomes
}

/// Waits until `at` after `start`, on the paused clock.
async fn until(start: tokio::time::Instant, at: Duration) {
    tokio::time::sleep_until(start + at).await;
}

const QUIET: Duration = Duration::from_secs(60);
const EVERY: Duration = Duration::from_millis(200);

#[tokio::test(start_paused = true)]
async fn thirty_successes_and_twenty_failures_after_a_quiet_spell_keep_it_closed() {
    // Issue 40, defect 3: 40 % of 50 attempts within the window, the
    // successes first, after a minute with no traffic.
    let start = tokio::time::Instant::now();
    let script = Scripted::new(20);
    assert_eq!(script.send(&[false; 10], EVERY).await, None);
    until(start, QUIET).await;
    // 50 attempts 200 ms apart: from 60.0 s to 69.8 s, all in the window.
    let opened = script.send(&successes_then_failures(30, 20), EVERY).await;
    assert_eq!(
        opened,
        None,
        "opened at failure {opened:?}, window {:?}",
        script.breaker.window()
    );
    assert_eq!(script.breaker.window(), (50, 20));
}

#[tokio::test(start_paused = true)]
async fn half_of_at_least_the_minimum_within_the_window_opens_it_not_before() {
    for (successes, failures) in [(10, 10), (15, 15), (30, 30)] {
        let start = tokio::time::Instant::now();
        let script = Scripted::new(20);
        until(start, QUIET).await;
        // At most 60 attempts 150 ms apart: within 8.85 s.
        let opened = script
            .send(
                &successes_then_failures(successes, failures),
                Duration::from_millis(150),
            )
            .await;
        assert_eq!(
            opened,
            Some(failures),
            "{successes} successes and {failures} failures"
        );
        assert_eq!(
            script.breaker.window(),
            (successes as u64 + failures as u64, failures as u64)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn below_half_within_the_window_it_stays_closed() {
    // 19 failures of 39 attempts, just under half; and half of 18, under
    // the minimum.
    for (successes, failures) in [(20, 19), (9, 9)] {
        let start = tokio::time::Instant::now();
        let script = Scripted::new(20);
        until(start, QUIET).await;
        let outcomes = successes_then_failures(successes, failures);
        assert_eq!(script.send(&outcomes, EVERY).await, None);
    }
}

#[tokio::test(start_paused = true)]
async fn a_window_that_has_fully_passed_forgets_everything() {
    let start = tokio::time::Instant::now();
    let script = Scripted::new(20);
    let mut outcomes = vec![false; 30];
    outcomes.extend([true; 19]);
    // All at 0 s, in the window's first second.
    assert_eq!(script.send(&outcomes, Duration::ZERO).await, None);
    until(start, Duration::from_millis(9_999)).await;
    assert_eq!(script.breaker.window(), (49, 19), "the tenth second");
    until(start, Duration::from_secs(10)).await;
    assert_eq!(script.breaker.window(), (0, 0), "ten seconds on");
    // Nothing of it is left to open it: 19 failures more, alone.
    assert_eq!(script.send(&[true; 19], Duration::ZERO).await, None);
    assert_eq!(script.breaker.window(), (19, 19));
}

#[tokio::test(start_paused = true)]
async fn a_window_partly_passed_forgets_exactly_its_expired_seconds() {
    let start = tokio::time::Instant::now();
    let script = Scripted::new(1_000);
    // Second k (0 to 9): k + 1 successes and one failure.
    let mut attempts = Vec::new();
    for k in 0..10u64 {
        until(start, Duration::from_secs(k)).await;
        let mut outcomes = vec![false; k as usize + 1];
        outcomes.push(true);
        script.send(&outcomes, Duration::ZERO).await;
        attempts.push(k + 2);
    }
    assert_eq!(script.breaker.window(), (65, 10));
    for expired in 1..=10 {
        // Second `expired - 1` has just left the window.
        let left = |expired: usize| attempts[expired..].iter().sum::<u64>();
        let at = Duration::from_secs(9 + expired as u64);
        until(start, at - Duration::from_millis(1)).await;
        assert_eq!(
            script.breaker.window(),
            (left(expired - 1), 11 - expired as u64),
            "just before {at:?}"
        );
        until(start, at).await;
        assert_eq!(
            script.breaker.window(),
            (left(expired), 10 - expired as u64),
            "at {at:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn successes_after_a_quiet_spell_are_counted_until_their_own_second_leaves() {
    // The successes before a quiet spell and those after it are placed
    // each in their own second: the old ones long gone, the new ones all
    // there until ten seconds after they came.
    let start = tokio::time::Instant::now();
    let script = Scripted::new(1_000);
    script.send(&[false; 5], Duration::ZERO).await;
    until(start, QUIET).await;
    script.send(&[false; 3], Duration::ZERO).await;
    until(start, QUIET + Duration::from_secs(9)).await;
    script.send(&[true], Duration::ZERO).await;
    assert_eq!(script.breaker.window(), (4, 1));
    until(start, QUIET + Duration::from_secs(10)).await;
    assert_eq!(script.breaker.window(), (1, 1), "the three have left");
}
