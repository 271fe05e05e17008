//! A flaky local server answers 503 a few times, then 200; a hyper-util client
//! wrapped in `BackoffLayer` rides it out. Prints every attempt and the delay
//! before it, then exits.
//!
//! ```text
//! cargo run --release -p demo --bin quickstart
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_backoff::{classify_fn, BackoffLayer, Decision, Exponential, Jitter};

const FAILURES: usize = 3;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = flaky_server(FAILURES).await?;
    println!("server on http://{addr}: answers 503 {FAILURES} times, then 200\n");

    // Retry 503s and connection errors; everything else is an answer.
    let policy = classify_fn(
        |_: &Request<Full<Bytes>>, result: &Result<Response<Incoming>, _>| match result {
            Ok(response) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                Decision::retry()
            }
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        },
    );
    let layer = BackoffLayer::builder()
        .policy(policy)
        .schedule(Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_secs(2)))
        .jitter(Jitter::Full)
        .max_attempts(5)
        .max_elapsed(Duration::from_secs(10))
        .build()?;

    // Logs each attempt as it leaves, with the time since the previous one.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let started = Instant::now();
    let last = Arc::new(std::sync::Mutex::new(started));
    let attempts = Arc::new(AtomicUsize::new(0));
    let logged = {
        let attempts = attempts.clone();
        service_fn(move |request: Request<Full<Bytes>>| {
            let n = attempts.fetch_add(1, Ordering::SeqCst) + 1;
            let now = Instant::now();
            let waited = now - std::mem::replace(&mut *last.lock().unwrap(), now);
            let client = client.clone();
            async move {
                let response = client.request(request).await?;
                println!(
                    "attempt {n}: slept {:>4} ms before it -> {}",
                    waited.as_millis(),
                    response.status()
                );
                Ok::<_, hyper_util::client::legacy::Error>(response)
            }
        })
    };

    let svc = ServiceBuilder::new().layer(layer).service(logged);
    let request = Request::get(format!("http://{addr}/")).body(Full::new(Bytes::new()))?;
    let response = svc.oneshot(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    println!(
        "\nfinal: {status} {:?} after {} attempts in {} ms",
        body,
        attempts.load(Ordering::SeqCst),
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Answers 503 to the first `failures` requests, then 200.
async fn flaky_server(failures: usize) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let hits = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hits = hits.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let n = hits.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let (status, body) = if n < failures {
                            (StatusCode::SERVICE_UNAVAILABLE, "busy, try later")
                        } else {
                            (StatusCode::OK, "hello from a recovered server")
                        };
                        let mut response = Response::new(Full::new(Bytes::from(body)));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}
