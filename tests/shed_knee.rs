//! Under overload the limit settles at the server's knee (issue 52): the
//! admitted p99 stays within twice the unloaded one, with a knee of 2 as of
//! 20, and a server whose efficiency falls past its knee keeps 95 % of its
//! capacity at twice and four times it.
//!
//! `ShedLayer` with its defaults in front of a handler on tokio's paused
//! clock, open loop (Poisson arrivals, seeded) with a 2 s client timeout as
//! a load generator has: 10 s at half the capacity, then 60 s at the load;
//! measured over its last 50 s. The real-load benchmark
//! (`benches/shed_load.sh`) runs the same two servers over sockets.
//!
//! `cargo test --all-features --test suite shed_knee:: -- --nocapture` prints the
//! numbers.
#![cfg(feature = "shed")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::shed::{Limiter, ShedLayer};
use tower_backoff::Rng;

/// A request's work at full speed.
const WORK: Duration = Duration::from_millis(100);
/// A client gives up on a request after this long.
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Model {
    /// `knee` workers; beyond them requests wait their turn.
    Queue,
    /// `knee` workers, each slower by 1.5 % for every request held past
    /// the knee (contention): throughput falls as concurrency grows.
    Thrash,
}

#[derive(Debug)]
struct Report {
    goodput: f64,
    unloaded_p99: Duration,
    loaded_p99: Duration,
    mean_limit: f64,
    /// Requests in flight, on average over the arrivals.
    mean_in_flight: f64,
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort_unstable();
    latencies
        .get(latencies.len() * 99 / 100)
        .copied()
        .unwrap_or_default()
}

async fn run(model: Model, knee: usize, load: f64, seed: u64) -> Report {
    let layer = ShedLayer::builder()
        .limiter(Limiter::builder().min_limit(1).seed(seed))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let workers = Arc::new(Semaphore::new(knee));
    let held = Arc::new(AtomicUsize::new(0));
    let server = layer.layer(service_fn(move |_req: Request<Full<Bytes>>| {
        let (workers, held) = (workers.clone(), held.clone());
        async move {
            let n = held.fetch_add(1, Ordering::Relaxed) + 1;
            let worker = workers.acquire().await.unwrap();
            let work = match model {
                Model::Queue => WORK,
                Model::Thrash => WORK.mul_f64(1.015f64.powi(n.saturating_sub(knee) as i32)),
            };
            tokio::time::sleep(work).await;
            drop(worker);
            held.fetch_sub(1, Ordering::Relaxed);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    }));
    let capacity = knee as f64 / WORK.as_secs_f64();
    let calm = Duration::from_secs(10);
    let length = calm + Duration::from_secs(60);
    let measured = calm + Duration::from_secs(10)..length;
    // (sent at, latency, finished at) of every request served in time.
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut limits = Vec::new();
    let mut in_flight = Vec::new();
    let mut rng = Rng::stream(seed, 0x52);
    let start = Instant::now();
    let mut next = start;
    let mut tasks = Vec::new();
    loop {
        let since = next - start;
        let rate = capacity * if since < calm { 0.5 } else { load };
        next += Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / rate);
        if next >= start + length {
            break;
        }
        tokio::time::sleep_until(next).await;
        if measured.contains(&since) {
            limits.push(limiter.limit());
            in_flight.push(limiter.in_flight());
        }
        let (server, served) = (server.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let answer = tokio::time::timeout(TIMEOUT, async move {
                let response = server
                    .oneshot(Request::new(Full::new(Bytes::new())))
                    .await
                    .unwrap();
                let status = response.status();
                response.into_body().collect().await.unwrap();
                status
            })
            .await;
            if answer == Ok(StatusCode::OK) {
                let done = Instant::now();
                served
                    .lock()
                    .unwrap()
                    .push((sent - start, done - sent, done - start));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let served = served.lock().unwrap();
    let in_time = served
        .iter()
        .filter(|(_, _, done)| measured.contains(done))
        .count();
    let window = (measured.end - measured.start).as_secs_f64();
    let latencies = |range: std::ops::Range<Duration>| {
        served
            .iter()
            .filter(|(sent, _, _)| range.contains(sent))
            .map(|(_, latency, _)| *latency)
            .collect::<Vec<_>>()
    };
    Report {
        goodput: in_time as f64 / window / capacity,
        unloaded_p99: p99(latencies(Duration::from_secs(2)..calm)),
        loaded_p99: p99(latencies(measured.clone())),
        mean_limit: limits.iter().sum::<usize>() as f64 / limits.len().max(1) as f64,
        mean_in_flight: in_flight.iter().sum::<usize>() as f64 / in_flight.len().max(1) as f64,
    }
}

#[tokio::test(start_paused = true)]
async fn at_twice_capacity_the_admitted_p99_stays_within_twice_the_unloaded_knee_2_and_20() {
    for knee in [2, 20] {
        for seed in 1..=2 {
            let report = run(Model::Queue, knee, 2.0, seed).await;
            println!(
                "queue, knee {knee}, 2x, seed {seed}: goodput {:.1} %, p99 {:?} unloaded, {:?} admitted at 2x; limit {:.1}, in flight {:.1} on average",
                report.goodput * 100.0,
                report.unloaded_p99,
                report.loaded_p99,
                report.mean_limit,
                report.mean_in_flight
            );
            assert!(
                report.loaded_p99 <= report.unloaded_p99 * 2,
                "knee {knee}: {report:?}"
            );
            // At a knee of 2 a worker freed waits for the next arrival (a
            // quarter of a request's time at twice the capacity): no
            // limit that keeps no queue can give more.
            assert!(report.goodput >= 0.8, "knee {knee}: {report:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_thrashing_server_keeps_95_percent_at_twice_and_four_times_and_admits_about_its_knee() {
    for load in [2.0, 4.0] {
        for seed in 1..=2 {
            let report = run(Model::Thrash, 20, load, seed).await;
            println!(
                "thrash, knee 20, {load}x, seed {seed}: goodput {:.1} %, p99 {:?} unloaded, {:?} admitted; limit {:.1}, in flight {:.1} on average",
                report.goodput * 100.0,
                report.unloaded_p99,
                report.loaded_p99,
                report.mean_limit,
                report.mean_in_flight
            );
            assert!(report.goodput >= 0.95, "{load}x: {report:?}");
            // Default traffic fills 90 % of the limit (`shares`).
            assert!(report.mean_in_flight <= 20.0 * 1.15, "{load}x: {report:?}");
        }
    }
}
