//! Responses classified on their body and bodies cut short, through
//! `BufferBody` inside the retry layer, against a real hyper server on
//! 127.0.0.1 and real hyper-util and reqwest clients.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{stream, StreamExt};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::{BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_backoff::http::parts::BufferBodyLayer;
use tower_backoff::http::{HttpPolicy, HttpRetryLayer, RetryInfo, DEFAULT_BUFFER_LIMIT};
use tower_backoff::{BackoffLayer, Cause, Constant, Jitter};

use http_server::{http_layer as layer, STEP};

/// `client` behind the retry layer with `policy`, its response bodies read
/// ahead up to the default limit.
fn buffered<S: Clone>(
    policy: HttpPolicy,
    client: S,
) -> tower_backoff::http::HttpRetry<tower_backoff::http::parts::BufferBody<S>> {
    layer(policy).layer(BufferBodyLayer::new().layer(client))
}

/// What the server sends for one request.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    chunks: Vec<Bytes>,
    /// Close the connection after the chunks, whatever the headers promised.
    then_close: bool,
    /// Send nothing more after the chunks, never ending the body.
    then_stall: bool,
    trailers: Option<HeaderMap>,
}

/// `body` whole, with its `content-length`.
fn whole(status: u16, body: impl Into<Bytes>) -> Answer {
    let body = body.into();
    Answer {
        status,
        headers: vec![("content-length", body.len().to_string())],
        chunks: vec![body],
        then_close: false,
        then_stall: false,
        trailers: None,
    }
}

/// `content-length: declared`, then `sent` (shorter), then the connection
/// closes.
fn cut_short(declared: usize, sent: impl Into<Bytes>) -> Answer {
    Answer {
        status: 200,
        headers: vec![("content-length", declared.to_string())],
        chunks: vec![sent.into()],
        then_close: true,
        then_stall: false,
        trailers: None,
    }
}

/// `body` in chunks of `chunk` bytes, with no length: chunked encoding.
fn chunked(body: &Bytes, chunk: usize) -> Answer {
    Answer {
        status: 200,
        headers: Vec::new(),
        chunks: body.chunks(chunk).map(Bytes::copy_from_slice).collect(),
        then_close: false,
        then_stall: false,
        trailers: None,
    }
}

fn with_header(mut answer: Answer, name: &'static str, value: &str) -> Answer {
    answer.headers.push((name, value.to_owned()));
    answer
}

/// `len` bytes that differ from their neighbours, starting with
/// "queue capacity", so a reordered or dropped chunk shows.
fn pattern(len: usize) -> Bytes {
    let mut body = b"queue capacity".to_vec();
    body.extend((0..len).map(|i| (i % 251) as u8));
    body.truncate(len);
    Bytes::from(body)
}

/// The first answer's body breaks off after 100 of its 1,000 bytes; the
/// next ones come whole.
fn cut_short_once(n: usize, _: &Method) -> Answer {
    match n {
        0 => cut_short(1000, pattern(100)),
        _ => whole(200, pattern(1000)),
    }
}

/// A `200` whose body says the queue is full, then `200` "done".
fn queue_full_once(n: usize, _: &Method) -> Answer {
    match n {
        0 => whole(200, "error: queue capacity exceeded"),
        _ => whole(200, "done"),
    }
}

