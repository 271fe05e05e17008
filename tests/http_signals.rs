//! Every server signal the HTTP policy reads, against a real hyper server on
//! 127.0.0.1 through hyper-util's client, on tokio's paused clock.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::join_all;
use http::{HeaderName, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{DelayHeaders, HttpPolicy, RetryInfo};
use tower_backoff::{BackoffLayer, Exponential};

use http_server::{http_layer_with as layer_with, status, status_with, Seen, Server, STEP};

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(server: &Server, path: &str) -> Request<Full<Bytes>> {
    Request::get(server.url(path))
        .body(Full::default())
        .unwrap()
}

fn info<B>(response: &http::Response<B>) -> RetryInfo {
    *response.extensions().get::<RetryInfo>().expect("RetryInfo")
}

/// The policy without upward jitter on server delays, so delays are exact.
fn exact() -> HttpPolicy {
    HttpPolicy::new().server_delay_jitter(0, Duration::ZERO)
}

/// 100 ms, doubling, capped at 10 s, no jitter: the first retry waits 100 ms
/// unless the server says otherwise.
fn schedule() -> Exponential {
    Exponential::new(STEP).max_delay(Duration::from_secs(10))
}

/// What one GET ends with when the server answers the first attempt with
/// `code` and the headers `first()` makes, then 200: the final status, the
/// requests the server saw, and the gap between the first two.
struct Outcome {
    status: StatusCode,
    seen: Vec<Seen>,
    info: RetryInfo,
    elapsed: Duration,
}

impl Outcome {
    fn gap(&self) -> Duration {
        self.seen[1].at - self.seen[0].at
    }
}

async fn first_answer(
    policy: HttpPolicy,
    code: u16,
    first: impl Fn() -> Vec<(&'static str, String)> + Send + Sync + 'static,
) -> Outcome {
    let server = Server::start(move |n, _| {
        if n == 0 {
            let headers = first();
            let borrowed: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            status_with(code, &borrowed)
        } else {
            status(200)
        }
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(policy, schedule(), 3, None))
        .service(client());
    let started = Instant::now();
    let response = svc.oneshot(get(&server, "/")).await.unwrap();
    Outcome {
        status: response.status(),
        seen: server.seen(),
        info: info(&response),
        elapsed: started.elapsed(),
    }
}

fn header(name: &'static str, value: &str) -> Vec<(&'static str, String)> {
    vec![(name, value.to_owned())]
}

// --- retry-after-ms ---------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn retry_after_ms_is_waited_to_the_millisecond() {
    let out = first_answer(exact(), 503, || header("retry-after-ms", "1250")).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.info, RetryInfo::new(2, Duration::from_millis(1250)));
    assert!(
        out.gap() >= Duration::from_millis(1250) && out.gap() < Duration::from_millis(1300),
        "{:?}",
        out.gap()
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_ms_wins_over_retry_after() {
    let out = first_answer(exact(), 429, || {
        vec![
            ("retry-after", "5".into()),
            ("retry-after-ms", "300".into()),
        ]
    })
    .await;
    assert_eq!(out.info.slept, Duration::from_millis(300));
}

// --- RateLimit-Reset / X-RateLimit-Reset -------------------------------------

#[tokio::test(start_paused = true)]
async fn ratelimit_reset_delta_seconds_is_waited() {
    let out = first_answer(exact(), 429, || header("ratelimit-reset", "3")).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.info.slept, Duration::from_secs(3));
    assert!(out.gap() >= Duration::from_secs(3), "{:?}", out.gap());
}

#[tokio::test(start_paused = true)]
async fn x_ratelimit_reset_as_a_unix_timestamp_is_waited_until() {
    // As GitHub sends it: the second the quota resets, computed by the server
    // when it answers (the paused clock does not move `SystemTime`).
    let out = first_answer(exact(), 429, || {
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(3);
        header("x-ratelimit-reset", &at.as_secs().to_string())
    })
    .await;
    assert_eq!(out.status, StatusCode::OK);
    // Whole seconds: "now + 3 s" truncated is between 2 and 3 s away.
    let slept = out.info.slept;
    assert!(
        slept > Duration::from_secs(2) && slept <= Duration::from_secs(3),
        "{slept:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn delay_headers_left_out_of_the_set_are_not_read() {
    let policy = exact().delay_headers(DelayHeaders::RETRY_AFTER);
    let out = first_answer(policy, 429, || header("ratelimit-reset", "3")).await;
    assert_eq!(out.info.slept, STEP, "the schedule's delay");
}

// --- hostile values -----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hostile_delay_values_fall_back_to_the_schedule() {
    let past = (SystemTime::now() - Duration::from_secs(60))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let ten_kb = "9".repeat(10_000);
    for name in ["retry-after-ms", "ratelimit-reset", "x-ratelimit-reset"] {
        let mut values = vec!["-5", "1e3", "NaN", "abc", "0", ten_kb.as_str()];
        if name != "retry-after-ms" {
            // Only the reset headers take timestamps.
            values.push(past.as_str());
        }
        for value in values {
            let value = value.to_owned();
            let shown = value.chars().take(12).collect::<String>();
            let out = first_answer(exact(), 503, move || header(name, &value)).await;
            assert_eq!(out.status, StatusCode::OK, "{name}: {shown}");
            assert_eq!(out.info.slept, STEP, "{name}: {shown}");
            assert!(
                out.gap() < STEP + Duration::from_millis(50),
                "{name}: {shown}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn absent_delay_headers_leave_the_delay_to_the_schedule() {
    let out = first_answer(exact(), 503, Vec::new).await;
    assert_eq!(out.info, RetryInfo::new(2, STEP));
}

// --- a delay longer than the policy accepts ------------------------------------

#[tokio::test(start_paused = true)]
async fn a_server_delay_past_max_server_delay_returns_the_response_at_once() {
    for (name, value) in [
        ("retry-after", "61"),
        ("retry-after", "999999999999"),
        ("retry-after-ms", "60001"),
        ("ratelimit-reset", "3600"),
        ("x-ratelimit-reset", "99999999999999999999999999"),
    ] {
        let out = first_answer(exact(), 503, move || header(name, value)).await;
        assert_eq!(
            out.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{name}: {value}"
        );
        assert_eq!(out.seen.len(), 1, "{name}: {value}");
        assert_eq!(out.info, RetryInfo::new(1, Duration::ZERO));
        assert!(out.elapsed < STEP, "no sleep at all: {name}: {value}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_longer_max_server_delay_waits_what_the_server_asked() {
    let policy = exact().max_server_delay(Duration::from_secs(120));
    let out = first_answer(policy, 503, || header("retry-after-ms", "9000")).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.info.slept, Duration::from_secs(9));
    let policy = exact().max_server_delay(Duration::from_secs(5));
    let out = first_answer(policy, 503, || header("retry-after-ms", "9000")).await;
    assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);
}

// --- x-should-retry -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn should_retry_false_on_a_503_is_returned_and_never_retried() {
    let out = first_answer(exact(), 503, || {
        vec![
            ("x-should-retry", "false".into()),
            ("retry-after", "1".into()),
        ]
    })
    .await;
    assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(out.seen.len(), 1);
    assert_eq!(out.elapsed, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn should_retry_true_on_a_409_is_retried() {
    let out = first_answer(exact(), 409, || header("x-should-retry", "true")).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.info, RetryInfo::new(2, STEP));
}

#[tokio::test(start_paused = true)]
async fn should_retry_garbage_leaves_the_status_to_decide() {
    for value in ["maybe", "", "1"] {
        let out = first_answer(exact(), 409, move || header("x-should-retry", value)).await;
        assert_eq!(out.status, StatusCode::CONFLICT, "{value:?}");
        assert_eq!(out.seen.len(), 1);
        let out = first_answer(exact(), 503, move || header("x-should-retry", value)).await;
        assert_eq!(out.status, StatusCode::OK, "{value:?}");
    }
    let ten_kb = "t".repeat(10_000);
    let out = first_answer(exact(), 503, move || header("x-should-retry", &ten_kb)).await;
    assert_eq!(out.status, StatusCode::OK);
}

// --- attempt count upstream -------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_server_sees_the_attempt_number_on_each_retry_only() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let policy = HttpPolicy::new().attempt_header(HeaderName::from_static("x-envoy-attempt-count"));
    let svc = ServiceBuilder::new()
        .layer(layer_with(policy, schedule(), 3, None))
        .service(client());
    let response = svc.oneshot(get(&server, "/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let counts: Vec<Option<String>> = server
        .seen()
        .iter()
        .map(|seen| {
            seen.headers
                .get("x-envoy-attempt-count")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(counts, [None, Some("2".into()), Some("3".into())]);
}

#[tokio::test(start_paused = true)]
async fn without_an_attempt_header_retries_go_out_as_the_first_did() {
    let server = Server::start(|n, _| if n < 1 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(
            HttpPolicy::new().no_attempt_header(),
            schedule(),
            3,
            None,
        ))
        .service(client());
    svc.oneshot(get(&server, "/")).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen[0].headers, seen[1].headers);
}

#[tokio::test(start_paused = true)]
async fn by_default_each_retry_carries_x_retry_attempt_for_the_server_to_shed_first() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let svc = ServiceBuilder::new()
        .layer(layer_with(HttpPolicy::new(), schedule(), 3, None))
        .service(client());
    svc.oneshot(get(&server, "/")).await.unwrap();
    let marks: Vec<Option<String>> = server
        .seen()
        .iter()
        .map(|seen| {
            let mark = seen.headers.get("x-retry-attempt");
            mark.map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(marks, [None, Some("2".into()), Some("3".into())]);
}

// --- jitter on server delays -------------------------------------------------------

/// 1,000 requests told to come back in 5 s at the same instant: how many of
/// their retries reach the server in the fullest 10 ms window.
///
/// `Retry-After: 5` rather than an HTTP-date: on the paused clock `SystemTime`
/// still moves, so a date would reach each request as a slightly different
/// delay and spread them by itself. Once parsed, both forms are one delay and
/// get the same jitter (the policy's unit tests use a date).
async fn fullest_10ms_bucket(policy: HttpPolicy) -> usize {
    let server = Server::start(move |_, seen| {
        if seen.headers.contains_key("x-retry") {
            status(200)
        } else {
            status_with(503, &[("retry-after", "5")])
        }
    })
    .await;
    // No budget: 1,000 retries at once would empty the default one.
    let layer = BackoffLayer::builder()
        .policy(policy.attempt_header(HeaderName::from_static("x-retry")))
        .max_attempts(2)
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(client());
    let started = Instant::now();
    let responses =
        join_all((0..1_000).map(|i| svc.clone().oneshot(get(&server, &format!("/{i}"))))).await;
    assert!(responses
        .iter()
        .all(|r| r.as_ref().unwrap().status() == StatusCode::OK));
    let mut buckets = std::collections::HashMap::<u128, usize>::new();
    for seen in server
        .seen()
        .iter()
        .filter(|s| s.headers.contains_key("x-retry"))
    {
        assert!(seen.at - started >= Duration::from_secs(5), "never early");
        *buckets
            .entry((seen.at - started).as_millis() / 10)
            .or_default() += 1;
    }
    assert_eq!(buckets.values().sum::<usize>(), 1_000);
    *buckets.values().max().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_thousand_clients_told_the_same_time_do_not_come_back_together() {
    // Up to 10 % of 5 s, so 500 ms of spread: 2 % per 10 ms on average.
    let fullest = fullest_10ms_bucket(HttpPolicy::new()).await;
    assert!(fullest <= 50, "at most 5 % in any 10 ms: {fullest}");
}

#[tokio::test(start_paused = true)]
async fn without_server_delay_jitter_they_come_back_together() {
    // The contrast that shows the test above can fail.
    let fullest = fullest_10ms_bucket(exact()).await;
    assert!(fullest > 900, "{fullest}");
}

// --- a delay longer than the schedule's cap -------------------------------------

#[tokio::test(start_paused = true)]
async fn a_server_delay_beyond_the_schedule_cap_is_slept_in_full() {
    // Issue 14: `Retry-After: 8` with a 5 s cap must wait 8 s, not 5.
    let server = Server::start(|n, _| {
        if n == 0 {
            status_with(503, &[("retry-after", "8")])
        } else {
            status(200)
        }
    })
    .await;
    let capped = Exponential::new(STEP).max_delay(Duration::from_secs(5));
    let svc = ServiceBuilder::new()
        .layer(layer_with(exact(), capped, 3, None))
        .service(client());
    let response = svc.oneshot(get(&server, "/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).slept, Duration::from_secs(8));
    let seen = server.seen();
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(8));
}
