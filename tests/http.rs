//! The HTTP policy against a real hyper server on 127.0.0.1, through
//! hyper-util's client, on tokio's paused clock.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream;
use http::{Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{HttpPolicy, ReplayBody, RetryInfo, IDEMPOTENCY_KEY};
use tower_backoff::{BackoffLayer, Budget, Cause, Constant, Exponential};

use http_server::{
    counting, http_layer as layer, http_layer_with as layer_with, status, status_with, unused_addr,
    with_chunked_body, Reply, Server, STEP,
};

type Plain = Request<Full<Bytes>>;

fn client() -> Client<HttpConnector, Full<Bytes>> {
    client_for()
}

fn client_for<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url("/")).body(Full::default()).unwrap()
}

fn info<B>(response: &http::Response<B>) -> RetryInfo {
    *response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
}

/// Busy with `code` (and `headers`) at first, then 200.
fn busy_once(
    code: u16,
    headers: &'static [(&'static str, &'static str)],
) -> impl Fn(usize, &http_server::Seen) -> Reply {
    move |n, _| {
        if n == 0 {
            status_with(code, headers)
        } else {
            status(200)
        }
    }
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_503_and_returns_200() {
    let server = Server::start(busy_once(503, &[])).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_429_and_returns_200() {
    let server = Server::start(busy_once(429, &[])).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response).attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn post_on_503_is_sent_once_and_its_response_returned() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let request = Request::post(server.url("/orders"))
        .body(Full::from("buy 1"))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
    assert_eq!(info(&response), RetryInfo::new(1, Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_is_retried_with_the_same_key_and_body() {
    let server = Server::start(busy_once(503, &[])).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let request = Request::post(server.url("/orders"))
        .header(IDEMPOTENCY_KEY, "order-17")
        .body(Full::from("buy 1"))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for attempt in &seen {
        assert_eq!(attempt.method, Method::POST);
        assert_eq!(attempt.headers[&IDEMPOTENCY_KEY], "order-17");
        assert_eq!(attempt.body, "buy 1");
    }
}

#[tokio::test(start_paused = true)]
async fn put_and_delete_are_retried_without_a_key() {
    for method in [Method::PUT, Method::DELETE] {
        let server = Server::start(busy_once(502, &[])).await;
        let svc = ServiceBuilder::new()
            .layer(layer(HttpPolicy::new()))
            .service(client());
        let request = Request::builder()
            .method(method.clone())
            .uri(server.url("/item/1"))
            .body(Full::default())
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{method}");
        assert_eq!(server.requests(), 2, "{method}");
    }
}

#[tokio::test(start_paused = true)]
async fn status_500_is_final_by_default_and_retried_after_one_call() {
    let server = Server::start(busy_once(500, &[])).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(server.requests(), 1);

    let server = Server::start(busy_once(500, &[])).await;
    let policy = HttpPolicy::new().retry_status(StatusCode::INTERNAL_SERVER_ERROR);
    let svc = ServiceBuilder::new().layer(layer(policy)).service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn status_400_is_returned_at_once() {
    let server = Server::start(|_, _| status(400)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn persistent_503_returns_the_last_503_after_max_attempts() {
    let server =
        Server::start(|n, _| status_with(503, &[("x-attempt", ["0", "1", "2", "3"][n.min(3)])]))
            .await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["x-attempt"],
        "2",
        "the last real response"
    );
    assert_eq!(server.requests(), 3);
    assert_eq!(info(&response), RetryInfo::new(3, 2 * STEP));
}

// --- Retry-After -----------------------------------------------------------

/// Exponential from 100 ms, capped at `cap`, without jitter: the first retry
/// waits 100 ms unless the server says otherwise.
fn schedule(cap: Duration) -> Exponential {
    Exponential::new(STEP).max_delay(cap)
}

async fn wait_before_retry(retry_after: String, cap: Duration) -> (Duration, RetryInfo) {
    let server = Server::start(move |n, _| {
        if n == 0 {
            status_with(503, &[("retry-after", retry_after.as_str())])
        } else {
            status(200)
        }
    })
    .await;
    // Without the upward jitter on server delays, so delays are exact.
    let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
    let svc = ServiceBuilder::new()
        .layer(layer_with(policy, schedule(cap), 3, None))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    (seen[1].at - seen[0].at, info(&response))
}

#[tokio::test(start_paused = true)]
async fn retry_after_two_seconds_waits_two_seconds() {
    let (gap, info) = wait_before_retry("2".into(), Duration::from_secs(10)).await;
    assert_eq!(info.slept, Duration::from_secs(2));
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2050),
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds() {
    // The paused clock does not move `SystemTime`, so the date is computed by
    // the server when it answers, as a real server would. HTTP-dates have
    // whole seconds: "now + 2 s" truncated is between 1 and 2 s away.
    let server = Server::start(|n, _| {
        if n == 0 {
            let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
            status_with(503, &[("retry-after", date.as_str())])
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            // Without the upward jitter on server delays (up to 10 %), which
            // would take a date 1.9 s ahead past 2 s.
            HttpPolicy::new().server_delay_jitter(0, Duration::ZERO),
            schedule(Duration::from_secs(10)),
            3,
            None,
        ))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let slept = info(&response).slept;
    assert!(
        slept >= Duration::from_secs(1) && slept <= Duration::from_secs(2),
        "{slept:?}"
    );
    let seen = server.seen();
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_secs(1) && gap < Duration::from_millis(2050),
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_schedule_cap_is_honoured_not_cut_short() {
    let (gap, info) = wait_before_retry("30".into(), Duration::from_secs(1)).await;
    assert_eq!(info.slept, Duration::from_secs(30));
    assert!(gap >= Duration::from_secs(30), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn hostile_retry_after_values_fall_back_to_the_schedule() {
    let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(60));
    let hostile = [
        "-5".to_owned(),
        "abc".to_owned(),
        "9".repeat(10_000),
        past,
        "Thu, 01 Jan 1970 00:00:00 GMT".to_owned(),
    ];
    for value in hostile {
        let shown = value.chars().take(20).collect::<String>();
        let started = Instant::now();
        let (gap, info) = wait_before_retry(value, Duration::from_secs(1)).await;
        // The schedule's first delay, not the header's: nothing beyond the cap,
        // no stall, no panic.
        assert_eq!(info.slept, STEP, "{shown}");
        assert!(gap < STEP + Duration::from_millis(50), "{shown}: {gap:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{shown}");
    }
}

/// `Retry-After: 0` is "retry now" (RFC 9110), not "ask the next header"
/// (defect 5 of issue 28); and never sooner than the schedule's delay, so
/// that a server saying it to every client makes no tight loop (issue 50).
#[tokio::test(start_paused = true)]
async fn retry_after_zero_waits_the_schedules_delay_whatever_the_other_headers_say() {
    let server = Server::start(|n, _| {
        if n == 0 {
            status_with(503, &[("retry-after", "0"), ("x-ratelimit-reset", "30")])
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        info(&response),
        RetryInfo::new(2, Duration::from_millis(100))
    );
    let seen = server.seen();
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(100) && gap < Duration::from_millis(105),
        "{gap:?}: the schedule's 100 ms, not x-ratelimit-reset's 30 s"
    );
}

/// Sends one GET answered 502 with `headers`, then 200: the time slept
/// before the retry.
async fn slept_after_502_with(headers: &'static [(&'static str, &'static str)]) -> Duration {
    let server = Server::start(move |n, _| {
        if n == 0 {
            status_with(502, headers)
        } else {
            status(200)
        }
    })
    .await;
    let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
    let svc = ServiceBuilder::new().layer(layer(policy)).service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{headers:?}");
    info(&response).slept
}

/// Defect 5 of issue 28: a rate-limit reset is when the quota renews, a
/// delay only once the quota is spent. GitHub sends both headers on every
/// response, with thousands of requests left and a reset up to an hour away.
#[tokio::test(start_paused = true)]
async fn a_rate_limit_reset_is_a_delay_only_when_no_quota_is_left() {
    let quota_left = slept_after_502_with(&[
        ("x-ratelimit-remaining", "4999"),
        ("x-ratelimit-reset", "1800"),
        ("ratelimit-remaining", "12"),
        ("ratelimit-reset", "1800"),
    ])
    .await;
    assert_eq!(quota_left, STEP, "the schedule's delay, not 30 minutes");
    let spent =
        slept_after_502_with(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "3")]).await;
    assert_eq!(spent, Duration::from_secs(3));
    let spent =
        slept_after_502_with(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "2")]).await;
    assert_eq!(spent, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_time_left_returns_the_response_at_once() {
    let server = Server::start(|_, _| status_with(503, &[("retry-after", "10")])).await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            schedule(Duration::from_secs(60)),
            3,
            Some(Duration::from_secs(5)),
        ))
        .service(client());
    let started = Instant::now();
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "10");
    assert_eq!(server.requests(), 1);
    assert_eq!(info(&response), RetryInfo::new(1, Duration::ZERO));
    assert!(started.elapsed() < STEP, "no sleep at all");
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_cap_and_the_time_left_returns_the_response_at_once() {
    // The server asks for 60 s; the cap is 20 s and only 30 s are left: a
    // retry after 20 s would come before the server said it is ready.
    let server = Server::start(|_, _| status_with(503, &[("retry-after", "60")])).await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            schedule(Duration::from_secs(20)),
            3,
            Some(Duration::from_secs(30)),
        ))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
}

/// A budget that allows every retry and remembers the cause of each.
#[derive(Default)]
struct Causes(std::sync::Mutex<Vec<Cause>>);

impl Budget for Causes {
    fn try_retry(&self, cause: Cause) -> bool {
        self.0.lock().unwrap().push(cause);
        true
    }
}

#[tokio::test(start_paused = true)]
async fn throttling_and_timeouts_reach_the_budget_as_such() {
    let server = Server::start(|n, _| match n {
        0 => status(429),
        1 => status(503),
        2 => Reply::Hang,
        3 => status(502),
        _ => status(200),
    })
    .await;
    let causes = Arc::new(Causes::default());
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .max_attempts(5)
        .budget(causes.clone())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(1))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        *causes.0.lock().unwrap(),
        [
            Cause::Throttled,
            Cause::Throttled,
            Cause::Timeout,
            Cause::Transient
        ]
    );
}

// --- connection errors -----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn connection_refused_is_retried_until_the_server_starts() {
    let addr = unused_addr();
    // Up 500 ms from now; the retry comes 1 s after the refused attempt.
    let starting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Server::start_on(addr, |_, _| status(200)).await
    });
    let (count, attempts) = counting::<Plain>();
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            Constant::new(Duration::from_secs(1)),
            3,
            None,
        ))
        .map_request(count)
        .service(client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    let server = starting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(info(&response), RetryInfo::new(2, Duration::from_secs(1)));
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn connection_refused_every_time_returns_the_connect_error_after_every_attempt() {
    let addr = unused_addr();
    let (count, attempts) = counting::<Plain>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .map_request(count)
        .service(client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    let error = svc.oneshot(request).await.unwrap_err();
    assert!(client_error(&error).is_connect(), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
}

// --- streaming bodies --------------------------------------------------------

/// `chunks` frames of 1 KiB, each filled with its own index.
fn streaming(
    chunks: u8,
) -> (
    impl http_body::Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
    Bytes,
) {
    let frames: Vec<Bytes> = (0..chunks).map(|i| Bytes::from(vec![i; 1024])).collect();
    let whole = Bytes::from(frames.concat());
    let body = StreamBody::new(stream::iter(
        frames
            .into_iter()
            .map(|f| Ok::<_, Infallible>(Frame::data(f))),
    ));
    (body, whole)
}

#[tokio::test(start_paused = true)]
async fn streaming_body_under_the_limit_is_replayed_byte_identical() {
    let server = Server::start(busy_once(503, &[])).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client_for());
    let (body, whole) = streaming(16);
    let request = Request::put(server.url("/upload"))
        .body(ReplayBody::new(body))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, whole);
    assert_eq!(seen[1].body, whole);
}

#[tokio::test(start_paused = true)]
async fn streaming_body_is_replayed_byte_identical_up_to_the_last_attempt() {
    // The last attempt gets a fresh copy of the recording too: the kept one
    // is older than the copies sent since, and may no longer be sent.
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client_for());
    let (body, whole) = streaming(16);
    let request = Request::put(server.url("/upload"))
        .body(ReplayBody::new(body))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).attempts, 3);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|attempt| attempt.body == whole));
}

