//! The default budget through each front-end, against real servers on
//! 127.0.0.1 on tokio's paused clock: a freshly built layer lets its first
//! failing request make every attempt it is allowed, and in an outage makes
//! no more than that one request's retries.
#![cfg(all(feature = "reqwest-middleware", feature = "grpc"))]

use crate::http_server;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_backoff::grpc::{GrpcRetryLayer, ServiceConfig};
use tower_backoff::http::{BackoffMiddleware, HttpPolicy, HttpRetryLayer, RetryInfo};
use tower_backoff::BackoffLayer;

use http_server::{status, Server};

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn reqwest_middleware_from_a_fresh_layer_of_four_attempts_gets_through_three_503s() {
    let server = Server::start(|n, _| if n < 3 { status(503) } else { status(200) }).await;
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .max_attempts(4)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest::Client::builder().no_proxy().build().unwrap(),
    )
    .with(BackoffMiddleware::new(layer))
    .build();

    let response = client.get(server.url("/")).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 4);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts,
        4
    );
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url("/")).body(Full::default()).unwrap()
}

/// Three hosts behind one client and one per-host stack of default layers:
/// the dead host spends only its own budget, so the healthy host answers
/// every request and the flaky host, whose every request fails once, gets
/// every one through on its retry.
#[tokio::test(start_paused = true)]
async fn per_host_default_budgets_let_healthy_and_flaky_hosts_through_beside_a_dead_one() {
    let healthy = Server::start(|_, _| status(200)).await;
    let dead = Server::start(|_, _| status(503)).await;
    let flaky = Server::start(|n, _| if n % 2 == 0 { status(503) } else { status(200) }).await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut svc = ServiceBuilder::new()
        .layer(HttpRetryLayer::builder().build_per_host().unwrap())
        .service(client);

    let mut through = (0, 0);
    for _ in 0..50 {
        let response = svc.ready().await.unwrap().call(get(&healthy)).await;
        through.0 += usize::from(response.unwrap().status() == StatusCode::OK);
        let response = svc.ready().await.unwrap().call(get(&dead)).await;
        assert_eq!(response.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
        let response = svc.ready().await.unwrap().call(get(&flaky)).await;
        through.1 += usize::from(response.unwrap().status() == StatusCode::OK);
    }

    assert_eq!(through, (50, 50), "(healthy, flaky) of 50 each");
    assert_eq!(healthy.requests(), 50);
    assert_eq!(flaky.requests(), 100, "each request's retry went out");
    assert_eq!(
        dead.requests(),
        50 + 2,
        "the first request's two retries, then none"
    );
    assert_eq!(svc.hosts(), 3);
}

// ---------------------------------------------------------------------------
// gRPC
// ---------------------------------------------------------------------------

/// `grpc.health.v1.Health`, written by hand so that it can fail: its first
/// `failures` calls end UNAVAILABLE, later ones answer SERVING.
#[derive(Clone)]
struct Health {
    failures: u32,
    calls: Arc<AtomicU32>,
}

impl tonic::server::NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<Body>> for Health {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let fails = n <= self.failures;
        Box::pin(async move {
            // The whole request, as a server reads it before answering.
            let _ = request.into_body().collect().await;
            if fails {
                return Ok(Status::unavailable("down").into_http());
            }
            let message = HealthCheckResponse { status: 1 }.encode_to_vec();
            let mut framed = BytesMut::with_capacity(5 + message.len());
            framed.put_u8(0);
            framed.put_u32(message.len() as u32);
            framed.put_slice(&message);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames = [
                Ok::<_, Infallible>(Frame::data(framed.freeze())),
                Ok(Frame::trailers(trailers)),
            ];
            let body = Body::new(StreamBody::new(futures::stream::iter(frames)));
            Ok(http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body)
                .unwrap())
        })
    }
}

/// Starts a tonic server on 127.0.0.1, port 0, whose health check fails
/// `failures` times; the calls it has had.
async fn serve(failures: u32) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let health = Health {
        failures,
        calls: calls.clone(),
    };
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let router = tonic::transport::Server::builder().add_service(health);
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    (addr, calls)
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Four attempts for UNAVAILABLE, and no `retryThrottling`: the layer's
/// budget is the crate's default.
fn four_attempts_no_throttling() -> ServiceConfig {
    ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap()
}

fn health_check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_fresh_grpc_layer_without_throttling_makes_one_calls_retries_against_a_dead_server() {
    let (addr, calls) = serve(u32::MAX).await;
    let layer = GrpcRetryLayer::new(&four_attempts_no_throttling()).unwrap();
    assert!(layer.throttle().is_none());
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    for _ in 0..20 {
        let status = client.check(health_check()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
    }

    assert_eq!(
        calls.load(Ordering::SeqCst),
        20 + 3,
        "the first call's three retries, nothing earned after"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fresh_grpc_layer_without_throttling_gets_its_first_call_through_three_failures() {
    let (addr, calls) = serve(3).await;
    let layer = GrpcRetryLayer::new(&four_attempts_no_throttling()).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let response = client.check(health_check()).await.unwrap();

    assert_eq!(response.get_ref().status, 1, "SERVING");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts,
        4
    );
}
