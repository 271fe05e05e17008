//! One `HttpRetryLayer` with a circuit breaker around one client that talks
//! to two hosts, one dead (503 always) and one healthy (200), on tokio's
//! paused clock: the breaker is kept per host, so the dead host's breaker
//! opens and stops its calls while the healthy host is never rejected.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::breaker::{BreakerState, CircuitBreaker};
use tower_backoff::http::{HttpRetry, HttpRetryLayer};

use http_server::{status, unused_addr, Server};

/// Requests to each host, interleaved one to one.
const REQUESTS: usize = 361;
/// Time between two rounds of requests: 361 rounds make 36 s, so the dead
/// host's breaker (open 4 to 5 s at a time) probes several times.
const PAUSE: Duration = Duration::from_millis(100);

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url("/")).body(Full::default()).unwrap()
}

/// What each host saw of [`REQUESTS`] requests each.
#[derive(Debug, Default)]
struct Tally {
    dead_rejected: usize,
    healthy_rejected: usize,
    /// Calls the dead host got once its breaker had first rejected a
    /// request.
    dead_calls_after_open: usize,
    dead_calls: usize,
    healthy_calls: usize,
}

/// The outcome of one request: `Ok(status)` or whether the breaker rejected
/// it (any other error fails the test).
type Outcome = Result<StatusCode, ()>;

/// Sends [`REQUESTS`] to each host, alternating, through `send`.
async fn interleave<F, Fut>(dead: &Server, healthy: &Server, mut send: F) -> Tally
where
    F: FnMut(&Server) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let mut tally = Tally::default();
    let mut dead_calls_at_open = None;
    for _ in 0..REQUESTS {
        match send(dead).await {
            Ok(status) => assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE),
            Err(()) => {
                tally.dead_rejected += 1;
                dead_calls_at_open.get_or_insert(dead.requests());
            }
        }
        match send(healthy).await {
            Ok(status) => assert_eq!(status, StatusCode::OK),
            Err(()) => tally.healthy_rejected += 1,
        }
        tokio::time::sleep(PAUSE).await;
    }
    tally.dead_calls = dead.requests();
    tally.healthy_calls = healthy.requests();
    tally.dead_calls_after_open = dead_calls_at_open.map_or(0, |at| tally.dead_calls - at);
    eprintln!("{tally:?}");
    tally
}

/// The dead host's breaker opened, and once open let through at most 5 %
/// of its requests (the probes); the healthy host was never rejected.
fn assert_breaker_per_host(tally: &Tally) {
    assert_eq!(tally.healthy_rejected, 0, "{tally:?}");
    assert_eq!(tally.healthy_calls, REQUESTS, "{tally:?}");
    assert!(tally.dead_rejected > REQUESTS * 9 / 10, "{tally:?}");
    assert!(
        tally.dead_calls_after_open * 20 <= REQUESTS,
        "calls after opening: {tally:?}"
    );
}

/// The service under test, as a user names it in a struct field.
type Retried = HttpRetry<Client<HttpConnector, Full<Bytes>>>;

fn retried(layer: HttpRetryLayer) -> Retried {
    ServiceBuilder::new().layer(layer).service(client())
}

/// Sends one request to `server` through a clone of `svc`: each request
/// goes through a clone of its own, as from many tasks, so the clones
/// share every host's breaker.
fn send(svc: &Retried, server: &Server) -> impl std::future::Future<Output = Outcome> {
    let sent = svc.clone().oneshot(get(server));
    async move {
        match sent.await {
            Ok(response) => Ok(response.status()),
            Err(error) if error.is::<tower_backoff::error::BreakerOpen>() => Err(()),
            Err(error) => panic!("{error:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn one_breaker_setting_keeps_the_healthy_host_unrejected_beside_a_dead_one() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let breaker = CircuitBreaker::new();
    let svc = retried(
        HttpRetryLayer::builder()
            .circuit_breaker(breaker.clone())
            .build()
            .unwrap(),
    );
    let tally = interleave(&dead, &healthy, |server| send(&svc, server)).await;
    assert_breaker_per_host(&tally);
    assert_ne!(
        breaker.state(),
        BreakerState::Closed,
        "the handle given is the first host's: the dead one's"
    );
}

/// The opt-in for one breaker: the dead host's failures open it for every
/// host, the healthy one included (what `.circuit_breaker(..)` did before).
#[tokio::test(start_paused = true)]
async fn a_breaker_for_all_hosts_rejects_the_healthy_host_too() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let svc = retried(
        HttpRetryLayer::builder()
            .circuit_breaker_for_all_hosts(CircuitBreaker::new())
            .build()
            .unwrap(),
    );
    let tally = interleave(&dead, &healthy, |server| send(&svc, server)).await;
    assert!(tally.healthy_rejected > REQUESTS / 2, "{tally:?}");
}

/// A dead host that refuses connections: its breaker opens on the refused
/// connects, and the healthy host is still never rejected.
#[tokio::test(start_paused = true)]
async fn a_host_refusing_connections_opens_only_its_own_breaker() {
    let closed = unused_addr();
    let healthy = Server::start(|_, _| status(200)).await;
    let svc = retried(
        HttpRetryLayer::builder()
            .circuit_breaker(CircuitBreaker::new())
            .build()
            .unwrap(),
    );
    let (mut closed_rejected, mut healthy_rejected) = (0, 0);
    for _ in 0..REQUESTS {
        let request = Request::get(format!("http://{closed}/"))
            .body(Full::default())
            .unwrap();
        match svc.clone().oneshot(request).await {
            Err(error) if error.is::<tower_backoff::error::BreakerOpen>() => closed_rejected += 1,
            Err(_) => {}
            Ok(response) => panic!("nothing listens there: {response:?}"),
        }
        if send(&svc, &healthy).await.is_err() {
            healthy_rejected += 1;
        }
        tokio::time::sleep(PAUSE).await;
    }
    assert_eq!(healthy_rejected, 0);
    assert_eq!(healthy.requests(), REQUESTS);
    assert!(closed_rejected > REQUESTS * 9 / 10, "{closed_rejected}");
}

#[cfg(feature = "reqwest")]
#[tokio::test(start_paused = true)]
async fn one_breaker_setting_keeps_the_healthy_host_unrejected_through_reqwest() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let svc: HttpRetry<reqwest::Client> = ServiceBuilder::new()
        .layer(
            HttpRetryLayer::builder()
                .circuit_breaker(CircuitBreaker::new())
                .build()
                .unwrap(),
        )
        .service(reqwest::Client::builder().no_proxy().build().unwrap());
    let tally = interleave(&dead, &healthy, |server| {
        let request = reqwest::Request::new(http::Method::GET, server.url("/").parse().unwrap());
        let svc = svc.clone();
        async move {
            match svc.oneshot(request).await {
                Ok(response) => Ok(response.status()),
                Err(error) if error.is_breaker_open() => Err(()),
                Err(error) => panic!("{error:?}"),
            }
        }
    })
    .await;
    assert_breaker_per_host(&tally);
}