/// A hyper server on 127.0.0.1 (port 0) answering the `n`th request (from 0)
/// with `script(n, method)`; counts requests.
struct Server {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl Server {
    async fn start(script: impl Fn(usize, &Method) -> Answer + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let script = Arc::new(script);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let counter = counter.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let answer = script(n, request.method());
                        async move { Ok::<_, io::Error>(respond(answer)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server {
            addr,
            requests,
            connections,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// The answer as a hyper response. A body that ends in an error makes hyper
/// abort the connection: the client sees it close mid-body. The error comes a
/// moment after the data, so that hyper has sent the headers and the data.
fn respond(answer: Answer) -> Response<UnsyncBoxBody<Bytes, io::Error>> {
    let trailers = answer.trailers.map(|t| Ok(Frame::trailers(t)));
    let data = stream::iter(
        answer
            .chunks
            .into_iter()
            .map(|c| Ok(Frame::data(c)))
            .chain(trailers),
    );
    let body = if answer.then_stall {
        StreamBody::new(data.chain(stream::pending())).boxed_unsync()
    } else if answer.then_close {
        let close = stream::once(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Err(io::Error::other("closing mid-body"))
        });
        StreamBody::new(data.chain(close)).boxed_unsync()
    } else {
        StreamBody::new(data).boxed_unsync()
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap();
    for (name, value) in answer.headers {
        response
            .headers_mut()
            .insert(name, value.parse().expect("valid header value"));
    }
    response
}

fn hyper_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url()).body(Full::default()).unwrap()
}

fn attempts<B>(response: &Response<B>) -> u32 {
    response
        .extensions()
        .get::<RetryInfo>()
        .expect("every response carries RetryInfo")
        .attempts
}

fn queue_full(_: StatusCode, _: &HeaderMap, body: &[u8]) -> Option<Cause> {
    body.windows(14)
        .any(|w| w == b"queue capacity")
        .then_some(Cause::Throttled)
}

/// Whether `error`'s `source()` chain holds an `io::Error` of `kind`.
fn chain_has_io_kind(error: &(dyn std::error::Error + 'static), kind: io::ErrorKind) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == kind)
        {
            return true;
        }
        next = error.source();
    }
    false
}

// Bodies cut short.

#[tokio::test(start_paused = true)]
async fn without_buffering_a_body_cut_short_is_returned_as_a_success_that_fails_when_read() {
    let server = Server::start(cut_short_once).await;
    // A zero limit reads no body of any length ahead: the layer's parts
    // without `BufferBody`.
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()).buffer_limit(0))
        .service(hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 1);
    let error = response.into_body().collect().await.unwrap_err();
    assert!(
        chain_has_io_kind(&error, io::ErrorKind::UnexpectedEof),
        "{error:?}"
    );
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn hyper_util_get_whose_body_is_cut_short_is_retried_and_returns_the_whole_body() {
    let server = Server::start(cut_short_once).await;
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        pattern(1000)
    );
    assert_eq!(server.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn hyper_util_get_whose_body_is_always_cut_short_returns_the_last_real_error() {
    let server = Server::start(|_, _| cut_short(1000, pattern(100))).await;
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let error: BoxError = svc.oneshot(get(&server)).await.unwrap_err();
    let hyper_error = error
        .downcast_ref::<hyper::Error>()
        .expect("the body's own error, boxed as is");
    assert_eq!(
        hyper_error.to_string(),
        "error reading a body from connection"
    );
    assert!(chain_has_io_kind(&*error, io::ErrorKind::UnexpectedEof));
    assert_eq!(server.requests(), 3, "every attempt the layer allows");
}

#[tokio::test(start_paused = true)]
async fn post_whose_body_is_cut_short_is_sent_once_and_its_error_returned() {
    let server = Server::start(cut_short_once).await;
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let post = Request::post(server.url())
        .body(Full::from("order"))
        .unwrap();
    let error = svc.oneshot(post).await.unwrap_err();
    assert!(error.downcast_ref::<hyper::Error>().is_some(), "{error:?}");
    assert_eq!(server.requests(), 1);
}

/// A raw server (hyper will not send these bytes): the headers and the first
/// 100 of 1,000 promised bytes, then the socket closes with a reset (linger
/// 0) on the first connection; a whole response on the next.
async fn resetting_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let n = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let body = pattern(1000);
                let mut reply =
                    b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\nconnection: close\r\n\r\n"
                        .to_vec();
                if n == 0 {
                    reply.extend_from_slice(&body[..100]);
                    let _ = stream.write_all(&reply).await;
                    let _ = stream.flush().await;
                    stream.set_zero_linger().unwrap();
                    drop(stream);
                } else {
                    reply.extend_from_slice(&body);
                    let _ = stream.write_all(&reply).await;
                }
            });
        }
    });
    (addr, connections)
}

