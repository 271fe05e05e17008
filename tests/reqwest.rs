//! The HTTP policy through `reqwest::Client` (a tower `Service`), against a
//! real hyper server on 127.0.0.1, on tokio's paused clock.
#![cfg(feature = "reqwest")]

mod http_server;

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream;
use http::{Method, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{
    HttpPolicy, IntoReqwestLayer, ReplayBody, ReplayLayer, RetryInfo, IDEMPOTENCY_KEY,
};
use tower_backoff::{Constant, Exponential};

use http_server::{
    counting, layer, layer_with, status, status_with, unused_addr, with_chunked_body, Reply,
    Server, STEP,
};

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn request(method: Method, url: &str) -> reqwest::Request {
    reqwest::Request::new(method, url.parse().unwrap())
}

fn get(server: &Server) -> reqwest::Request {
    request(Method::GET, &server.url("/"))
}

fn info(response: &reqwest::Response) -> RetryInfo {
    *response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
}

fn busy_once(code: u16) -> impl Fn(usize, &http_server::Seen) -> Reply {
    move |n, _| if n == 0 { status(code) } else { status(200) }
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_503_and_returns_200() {
    let server = Server::start(busy_once(503)).await;
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
    let server = Server::start(busy_once(429)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn post_on_503_is_sent_once_and_its_response_returned() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let mut post = request(Method::POST, &server.url("/orders"));
    *post.body_mut() = Some("buy 1".into());
    let response = svc.oneshot(post).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
    assert_eq!(info(&response).attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_is_retried_with_the_same_key_and_body() {
    let server = Server::start(busy_once(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let mut post = request(Method::POST, &server.url("/orders"));
    post.headers_mut()
        .insert(IDEMPOTENCY_KEY, "order-17".parse().unwrap());
    *post.body_mut() = Some("buy 1".into());
    let response = svc.oneshot(post).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for attempt in &seen {
        assert_eq!(attempt.headers[&IDEMPOTENCY_KEY], "order-17");
        assert_eq!(attempt.body, "buy 1");
    }
}

// --- Retry-After -----------------------------------------------------------

fn schedule(cap: Duration) -> Exponential {
    Exponential::new(STEP).max_delay(cap)
}

async fn wait_before_retry(
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
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            // Without the upward jitter on server delays, so delays are exact.
            HttpPolicy::new().server_delay_jitter(0, Duration::ZERO),
            schedule(Duration::from_secs(10)),
            3,
            None,
        ))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    (seen[1].at - seen[0].at, info(&response))
}

#[tokio::test(start_paused = true)]
async fn retry_after_two_seconds_waits_two_seconds() {
    let (gap, info) = wait_before_retry(|| "2".into()).await;
    assert_eq!(info.slept, Duration::from_secs(2));
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2050),
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds() {
    // Computed when the server answers; HTTP-dates have whole seconds.
    let (gap, info) =
        wait_before_retry(|| httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2)))
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

#[tokio::test(start_paused = true)]
async fn hostile_retry_after_values_fall_back_to_the_schedule() {
    let hostile: [fn() -> String; 4] = [
        || "-5".into(),
        || "abc".into(),
        || "9".repeat(10_000),
        || httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(60)),
    ];
    for (i, value) in hostile.into_iter().enumerate() {
        let (gap, info) = wait_before_retry(value).await;
        assert_eq!(info.slept, STEP, "value #{i}");
        assert!(
            gap < STEP + Duration::from_millis(50),
            "value #{i}: {gap:?}"
        );
    }
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
    assert_eq!(server.requests(), 1);
    assert!(started.elapsed() < STEP, "no sleep at all");
}

// --- errors ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn connection_refused_is_retried_until_the_server_starts() {
    let addr = unused_addr();
    let starting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Server::start_on(addr, |_, _| status(200)).await
    });
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new(),
            Constant::new(Duration::from_secs(1)),
            3,
            None,
        ))
        .map_request(count)
        .service(client());
    let response = svc
        .oneshot(request(Method::GET, &format!("http://{addr}/")))
        .await
        .unwrap();
    let server = starting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(info(&response).attempts, 2);
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn connection_refused_every_time_returns_the_connect_error_after_every_attempt() {
    let addr = unused_addr();
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .map_request(count)
        .service(client());
    let error = svc
        .oneshot(request(Method::GET, &format!("http://{addr}/")))
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn reqwest_own_timeout_is_retried() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client);
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response).attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn per_attempt_tower_timeout_inside_the_layer_retries_a_hung_attempt() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .timeout(Duration::from_secs(1))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
}

