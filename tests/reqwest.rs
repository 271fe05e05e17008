//! The HTTP policy through `reqwest::Client` (a tower `Service`), against a
//! real hyper server on 127.0.0.1, on tokio's paused clock.
#![cfg(feature = "reqwest")]

use crate::http_server;
use crate::reqwest_cases;

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::stream;
use http::{Method, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::parts::{IntoReqwestLayer, ReplayLayer};
use tower_backoff::http::{HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo};
use tower_backoff::{BackoffLayer, Constant};

use http_server::{
    counting, http_layer as layer, http_layer_with as layer_with, status, unused_addr, Reply,
    Server, STEP,
};
use reqwest_cases as cases;
use reqwest_cases::{busy_once, client, get, info, request, upload_bytes, upload_chunks, Through};

/// The layer around `reqwest::Client` as a tower service.
struct Tower;

impl Through for Tower {
    async fn send_all(
        layer: BackoffLayer<HttpPolicy>,
        requests: Vec<reqwest::Request>,
    ) -> Vec<reqwest::Response> {
        let svc = ServiceBuilder::new()
            .layer(HttpRetryLayer::from(layer))
            .service(client());
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            responses.push(svc.clone().oneshot(request).await.unwrap());
        }
        responses
    }

    async fn send_without_info(
        layer: BackoffLayer<HttpPolicy>,
        request: reqwest::Request,
    ) -> reqwest::Response {
        let layer = HttpRetryLayer::from(layer).without_retry_info();
        let svc = ServiceBuilder::new().layer(layer).service(client());
        svc.oneshot(request).await.unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_503_and_returns_200() {
    cases::get_is_retried_on_503_and_returns_200::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_429_and_returns_200() {
    cases::get_is_retried_on_429_and_returns_200::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn post_on_503_is_sent_once_and_its_response_returned() {
    cases::post_on_503_is_sent_once_and_its_response_returned::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_is_retried_with_the_same_key_and_body() {
    cases::post_with_idempotency_key_is_retried_with_the_same_key_and_body::<Tower>().await;
}

// --- Retry-After -----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn retry_after_two_seconds_waits_two_seconds() {
    cases::retry_after_two_seconds_waits_two_seconds::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds() {
    cases::retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn hostile_retry_after_values_fall_back_to_the_schedule() {
    cases::hostile_retry_after_values_fall_back_to_the_schedule::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_time_left_returns_the_response_at_once() {
    cases::retry_after_longer_than_the_time_left_returns_the_response_at_once::<Tower>().await;
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
    assert!(error.get_ref().is_some_and(|e| e.is_connect()), "{error:?}");
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
async fn streaming_body_that_cannot_be_recorded_goes_out_once() {
    let server = Server::start(|_, _| status(503)).await;
    // A zero replay limit records nothing: as reqwest's own `try_clone`,
    // which cannot copy a streaming body.
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()).replay_limit(0))
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
        .layer(layer(HttpPolicy::new()))
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

/// The parts the layer is made of still compose by hand, for power users:
/// `ReplayLayer`, a plain `BackoffLayer`, `IntoReqwestLayer`.
#[tokio::test(start_paused = true)]
async fn the_parts_compose_by_hand_and_retry_a_streaming_body_byte_identical() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(http_server::layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let response = svc.oneshot(streaming_put(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.body == upload_bytes()));
}

/// As through `HttpRetryLayer` (tests/reqwest_parity.rs): a body in memory
/// goes out as its bytes, which reqwest copies to follow a 307.
#[tokio::test(start_paused = true)]
async fn the_parts_composed_by_hand_follow_a_307_with_an_in_memory_body() {
    let server = Server::start(|_, seen| {
        if seen.path == "/old" {
            http_server::status_with(307, &[("location", "/new")])
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(http_server::layer(HttpPolicy::new()))
        .layer(IntoReqwestLayer)
        .service(client());
    let mut put = request(Method::PUT, &server.url("/old"));
    *put.body_mut() = Some("payload".into());
    let response = svc.oneshot(put).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.url().path(), "/new");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|s| s.method == Method::PUT && s.body == "payload"));
}

#[tokio::test(start_paused = true)]
async fn streaming_body_over_the_replay_limit_is_sent_once_and_its_response_returned() {
    let server = Server::start(|_, _| status(503)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()).replay_limit(2 * 1024))
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
        .layer(layer(HttpPolicy::new()))
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
        .layer(layer(HttpPolicy::new()).replay_limit(16))
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
        .layer(layer(HttpPolicy::new()))
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
        .layer(layer(HttpPolicy::new()))
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
        .layer(HttpRetryLayer::from(
            tower_backoff::BackoffLayer::builder()
                .policy(HttpPolicy::new())
                .schedule(Constant::new(STEP))
                .jitter(tower_backoff::Jitter::None)
                .attempt_timeout(Duration::from_secs(1))
                .no_budget()
                .build()
                .unwrap(),
        ))
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
        .layer(layer(HttpPolicy::new()))
        .service(client());
    let error = svc
        .oneshot(request(Method::GET, "http://{{hostname}}/"))
        .await
        .unwrap_err();
    assert!(error.get_ref().is_some_and(|e| e.is_builder()), "{error:?}");
}

#[tokio::test(start_paused = true)]
async fn a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained() {
    cases::a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained::<Tower>()
        .await;
}

// --- every server signal ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn every_delay_header_is_waited_through_reqwest() {
    cases::every_delay_header_is_waited::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_delay_past_max_server_delay_is_returned_at_once_through_reqwest() {
    cases::a_server_delay_past_max_server_delay_is_returned_at_once::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn should_retry_overrides_the_status_through_reqwest() {
    cases::should_retry_overrides_the_status::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn server_delays_are_jittered_upward_through_reqwest() {
    cases::server_delays_are_jittered_upward::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn the_server_sees_the_attempt_number_through_reqwest() {
    cases::the_server_sees_the_attempt_number::<Tower>().await;
}

#[tokio::test(start_paused = true)]
async fn without_retry_info_responses_carry_none_through_reqwest() {
    cases::without_retry_info_responses_carry_none::<Tower>().await;
}
