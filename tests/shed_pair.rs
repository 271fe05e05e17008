//! The two halves together, in process: what the client half's defaults do
//! with each answer of the server half.
#![cfg(all(feature = "shed", feature = "http"))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::http::{HttpPolicy, X_RETRY_ATTEMPT};
use tower_backoff::shed::{Criticality, Limiter, Priority, ShedLayer};
use tower_backoff::{BackoffLayer, Hedging};

type Body = Full<Bytes>;

fn get() -> Request<Body> {
    Request::get("http://server.test/")
        .body(Body::new(Bytes::new()))
        .unwrap()
}

/// A limiter of one place, held by hand while `hold` is.
fn one_place() -> Limiter {
    Limiter::builder()
        .initial_limit(1)
        .min_limit(1)
        .max_limit(1)
        .seed(5)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_shed_503_is_retried_after_its_spread_retry_after_not_sooner() {
    let limiter = one_place();
    let held = limiter
        .try_acquire(Priority::HIGHEST, Instant::now().into_std())
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let server = ShedLayer::builder()
        .shared_limiter(limiter.clone())
        .build()
        .unwrap()
        .layer(service_fn(move |_req: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Body::new(Bytes::new()))) }
        }));
    let client = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .build()
        .unwrap()
        .layer(server);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
    });
    let started = Instant::now();
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Sent once, shed without reaching the handler, retried after 1 to 3 s
    // (plus the client's upward jitter of at most 10 %).
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited <= Duration::from_millis(3_300), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn do_not_retry_ends_the_request_with_the_servers_answer() {
    // The drain is past max_drain at once: a zero bound and a backlog.
    let limiter = Limiter::builder()
        .initial_limit(1)
        .min_limit(1)
        .max_limit(1)
        .max_drain(Duration::ZERO)
        .seed(5)
        .build()
        .unwrap();
    let now = Instant::now().into_std();
    let held = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
    for _ in 0..50 {
        limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
    }
    drop(held);
    let busy = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
    busy.complete(now + Duration::from_millis(200));
    let _held = limiter
        .try_acquire(Priority::HIGHEST, now + Duration::from_millis(200))
        .unwrap();
    assert!(limiter.queue_time() > Duration::ZERO);
    let server = ShedLayer::builder()
        .shared_limiter(limiter.clone())
        .build()
        .unwrap()
        .layer(service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::new(Bytes::new())))
        }));
    let client = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .build()
        .unwrap()
        .layer(server);
    let started = Instant::now();
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert_eq!(started.elapsed(), Duration::ZERO, "no retry, no wait");
}

#[tokio::test(start_paused = true)]
async fn retries_and_hedges_reach_the_server_marked_and_rank_one_level_lower() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let calls = Arc::new(AtomicU32::new(0));
    let server = service_fn(move |req: Request<Body>| {
        log.lock()
            .unwrap()
            .push(Priority::from_headers(req.headers()));
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            // The first attempt is slow enough to be hedged.
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Ok::<_, Infallible>(Response::new(Body::new(Bytes::new())))
        }
    });
    let client = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .hedge(Hedging::after(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap()
        .layer(server);
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        [
            Priority::new(Criticality::Default, false),
            Priority::new(Criticality::Default, true)
        ],
        "the hedge is marked as a retry ({X_RETRY_ATTEMPT}) and shed first"
    );
}

#[cfg(feature = "grpc")]
#[test]
fn grpc_policys_defaults_wait_out_the_pushback_and_stop_on_a_negative_one() {
    use tower_backoff::grpc::GrpcPolicy;
    use tower_backoff::shed::{RESOURCE_EXHAUSTED, UNAVAILABLE};
    use tower_backoff::Decision;

    let limiter = one_place();
    let now = Instant::now().into_std();
    let _held = limiter.try_acquire(Priority::HIGHEST, now).unwrap();
    let rejection = limiter.try_acquire(Priority::HIGHEST, now).unwrap_err();
    let pushback = rejection.retry_after().unwrap();
    let policy = GrpcPolicy::new();
    let retry: Response<()> = rejection.grpc_response(UNAVAILABLE);
    match policy.classify_response(retry.status(), retry.headers()) {
        Decision::Retry { after, .. } => {
            let millis = Duration::from_millis(pushback.as_millis() as u64);
            assert_eq!(after, Some(millis));
        }
        other => panic!("{other:?}"),
    }
    // The same answer with a negative pushback, as the layer sends when the
    // backlog cannot drain: final, whatever the code.
    let mut stop: Response<()> = rejection.grpc_response(RESOURCE_EXHAUSTED);
    stop.headers_mut().insert(
        "grpc-retry-pushback-ms",
        http::HeaderValue::from_static("-1"),
    );
    assert_eq!(
        policy.classify_response(stop.status(), stop.headers()),
        Decision::Final
    );
    stop.headers_mut()
        .insert("grpc-status", http::HeaderValue::from(14u16));
    assert_eq!(
        policy.classify_response(stop.status(), stop.headers()),
        Decision::Final,
        "UNAVAILABLE with a negative pushback is final too"
    );
}