// --- bodies and connections ---------------------------------------------------

#[tokio::test(start_paused = true)]
async fn streaming_body_without_a_replay_layer_goes_out_once() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let frames = (0..4u8).map(|i| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![i; 1024]))));
    let mut put = request(Method::PUT, &server.url("/upload"));
    *put.body_mut() = Some(reqwest::Body::wrap(StreamBody::new(stream::iter(frames))));
    let response = svc.oneshot(put).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(info(&response).attempts, 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.len(), 4 * 1024);
}

// --- streaming bodies through ReplayLayer --------------------------------------

/// Four chunks of 1 KiB, each of its own byte, so a reordered or missing
/// chunk shows.
fn upload_chunks() -> impl Iterator<Item = Result<Frame<Bytes>, Infallible>> {
    (0..4u8).map(|i| Ok(Frame::data(Bytes::from(vec![b'a' + i; 1024]))))
}

fn upload_bytes() -> Bytes {
    upload_chunks()
        .flat_map(|frame| frame.unwrap().into_data().unwrap())
        .collect()
}

/// `reqwest::Body::wrap_stream` needs reqwest's `stream` feature; `wrap` of a
/// stream body makes the same streaming (not clonable) body.
fn streaming_put(server: &Server) -> reqwest::Request {
    let mut put = request(Method::PUT, &server.url("/upload"));
    *put.body_mut() = Some(reqwest::Body::wrap(StreamBody::new(stream::iter(
        upload_chunks(),
    ))));
    put
}

#[tokio::test(start_paused = true)]
async fn streaming_body_behind_a_replay_layer_is_retried_byte_identical() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let response = svc.oneshot(streaming_put(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response), RetryInfo::new(3, 2 * STEP));
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for attempt in &seen {
        assert_eq!(attempt.method, Method::PUT);
        assert_eq!(attempt.path, "/upload");
        assert_eq!(attempt.body, upload_bytes());
    }
}

#[tokio::test(start_paused = true)]
async fn streaming_body_over_the_replay_limit_is_sent_once_and_its_response_returned() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::with_limit(2 * 1024))
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let response = svc.oneshot(streaming_put(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(info(&response).attempts, 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, upload_bytes());
}

#[tokio::test(start_paused = true)]
async fn streaming_upload_reaches_the_server_the_same_through_reqwest_as_through_hyper_util() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let script = |n: usize, _: &http_server::Seen| if n < 1 { status(503) } else { status(200) };
    let through_reqwest = Server::start(script).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let response = svc.oneshot(streaming_put(&through_reqwest)).await.unwrap();
    let reqwest_info = (response.status(), info(&response));

    let through_hyper = Server::start(script).await;
    let hyper_client = Client::builder(TokioExecutor::new())
        .build_http::<ReplayBody<StreamBody<stream::Iter<std::vec::IntoIter<_>>>>>();
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .service(hyper_client);
    let put = http::Request::put(through_hyper.url("/upload"))
        .body(StreamBody::new(stream::iter(
            upload_chunks().collect::<Vec<_>>(),
        )))
        .unwrap();
    let response = svc.oneshot(put).await.unwrap();
    let hyper_info = (
        response.status(),
        *response.extensions().get::<RetryInfo>().unwrap(),
    );

    assert_eq!(reqwest_info, hyper_info);
    assert_eq!(reqwest_info, (StatusCode::OK, RetryInfo::new(2, STEP)));
    let bodies = |server: &Server| {
        server
            .seen()
            .into_iter()
            .map(|s| s.body)
            .collect::<Vec<_>>()
    };
    assert_eq!(bodies(&through_reqwest), bodies(&through_hyper));
    assert_eq!(bodies(&through_reqwest), [upload_bytes(), upload_bytes()]);
}

#[tokio::test(start_paused = true)]
async fn an_in_memory_body_larger_than_the_replay_limit_is_still_retried() {
    let server = Server::start(busy_once(503)).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::with_limit(16))
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let mut put = request(Method::PUT, &server.url("/doc"));
    *put.body_mut() = Some(upload_bytes().into());
    let response = svc.oneshot(put).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.body == upload_bytes()));
}

