//! The scenarios `tests/reqwest.rs` (the layer around `reqwest::Client` as a
//! tower service) and `tests/reqwest_middleware.rs` (the layer in a
//! `reqwest_middleware` client) both run: written once, each test file runs
//! them through its own [`Through`].
#![allow(dead_code)] // each test binary uses part of it

use std::convert::Infallible;
use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body::Frame;
use tokio::time::Instant;
use tower_backoff::http::{HttpPolicy, RetryInfo, IDEMPOTENCY_KEY};
use tower_backoff::{BackoffLayer, Exponential};

use super::http_server::{
    layer, layer_with, status, status_with, with_chunked_body, Reply, Seen, Server, STEP,
};

/// A reqwest client with a retry layer in it.
pub trait Through {
    /// Sends `requests` one after another through one client built on
    /// `layer`, so that they share its connections; each must succeed.
    fn send_all(
        layer: BackoffLayer<HttpPolicy>,
        requests: Vec<reqwest::Request>,
    ) -> impl Future<Output = Vec<reqwest::Response>>;

    /// Sends `request` through a client built on `layer`, told to record no
    /// `RetryInfo`.
    fn send_without_info(
        layer: BackoffLayer<HttpPolicy>,
        request: reqwest::Request,
    ) -> impl Future<Output = reqwest::Response>;
}

/// Sends `request` through a client built on `layer`.
pub async fn send<T: Through>(
    layer: BackoffLayer<HttpPolicy>,
    request: reqwest::Request,
) -> reqwest::Response {
    T::send_all(layer, vec![request])
        .await
        .pop()
        .expect("one response per request")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn request(method: Method, url: &str) -> reqwest::Request {
    reqwest::Request::new(method, url.parse().unwrap())
}

pub fn get(server: &Server) -> reqwest::Request {
    request(Method::GET, &server.url("/"))
}

pub fn info(response: &reqwest::Response) -> RetryInfo {
    *response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
}

pub fn busy_once(code: u16) -> impl Fn(usize, &Seen) -> Reply {
    move |n, _| if n == 0 { status(code) } else { status(200) }
}

pub fn schedule(cap: Duration) -> Exponential {
    Exponential::new(STEP).max_delay(cap)
}

/// Four chunks of 1 KiB, each of its own byte, so a reordered or missing
/// chunk shows.
pub fn upload_chunks() -> impl Iterator<Item = Result<Frame<Bytes>, Infallible>> {
    (0..4u8).map(|i| Ok(Frame::data(Bytes::from(vec![b'a' + i; 1024]))))
}

pub fn upload_bytes() -> Bytes {
    upload_chunks()
        .flat_map(|frame| frame.unwrap().into_data().unwrap())
        .collect()
}

fn post_order(server: &Server) -> reqwest::Request {
    let mut post = request(Method::POST, &server.url("/orders"));
    *post.body_mut() = Some("buy 1".into());
    post
}

pub async fn get_is_retried_on_503_and_returns_200<T: Through>() {
    let server = Server::start(busy_once(503)).await;
    let response = send::<T>(layer(HttpPolicy::new()), get(&server)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
}

pub async fn get_is_retried_on_429_and_returns_200<T: Through>() {
    let server = Server::start(busy_once(429)).await;
    let response = send::<T>(layer(HttpPolicy::new()), get(&server)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
}

pub async fn post_on_503_is_sent_once_and_its_response_returned<T: Through>() {
    let server = Server::start(|_, _| status(503)).await;
    let response = send::<T>(layer(HttpPolicy::new()), post_order(&server)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
    assert_eq!(info(&response).attempts, 1);
}

pub async fn post_with_idempotency_key_is_retried_with_the_same_key_and_body<T: Through>() {
    let server = Server::start(busy_once(503)).await;
    let mut post = post_order(&server);
    post.headers_mut()
        .insert(IDEMPOTENCY_KEY, "order-17".parse().unwrap());
    let response = send::<T>(layer(HttpPolicy::new()), post).await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for attempt in &seen {
        assert_eq!(attempt.headers[&IDEMPOTENCY_KEY], "order-17");
        assert_eq!(attempt.body, "buy 1");
    }
}

// --- Retry-After -----------------------------------------------------------

async fn wait_before_retry<T: Through>(
    retry_after: impl Fn() -> String + Send + Sync + 'static,
) -> (Duration, RetryInfo) {
    let server = Server::start(move |n, _| {
        if n == 0 {
            status_with(503, &[("retry-after", retry_after().as_str())])
        } else {
            status(200)
        }
    })
    .await;
    let layer = layer_with(
        // Without the upward jitter on server delays, so delays are exact.
        HttpPolicy::new().server_delay_jitter(0, Duration::ZERO),
        schedule(Duration::from_secs(10)),
        3,
        None,
    );
    let response = send::<T>(layer, get(&server)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    (seen[1].at - seen[0].at, info(&response))
}

pub async fn retry_after_two_seconds_waits_two_seconds<T: Through>() {
    let (gap, info) = wait_before_retry::<T>(|| "2".into()).await;
    assert_eq!(info.slept, Duration::from_secs(2));
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2050),
        "{gap:?}"
    );
}

pub async fn retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds<T: Through>() {
    // Computed when the server answers; HTTP-dates have whole seconds.
    let (gap, info) = wait_before_retry::<T>(|| {
        httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2))
    })
    .await;
    assert!(
        info.slept >= Duration::from_secs(1) && info.slept <= Duration::from_secs(2),
        "{:?}",
        info.slept
    );
    assert!(
        gap >= Duration::from_secs(1) && gap < Duration::from_millis(2050),
        "{gap:?}"
    );
}

pub async fn hostile_retry_after_values_fall_back_to_the_schedule<T: Through>() {
    let hostile: [fn() -> String; 4] = [
        || "-5".into(),
        || "abc".into(),
        || "9".repeat(10_000),
        || httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(60)),
    ];
    for (i, value) in hostile.into_iter().enumerate() {
        let (gap, info) = wait_before_retry::<T>(value).await;
        assert_eq!(info.slept, STEP, "value #{i}");
        assert!(
            gap < STEP + Duration::from_millis(50),
            "value #{i}: {gap:?}"
        );
    }
}

