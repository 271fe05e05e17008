//! The service types users name in a struct field stay the same as options
//! are added: `HttpRetry<Client>` with a breaker, hedging, an attempt
//! timeout and per-host state on, and `BackoffRetry<S, P, Guarded>` for the
//! generic layer once its error is the layer's own.
#![cfg(feature = "reqwest")]

use crate::http_server;

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_backoff::breaker::CircuitBreaker;
use tower_backoff::http::{HttpRetry, HttpRetryLayer, RetryInfo};
use tower_backoff::{BackoffLayer, BackoffRetry, Guarded, Hedging, RetryOnError};

use http_server::{status, Server};

/// What an application keeps: one field per client, named once.
struct Clients {
    plain: HttpRetry<reqwest::Client>,
    everything: HttpRetry<reqwest::Client>,
}

fn clients() -> Clients {
    let everything = HttpRetryLayer::builder()
        .circuit_breaker(CircuitBreaker::new())
        .hedge(Hedging::after(Duration::from_millis(50)))
        .attempt_timeout(Duration::from_secs(2))
        .build_per_host()
        .unwrap();
    assert!(everything.is_per_host() && everything.breaker_per_host());
    Clients {
        plain: ServiceBuilder::new()
            .layer(HttpRetryLayer::new())
            .service(reqwest::Client::new()),
        everything: ServiceBuilder::new()
            .layer(everything)
            .service(reqwest::Client::new()),
    }
}

#[tokio::test]
async fn one_field_type_holds_a_client_with_every_option_on_and_it_retries() {
    let server = Server::start(|n, _| status(if n == 0 { 503 } else { 200 })).await;
    let clients = clients();
    let request = reqwest::Request::new(reqwest::Method::GET, server.url("/").parse().unwrap());
    let response = clients.everything.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts, 2, "the 503 was retried through every option");
    let request = reqwest::Request::new(reqwest::Method::GET, server.url("/").parse().unwrap());
    let response = clients.plain.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests(), 3);
}

/// A backend with a name, so that the service around it can be named.
#[derive(Clone)]
struct Backend;

impl tower::Service<u32> for Backend {
    type Response = u32;
    type Error = Infallible;
    type Future = Ready<Result<u32, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, n: u32) -> Self::Future {
        ready(Ok(n + 1))
    }
}

struct Jobs {
    retried: BackoffRetry<Backend, RetryOnError, Guarded>,
}

#[tokio::test]
async fn a_guarded_generic_layer_keeps_its_service_type_as_options_are_added() {
    let guarded = BackoffLayer::builder().guarded().build().unwrap();
    let with_options = BackoffLayer::builder()
        .guarded()
        .circuit_breaker(CircuitBreaker::new())
        .attempt_timeout(Duration::from_secs(1))
        .hedge(Hedging::after(Duration::from_millis(10)))
        .build()
        .unwrap();
    for layer in [guarded, with_options] {
        let jobs = Jobs {
            retried: layer.layer(Backend),
        };
        assert_eq!(jobs.retried.oneshot(1).await.unwrap(), 2);
    }
}
