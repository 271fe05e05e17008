//! Deadlines: each attempt gets at most `min(attempt timeout, time left)`, a
//! hung attempt is cut short and retried, and callers set limits per request.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::Error;
use tower_backoff::{BackoffLayer, Constant, Jitter};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Hangs on the calls `hang` says, else fails with `Err(call number)` until
/// call `succeed_at`, recording when each call came in.
fn scripted(
    hang: fn(u32) -> bool,
    succeed_at: u32,
    calls: Arc<Mutex<Vec<Instant>>>,
) -> impl Service<(), Response = u32, Error = u32, Future = impl Send> + Clone {
    service_fn(move |()| {
        let n = {
            let mut calls = calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len() as u32
        };
        async move {
            if hang(n) {
                std::future::pending::<()>().await;
            }
            if n >= succeed_at {
                Ok(n)
            } else {
                Err(n)
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_hung_attempt_is_cut_short_at_the_attempt_timeout_and_retried() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .attempt_timeout(secs(1))
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, scripted(|n| n == 1, 2, calls.clone()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await.unwrap(), 2);
    assert_eq!(started.elapsed(), secs(1) + Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn the_last_attempt_gets_only_the_time_left_before_the_deadline() {
    // Attempts hang. 1: 0..1 s (its own 1 s limit); sleep 1 s; 2: 2..2.5 s,
    // cut at the 2.5 s deadline, though its own limit is 1 s.
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(secs(1)))
        .jitter(Jitter::None)
        .max_attempts(5)
        .attempt_timeout(secs(1))
        .max_elapsed(Duration::from_millis(2_500))
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let svc = tower::Layer::layer(&layer, scripted(|_| true, u32::MAX, calls.clone()));
    let started = Instant::now();
    let error = svc.oneshot(()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(2_500));
    assert_eq!(
        calls.lock().unwrap().len(),
        2,
        "no attempt starts without time left"
    );
    match error {
        Error::TimedOut(timed_out) => assert_eq!(timed_out.after(), Duration::from_millis(500)),
        Error::Inner(n) => panic!("expected a time-out, got Err({n})"),
        other => panic!("expected a time-out, got {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_untouched_with_attempt_timeouts() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .attempt_timeout(secs(1))
        .no_budget()
        .build()
        .unwrap();
    let svc = tower::Layer::layer(&layer, scripted(|_| false, u32::MAX, Arc::default()));
    let error = svc.oneshot(()).await.unwrap_err();
    assert!(!error.is_timeout());
    assert_eq!(error.into_inner(), Some(3));
}

#[test]
fn a_zero_attempt_timeout_is_refused_naming_the_field() {
    let error = BackoffLayer::builder()
        .attempt_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "attempt_timeout");
}

#[tokio::test(start_paused = true)]
async fn without_attempt_timeouts_the_error_type_is_the_inner_services() {
    let layer = BackoffLayer::builder().max_attempts(2).build().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = tower::Layer::layer(
        &layer,
        service_fn(move |()| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), std::io::Error>(std::io::Error::other("down")) }
        }),
    );
    // The type annotation is the test: no wrapper.
    let error: std::io::Error = svc.oneshot(()).await.unwrap_err();
    assert_eq!(error.to_string(), "down");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Ready for its first call, then never again (a `ConcurrencyLimit` whose
/// only permit a hung call holds); every call fails with its number.
#[derive(Clone, Default)]
struct ReadyOnce {
    calls: Arc<AtomicU32>,
}

impl Service<()> for ReadyOnce {
    type Response = ();
    type Error = u32;
    type Future = std::future::Ready<Result<(), u32>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), u32>> {
        if self.calls.load(Ordering::SeqCst) == 0 {
            std::task::Poll::Ready(Ok(()))
        } else {
            std::task::Poll::Pending
        }
    }

    fn call(&mut self, (): ()) -> Self::Future {
        std::future::ready(Err(self.calls.fetch_add(1, Ordering::SeqCst) + 1))
    }
}

/// Defect 2 of issue 28: a retry waiting for a service that never gets ready
/// still ends at the request's time limit, with the outcome it kept.
#[tokio::test(start_paused = true)]
async fn a_retry_waiting_for_readiness_ends_at_max_elapsed_with_the_kept_outcome() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .max_elapsed(secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(secs(30), layer.layer(ReadyOnce::default()).oneshot(()))
        .await
        .expect("ends at its time limit, not when the service is ready");
    assert_eq!(outcome, Err(1), "the first attempt's real error");
    let waited = started.elapsed();
    assert!(
        waited >= secs(1) && waited <= secs(1) + Duration::from_millis(1),
        "{waited:?}"
    );
}

#[cfg(feature = "hyper")]
use crate::http_server;

#[cfg(feature = "hyper")]
type HangingLayer = BackoffLayer<tower_backoff::http::HttpPolicy, tower_backoff::deadline::Guarded>;

/// 500 ms between attempts, 30 s an attempt, 2 s in all: a second attempt
/// that hangs is cut by the 2 s limit, not by its own.
#[cfg(feature = "hyper")]
fn cut_at_two_seconds() -> HangingLayer {
    BackoffLayer::builder()
        .policy(tower_backoff::http::HttpPolicy::new())
        .schedule(Constant::new(Duration::from_millis(500)))
        .jitter(Jitter::None)
        .attempt_timeout(secs(30))
        .max_elapsed(secs(2))
        .build()
        .unwrap()
}

/// The caller got its answer when the 2 s limit ran out, not later.
#[cfg(feature = "hyper")]
fn assert_waited_two_seconds(started: Instant) {
    let waited = started.elapsed();
    assert!(
        waited >= secs(2) && waited < secs(2) + Duration::from_millis(50),
        "{waited:?}"
    );
}

#[cfg(feature = "hyper")]
mod over_http {
    use super::*;
    use ::http::{Request, StatusCode};
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_backoff::http::{HttpPolicy, HttpRetryLayer, RetryInfo};
    use tower_backoff::RetryLimits;

    use super::http_server::{status, Reply, Server};

    fn get(server: &Server, limits: Option<RetryLimits>) -> Request<Full<Bytes>> {
        let mut request = Request::get(server.url("/"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Some(limits) = limits {
            request.extensions_mut().insert(limits);
        }
        request
    }

    fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
        Client::builder(TokioExecutor::new()).build_http()
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_second_attempt_is_cut_short_by_the_deadline_over_hyper() {
        // 503, then the server hangs: the retry is cut at the 2 s deadline
        // and the caller learns it timed out.
        let server = Server::start(|n, _| if n == 0 { status(503) } else { Reply::Hang }).await;
        let layer = cut_at_two_seconds();
        let svc = tower::Layer::layer(&HttpRetryLayer::from(layer), client());
        let started = Instant::now();
        let error = svc.oneshot(get(&server, None)).await.unwrap_err();
        assert!(error.is::<tower_backoff::error::TimedOut>(), "{error}");
        assert_eq!(server.requests(), 2);
        assert_waited_two_seconds(started);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_attempt_is_retried_as_a_timeout_and_the_retry_answers() {
        let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .attempt_timeout(secs(1))
            .no_budget()
            .build()
            .unwrap();
        let svc = tower::Layer::layer(&HttpRetryLayer::from(layer), client());
        let response = svc.oneshot(get(&server, None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let info = response.extensions().get::<RetryInfo>().copied().unwrap();
        assert_eq!(info.attempts, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn per_request_limits_override_the_layers_for_that_request_only() {
        let server = Server::start(|_, _| status(503)).await;
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .max_attempts(3)
            .no_budget()
            .build()
            .unwrap();
        let svc = tower::Layer::layer(&HttpRetryLayer::from(layer), client());
        let attempts = |response: &::http::Response<
            tower_backoff::http::BufferedBody<hyper::body::Incoming>,
        >| { response.extensions().get::<RetryInfo>().unwrap().attempts };

        let once = svc
            .clone()
            .oneshot(get(&server, Some(RetryLimits::no_retries())));
        assert_eq!(attempts(&once.await.unwrap()), 1);
        let more = svc
            .clone()
            .oneshot(get(&server, Some(RetryLimits::new().max_attempts(5))));
        assert_eq!(attempts(&more.await.unwrap()), 5);
        let plain = svc.clone().oneshot(get(&server, None));
        assert_eq!(attempts(&plain.await.unwrap()), 3);
        // 250 ms: attempts at 0, 100 and 200 ms; a retry at 300 ms would
        // end past it.
        let limits = RetryLimits::new()
            .max_attempts(10)
            .timeout(Duration::from_millis(250));
        let hurried = svc.clone().oneshot(get(&server, Some(limits)));
        assert_eq!(attempts(&hurried.await.unwrap()), 3);
        assert_eq!(server.requests(), 1 + 5 + 3 + 3);
    }
}

#[cfg(feature = "reqwest")]
mod over_reqwest {
    use super::http_server::{status, Reply, Server};
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hanging_second_attempt_is_cut_short_by_the_deadline_over_reqwest() {
        let server = Server::start(|n, _| if n == 0 { status(503) } else { Reply::Hang }).await;
        let layer = cut_at_two_seconds();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let svc = tower::Layer::layer(&layer, client);
        let request = reqwest::Request::new(reqwest::Method::GET, server.url("/").parse().unwrap());
        let started = Instant::now();
        let error = svc.oneshot(request).await.unwrap_err();
        assert!(error.is_timeout(), "{error}");
        assert_eq!(server.requests(), 2);
        assert_waited_two_seconds(started);
    }
}
