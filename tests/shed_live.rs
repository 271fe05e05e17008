//! The server half over loopback, bounded in count and time: a hyper server
//! behind `ShedLayer`, at most 1,000 concurrent client tasks through
//! `HttpRetryLayer` at about twice its measured capacity for 20 s; and a
//! tonic server behind it whose pushback a `GrpcRetryLayer` client honours.
#![cfg(all(feature = "shed", feature = "grpc"))]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_backoff::http::HttpRetryLayer;
use tower_backoff::shed::{Limiter, Priority, ShedLayer};

/// Work slots of the server and the time each request holds one: a
/// capacity of about 200 requests a second, low enough that the client
/// tasks, on the same two cores, are not the bottleneck.
const SLOTS: usize = 4;
const WORK: Duration = Duration::from_millis(20);

async fn serve_http(layer: ShedLayer) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let slots = Arc::new(Semaphore::new(SLOTS));
    let handler = service_fn(move |_req: Request<Incoming>| {
        let slots = slots.clone();
        async move {
            let _slot = slots.acquire().await.unwrap();
            tokio::time::sleep(WORK).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let service = ServiceBuilder::new().layer(layer).service(handler);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_twice_capacity_goodput_stays_near_capacity_and_every_request_is_answered() {
    let layer = ShedLayer::builder().build().unwrap();
    let limiter = layer.limiter().clone();
    let addr = serve_http(layer).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("http://{addr}/");
    let get = move || {
        Request::get(url.as_str())
            .body(Full::new(Bytes::new()))
            .unwrap()
    };

    // Capacity, measured: 2 s of a closed loop that keeps every slot busy.
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(2);
    let loops: Vec<_> = (0..SLOTS * 2)
        .map(|_| {
            let (client, get, done) = (client.clone(), get.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let response = client.request(get()).await.unwrap();
                    if response.status() == StatusCode::OK {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for l in loops {
        l.await.unwrap();
    }
    let capacity = done.load(Ordering::Relaxed) as f64 / 2.0;

    // Twice that for 20 s, open loop, through the client half's defaults.
    let retrying = HttpRetryLayer::builder().build().unwrap().layer(client);
    let tasks = Arc::new(Semaphore::new(1_000));
    let (sent, ok, shed, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    // Goodput is counted while the load is offered: the retries of requests
    // shed near the end finish during a drain of up to a few `Retry-After`
    // seconds in which the server idles, which says nothing of overload.
    let ok_in_window = Arc::new(AtomicU64::new(0));
    let rate = 2.0 * capacity;
    let started = Instant::now();
    let length = Duration::from_secs(20);
    let mut handles = Vec::new();
    let mut n = 0u64;
    while started.elapsed() < length {
        let due = started + Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        n += 1;
        let permit = tasks.clone().acquire_owned().await.unwrap();
        let (svc, get) = (retrying.clone(), get.clone());
        let (ok, shed, errors) = (ok.clone(), shed.clone(), errors.clone());
        let ok_in_window = ok_in_window.clone();
        sent.fetch_add(1, Ordering::Relaxed);
        handles.push(tokio::spawn(async move {
            let _permit = permit;
            match svc.oneshot(get()).await {
                Ok(response) if response.status() == StatusCode::OK => {
                    if started.elapsed() < length {
                        ok_in_window.fetch_add(1, Ordering::Relaxed);
                    }
                    ok.fetch_add(1, Ordering::Relaxed)
                }
                Ok(_) => shed.fetch_add(1, Ordering::Relaxed),
                Err(_) => errors.fetch_add(1, Ordering::Relaxed),
            };
        }));
    }
    let offered = n as f64 / started.elapsed().as_secs_f64();
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (sent, ok, shed, errors) = (
        sent.load(Ordering::Relaxed),
        ok.load(Ordering::Relaxed),
        shed.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    let goodput = ok_in_window.load(Ordering::Relaxed) as f64 / length.as_secs_f64();
    println!(
        "capacity {capacity:.0}/s, offered {offered:.0}/s; {sent} requests: {ok} ok, {shed} shed in the end, {errors} errors; goodput over the {} s of load {goodput:.0}/s = {:.1} % of capacity ({:.0}/s over the {elapsed:.1} s to the last answer); limit at the end {}",
        length.as_secs(),
        100.0 * goodput / capacity,
        ok as f64 / elapsed,
        limiter.limit()
    );
    assert_eq!(ok + shed + errors, sent, "every request answered");
    assert_eq!(errors, 0);
    assert!(goodput >= 0.9 * capacity, "goodput {goodput} of {capacity}");
}

#[tokio::test]
async fn a_tonic_server_behind_the_layer_pushes_back_and_the_grpc_client_waits() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tower_backoff::grpc::{GrpcRetryLayer, ServiceConfig};

    // One place, taken by hand: the first call is shed.
    let limiter = Limiter::builder()
        .initial_limit(1)
        .min_limit(1)
        .max_limit(1)
        .seed(3)
        .build()
        .unwrap();
    let held = limiter
        .try_acquire(Priority::HIGHEST, Instant::now())
        .unwrap();
    let layer = ShedLayer::builder()
        .shared_limiter(limiter.clone())
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let router = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(health);
    tokio::spawn(async move {
        let _reporter = _reporter;
        router.serve_with_incoming(incoming).await.unwrap();
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let mut client = HealthClient::new(GrpcRetryLayer::new(&config).unwrap().layer(channel));
    let freed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(held);
    });
    let started = Instant::now();
    let answer = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    let waited = started.elapsed();
    freed.await.unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    // The schedule alone would have retried after 10 ms, into the held
    // place; the pushback (1 to 3 s) kept the client away until it was free.
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited < Duration::from_millis(3_500), "{waited:?}");
}
