//! `HttpPolicy::retry_unsent`: a request that provably never reached the
//! server (connection refused; handed back unwritten by hyper) is retried
//! whatever its method, through hyper-util's client, reqwest and hyper's own
//! connection, against real sockets on 127.0.0.1 and a real hyper server on
//! an in-memory pipe; a request that reached the server is not, however its
//! connection ended.
#![cfg(feature = "reqwest")]

use crate::http_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{is_unsent, HttpPolicy, HttpRetryLayer, RetryInfo};
use tower_backoff::{BackoffLayer, Budget, Cause, Constant, Jitter};

use http_server::{counting, http_layer_with as layer_with, status, unused_addr, Server};

/// The sleep between ordinary retries.
const SLEEP: Duration = Duration::from_secs(1);

fn layer(policy: HttpPolicy) -> HttpRetryLayer {
    layer_with(policy, Constant::new(SLEEP), 3, None)
}

/// A server on `addr` that starts half a second from now, between the
/// first attempts and the first ordinary retry.
fn starts_soon(addr: std::net::SocketAddr) -> tokio::task::JoinHandle<Server> {
    tokio::spawn(async move {
        tokio::time::sleep(SLEEP / 2).await;
        Server::start_on(addr, |_, _| status(200)).await
    })
}

fn hyper_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn hyper_post(url: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(url)
        .body(Full::new(Bytes::from_static(b"order=1")))
        .unwrap()
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn reqwest_post(url: &str) -> reqwest::Request {
    let mut post = reqwest::Request::new(Method::POST, url.parse().unwrap());
    *post.body_mut() = Some("order=1".into());
    post
}

// --- connection refused: never sent --------------------------------------------

#[tokio::test(start_paused = true)]
async fn post_to_a_closed_port_is_retried_until_the_server_is_up_with_retry_unsent_through_hyper_util(
) {
    let addr = unused_addr();
    let starting = starts_soon(addr);
    let (count, attempts) = counting::<http::Request<Full<Bytes>>>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .map_request(count)
        .service(hyper_client());
    let response = svc
        .oneshot(hyper_post(&format!("http://{addr}/orders")))
        .await
        .unwrap();
    let server = starting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Refused, refused again at once (the transparent retry), then sent
    // after one sleep: the server got the POST once.
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!(
        *response.extensions().get::<RetryInfo>().unwrap(),
        RetryInfo::new(3, SLEEP)
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.clone(), &seen[0].body[..]),
        (Method::POST, &b"order=1"[..])
    );
}

#[tokio::test(start_paused = true)]
async fn post_to_a_closed_port_is_sent_once_without_retry_unsent_through_hyper_util() {
    let addr = unused_addr();
    let starting = starts_soon(addr);
    let (count, attempts) = counting::<http::Request<Full<Bytes>>>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .map_request(count)
        .service(hyper_client());
    let error = svc
        .oneshot(hyper_post(&format!("http://{addr}/orders")))
        .await
        .unwrap_err();
    assert!(client_error(&error).is_connect(), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let server = starting.await.unwrap();
    assert_eq!(server.requests(), 0);
}

#[tokio::test(start_paused = true)]
async fn post_to_a_closed_port_is_retried_until_the_server_is_up_with_retry_unsent_through_reqwest()
{
    let addr = unused_addr();
    let starting = starts_soon(addr);
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .map_request(count)
        .service(reqwest_client());
    let response = svc
        .oneshot(reqwest_post(&format!("http://{addr}/orders")))
        .await
        .unwrap();
    let server = starting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(&seen[0].body[..], b"order=1");
}

#[tokio::test(start_paused = true)]
async fn post_to_a_closed_port_is_sent_once_without_retry_unsent_through_reqwest() {
    let addr = unused_addr();
    let starting = starts_soon(addr);
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .map_request(count)
        .service(reqwest_client());
    let error = svc
        .oneshot(reqwest_post(&format!("http://{addr}/orders")))
        .await
        .unwrap_err();
    assert!(error.get_ref().is_some_and(|e| e.is_connect()), "{error:?}");
    assert!(is_unsent(&error));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let server = starting.await.unwrap();
    assert_eq!(server.requests(), 0);
}

// --- the transparent retry ------------------------------------------------------

/// Refuses every retry it is asked to pay for.
#[derive(Debug, Default)]
struct Empty {
    asked: AtomicUsize,
}

impl Budget for Empty {
    fn would_allow(&self, _: Cause) -> bool {
        false
    }

    fn try_retry(&self, _: Cause) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst);
        false
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_unsent_retry_goes_out_at_once_uncounted_and_unpaid() {
    let addr = unused_addr();
    let budget = Arc::new(Empty::default());
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(
            BackoffLayer::builder()
                .policy(HttpPolicy::new().retry_unsent())
                .schedule(Constant::new(SLEEP))
                .jitter(Jitter::None)
                .max_attempts(2)
                .budget(budget.clone())
                .build()
                .unwrap(),
        )
        .map_request(count)
        .service(reqwest_client());
    let started = Instant::now();
    let error = svc
        .oneshot(reqwest_post(&format!("http://{addr}/orders")))
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    // The transparent retry went out at once although the budget pays for
    // nothing; the next one, an ordinary retry, was refused by it.
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(budget.asked.load(Ordering::SeqCst), 0);
    assert!(started.elapsed() < SLEEP, "{:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn unsent_retries_stop_at_the_attempt_limit_after_the_transparent_one() {
    let addr = unused_addr();
    let (count, attempts) = counting::<http::Request<Full<Bytes>>>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .map_request(count)
        .service(hyper_client());
    let started = Instant::now();
    let error = svc
        .oneshot(hyper_post(&format!("http://{addr}/orders")))
        .await
        .unwrap_err();
    assert!(client_error(&error).is_connect(), "{error:?}");
    // One transparent retry, then the three attempts the layer allows.
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
    assert_eq!(started.elapsed(), 2 * SLEEP);
}

// --- reached the server: not provably unsent -------------------------------------

/// A server that reads whole requests and resets each connection instead of
/// answering: what it saw happened, the client cannot know whether.
async fn resets_after_reading() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut seen = Vec::new();
            let mut buf = [0; 4096];
            while !seen.ends_with(b"order=1") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            if seen.ends_with(b"order=1") {
                count.fetch_add(1, Ordering::SeqCst);
            }
            stream.set_zero_linger().unwrap();
            drop(stream);
        }
    });
    (url, received)
}

