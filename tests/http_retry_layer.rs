//! `HttpRetryLayer`, built with nothing but its own builder, around real
//! reqwest and hyper-util clients talking to a real hyper server on
//! 127.0.0.1. It proves the layer's three promises about bodies end to end:
//! - a response body cut short within the buffer limit is retried, and the
//!   caller gets a whole body or an error, never a body that fails later;
//! - a streaming reqwest upload within the replay limit is sent again byte
//!   for byte, and one past it goes out once;
//! - a response without a length streams through: the caller reads its
//!   first chunk before the server has sent the rest.
#![cfg(all(feature = "http", feature = "reqwest"))]

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{stream, StreamExt};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{
    HttpPolicy, HttpRetryBuilder, HttpRetryLayer, RetryInfo, DEFAULT_RESPONSE_BUFFER_LIMIT,
};
use tower_backoff::Cause;
use tower_backoff::{Constant, Jitter};

/// The sleep between attempts: constant, no jitter, so that on the paused
/// clock the tests never wait on chance.
const STEP: Duration = Duration::from_millis(100);

/// Attempts the layer allows in every test.
const MAX_ATTEMPTS: u32 = 3;

/// How long the tests on the real clock wait for anything before failing,
/// so a layer that holds a streaming body back fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(5);

/// The layer under test, from its builder only: a short constant schedule,
/// no jitter, [`MAX_ATTEMPTS`], no budget, and response bodies read ahead
/// (off by default).
fn retry_layer() -> HttpRetryLayer {
    settings()
        .buffer_limit(DEFAULT_RESPONSE_BUFFER_LIMIT)
        .build()
        .unwrap()
}

/// [`retry_layer`]'s settings, the read-ahead left at its default.
fn settings() -> HttpRetryBuilder {
    HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .max_attempts(MAX_ATTEMPTS)
        .no_budget()
}

// --- the server ---------------------------------------------------------------

type ServerBody = UnsyncBoxBody<Bytes, io::Error>;

/// A hyper server on 127.0.0.1 (port 0) answering the `n`th request (from 0)
/// with `script(n)`, after reading its body whole; it records every request
/// body it received.
struct Server {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Server {
    async fn start(script: impl Fn(usize) -> Response<ServerBody> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let log = bodies.clone();
        let script = Arc::new(script);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let log = log.clone();
                        let script = script.clone();
                        async move {
                            // A body the client failed to send counts as
                            // empty: the test compares it and fails.
                            let body = match request.into_body().collect().await {
                                Ok(collected) => collected.to_bytes(),
                                Err(_) => Bytes::new(),
                            };
                            let n = {
                                let mut log = log.lock().unwrap();
                                log.push(body);
                                log.len() - 1
                            };
                            Ok::<_, Infallible>(script(n))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server { addr, bodies }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn requests(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }

    /// The body of every request received, in order.
    fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().unwrap().clone()
    }
}

fn response(status: u16, length: Option<usize>, body: ServerBody) -> Response<ServerBody> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    if let Some(length) = length {
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, length.into());
    }
    response
}

/// `body` whole, with its `content-length`.
fn whole(status: u16, body: Bytes) -> Response<ServerBody> {
    let length = body.len();
    let frames = stream::iter([Ok(Frame::data(body))]);
    response(status, Some(length), StreamBody::new(frames).boxed_unsync())
}

/// `content-length: declared`, then only `sent` (shorter), then the
/// connection closes: a body ending in an error makes hyper abort the
/// connection. The error comes a moment after the data, so that hyper has
/// sent the headers and the data first.
fn cut_short(declared: usize, sent: Bytes) -> Response<ServerBody> {
    let data = stream::iter([Ok(Frame::data(sent))]);
    let close = stream::once(async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Err(io::Error::other("closing mid-body"))
    });
    let body = StreamBody::new(data.chain(close)).boxed_unsync();
    response(200, Some(declared), body)
}

/// A chunked `200` (no `content-length`): `first`, then nothing until `gate`
/// is notified, then `rest`.
fn chunked_gated(first: Bytes, gate: Arc<Notify>, rest: Bytes) -> Response<ServerBody> {
    let first = stream::iter([Ok(Frame::data(first))]);
    let rest = stream::once(async move {
        gate.notified().await;
        Ok(Frame::data(rest))
    });
    response(200, None, StreamBody::new(first.chain(rest)).boxed_unsync())
}

/// `len` bytes that differ from their neighbours, so a reordered, dropped or
/// repeated chunk shows.
fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// The first answer's body breaks off after 100 of its 1,000 bytes; later
/// ones come whole.
fn cut_short_once(n: usize) -> Response<ServerBody> {
    match n {
        0 => cut_short(1000, pattern(100)),
        _ => whole(200, pattern(1000)),
    }
}

