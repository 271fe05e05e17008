//! Retries a flaky local server through hyper-util's client.
//!
//! The server, on 127.0.0.1 and a free port, answers `GET /flaky` with 503,
//! then 429 asking for one second of patience, then 200; it answers every
//! `POST /orders` with 503. The client retries the GET and honours the
//! `Retry-After`; it sends the POST once, since repeating it could order twice;
//! it retries a streaming PUT, replaying its recorded body.
//!
//! ```text
//! cargo run --example hyper_client --features http
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo};
use tower_backoff::{BackoffLayer, Exponential};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type RequestBody = ReplayBody<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener));

    let client = Client::builder(TokioExecutor::new()).build_http::<RequestBody>();
    let svc = ServiceBuilder::new()
        .layer(HttpRetryLayer::from(
            BackoffLayer::builder()
                .policy(HttpPolicy::new())
                .schedule(
                    Exponential::new(Duration::from_millis(50)).max_delay(Duration::from_secs(2)),
                )
                .max_attempts(4)
                .max_elapsed(Duration::from_secs(5))
                .build()?,
        ))
        // Inside the retry layer, so they see every attempt.
        .map_request(|request: Request<RequestBody>| {
            println!("  -> {} {}", request.method(), request.uri().path());
            request
        })
        .map_result(|result: Result<Response<Incoming>, BoxError>| {
            match &result {
                Ok(response) => println!("  <- {}", response.status()),
                Err(error) => println!("  <- error: {error}"),
            }
            result
        })
        .timeout(Duration::from_secs(2))
        .service(client);

    let url = |path: &str| format!("http://{addr}{path}");
    let whole = |text: &'static str| ReplayBody::new(Full::new(Bytes::from(text)).boxed());

    println!("GET /flaky (idempotent: retried)");
    let response = svc
        .clone()
        .oneshot(Request::get(url("/flaky")).body(whole(""))?)
        .await?;
    let get = report(&response);

    println!("POST /orders (not idempotent: sent once)");
    let request = Request::post(url("/orders")).body(whole("one coffee"))?;
    let response = svc.clone().oneshot(request).await?;
    report(&response);

    println!("PUT /flaky with a streaming body (replayed on retry)");
    let chunks = ["chunk 1, ", "chunk 2, ", "chunk 3"]
        .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c))));
    let body = ReplayBody::new(StreamBody::new(futures::stream::iter(chunks)).boxed());
    let response = svc.oneshot(Request::put(url("/flaky")).body(body)?).await?;
    let put = report(&response);

    // The POST's 503 is the server's answer; the GET and the PUT must get
    // through, and the exit status tells a script or test whether they did.
    if get != StatusCode::OK || put != StatusCode::OK {
        return Err(format!("GET ended {get}, PUT ended {put}: both should be 200").into());
    }
    println!("GET and PUT got their 200");
    Ok(())
}

fn report<B>(response: &Response<B>) -> StatusCode {
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
    response.status()
}

/// 503, then 429 with `Retry-After: 1`, then 200, for each flaky request;
/// always 503 for orders.
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
                let body = request.into_body().collect().await?.to_bytes();
                let mut response = Response::new(Full::new(Bytes::new()));
                if path == "/orders" {
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                } else {
                    match flaky_hits.fetch_add(1, Ordering::Relaxed) % 3 {
                        0 => *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
                        1 => {
                            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                            response
                                .headers_mut()
                                .insert("retry-after", "1".parse().unwrap());
                        }
                        _ => {}
                    }
                }
                if !body.is_empty() {
                    println!(
                        "     server got {} bytes: {:?}",
                        body.len(),
                        String::from_utf8_lossy(&body)
                    );
                }
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