#[tokio::test(start_paused = true)]
async fn streaming_body_over_the_limit_goes_out_once() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client_for());
    let (body, whole) = streaming(16);
    let request = Request::put(server.url("/upload"))
        .body(ReplayBody::with_limit(body, 4 * 1024))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(info(&response).attempts, 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, whole, "the one attempt is sent whole");
}

// --- extensions and connections --------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_first_attempt_success_carries_retry_info_too() {
    let server = Server::start(|_, _| status(200)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(info(&response), RetryInfo::new(1, Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn without_retry_info_responses_carry_none() {
    let server = Server::start(busy_once(503, &[])).await;
    let layer = layer(HttpPolicy::new()).without_retry_info();
    let svc = ServiceBuilder::new().layer(layer).service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert!(response.extensions().get::<RetryInfo>().is_none());
}

/// Two requests one after the other, each answered 503 with a small body,
/// then 200: how many connections the client opened.
async fn connections_used(policy: HttpPolicy) -> usize {
    let server = Server::start(|n, _| {
        if n % 2 == 0 {
            with_chunked_body(status(503), 8)
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new().layer(layer(policy)).service(client());
    for _ in 0..2 {
        let response = svc.clone().oneshot(get(&server)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(info(&response).attempts, 2);
    }
    server.connections()
}

#[tokio::test(start_paused = true)]
async fn a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained() {
    // The 503 is kept (it is what the caller gets if the retry is stopped), so
    // its HTTP/1 connection is busy while the retry sleeps and the retry opens
    // a second one. Once the retry is sent, the 503's small body is drained
    // and its connection goes back to the pool: the next request reuses both.
    assert_eq!(connections_used(HttpPolicy::new()).await, 2);
    // Control: dropping the body unread costs the connection each time.
    assert_eq!(connections_used(HttpPolicy::new().drain_limit(0)).await, 3);
}

// --- composition -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn per_attempt_timeout_inside_the_layer_retries_a_hung_attempt() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .timeout(Duration::from_secs(1))
        .service(client());
    let started = Instant::now();
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1100) && took < Duration::from_millis(1200),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn overall_deadline_outside_the_layer_bounds_every_attempt_and_sleep() {
    let server = Server::start(|_, _| Reply::Hang).await;
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(3))
        .layer(layer_with(
            HttpPolicy::new(),
            Constant::new(Duration::from_millis(400)),
            10,
            None,
        ))
        .timeout(Duration::from_secs(1))
        .service(client());
    let started = Instant::now();
    let error = svc.oneshot(get(&server)).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_millis(3050),
        "{took:?}"
    );
    // Attempts at 0 s, 1.4 s and 2.8 s; the deadline falls during the third.
    assert_eq!(server.requests(), 3);
}

#[tokio::test(start_paused = true)]
async fn concurrency_limit_inside_is_taken_again_for_each_retry() {
    // Each path is busy once. With one permit, B's first attempt can only go
    // out while A sleeps if A gave its permit back before sleeping.
    let busy_paths = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let server = Server::start(move |_, seen| {
        if busy_paths.lock().unwrap().insert(seen.path.clone()) {
            status(503)
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            Constant::new(Duration::from_secs(1)),
            3,
            None,
        ))
        .concurrency_limit(1)
        .service(client());
    let a = svc.clone().oneshot(
        Request::get(server.url("/a"))
            .body(Full::default())
            .unwrap(),
    );
    let b = svc.clone().oneshot(
        Request::get(server.url("/b"))
            .body(Full::default())
            .unwrap(),
    );
    let (a, b) = tokio::join!(a, b);
    assert_eq!(a.unwrap().status(), StatusCode::OK);
    assert_eq!(b.unwrap().status(), StatusCode::OK);

    let order: Vec<String> = server.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(order, ["/a", "/b", "/a", "/b"]);
    assert_eq!(server.max_in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn rate_limit_inside_each_retry_takes_its_own_slot() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            Constant::new(Duration::from_millis(10)),
            3,
            None,
        ))
        .buffer(8)
        .rate_limit(1, Duration::from_secs(1))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).slept, Duration::from_millis(20));
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_secs(1),
            "the rate, not the 10 ms backoff: {gap:?}"
        );
    }
}

/// The hyper-util client's error inside the layer's boxed one.
fn client_error(error: &tower::BoxError) -> &hyper_util::client::legacy::Error {
    error
        .downcast_ref()
        .unwrap_or_else(|| panic!("a hyper-util client error: {error:?}"))
}
