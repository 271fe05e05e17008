//! Adaptive pacing through real tower layers: against a real hyper server that
//! throttles above a rate, and against scripted services for exact counts.
//! Tokio's clock is paused: time moves only when every task waits on a timer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::{
    classify_fn, AdaptivePacing, BackoffLayer, Cause, Constant, Decision, Exponential, Jitter,
    PacingMetrics, Stats,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A store that answers 429 to every request past `limit` in the same second,
/// while `throttling` is on.
struct Store {
    limit: u64,
    throttling: AtomicBool,
    started: Instant,
    this_second: Mutex<(u64, u64)>,
    ok: AtomicU64,
    throttled: AtomicU64,
    /// Every answer, in order: true for a 429.
    log: Mutex<Vec<bool>>,
}

impl Store {
    fn answer(&self) -> StatusCode {
        let second = self.started.elapsed().as_secs();
        let over_limit = {
            let mut window = self.this_second.lock().unwrap();
            if window.0 != second {
                *window = (second, 0);
            }
            window.1 += 1;
            window.1 > self.limit
        };
        let throttle = over_limit && self.throttling.load(Ordering::Relaxed);
        self.log.lock().unwrap().push(throttle);
        if throttle {
            self.throttled.fetch_add(1, Ordering::Relaxed);
            StatusCode::TOO_MANY_REQUESTS
        } else {
            self.ok.fetch_add(1, Ordering::Relaxed);
            StatusCode::OK
        }
    }
}

async fn serve(store: Arc<Store>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Stops with the test's runtime.
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let store = store.clone();
            let answer = hyper::service::service_fn(move |_request| {
                let status = store.answer();
                async move {
                    let mut response = http::Response::new(Empty::<Bytes>::new());
                    *response.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), answer),
            );
        }
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn pacing_rises_under_throttling_recovers_then_decays_to_zero() {
    const WORKERS: u64 = 4;
    const THROTTLED_JOBS: u64 = 60; // per worker, while the store throttles

    let store = Arc::new(Store {
        limit: 8,
        throttling: AtomicBool::new(true),
        started: Instant::now(),
        this_second: Mutex::new((0, 0)),
        ok: AtomicU64::new(0),
        throttled: AtomicU64::new(0),
        log: Mutex::new(Vec::new()),
    });
    let addr = serve(store.clone()).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: http::Uri = format!("http://{addr}/write").parse().unwrap();

    let pacing = AdaptivePacing::new(); // the defaults: 500 ms, ×1.5, ×0.9 per 10
    let stats = Stats::new();
    let retries_seen = Arc::new(AtomicU64::new(0));
    let hook_count = retries_seen.clone();
    let peak = Arc::new(AtomicU64::new(0));
    let layer = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &u64, result: &Result<StatusCode, BoxError>| match result {
                Ok(status) if status.is_success() => Decision::Success,
                Ok(status) if *status == StatusCode::TOO_MANY_REQUESTS => {
                    Decision::retry().because(Cause::Throttled)
                }
                Ok(_) => Decision::Fail,
                Err(_) => Decision::retry(),
            },
        ))
        .on_retry(
            move |_: &u64, _: u32, _: Duration, result: &Result<StatusCode, BoxError>| {
                assert_eq!(result.as_ref().ok(), Some(&StatusCode::TOO_MANY_REQUESTS));
                hook_count.fetch_add(1, Ordering::Relaxed);
            },
        )
        .max_attempts(20) // every job gets through in the end
        .schedule(Exponential::new(Duration::from_millis(50)))
        .seed(7)
        .pacing(pacing.clone())
        .stats(stats.clone())
        .build()
        .unwrap();
    let write = {
        let (pacing, peak) = (pacing.clone(), peak.clone());
        service_fn(move |_job: u64| {
            peak.fetch_max(pacing.interval().as_nanos() as u64, Ordering::Relaxed);
            let request = client.get(uri.clone());
            async move {
                let response = request.await?;
                let status = response.status();
                response.into_body().collect().await?;
                Ok::<_, BoxError>(status)
            }
        })
    };
    let service = layer.layer(write);

    let run = |jobs: u64, until_unpaced: bool| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (mut service, pacing) = (service.clone(), pacing.clone());
                tokio::spawn(async move {
                    for job in 0..jobs {
                        if until_unpaced && pacing.interval().is_zero() {
                            return job;
                        }
                        let status = service.ready().await.unwrap().call(job).await.unwrap();
                        assert_eq!(status, StatusCode::OK);
                    }
                    jobs
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut done = 0;
            for worker in workers {
                done += worker.await.unwrap();
            }
            done
        }
    };

    // The store throttles: the interval rises, and writes get through again.
    let mut jobs = run(THROTTLED_JOBS, false).await;
    let throttled = pacing.metrics();
    let log = store.log.lock().unwrap().clone();
    let picture: String = log.iter().map(|&t| if t { 'X' } else { '.' }).collect();
    let success_rate =
        |answers: &[bool]| answers.iter().filter(|&&t| !t).count() as f64 / answers.len() as f64;
    // At first every worker writes at once and many are throttled; paced, the
    // writes get through again, with only brief throttling as the interval
    // probes back down.
    let (early, late) = (
        success_rate(&log[..20]),
        success_rate(&log[log.len() - 120..]),
    );
    assert!(early < 0.75, "early success rate {early}: {picture}");
    assert!(late >= 0.85, "late success rate {late}: {picture}");
    let peak = Duration::from_nanos(peak.load(Ordering::Relaxed));
    assert!(peak >= Duration::from_millis(500), "peak interval {peak:?}");
    assert!(throttled.raised >= 1);

    // The store recovers: with no more throttling the interval decays to zero.
    store.throttling.store(false, Ordering::Relaxed);
    let throttled_before = store.throttled.load(Ordering::Relaxed);
    jobs += run(500, true).await;
    assert_eq!(pacing.interval(), Duration::ZERO);
    assert_eq!(store.throttled.load(Ordering::Relaxed), throttled_before);

    // The counters match what the store saw.
    let seen = stats.snapshot();
    let (ok, throttled) = (
        store.ok.load(Ordering::Relaxed),
        store.throttled.load(Ordering::Relaxed),
    );
    assert_eq!(seen.requests, jobs);
    assert_eq!(seen.successes, jobs);
    assert_eq!(ok, jobs);
    assert_eq!(seen.attempts, ok + throttled);
    assert_eq!(seen.retries, throttled);
    assert_eq!(retries_seen.load(Ordering::Relaxed), throttled);
    let metrics = pacing.metrics();
    assert!((1..=throttled).contains(&metrics.raised));
    assert!(metrics.lowered >= 1);
    assert!(metrics.sleeps >= 1 && metrics.sleeps <= seen.attempts);
    assert!(metrics.slept >= peak);
}

