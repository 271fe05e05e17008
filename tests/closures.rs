//! Closures given to a wrapped service learn their argument types from it:
//! real hyper-util and reqwest clients, no annotations.
#![cfg(feature = "reqwest")]

mod http_server;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceExt;
use tower_backoff::http::HttpPolicy;
use tower_backoff::Backoff;

use http_server::{layer, status, Server};

/// Answers 503 twice, then 200.
async fn busy_twice() -> Server {
    Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await
}

#[tokio::test(start_paused = true)]
async fn on_retry_over_hyper_util_needs_no_annotations() {
    let server = busy_twice().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let svc = Backoff::new(client, &layer(HttpPolicy::new())).on_retry(
        move |request, attempt, delay, outcome| {
            let status = outcome.as_ref().map(|response| response.status()).ok();
            log.lock()
                .unwrap()
                .push((request.uri().path().to_owned(), attempt, delay, status));
        },
    );
    let request = Request::get(server.url("/items"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let unavailable = Some(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            ("/items".to_owned(), 1, http_server::STEP, unavailable),
            ("/items".to_owned(), 2, http_server::STEP, unavailable),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn on_retry_over_reqwest_needs_no_annotations() {
    let server = busy_twice().await;
    let retried = Arc::new(Mutex::new(Vec::new()));
    let log = retried.clone();
    let svc = Backoff::new(
        reqwest::Client::builder().no_proxy().build().unwrap(),
        &layer(HttpPolicy::new()),
    )
    .on_retry(move |request, attempt, _delay, outcome| {
        let status = outcome.as_ref().map(|response| response.status()).ok();
        log.lock()
            .unwrap()
            .push((request.url().path().to_owned(), attempt, status));
    });
    let request =
        reqwest::Request::new(reqwest::Method::GET, server.url("/items").parse().unwrap());
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(retried.lock().unwrap().len(), 2);
    assert_eq!(
        retried.lock().unwrap()[0],
        (
            "/items".to_owned(),
            1,
            Some(StatusCode::SERVICE_UNAVAILABLE)
        )
    );
}
