//! Retries a flaky local server through `reqwest::Client`, which is a tower
//! `Service`.
//!
//! The server, on 127.0.0.1 and a free port, answers `GET /flaky` with 503,
//! then 503 again, then 200, and every `POST /orders` with 503. The GET is
//! retried; the POST is retried only because it carries an `Idempotency-Key`;
//! a request to a port where nothing listens is retried, then its connection
//! error returned. Each host gets its own retry budget (`build_per_host`), so
//! the order server's outage does not spend the other host's retries.
//!
//! ```text
//! cargo run --example reqwest_client --features reqwest
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{HttpRetryLayer, RetryInfo, IDEMPOTENCY_KEY};
use tower_backoff::Exponential;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener));

    let client = reqwest::Client::builder().no_proxy().build()?;
    let svc = ServiceBuilder::new()
        .layer(
            HttpRetryLayer::builder()
                .schedule(Exponential::new(Duration::from_millis(50)))
                .max_attempts(3)
                .build_per_host()?,
        )
        // Inside the retry layer, so they see every attempt.
        .map_request(|request: reqwest::Request| {
            println!("  -> {} {}", request.method(), request.url());
            request
        })
        .map_result(|result: Result<reqwest::Response, reqwest::Error>| {
            match &result {
                Ok(response) => println!("  <- {}", response.status()),
                Err(error) => println!("  <- error: {error}"),
            }
            result
        })
        .service(client.clone());

    println!("GET /flaky (idempotent: retried)");
    let get = client.get(format!("http://{addr}/flaky")).build()?;
    let flaky = report(svc.clone().oneshot(get).await);

    println!("POST /orders with an Idempotency-Key (retried, same key)");
    let post = client
        .post(format!("http://{addr}/orders"))
        .header(IDEMPOTENCY_KEY, "order-2024-0001")
        .body("one coffee")
        .build()?;
    report(svc.clone().oneshot(post).await);

    println!("GET to a port where nothing listens (connection refused: retried)");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let get = client.get(format!("http://{closed}/")).build()?;
    report(svc.oneshot(get).await);

    // The other two fail by design; the GET must get through, and the exit
    // status tells a script or test whether it did.
    if flaky != Some(StatusCode::OK) {
        return Err(format!("GET /flaky ended {flaky:?}, not 200").into());
    }
    println!("GET /flaky got its 200");
    Ok(())
}

/// Prints how the request ended, and its status if it got one.
fn report(
    result: Result<reqwest::Response, tower_backoff::Error<reqwest::Error>>,
) -> Option<StatusCode> {
    match result {
        Ok(response) => {
            let info = response
                .extensions()
                .get::<RetryInfo>()
                .expect("set by HttpRetryLayer");
            println!(
                "  = {} after {} attempt(s), {:?} asleep\n",
                response.status(),
                info.attempts,
                info.slept
            );
            Some(response.status())
        }
        Err(error) => {
            println!(
                "  = error (connect: {}): {error}\n",
                error.get_ref().is_some_and(|e| e.is_connect())
            );
            None
        }
    }
}

/// 503 twice, then 200, for flaky requests; always 503 for orders.
async fn serve(listener: TcpListener) {
    let flaky_hits = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let flaky_hits = flaky_hits.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let flaky_hits = flaky_hits.clone();
            async move {
                let path = request.uri().path().to_owned();
                let key = request.headers().get(IDEMPOTENCY_KEY).cloned();
                let body = request.into_body().collect().await?.to_bytes();
                let status = if path == "/orders" {
                    println!(
                        "     server got order {key:?}: {:?}",
                        String::from_utf8_lossy(&body)
                    );
                    StatusCode::SERVICE_UNAVAILABLE
                } else if flaky_hits.fetch_add(1, Ordering::Relaxed) % 3 < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                };
                let mut response = Response::new(Full::new(Bytes::from_static(b"busy")));
                *response.status_mut() = status;
                Ok::<_, hyper::Error>(response)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