/// Answers attempts from a script (`true` is a 429, then 200s) after
/// `latency`, and records when each attempt arrived.
fn scripted(
    script: Vec<bool>,
    latency: Duration,
    calls: Arc<Mutex<Vec<Duration>>>,
) -> impl Service<u32, Response = u16, Error = String, Future: Send> + Clone + Send {
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let started = Instant::now();
    service_fn(move |_: u32| {
        calls.lock().unwrap().push(started.elapsed());
        let throttle = script.lock().unwrap().pop_front().unwrap_or(false);
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok(if throttle { 429 } else { 200 })
        }
    })
}

fn status_policy() -> impl tower_backoff::Policy<u32, u16, String> + Clone + Send {
    classify_fn(|_: &u32, result: &Result<u16, String>| match result {
        Ok(429) => Decision::retry().because(Cause::Throttled),
        Ok(_) => Decision::Success,
        Err(_) => Decision::Fail,
    })
}

#[tokio::test(start_paused = true)]
async fn pacing_counts_every_rise_fall_and_pause_exactly() {
    let pacing = AdaptivePacing::builder()
        .initial_interval(Duration::from_millis(100))
        .up_multiplier(2.0)
        .down_multiplier(0.5)
        .success_threshold(2)
        .randomization(0.0)
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let layer = BackoffLayer::builder()
        .policy(status_policy())
        .max_attempts(5)
        .schedule(Constant::new(Duration::from_millis(10)))
        .jitter(Jitter::None)
        .pacing(pacing.clone())
        .build()
        .unwrap();
    let script = vec![true, true, true]; // then successes
    let service = layer.layer(scripted(script, Duration::ZERO, calls.clone()));

    let started = Instant::now();
    for request in 0..7 {
        assert_eq!(service.clone().oneshot(request).await, Ok(200));
    }

    // Three 429s raise 0 → 100 → 200 → 400 ms; each pair of successes halves
    // it, 400 → 200 → 100 → 0 (50 ms is below the initial interval).
    let ms = Duration::from_millis;
    let metrics: PacingMetrics = pacing.metrics();
    assert_eq!(metrics.interval, Duration::ZERO);
    assert_eq!((metrics.raised, metrics.lowered), (3, 3));
    assert_eq!(metrics.sleeps, 8);
    assert_eq!(
        metrics.slept,
        ms(100 + 200 + 400 + 400 + 200 + 200 + 100 + 100)
    );
    // Retries wait their backoff, then the pause; first attempts the pause.
    let expected = [0, 110, 320, 730, 1130, 1330, 1530, 1630, 1730, 1730].map(ms);
    assert_eq!(*calls.lock().unwrap(), expected);
    assert_eq!(started.elapsed(), ms(1730));
}

