//! One `on_retry` closure, the same function, on every front-end: the
//! generic layer, the HTTP layer over reqwest and over hyper-util, the
//! reqwest-middleware middleware; and `retry(..)`, whose hook gets its error
//! typed. Each call sees the attempt that failed, the delay, the cause, and
//! the outcome being retried.
#![cfg(all(feature = "reqwest-middleware", feature = "hyper"))]

use crate::http_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::events::{Outcome, RetryArgs};
use tower_backoff::http::{BackoffMiddleware, BufferedBody, HttpRetryLayer};
use tower_backoff::{retry, BackoffLayer, Cause, Constant, Jitter};

use http_server::{status, Server};

/// What the hook saw of one retry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    attempt: u32,
    delay: Duration,
    cause: Cause,
    replaced: String,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// The one hook: it reads the outcome as whichever front-end's types it is.
fn hook(log: &Log) -> impl Fn(&RetryArgs, Outcome<'_>) + Clone + Send + Sync + 'static {
    let log = log.clone();
    move |retry, outcome| {
        let replaced = if let Some(response) = outcome.response::<reqwest::Response>() {
            format!("status {}", response.status().as_u16())
        } else if let Some(response) =
            outcome.response::<http::Response<BufferedBody<hyper::body::Incoming>>>()
        {
            format!("status {}", response.status().as_u16())
        } else if let Some(error) = outcome.error::<std::io::Error>() {
            format!("error {error}")
        } else {
            format!("unknown {:?}", outcome.kind())
        };
        log.lock().unwrap().push(Seen {
            attempt: retry.attempt(),
            delay: retry.delay(),
            cause: retry.cause(),
            replaced,
        });
    }
}

const STEP: Duration = Duration::from_millis(5);

fn seen_one_503(log: &Log) {
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].attempt, 1);
    assert_eq!(seen[0].delay, STEP);
    assert_eq!(seen[0].replaced, "status 503");
    assert_eq!(
        seen[0].cause,
        Cause::Throttled,
        "the HTTP policy calls a 503 throttling"
    );
}

fn seen_one_busy_error(log: &Log) {
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen,
        [Seen {
            attempt: 1,
            delay: STEP,
            cause: Cause::Transient,
            replaced: "error busy".into()
        }]
    );
}

async fn flaky_server() -> Server {
    Server::start(|n, _| status(if n == 0 { 503 } else { 200 })).await
}

/// Fails its first call with a "busy" `io::Error`, takes `slow` to answer
/// its second, and answers every call with its number.
fn busy_once(
    slow: Duration,
) -> impl tower::Service<(), Response = u32, Error = std::io::Error, Future: Send> + Clone {
    let calls = Arc::new(Mutex::new(0));
    service_fn(move |()| {
        let n = {
            let mut calls = calls.lock().unwrap();
            *calls += 1;
            *calls
        };
        async move {
            match n {
                1 => Err(std::io::Error::other("busy")),
                2 => {
                    tokio::time::sleep(slow).await;
                    Ok(n)
                }
                _ => Ok(n),
            }
        }
    })
}

#[tokio::test]
async fn the_generic_layer_s_hook_sees_the_error_being_retried() {
    let log = Log::default();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .on_retry(hook(&log))
        .build()
        .unwrap();
    let svc = layer.layer(busy_once(Duration::ZERO));
    assert_eq!(svc.oneshot(()).await.unwrap(), 2);
    seen_one_busy_error(&log);
}