fn always_cut_short(_: usize) -> Response<ServerBody> {
    cut_short(1000, pattern(100))
}

// --- the clients --------------------------------------------------------------

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn hyper_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn reqwest_get(server: &Server) -> reqwest::Request {
    reqwest::Request::new(Method::GET, server.url().parse().unwrap())
}

fn hyper_get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url()).body(Full::default()).unwrap()
}

/// A PUT whose body is `upload` as a stream of 1,000-byte chunks:
/// `reqwest::Body::wrap` of a stream body, which reqwest's `try_clone`
/// cannot copy, so only the layer's recording can send it again.
fn streaming_put(server: &Server, upload: &Bytes) -> reqwest::Request {
    let chunks: Vec<Result<Frame<Bytes>, Infallible>> = upload
        .chunks(1000)
        .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    let mut put = reqwest::Request::new(Method::PUT, server.url().parse().unwrap());
    *put.body_mut() = Some(reqwest::Body::wrap(StreamBody::new(stream::iter(chunks))));
    assert!(
        put.try_clone().is_none(),
        "a streaming body reqwest cannot copy"
    );
    put
}

fn reqwest_info(response: &reqwest::Response) -> RetryInfo {
    *response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
}

fn hyper_info<B>(response: &Response<B>) -> RetryInfo {
    *response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
}

// --- 1. a body cut short once is retried and arrives whole -------------------------

