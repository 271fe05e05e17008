//! `on_retry` hooks over real hyper-util and reqwest clients take
//! unannotated closures: their argument is the engine's `RetryArgs`, whatever
//! the service.
#![cfg(feature = "reqwest")]

use crate::http_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_backoff::events::OutcomeKind;
use tower_backoff::http::{HttpPolicy, HttpRetryLayer};
use tower_backoff::{BackoffLayer, Cause, Constant, Jitter};

use http_server::{status, Server, STEP};

/// Answers 503 twice, then 200.
async fn busy_twice() -> Server {
    Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await
}

type Seen = Arc<Mutex<Vec<(u32, Duration, Cause, OutcomeKind)>>>;

/// The HTTP layer, logging each retry into `seen` with an unannotated
/// closure.
fn logging(seen: &Seen) -> HttpRetryLayer {
    let log = seen.clone();
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .on_retry(move |retry, _| {
            log.lock().unwrap().push((
                retry.attempt(),
                retry.delay(),
                retry.cause(),
                retry.replaced(),
            ));
        })
        .build()
        .unwrap();
    HttpRetryLayer::from(layer)
}

/// Two retries, each after a 503 answered (a response, throttled).
fn two_retries_after_503s() -> Vec<(u32, Duration, Cause, OutcomeKind)> {
    let busy = (Cause::Throttled, OutcomeKind::Response);
    vec![(1, STEP, busy.0, busy.1), (2, STEP, busy.0, busy.1)]
}

#[tokio::test(start_paused = true)]
async fn on_retry_over_hyper_util_needs_no_annotations() {
    let server = busy_twice().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let seen = Seen::default();
    let svc = logging(&seen).layer(client);
    let request = Request::get(server.url("/items"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*seen.lock().unwrap(), two_retries_after_503s());
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn on_retry_over_reqwest_needs_no_annotations() {
    let server = busy_twice().await;
    let seen = Seen::default();
    let svc = logging(&seen).layer(reqwest::Client::builder().no_proxy().build().unwrap());
    let request =
        reqwest::Request::new(reqwest::Method::GET, server.url("/items").parse().unwrap());
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*seen.lock().unwrap(), two_retries_after_503s());
    assert_eq!(server.seen().len(), 3);
}