fn http_layer(log: &Log) -> HttpRetryLayer {
    HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .on_retry(hook(log))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_http_layer_s_hook_sees_the_reqwest_response_being_retried() {
    let server = flaky_server().await;
    let log = Log::default();
    let svc = http_layer(&log).layer(reqwest::Client::new());
    let request = reqwest::Request::new(reqwest::Method::GET, server.url("/").parse().unwrap());
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    seen_one_503(&log);
}

/// The HTTP layer's error is `Error<reqwest::Error>`; its hook reads the
/// client's own `reqwest::Error` as that, without naming the wrapper.
#[tokio::test]
async fn the_http_layer_s_hook_reads_reqwest_s_error_as_reqwest_error() {
    let connects = Arc::new(Mutex::new(Vec::new()));
    let seen = connects.clone();
    let layer = HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .on_retry(move |_: &RetryArgs, outcome: Outcome<'_>| {
            let error = outcome.error::<reqwest::Error>().expect("reqwest's error");
            seen.lock().unwrap().push(error.is_connect());
        })
        .build()
        .unwrap();
    let svc = layer.layer(reqwest::Client::new());
    let url = format!("http://{}/", crate::http_server::unused_addr());
    let request = reqwest::Request::new(reqwest::Method::GET, url.parse().unwrap());
    let error = svc.oneshot(request).await.unwrap_err();
    assert!(
        error.get_ref().is_some_and(reqwest::Error::is_connect),
        "{error:?}"
    );
    assert_eq!(
        *connects.lock().unwrap(),
        [true, true],
        "two retries, each after a refused connect"
    );
}

#[tokio::test]
async fn the_http_layer_s_hook_sees_the_hyper_response_being_retried() {
    let server = flaky_server().await;
    let log = Log::default();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = http_layer(&log).layer(client);
    let request = http::Request::get(server.url("/"))
        .body(Full::default())
        .unwrap();
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    seen_one_503(&log);
}

#[tokio::test]
async fn the_middleware_s_hook_sees_the_response_being_retried() {
    let server = flaky_server().await;
    let log = Log::default();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(BackoffMiddleware::from(http_layer(&log)))
        .build();
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    seen_one_503(&log);
}

#[tokio::test]
async fn retry_fn_s_hook_sees_the_error_being_retried() {
    let log = Log::default();
    let mut calls = 0;
    let result = retry(|| {
        calls += 1;
        let n = calls;
        async move {
            match n {
                1 => Err(std::io::Error::other("busy")),
                _ => Ok(n),
            }
        }
    })
    .schedule(Constant::new(STEP))
    .jitter(Jitter::None)
    // `retry(..)` knows the error's type: its hook gets it typed, so it is
    // not the one shared closure, but records what it does.
    .on_retry({
        let log = log.clone();
        move |retry, error| {
            log.lock().unwrap().push(Seen {
                attempt: retry.attempt(),
                delay: retry.delay(),
                cause: retry.cause(),
                replaced: format!("error {error}"),
            })
        }
    })
    .await;
    assert_eq!(result.unwrap(), 2);
    seen_one_busy_error(&log);
}

/// A `Guarded` layer's outcomes carry its own `Error<E>`: the hook reads a
/// failed attempt as the inner error wrapped, and an attempt that ran out
/// of time as `Error::TimedOut`.
#[tokio::test(start_paused = true)]
async fn a_guarded_layer_s_hook_reads_its_error_type() {
    type Wrapped = tower_backoff::Error<std::io::Error>;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .attempt_timeout(Duration::from_millis(50))
        .on_retry(move |_: &RetryArgs, outcome: Outcome<'_>| {
            let read = match outcome.error::<Wrapped>() {
                Some(tower_backoff::Error::Inner(error)) => format!("inner {error}"),
                Some(error) if error.is_timeout() => "timed out".to_string(),
                Some(_) => "other".to_string(),
                None => format!("not Error<E>: {:?}", outcome.kind()),
            };
            // Read as the inner type, it is the inner error; a timeout has none.
            assert_eq!(
                outcome.error::<std::io::Error>().map(|e| e.to_string()),
                outcome
                    .error::<Wrapped>()
                    .and_then(|e| e.get_ref())
                    .map(|e| e.to_string()),
            );
            log.lock().unwrap().push(read);
        })
        .build()
        .unwrap();
    let svc = layer.layer(busy_once(Duration::from_secs(1)));
    assert_eq!(svc.oneshot(()).await.unwrap(), 3);
    assert_eq!(*seen.lock().unwrap(), ["inner busy", "timed out"]);
}