#[tokio::test(start_paused = true)]
async fn hyper_util_get_whose_connection_is_reset_mid_body_is_retried() {
    let (addr, connections) = resetting_server().await;
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        pattern(1000)
    );
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_within_the_limit_is_cut_by_the_attempt_timeout_and_retried() {
    let server = Server::start(|n, _| match n {
        0 => Answer {
            then_close: false,
            then_stall: true,
            ..cut_short(1000, pattern(100))
        },
        _ => whole(200, pattern(1000)),
    })
    .await;
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .attempt_timeout(Duration::from_secs(1))
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(HttpRetryLayer::from(layer))
        .layer(BufferBodyLayer::new())
        .service(hyper_client());
    let started = tokio::time::Instant::now();
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(started.elapsed(), Duration::from_secs(1) + STEP);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        pattern(1000)
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_chunked_body_is_a_final_error_not_a_panic() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n\xff\xfe\x00zz\r\n",
                )
                .await;
        }
    });
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    let error = svc.oneshot(request).await.unwrap_err();
    assert!(error.downcast_ref::<hyper::Error>().is_some(), "{error:?}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "a parse error is the server's fault, not transient"
    );
}

// Bodies classified.

#[tokio::test(start_paused = true)]
async fn a_200_whose_body_says_queue_capacity_is_retried_and_the_next_answer_returned() {
    let server = Server::start(queue_full_once).await;
    let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "done"
    );
    assert_eq!(server.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_always_says_queue_capacity_returns_the_last_response_readable() {
    let server = Server::start(|n, _| whole(200, format!("queue capacity, try {n}"))).await;
    let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 3);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "queue capacity, try 2"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_retry_waits_the_retry_after_the_server_names() {
    let server = Server::start(|n, _| match n {
        0 => with_header(whole(200, "queue capacity"), "retry-after", "2"),
        _ => whole(200, "done"),
    })
    .await;
    let policy = HttpPolicy::new()
        .retry_on_body(queue_full)
        .server_delay_jitter(0, Duration::ZERO);
    let svc = buffered(policy, hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    let info = *response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info, RetryInfo::new(2, Duration::from_secs(2)));
}

/// 10 KiB: more than the policy drains to save a connection (4 KiB), less
/// than the buffer's limit.
#[tokio::test(start_paused = true)]
async fn a_buffered_response_retried_away_leaves_its_connection_to_the_retry() {
    let busy = Bytes::from(vec![b'x'; 10 * 1024]);
    let server = Server::start(move |n, _| match n {
        0 => whole(503, busy.clone()),
        _ => whole(200, "done"),
    })
    .await;
    let svc = buffered(HttpPolicy::new(), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        server.connections(),
        1,
        "the retry went out on the same connection"
    );

    let unbuffered = Server::start(move |n, _| match n {
        0 => whole(503, Bytes::from(vec![b'x'; 10 * 1024])),
        _ => whole(200, "done"),
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()).buffer_limit(0))
        .service(hyper_client());
    let response = svc.oneshot(get(&unbuffered)).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        unbuffered.connections(),
        2,
        "without it, the body too large to drain closes it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_classifier_never_overrides_x_should_retry_false() {
    let server =
        Server::start(|_, _| with_header(whole(200, "queue capacity"), "x-should-retry", "false"))
            .await;
    let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 1);
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_classifier_does_not_make_a_post_repeatable() {
    let server = Server::start(|_, _| whole(200, "queue capacity")).await;
    let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), hyper_client());
    let post = Request::post(server.url())
        .body(Full::from("order"))
        .unwrap();
    let response = svc.oneshot(post).await.unwrap();
    assert_eq!(attempts(&response), 1);
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn statuses_still_retry_with_a_body_classifier_set() {
    let server = Server::start(|n, _| match n {
        0 => whole(503, "busy"),
        _ => whole(200, "done"),
    })
    .await;
    let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(attempts(&response), 2);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "done"
    );
}

// Bodies over the limit.