#[tokio::test(start_paused = true)]
async fn post_reset_after_the_server_read_it_is_not_retried_with_retry_unsent_through_hyper_util() {
    let (url, received) = resets_after_reading().await;
    let (count, attempts) = counting::<http::Request<Full<Bytes>>>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .map_request(count)
        .service(hyper_client());
    let error = svc.oneshot(hyper_post(&url)).await.unwrap_err();
    assert!(!client_error(&error).is_connect(), "{error:?}");
    assert!(!is_unsent(&*error), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(received.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn post_reset_after_the_server_read_it_is_not_retried_with_retry_unsent_through_reqwest() {
    let (url, received) = resets_after_reading().await;
    let (count, attempts) = counting::<reqwest::Request>();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .map_request(count)
        .service(reqwest_client());
    let error = svc.oneshot(reqwest_post(&url)).await.unwrap_err();
    assert!(
        !error.get_ref().is_some_and(|e| e.is_connect()),
        "{error:?}"
    );
    assert!(!is_unsent(&error), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(received.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn put_reset_after_the_server_read_it_is_still_retried_with_retry_unsent() {
    let (url, received) = resets_after_reading().await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .service(reqwest_client());
    // A PUT may be repeated anyway: retry_unsent takes nothing away.
    let mut put = reqwest_post(&url);
    *put.method_mut() = Method::PUT;
    let error = svc.oneshot(put).await.unwrap_err();
    assert!(!is_unsent(&error), "{error:?}");
    assert_eq!(received.load(Ordering::SeqCst), 3);
}

// --- handed back unwritten: a connection gone before the request went out ------

/// A client that opens a fresh HTTP/1 connection per attempt over an
/// in-memory pipe to a real hyper server, except that the first attempt's
/// connection is gone before the request is written: hyper hands the
/// request back, canceled. Returns the client and the requests the server
/// received.
fn first_connection_gone() -> (
    impl tower::Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<hyper::body::Incoming>,
            Error = hyper::Error,
            Future = impl Send,
        > + Clone,
    Arc<AtomicUsize>,
) {
    use hyper_util::rt::TokioIo;
    let received = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    let client = tower::service_fn(move |request: http::Request<Full<Bytes>>| {
        let first = attempts.fetch_add(1, Ordering::SeqCst) == 0;
        let received = count.clone();
        async move {
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await?;
            if first {
                drop(connection);
            } else {
                tokio::spawn(connection);
                let server = hyper::service::service_fn(move |_: http::Request<_>| {
                    received.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            Full::<Bytes>::default(),
                        ))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(server_io), server),
                );
            }
            sender.send_request(request).await
        }
    });
    (client, received)
}

#[tokio::test(start_paused = true)]
async fn post_handed_back_unwritten_is_retried_with_retry_unsent() {
    let (client, received) = first_connection_gone();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_unsent()))
        .service(client);
    let response = svc.oneshot(hyper_post("/orders")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        *response.extensions().get::<RetryInfo>().unwrap(),
        RetryInfo::new(2, Duration::ZERO)
    );
    assert_eq!(received.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn post_handed_back_unwritten_is_returned_without_retry_unsent() {
    let (client, received) = first_connection_gone();
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .service(client);
    let error = svc.oneshot(hyper_post("/orders")).await.unwrap_err();
    assert!(
        error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled),
        "{error:?}"
    );
    assert!(is_unsent(&*error));
    assert_eq!(received.load(Ordering::SeqCst), 0);
}

/// The hyper-util client's error inside the layer's boxed one.
fn client_error(error: &tower::BoxError) -> &hyper_util::client::legacy::Error {
    error
        .downcast_ref()
        .unwrap_or_else(|| panic!("a hyper-util client error: {error:?}"))
}