pub async fn retry_after_longer_than_the_time_left_returns_the_response_at_once<T: Through>() {
    let server = Server::start(|_, _| status_with(503, &[("retry-after", "10")])).await;
    let layer = layer_with(
        HttpPolicy::new(),
        schedule(Duration::from_secs(60)),
        3,
        Some(Duration::from_secs(5)),
    );
    let started = Instant::now();
    let response = send::<T>(layer, get(&server)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
    assert!(started.elapsed() < STEP, "no sleep at all");
}

// --- connections ---------------------------------------------------------------

async fn connections_used<T: Through>(policy: HttpPolicy) -> usize {
    let server = Server::start(|n, _| {
        if n % 2 == 0 {
            with_chunked_body(status(503), 8)
        } else {
            status(200)
        }
    })
    .await;
    let responses = T::send_all(layer(policy), vec![get(&server), get(&server)]).await;
    for response in &responses {
        assert_eq!(response.status(), StatusCode::OK);
    }
    server.connections()
}

pub async fn a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained<
    T: Through,
>() {
    // See the test of the same name in tests/http.rs.
    assert_eq!(connections_used::<T>(HttpPolicy::new()).await, 2);
    assert_eq!(
        connections_used::<T>(HttpPolicy::new().drain_limit(0)).await,
        3
    );
}

// --- every server signal ------------------------------------------------------

/// The first answer is `code` with `headers`, then 200: the final status, the
/// requests seen and what the layer recorded.
async fn signalled<T: Through>(
    policy: HttpPolicy,
    code: u16,
    headers: &'static [(&'static str, &'static str)],
) -> (StatusCode, usize, RetryInfo) {
    let server = Server::start(move |n, _| {
        if n == 0 {
            status_with(code, headers)
        } else {
            status(200)
        }
    })
    .await;
    let layer = layer_with(policy, schedule(Duration::from_secs(10)), 3, None);
    let response = send::<T>(layer, get(&server)).await;
    (response.status(), server.requests(), info(&response))
}

fn exact() -> HttpPolicy {
    HttpPolicy::new().server_delay_jitter(0, Duration::ZERO)
}

pub async fn every_delay_header_is_waited<T: Through>() {
    for (headers, wanted) in [
        (
            &[("retry-after-ms", "1250")][..],
            Duration::from_millis(1250),
        ),
        (&[("ratelimit-reset", "3")][..], Duration::from_secs(3)),
        (&[("x-ratelimit-reset", "4")][..], Duration::from_secs(4)),
        (
            &[("retry-after-ms", "-1"), ("retry-after", "abc")][..],
            STEP,
        ),
    ] {
        let (status, requests, info) = signalled::<T>(exact(), 429, headers).await;
        assert_eq!(status, StatusCode::OK, "{headers:?}");
        assert_eq!(requests, 2);
        assert_eq!(info.slept, wanted, "{headers:?}");
    }
}

pub async fn a_server_delay_past_max_server_delay_is_returned_at_once<T: Through>() {
    let (status, requests, info) = signalled::<T>(exact(), 503, &[("retry-after", "3600")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(requests, 1);
    assert_eq!(info, RetryInfo::new(1, Duration::ZERO));
}

pub async fn should_retry_overrides_the_status<T: Through>() {
    let (status, requests, _) = signalled::<T>(exact(), 503, &[("x-should-retry", "false")]).await;
    assert_eq!((status, requests), (StatusCode::SERVICE_UNAVAILABLE, 1));
    let (status, requests, _) = signalled::<T>(exact(), 409, &[("x-should-retry", "true")]).await;
    assert_eq!((status, requests), (StatusCode::OK, 2));
}

pub async fn server_delays_are_jittered_upward<T: Through>() {
    let (_, _, info) = signalled::<T>(HttpPolicy::new(), 503, &[("retry-after", "2")]).await;
    assert!(
        info.slept >= Duration::from_secs(2) && info.slept <= Duration::from_millis(2200),
        "{:?}",
        info.slept
    );
}

pub async fn the_server_sees_the_attempt_number<T: Through>() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let policy = HttpPolicy::new().attempt_header(http::HeaderName::from_static("amz-sdk-attempt"));
    let response = send::<T>(layer(policy), get(&server)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let attempts: Vec<Option<String>> = server
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("amz-sdk-attempt")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(attempts, [None, Some("2".into()), Some("3".into())]);
}

pub async fn without_retry_info_responses_carry_none<T: Through>() {
    let server = Server::start(busy_once(503)).await;
    let response = T::send_without_info(layer(HttpPolicy::new()), get(&server)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.extensions().get::<RetryInfo>().is_none());
}