#[tokio::test(start_paused = true)]
async fn throttled_burst_raises_the_interval_once() {
    let pacing = AdaptivePacing::builder()
        .initial_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let layer = BackoffLayer::builder()
        .policy(status_policy())
        .max_attempts(1)
        .pacing(pacing.clone())
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let service = layer.layer(scripted(
        vec![true; 10],
        Duration::from_millis(5),
        calls.clone(),
    ));
    // Ten requests go out together at interval zero and all come back 429.
    let burst: Vec<_> = (0..10).map(|r| service.clone().oneshot(r)).collect();
    for outcome in futures::future::join_all(burst).await {
        assert_eq!(outcome, Ok(429));
    }
    assert_eq!(*calls.lock().unwrap(), [Duration::ZERO; 10]);
    assert_eq!(pacing.metrics().raised, 1);
    assert_eq!(pacing.interval(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn reset_drops_the_interval_to_zero_immediately() {
    let pacing = AdaptivePacing::new();
    let layer = BackoffLayer::builder()
        .policy(status_policy())
        .max_attempts(1)
        .pacing(pacing.clone())
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let latency = Duration::from_millis(10);
    let script = vec![true, true, true]; // then 200s
    let mut service = layer.layer(scripted(script, latency, calls.clone()));
    assert_eq!(service.clone().oneshot(0).await, Ok(429));
    assert_eq!(service.clone().oneshot(1).await, Ok(429));
    assert_eq!(pacing.interval(), Duration::from_millis(750));

    // A request paces, goes out, and is in flight when the reset comes.
    let in_flight = tokio::spawn(service.clone().oneshot(2));
    for _ in 0..2000 {
        if calls.lock().unwrap().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(calls.lock().unwrap().len(), 3);
    pacing.reset();
    assert_eq!(pacing.interval(), Duration::ZERO);
    // Its 429 answers the old interval: it does not undo the reset.
    assert_eq!(in_flight.await.unwrap(), Ok(429));
    assert_eq!(pacing.interval(), Duration::ZERO);
    assert_eq!(pacing.metrics().raised, 2);

    // The next request goes straight to the inner service, inside `call`.
    let before = Instant::now();
    let future = service.ready().await.unwrap().call(3);
    assert_eq!(calls.lock().unwrap().len(), 4);
    assert_eq!(future.await, Ok(200));
    assert_eq!(
        before.elapsed(),
        latency,
        "no pause, only the service's latency"
    );
}

#[tokio::test(start_paused = true)]
async fn pause_is_randomized_within_the_factor_and_its_cap() {
    for (max_spread, low, high) in [
        (None, 700, 1300),
        (Some(Duration::from_millis(50)), 950, 1050),
    ] {
        let mut builder = AdaptivePacing::builder()
            .initial_interval(Duration::from_secs(1))
            .randomization(0.3)
            .success_threshold(1000);
        if let Some(spread) = max_spread {
            builder = builder.max_spread(spread);
        }
        let pacing = builder.build().unwrap();
        let layer = BackoffLayer::builder()
            .policy(status_policy())
            .max_attempts(1)
            .seed(3)
            .pacing(pacing.clone())
            .build()
            .unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let service = layer.layer(scripted(vec![true], Duration::ZERO, calls));
        assert_eq!(service.clone().oneshot(0).await, Ok(429));

        let mut pauses = Vec::new();
        for request in 1..=20 {
            let before = Instant::now();
            assert_eq!(service.clone().oneshot(request).await, Ok(200));
            pauses.push(before.elapsed());
        }
        for pause in &pauses {
            assert!(
                (Duration::from_millis(low)..=Duration::from_millis(high)).contains(pause),
                "{pause:?} outside {low}..={high} ms"
            );
        }
        pauses.dedup();
        assert!(pauses.len() > 10, "pauses are spread out: {pauses:?}");
    }
}

#[test]
fn pacing_rejects_settings_that_cannot_work() {
    let field =
        |builder: tower_backoff::AdaptivePacingBuilder| builder.build().unwrap_err().field();
    let b = AdaptivePacing::builder;
    assert_eq!(
        field(b().initial_interval(Duration::ZERO)),
        "initial_interval"
    );
    assert_eq!(
        field(b().initial_interval(Duration::from_secs(3600))),
        "initial_interval"
    );
    assert_eq!(field(b().up_multiplier(1.0)), "up_multiplier");
    assert_eq!(field(b().up_multiplier(f64::INFINITY)), "up_multiplier");
    assert_eq!(field(b().down_multiplier(1.0)), "down_multiplier");
    assert_eq!(field(b().down_multiplier(f64::NAN)), "down_multiplier");
    assert_eq!(field(b().success_threshold(0)), "success_threshold");
    assert_eq!(field(b().randomization(1.5)), "randomization");
    assert_eq!(
        field(b().max_interval(Duration::from_secs(400 * 24 * 3600))),
        "max_interval"
    );
}
