//! `client.get(url).send()` through `HttpRetryLayer` over a real
//! `reqwest::Client`, against a real hyper server: the wrapped client keeps
//! reqwest's way of writing a request, and each request it sends is retried
//! like one sent with `oneshot`.
#![cfg(feature = "reqwest")]

use crate::http_server;
use crate::reqwest_cases;

use http::{Method, StatusCode};
use tower::ServiceBuilder;
use tower_backoff::http::{HttpPolicy, HttpRetry, RetryInfo};

use http_server::{http_layer as layer, status, with_body, Server};
use reqwest_cases::client;

fn wrapped() -> HttpRetry<reqwest::Client> {
    ServiceBuilder::new()
        .layer(layer(HttpPolicy::default()))
        .service(client())
}

#[tokio::test]
async fn get_send_is_retried_and_carries_what_the_builder_set() {
    let server = Server::start(|n, _| match n {
        0 => status(503),
        _ => with_body(status(200), "ok"),
    })
    .await;
    let client = wrapped();

    let response = client
        .get(server.url("/items"))
        .header("x-request-id", "7")
        .bearer_auth("secret")
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts,
        2
    );
    assert_eq!(response.text().await.unwrap(), "ok");
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the 503, then its retry");
    for request in &seen {
        assert_eq!(request.method, Method::GET);
        assert_eq!(request.path, "/items");
        assert_eq!(request.headers["x-request-id"], "7");
        assert_eq!(request.headers["authorization"], "Bearer secret");
    }
}

#[tokio::test]
async fn a_post_with_a_body_is_sent_once_as_the_policy_says() {
    let server = Server::start(|_, _| status(503)).await;
    let response = wrapped()
        .post(server.url("/orders"))
        .body("one order")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let seen = server.seen();
    assert_eq!(
        seen.len(),
        1,
        "POST is not idempotent: never retried by default"
    );
    assert_eq!(seen[0].body, "one order");
}

#[tokio::test]
async fn a_request_reqwest_cannot_build_is_its_error_and_nothing_is_sent() {
    let server = Server::start(|_, _| status(200)).await;
    let error = wrapped()
        .get(server.url("/"))
        .header("bad header name", "x")
        .send()
        .await
        .unwrap_err();
    let reqwest = error.get_ref().expect("reqwest's own error");
    assert!(reqwest.is_builder(), "{reqwest:?}");
    assert_eq!(server.requests(), 0);
}

#[tokio::test]
async fn send_is_a_future_a_task_can_own() {
    let server = Server::start(|_, _| status(204)).await;
    let request = wrapped()
        .get(server.url("/"))
        .with(|r| r.header("x-from", "task"));
    let response = tokio::spawn(request.send()).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(server.seen()[0].headers["x-from"], "task");
}