#[tokio::test(start_paused = true)]
async fn get_behind_a_replay_layer_is_retried_with_its_headers_and_no_body() {
    let server = Server::start(busy_once(503)).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let mut get = get(&server);
    get.headers_mut().insert("x-trace", "abc".parse().unwrap());
    let response = svc.oneshot(get).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for attempt in &seen {
        assert_eq!(attempt.method, Method::GET);
        assert_eq!(attempt.headers["x-trace"], "abc");
        assert!(attempt.body.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn the_request_timeout_survives_the_replay_layer() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let mut get = get(&server);
    *get.timeout_mut() = Some(Duration::from_secs(1));
    let started = Instant::now();
    // Were the timeout lost, the first attempt would hang past this.
    let response = tokio::time::timeout(Duration::from_secs(10), svc.oneshot(get))
        .await
        .expect("reqwest's timeout ended the hung attempt")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn streaming_body_behind_a_replay_layer_with_an_attempt_timeout_is_resent_after_a_hang() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(
            tower_backoff::BackoffLayer::builder()
                .policy(HttpPolicy::new())
                .schedule(Constant::new(STEP))
                .jitter(tower_backoff::Jitter::None)
                .attempt_timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .layer(IntoReqwestLayer)
        .service(client());
    let response = svc.oneshot(streaming_put(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.body == upload_bytes()));
}

#[tokio::test(start_paused = true)]
async fn a_url_reqwest_cannot_send_fails_with_its_builder_error_behind_a_replay_layer() {
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let error = svc
        .oneshot(request(Method::GET, "http://{{hostname}}/"))
        .await
        .unwrap_err();
    assert!(error.is_builder(), "{error:?}");
}

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
    }
    server.connections()
}

#[tokio::test(start_paused = true)]
async fn a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained() {
    // See the test of the same name in tests/http.rs.
    assert_eq!(connections_used(HttpPolicy::new()).await, 2);
    assert_eq!(connections_used(HttpPolicy::new().drain_limit(0)).await, 3);
}

// --- every server signal ------------------------------------------------------

/// The first answer is `code` with `headers`, then 200: the final status, the
/// requests seen and what the layer recorded.
async fn signalled(
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
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            policy,
            schedule(Duration::from_secs(10)),
            3,
            None,
        ))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    (response.status(), server.requests(), info(&response))
}

fn exact() -> HttpPolicy {
    HttpPolicy::new().server_delay_jitter(0, Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn every_delay_header_is_waited_through_reqwest() {
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
        let (status, requests, info) = signalled(exact(), 429, headers).await;
        assert_eq!(status, StatusCode::OK, "{headers:?}");
        assert_eq!(requests, 2);
        assert_eq!(info.slept, wanted, "{headers:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_delay_past_max_server_delay_is_returned_at_once_through_reqwest() {
    let (status, requests, info) = signalled(exact(), 503, &[("retry-after", "3600")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(requests, 1);
    assert_eq!(info, RetryInfo::new(1, Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn should_retry_overrides_the_status_through_reqwest() {
    let (status, requests, _) = signalled(exact(), 503, &[("x-should-retry", "false")]).await;
    assert_eq!((status, requests), (StatusCode::SERVICE_UNAVAILABLE, 1));
    let (status, requests, _) = signalled(exact(), 409, &[("x-should-retry", "true")]).await;
    assert_eq!((status, requests), (StatusCode::OK, 2));
}

#[tokio::test(start_paused = true)]
async fn server_delays_are_jittered_upward_through_reqwest() {
    let (_, _, info) = signalled(HttpPolicy::new(), 503, &[("retry-after", "2")]).await;
    assert!(
        info.slept >= Duration::from_secs(2) && info.slept <= Duration::from_millis(2200),
        "{:?}",
        info.slept
    );
}

#[tokio::test(start_paused = true)]
async fn the_server_sees_the_attempt_number_through_reqwest() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let policy = HttpPolicy::new().attempt_header(http::HeaderName::from_static("amz-sdk-attempt"));
    let svc = ServiceBuilder::new().layer(layer(policy)).service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
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

#[tokio::test(start_paused = true)]
async fn without_retry_info_responses_carry_none_through_reqwest() {
    let server = Server::start(busy_once(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().without_retry_info()))
        .service(client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.extensions().get::<RetryInfo>().is_none());
}
