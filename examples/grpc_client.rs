//! A tonic client retried as its gRPC service config says.
//!
//! Starts tonic's health service on 127.0.0.1 behind a layer that fails the
//! first calls (trailers-only `UNAVAILABLE`, then `RESOURCE_EXHAUSTED` with
//! `grpc-retry-pushback-ms`), then calls it through a `Channel` wrapped by
//! `GrpcRetryLayer`, configured from a service-config JSON. Prints every
//! attempt the server sees and what the client gets back, then exits.
//!
//! ```text
//! cargo run --example grpc_client --features grpc
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{Layer, Service, ServiceBuilder};
use tower_backoff::grpc::{CodeSet, GrpcRetryLayer, ServiceConfig};
use tower_backoff::http::RetryInfo;

const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{ "service": "grpc.health.v1.Health" }],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
    }
  }],
  "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = serve().await?;

    let config = ServiceConfig::from_json(SERVICE_CONFIG)?;
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let channel = ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(&config)?)
        .service(channel);
    let mut client = HealthClient::new(channel);

    // Both calls must get through: a call that fails ends the run with an
    // error, so a script or test can tell from the exit status.
    for call in 1..=2 {
        let started = Instant::now();
        let response = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await?;
        let info = response.extensions().get::<RetryInfo>().copied();
        let status = response.into_inner().status();
        println!(
            "client: call {call} -> {status:?} after {} attempt(s), {:?} asleep, {:?} in all\n",
            info.map_or(1, |i| i.attempts),
            info.map(|i| i.slept).unwrap_or_default(),
            started.elapsed(),
        );
        if status != ServingStatus::Serving {
            return Err(format!("call {call} answered {status:?}, not Serving").into());
        }
    }
    println!("both calls served");
    Ok(())
}

/// Serves tonic's health service on an unused local port, behind `Flaky`.
async fn serve() -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        Some((listener.accept().await.map(|(s, _)| s), listener))
    });
    let (reporter, health) = tonic_health::server::health_reporter();
    let router = Server::builder()
        .layer(FlakyLayer::default())
        .add_service(health);
    tokio::spawn(async move {
        let _reporter = reporter;
        if let Err(error) = router.serve_with_incoming(incoming).await {
            eprintln!("server: {error}");
        }
    });
    Ok(addr)
}

/// Answers the 1st and 2nd calls `UNAVAILABLE`, the 4th `RESOURCE_EXHAUSTED`
/// with a 300 ms pushback, the rest with the real service.
#[derive(Clone, Default)]
struct FlakyLayer {
    calls: Arc<AtomicU32>,
}

impl<S> Layer<S> for FlakyLayer {
    type Service = Flaky<S>;

    fn layer(&self, inner: S) -> Flaky<S> {
        Flaky {
            inner,
            calls: Arc::clone(&self.calls),
        }
    }
}

#[derive(Clone)]
struct Flaky<S> {
    inner: S,
    calls: Arc<AtomicU32>,
}

impl<S> Service<http::Request<Body>> for Flaky<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        let status = match n {
            1 | 2 => Some((Code::Unavailable, None)),
            4 => Some((Code::ResourceExhausted, Some("300"))),
            _ => None,
        };
        println!(
            "server: attempt {n} of {} (previous attempts: {previous}) -> {}",
            request.uri().path(),
            status.map_or("OK", |(code, _)| CodeSet::name(code)),
        );
        match status {
            Some((code, pushback)) => {
                let mut response = Status::new(code, "try again").into_http::<Body>();
                if let Some(ms) = pushback {
                    response
                        .headers_mut()
                        .insert("grpc-retry-pushback-ms", http::HeaderValue::from_static(ms));
                }
                Box::pin(async move { Ok(response) })
            }
            None => Box::pin(self.inner.call(request)),
        }
    }
}