#[tokio::test(start_paused = true)]
async fn reqwest_get_whose_body_is_cut_short_once_reaches_the_caller_whole_after_2_attempts() {
    let server = Server::start(cut_short_once).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(reqwest_client());
    let response = svc.oneshot(reqwest_get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(reqwest_info(&response).attempts, 2);
    assert_eq!(response.bytes().await.unwrap(), pattern(1000));
    assert_eq!(server.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn hyper_util_get_whose_body_is_cut_short_once_reaches_the_caller_whole_after_2_attempts() {
    let server = Server::start(cut_short_once).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(hyper_client());
    let response = svc.oneshot(hyper_get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(hyper_info(&response).attempts, 2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, pattern(1000));
    assert_eq!(server.requests(), 2);
}

// --- 1b. by default nothing is read ahead: a body cut short fails the caller's read ---

#[tokio::test(start_paused = true)]
async fn by_default_a_reqwest_body_cut_short_is_returned_at_its_headers_and_fails_the_callers_read()
{
    let server = Server::start(always_cut_short).await;
    let svc = ServiceBuilder::new()
        .layer(settings().build().unwrap())
        .service(reqwest_client());
    let response = svc.oneshot(reqwest_get(&server)).await.unwrap();
    assert_eq!(reqwest_info(&response).attempts, 1);
    let error = response
        .bytes()
        .await
        .expect_err("a body cut short is never whole");
    assert!(error.is_body() || error.is_decode(), "{error:?}");
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn by_default_a_hyper_util_body_cut_short_is_returned_at_its_headers_and_fails_the_callers_read(
) {
    let server = Server::start(always_cut_short).await;
    let svc = ServiceBuilder::new()
        .layer(settings().build().unwrap())
        .service(hyper_client());
    let response = svc.oneshot(hyper_get(&server)).await.unwrap();
    assert_eq!(hyper_info(&response).attempts, 1);
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_classifies_bodies_reads_them_ahead_by_default_and_retries_one_cut_short() {
    let server = Server::start(cut_short_once).await;
    let policy =
        HttpPolicy::new().retry_on_body(|_, _, body| body.is_empty().then_some(Cause::Transient));
    let svc = ServiceBuilder::new()
        .layer(settings().policy(policy).build().unwrap())
        .service(reqwest_client());
    let response = svc.oneshot(reqwest_get(&server)).await.unwrap();
    assert_eq!(reqwest_info(&response).attempts, 2);
    assert_eq!(response.bytes().await.unwrap(), pattern(1000));
    assert_eq!(server.requests(), 2);
}

// --- 2. a body always cut short is an error, never a response ------------------------

#[tokio::test(start_paused = true)]
async fn reqwest_get_whose_body_is_always_cut_short_ends_in_an_error_after_max_attempts() {
    let server = Server::start(always_cut_short).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(reqwest_client());
    let outcome = svc.oneshot(reqwest_get(&server)).await;
    let error = outcome.expect_err("a body cut short is never a success");
    assert!(
        error.get_ref().is_some_and(|e| e.is_body())
            || error.get_ref().is_some_and(|e| e.is_decode()),
        "{error:?}"
    );
    assert_eq!(server.requests(), MAX_ATTEMPTS as usize);
}

#[tokio::test(start_paused = true)]
async fn hyper_util_get_whose_body_is_always_cut_short_ends_in_an_error_after_max_attempts() {
    let server = Server::start(always_cut_short).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(hyper_client());
    let outcome = svc.oneshot(hyper_get(&server)).await;
    let error = outcome.expect_err("a body cut short is never a success");
    assert!(error.downcast_ref::<hyper::Error>().is_some(), "{error:?}");
    assert_eq!(server.requests(), MAX_ATTEMPTS as usize);
}

// --- 3. and 4. streaming uploads through reqwest -------------------------------------

#[tokio::test(start_paused = true)]
async fn reqwest_60_kb_streaming_upload_answered_503_then_200_is_sent_twice_byte_identical() {
    let upload = pattern(60_000);
    let server = Server::start(|n| match n {
        0 => whole(503, Bytes::from_static(b"busy")),
        _ => whole(200, Bytes::from_static(b"stored")),
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(reqwest_client());
    let response = svc.oneshot(streaming_put(&server, &upload)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(reqwest_info(&response).attempts, 2);
    assert_eq!(response.bytes().await.unwrap(), "stored");
    assert_eq!(server.bodies(), [upload.clone(), upload]);
}

#[tokio::test(start_paused = true)]
async fn reqwest_streaming_upload_over_the_replay_limit_goes_out_once_and_its_503_is_returned() {
    // 4 KB against a 2 KiB limit: the recording gives up part way, so
    // there is nothing to send again.
    let upload = pattern(4_000);
    let server = Server::start(|_| whole(503, Bytes::from_static(b"busy"))).await;
    let layer = HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .max_attempts(MAX_ATTEMPTS)
        .replay_limit(2 * 1024)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(reqwest_client());
    let response = svc.oneshot(streaming_put(&server, &upload)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reqwest_info(&response).attempts, 1);
    assert_eq!(server.requests(), 1);
    assert_eq!(server.bodies(), [upload], "the one upload went out whole");
}

// --- 5. a chunked response streams through -------------------------------------------
//
// On the real clock: these wait on real sockets with a timeout, which the
// paused clock could fire early while the runtime idles on I/O.

/// The server's first chunk, then (once the test opens the gate) the rest.
fn first_chunk() -> Bytes {
    Bytes::from_static(b"first chunk, sent before the rest")
}

fn rest() -> Bytes {
    Bytes::from_static(b"the rest, sent once the test has read the first")
}

/// `future`, or a panic naming `what` after [`PATIENCE`].
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not arrive within {PATIENCE:?}"))
}

#[tokio::test]
async fn reqwest_chunked_response_reaches_the_caller_before_the_server_sends_the_rest() {
    let gate = Arc::new(Notify::new());
    let server_gate = gate.clone();
    let server =
        Server::start(move |_| chunked_gated(first_chunk(), server_gate.clone(), rest())).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(reqwest_client());

    // The rest is held back until the gate opens below, so the response and
    // its first chunk can only arrive here if the layer streams them.
    let mut response = within("the response", svc.oneshot(reqwest_get(&server)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.content_length(), None, "chunked: no length");
    assert_eq!(reqwest_info(&response).attempts, 1);
    let mut read = Vec::new();
    while read.len() < first_chunk().len() {
        let chunk = within("the first chunk", response.chunk()).await.unwrap();
        read.extend_from_slice(&chunk.expect("the body goes on past the first chunk"));
    }
    assert_eq!(read, first_chunk());

    gate.notify_one();
    let remainder = within("the rest", response.bytes()).await.unwrap();
    assert_eq!(remainder, rest());
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn hyper_util_chunked_response_reaches_the_caller_before_the_server_sends_the_rest() {
    let gate = Arc::new(Notify::new());
    let server_gate = gate.clone();
    let server =
        Server::start(move |_| chunked_gated(first_chunk(), server_gate.clone(), rest())).await;
    let svc = ServiceBuilder::new()
        .layer(retry_layer())
        .service(hyper_client());

    // As above: nothing past the first chunk is sent before the gate opens.
    let response = within("the response", svc.oneshot(hyper_get(&server)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response
        .headers()
        .contains_key(http::header::CONTENT_LENGTH));
    assert_eq!(hyper_info(&response).attempts, 1);
    let mut body = response.into_body();
    let mut read = Vec::new();
    while read.len() < first_chunk().len() {
        let frame = within("the first chunk", body.frame())
            .await
            .expect("the body goes on past the first chunk")
            .unwrap();
        read.extend_from_slice(&frame.into_data().expect("a data frame"));
    }
    assert_eq!(read, first_chunk());

    gate.notify_one();
    let remainder = within("the rest", body.collect()).await.unwrap().to_bytes();
    assert_eq!(remainder, rest());
    assert_eq!(server.requests(), 1);
}