#[tokio::test(start_paused = true)]
async fn a_chunked_body_over_the_limit_streams_through_byte_identical_and_unclassified() {
    let body = pattern(5000);
    let sent = body.clone();
    let server = Server::start(move |_, _| chunked(&sent, 100)).await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new().retry_on_body(queue_full)))
        .layer(BufferBodyLayer::new().limit(1000))
        .service(hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(
        attempts(&response),
        1,
        "its first bytes say queue capacity, unread"
    );
    assert!(!response.body().is_whole());
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        body
    );
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_whose_length_is_over_the_limit_is_not_read_ahead() {
    let body = pattern(5000);
    let sent = body.clone();
    let server = Server::start(move |_, _| whole(200, sent.clone())).await;
    let svc = ServiceBuilder::new()
        .layer(BufferBodyLayer::new().limit(1000))
        .service(hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert!(!response.body().is_whole());
    assert_eq!(
        http_body::Body::size_hint(response.body()).exact(),
        Some(5000),
        "nothing read: the content-length is still the whole of it"
    );
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        body
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_of_exactly_the_limit_is_read_whole() {
    let body = pattern(1000);
    let sent = body.clone();
    let server = Server::start(move |_, _| chunked(&sent, 300)).await;
    let svc = ServiceBuilder::new()
        .layer(BufferBodyLayer::new().limit(1000))
        .service(hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.body().bytes(), Some(&body));
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        body
    );
}

#[tokio::test(start_paused = true)]
async fn trailers_read_ahead_reach_the_caller_after_the_body() {
    let body = pattern(300);
    let sent = body.clone();
    let server = Server::start(move |_, _| {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "abc".parse().unwrap());
        // hyper sends only the trailers the head announces.
        let answer = with_header(chunked(&sent, 100), "trailer", "x-checksum");
        Answer {
            trailers: Some(trailers),
            ..answer
        }
    })
    .await;
    let svc = BufferBodyLayer::new().layer(hyper_client());
    let request = Request::get(server.url())
        .header("te", "trailers")
        .body(Full::default())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert!(response.body().is_whole());
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-checksum"], "abc");
    assert_eq!(collected.to_bytes(), body);
}

#[tokio::test(start_paused = true)]
async fn limit_zero_reads_only_empty_bodies_whole_and_a_huge_limit_reads_every_body_whole() {
    let body = pattern(5000);
    let sent = body.clone();
    let server = Server::start(move |n, _| match n % 2 {
        0 => chunked(&sent, 100),
        _ => whole(204, Bytes::new()),
    })
    .await;
    let zero = BufferBodyLayer::new().limit(0).layer(hyper_client());
    let response = zero.clone().oneshot(get(&server)).await.unwrap();
    assert!(!response.body().is_whole());
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        body
    );
    let empty = zero.oneshot(get(&server)).await.unwrap();
    assert_eq!(empty.body().bytes(), Some(&Bytes::new()));

    let huge = BufferBodyLayer::new()
        .limit(usize::MAX)
        .layer(hyper_client());
    let response = huge.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.body().bytes(), Some(&body));
}

#[test]
fn the_default_limit_is_64_kib() {
    assert_eq!(DEFAULT_BUFFER_LIMIT, 64 * 1024);
    let svc = tower_backoff::http::parts::BufferBody::new(());
    assert_eq!(svc.limit(), DEFAULT_BUFFER_LIMIT);
}

// Through reqwest.

#[cfg(feature = "reqwest")]
mod through_reqwest {
    use super::*;

    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    fn get(server: &Server) -> reqwest::Request {
        reqwest::Request::new(Method::GET, server.url().parse().unwrap())
    }

    fn attempts(response: &reqwest::Response) -> u32 {
        response.extensions().get::<RetryInfo>().unwrap().attempts
    }

