//! The server half does no harm: a server that is slow but not overloaded
//! (latency that does not grow with concurrency) has none of its traffic
//! shed, whatever its latency distribution (issue 52, cases 1 to 4).
//!
//! Each case drives `ShedLayer` with its defaults, open loop (Poisson
//! arrivals, seeded), in front of a handler that takes the time the case
//! draws, on tokio's paused clock: minutes of traffic in about a second.
//! Every response body is read to its end, where the layer measures.
//!
//! `cargo test --all-features --test suite shed_healthy:: -- --nocapture` prints
//! each case's numbers.
#![cfg(feature = "shed")]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::shed::{Limiter, ShedLayer};
use tower_backoff::Rng;

/// What the handler does with one request: wait, then answer.
#[derive(Debug, Clone, Copy)]
struct Work {
    takes: Duration,
    status: StatusCode,
}

/// What a run measured after its warm-up.
#[derive(Debug)]
struct Shed {
    sent: u64,
    shed: u64,
    limit: usize,
    baseline: Option<Duration>,
    /// Requests shed in each 10 s from the start, and the limit at its end.
    per_10_s: Vec<(u64, usize)>,
}

impl Shed {
    fn share(&self) -> f64 {
        self.shed as f64 / self.sent.max(1) as f64
    }
}

/// Sends `rate` requests a second for `length`, each doing what `work`
/// draws for the time since the start; counts the requests sent and shed
/// from `warm_up` on.
async fn run(
    rate: f64,
    length: Duration,
    warm_up: Duration,
    seed: u64,
    work: impl Fn(&mut Rng, Duration) -> Work,
) -> Shed {
    let layer = ShedLayer::builder()
        .limiter(Limiter::builder().seed(seed))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let server = layer.layer(service_fn(|req: Request<Full<Bytes>>| async move {
        let work = *req.extensions().get::<Work>().unwrap();
        tokio::time::sleep(work.takes).await;
        let mut response = Response::new(Full::new(Bytes::from_static(b"done")));
        *response.status_mut() = work.status;
        Ok::<_, Infallible>(response)
    }));
    let counts = Arc::new(Mutex::new((0u64, 0u64)));
    let buckets = (length.as_secs() / 10 + 1) as usize;
    let per_10_s = Arc::new(Mutex::new(vec![(0u64, 0usize); buckets]));
    let mut rng = Rng::stream(seed, 52);
    let start = Instant::now();
    let mut next = start;
    let mut tasks = Vec::new();
    loop {
        next += Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / rate);
        if next >= start + length {
            break;
        }
        tokio::time::sleep_until(next).await;
        let since = next - start;
        per_10_s.lock().unwrap()[(since.as_secs() / 10) as usize].1 = limiter.limit();
        let mut request = Request::new(Full::new(Bytes::new()));
        request.extensions_mut().insert(work(&mut rng, since));
        let (server, counts, per_10_s) = (server.clone(), counts.clone(), per_10_s.clone());
        let counted = since >= warm_up;
        tasks.push(tokio::spawn(async move {
            let response = server.oneshot(request).await.unwrap();
            let shed = response.headers().contains_key("retry-after-ms")
                || response.headers().contains_key("x-should-retry");
            response.into_body().collect().await.unwrap();
            per_10_s.lock().unwrap()[(since.as_secs() / 10) as usize].0 += u64::from(shed);
            if counted {
                let mut counts = counts.lock().unwrap();
                counts.0 += 1;
                counts.1 += u64::from(shed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (sent, shed) = *counts.lock().unwrap();
    Shed {
        sent,
        shed,
        limit: limiter.limit(),
        baseline: limiter.baseline(),
        per_10_s: Arc::try_unwrap(per_10_s).unwrap().into_inner().unwrap(),
    }
}

fn report(case: &str, seed: u64, shed: &Shed) {
    let limits: Vec<usize> = shed.per_10_s.iter().map(|(_, limit)| *limit).collect();
    let shed_per_10_s: Vec<u64> = shed.per_10_s.iter().map(|(shed, _)| *shed).collect();
    println!(
        "{case}, seed {seed}: {} of {} shed after the first minute ({:.3} %); limit {} and baseline {:?} at the end; shed per 10 s {shed_per_10_s:?}; limit per 10 s {limits:?}",
        shed.shed,
        shed.sent,
        100.0 * shed.share(),
        shed.limit,
        shed.baseline,
    );
}

fn ok(takes: Duration) -> Work {
    Work {
        takes,
        status: StatusCode::OK,
    }
}

fn exponential(rng: &mut Rng, mean: Duration) -> Duration {
    mean.mul_f64(-(1.0 - rng.next_f64()).ln())
}

const MINUTE: Duration = Duration::from_secs(60);

fn seeds() -> std::ops::RangeInclusive<u64> {
    1..=3
}

#[tokio::test(start_paused = true)]
async fn case_1_exponential_work_times_are_not_shed() {
    for seed in seeds() {
        let shed = run(200.0, 3 * MINUTE, MINUTE, seed, |rng, _| {
            ok(exponential(rng, Duration::from_millis(50)))
        })
        .await;
        report("exponential", seed, &shed);
        assert!(shed.share() <= 0.01, "{shed:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn case_1_a_fast_and_a_slow_endpoint_mixed_are_not_shed() {
    for seed in seeds() {
        let shed = run(200.0, 3 * MINUTE, MINUTE, seed, |rng, _| {
            if rng.next_f64() < 0.5 {
                ok(exponential(rng, Duration::from_millis(5)))
            } else {
                ok(exponential(rng, Duration::from_millis(200)))
            }
        })
        .await;
        report("two endpoints", seed, &shed);
        assert!(shed.share() <= 0.01, "{shed:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn case_2_a_dependency_slowing_from_50_to_250_ms_is_not_overload() {
    for seed in seeds() {
        let shed = run(200.0, 5 * MINUTE, MINUTE, seed, |rng, since| {
            let mean = if since < MINUTE { 50 } else { 250 };
            ok(Duration::from_millis(mean).mul_f64(0.8 + 0.4 * rng.next_f64()))
        })
        .await;
        report("slower dependency", seed, &shed);
        assert!(shed.share() <= 0.01, "{shed:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn case_3_a_burst_of_fast_failures_teaches_nothing() {
    for seed in seeds() {
        let outage = MINUTE..MINUTE + Duration::from_secs(10);
        let shed = run(200.0, 3 * MINUTE, MINUTE, seed, |rng, since| {
            if outage.contains(&since) {
                Work {
                    takes: Duration::from_millis(1),
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                }
            } else {
                ok(exponential(rng, Duration::from_millis(50)))
            }
        })
        .await;
        report("fast failures", seed, &shed);
        assert!(shed.share() <= 0.01, "{shed:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn case_4_few_slow_requests_adapt_within_the_first_minute() {
    for seed in seeds() {
        let shed = run(10.0, 4 * MINUTE, MINUTE, seed, |rng, _| {
            ok(Duration::from_secs(3).mul_f64(0.9 + 0.2 * rng.next_f64()))
        })
        .await;
        report("10/s of 3 s", seed, &shed);
        assert!(shed.share() <= 0.01, "{shed:?}");
    }
}