    #[tokio::test(start_paused = true)]
    async fn reqwest_get_whose_body_is_cut_short_is_retried_and_returns_the_whole_body() {
        let server = Server::start(cut_short_once).await;
        let svc = buffered(HttpPolicy::new(), client());
        let response = svc.oneshot(get(&server)).await.unwrap();
        assert_eq!(attempts(&response), 2);
        assert_eq!(response.url().as_str(), server.url(), "the URL survives");
        assert_eq!(response.content_length(), Some(1000));
        assert_eq!(response.bytes().await.unwrap(), pattern(1000));
        assert_eq!(server.requests(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn reqwest_200_whose_body_says_queue_capacity_is_retried() {
        let server = Server::start(queue_full_once).await;
        let svc = buffered(HttpPolicy::new().retry_on_body(queue_full), client());
        let response = svc.oneshot(get(&server)).await.unwrap();
        assert_eq!(attempts(&response), 2);
        assert_eq!(response.text().await.unwrap(), "done");
        assert_eq!(server.requests(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn reqwest_get_whose_body_is_always_cut_short_returns_the_last_reqwest_error() {
        let server = Server::start(|_, _| cut_short(1000, pattern(100))).await;
        let svc = buffered(HttpPolicy::new(), client());
        let error: reqwest::Error = svc
            .oneshot(get(&server))
            .await
            .unwrap_err()
            .into_inner()
            .expect("the layer has no timeout or breaker of its own");
        assert!(error.is_body() || error.is_decode(), "{error:?}");
        assert!(
            chain_has_io_kind(&error, io::ErrorKind::UnexpectedEof),
            "{error:?}"
        );
        assert_eq!(server.requests(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn reqwest_body_over_the_limit_streams_through_byte_identical() {
        let body = pattern(5000);
        let sent = body.clone();
        let server = Server::start(move |_, _| chunked(&sent, 100)).await;
        let svc = ServiceBuilder::new()
            .layer(layer(HttpPolicy::new()))
            .layer(BufferBodyLayer::new().limit(1000))
            .service(client());
        let response = svc.oneshot(get(&server)).await.unwrap();
        assert_eq!(attempts(&response), 1);
        assert_eq!(response.bytes().await.unwrap(), body);
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_failing_past_the_limit_is_returned_and_fails_when_read_after_its_bytes() {
    let body = pattern(5000);
    let sent = body.clone();
    let server = Server::start(move |_, _| Answer {
        then_close: true,
        ..chunked(&sent, 100)
    })
    .await;
    let svc = ServiceBuilder::new()
        .layer(layer(HttpPolicy::new()))
        .layer(BufferBodyLayer::new().limit(1000))
        .service(hyper_client());
    let response = svc.oneshot(get(&server)).await.unwrap();
    assert_eq!(
        attempts(&response),
        1,
        "past the limit, the body is the caller's"
    );
    let mut body_read = Vec::new();
    let mut body_stream = response.into_body();
    let error = loop {
        match body_stream.frame().await {
            Some(Ok(frame)) => body_read.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(error)) => break error,
            None => panic!("the body ended without its error"),
        }
    };
    assert_eq!(
        body_read, body,
        "every byte sent, the prefix read ahead included"
    );
    assert!(error.to_string().contains("body"), "{error}");
    assert_eq!(server.requests(), 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Whatever the chunking and the limit, the caller reads the bytes the
    /// server sent, and the body is whole exactly when it fits the limit.
    #[test]
    fn any_chunking_and_limit_reads_back_byte_identical(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..12),
        limit in 0usize..300,
    ) {
        let expected: Vec<u8> = chunks.concat();
        let chunks: Vec<Bytes> = chunks.into_iter().map(Bytes::from).collect();
        let client = tower::service_fn(move |_: Request<()>| {
            let frames = chunks.clone().into_iter().map(|c| Ok::<_, io::Error>(Frame::data(c)));
            let body = StreamBody::new(stream::iter(frames));
            async move { Ok::<_, io::Error>(Response::new(body)) }
        });
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (whole, read) = runtime.block_on(async {
            let response = BufferBodyLayer::new()
                .limit(limit)
                .layer(client)
                .oneshot(Request::new(()))
                .await
                .unwrap();
            let whole = response.body().is_whole();
            (whole, response.into_body().collect().await.unwrap().to_bytes())
        });
        proptest::prop_assert_eq!(read.as_ref(), expected.as_slice());
        proptest::prop_assert_eq!(whole, expected.len() <= limit);
    }
}

#[tokio::test]
async fn a_body_error_within_the_limit_is_the_outcome_and_past_it_the_callers() {
    let failing = |sent: usize| {
        tower::service_fn(move |_: Request<()>| async move {
            let frames: Vec<Result<Frame<Bytes>, io::Error>> = vec![
                Ok(Frame::data(Bytes::from(vec![b'x'; sent]))),
                Err(io::Error::from(io::ErrorKind::ConnectionReset)),
            ];
            Ok::<_, io::Error>(Response::new(StreamBody::new(stream::iter(frames))))
        })
    };
    let within = BufferBodyLayer::new().limit(100).layer(failing(100));
    let error = within.oneshot(Request::new(())).await.unwrap_err();
    let error = error.downcast::<io::Error>().expect("the body's own error");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);

    let past = BufferBodyLayer::new().limit(100).layer(failing(101));
    let response = past.oneshot(Request::new(())).await.unwrap();
    let error = response.into_body().collect().await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
}
