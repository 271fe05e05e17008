//! HTTP/2 where HTTP/1 is tested: response bodies cut short or reset
//! mid-read, requests reset before their headers, streaming request bodies
//! replayed, and hedges, through `HttpRetryLayer` over HTTP/1 and over
//! HTTP/2 (h2c with prior knowledge), with hyper-util's client and reqwest,
//! against one hyper server on 127.0.0.1 that speaks both (hyper-util's
//! `auto` builder). The HTTP/1-only versions are in `http_body.rs`,
//! `replay.rs` and `http_hedge.rs`.
//!
//! Each test runs both protocols and expects the same outcome, but where it
//! says why they differ:
//! - a stream the server refuses (`REFUSED_STREAM`) or never processed (past
//!   the last stream its `GOAWAY` names) provably did nothing, so
//!   `retry_unsent` retries even a POST; HTTP/1 has no such signal (the
//!   server can only close the connection, which proves nothing);
//! - reqwest retries those two itself over HTTP/2 (a refused stream, a
//!   graceful `GOAWAY`), inside one of the layer's attempts;
//! - a hedge goes out as another stream of the connection the first copy is
//!   using over HTTP/2; over HTTP/1 it needs a connection of its own;
//! - `GOAWAY` exists only in HTTP/2.
//!
//! HTTP/2 resets are read under the `http2` feature (which `grpc` turns on
//! too, since tonic speaks only HTTP/2).
#![cfg(all(feature = "http2", feature = "hyper"))]

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{stream, StreamExt};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_backoff::http::{
    HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo, DEFAULT_RESPONSE_BUFFER_LIMIT,
};
use tower_backoff::{Constant, Hedging, Jitter, Stats};

/// The sleep between attempts: short, constant, no jitter.
const STEP: Duration = Duration::from_millis(10);

/// Long enough for anything that happens promptly on a loaded machine.
const PROMPTLY: Duration = Duration::from_secs(5);

// --- the protocols ------------------------------------------------------------------

/// The protocol a client speaks to the server, which serves both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// h2c with prior knowledge: HTTP/2 from the first byte, no upgrade.
    Http2,
}

use Protocol::{Http1, Http2};

impl Protocol {
    const BOTH: [Protocol; 2] = [Http1, Http2];

    fn version(self) -> Version {
        match self {
            Http1 => Version::HTTP_11,
            Http2 => Version::HTTP_2,
        }
    }
}

/// hyper-util's client speaking `protocol`, with `TCP_NODELAY` as reqwest
/// and tonic set it: without it, a small HTTP/2 frame can wait in the
/// kernel for a delayed ACK, long enough for the paused clock to jump.
fn hyper_client<B>(protocol: Protocol) -> Client<HttpConnector, B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(protocol == Http2)
        .build(connector)
}

fn reqwest_client(protocol: Protocol) -> reqwest::Client {
    let builder = reqwest::Client::builder().no_proxy();
    match protocol {
        Http1 => builder.http1_only(),
        Http2 => builder.http2_prior_knowledge(),
    }
    .build()
    .unwrap()
}

// --- the server ---------------------------------------------------------------------

/// What the server does with one request.
#[derive(Clone)]
enum Answer {
    /// This status, and this body with its length.
    Whole(u16, Bytes),
    /// `content-length: 1000`, 100 bytes, then the body fails: hyper closes
    /// an HTTP/1 connection and resets an HTTP/2 stream (`INTERNAL_ERROR`).
    ResetMidBody,
    /// `content-length: 1000`, 100 bytes, then the body ends: HTTP/1 sees
    /// the connection close, HTTP/2 a stream that ended short of its length
    /// (h2 resets it, `PROTOCOL_ERROR`).
    CutShort,
    /// No response: the handler fails with `reason`, so hyper closes an
    /// HTTP/1 connection and resets an HTTP/2 stream with `reason`.
    Reset(h2::Reason),
    /// Never answer.
    Hang,
    /// Answer with this status after the first frame of the request body,
    /// the rest unread.
    Early(u16),
}

type ServerBody = UnsyncBoxBody<Bytes, io::Error>;

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

/// A hyper server on 127.0.0.1 (port 0) speaking HTTP/1 and HTTP/2 (hyper-util's
/// `auto` builder), answering the `n`th request (from 0) with `script(n)`.
#[derive(Clone)]
struct Server {
    addr: SocketAddr,
    script: Arc<dyn Fn(usize) -> Answer + Send + Sync>,
    next: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    /// Handlers dropped before they answered: requests the client cancelled.
    cancelled: Arc<AtomicUsize>,
}

struct DropGuard(Arc<AtomicUsize>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Server {
    async fn start(script: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server {
            addr: listener.local_addr().unwrap(),
            script: Arc::new(script),
            next: Arc::default(),
            seen: Arc::default(),
            connections: Arc::default(),
            cancelled: Arc::default(),
        };
        let state = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                stream.set_nodelay(true).unwrap();
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { state.answer(request).await }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        server
    }

    async fn answer(&self, request: Request<Incoming>) -> Result<Response<ServerBody>, h2::Error> {
        let answer = (self.script)(self.next.fetch_add(1, Ordering::SeqCst));
        let (parts, mut body) = request.into_parts();
        let body = match answer {
            Answer::Early(_) => match body.frame().await {
                Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
                _ => Bytes::new(),
            },
            _ => body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default(),
        };
        self.seen.lock().unwrap().push(Seen {
            version: parts.version,
            headers: parts.headers,
            body,
        });
        match answer {
            Answer::Whole(status, body) => Ok(respond(status, body.len(), stream::empty(), body)),
            Answer::Early(status) => Ok(respond(status, 0, stream::empty(), Bytes::new())),
            Answer::ResetMidBody => {
                let fail = stream::once(async {
                    // A moment after the data, so that hyper has sent it.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Err(io::Error::other("failing mid-body"))
                });
                Ok(respond(200, 1000, fail, pattern(100)))
            }
            Answer::CutShort => Ok(respond(200, 1000, stream::empty(), pattern(100))),
            Answer::Reset(reason) => Err(reason.into()),
            Answer::Hang => {
                let _guard = DropGuard(self.cancelled.clone());
                std::future::pending().await
            }
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Asserts that every request arrived over `protocol`, and returns how
    /// many did.
    fn requests_over(&self, protocol: Protocol) -> usize {
        let seen = self.seen();
        for request in &seen {
            assert_eq!(request.version, protocol.version(), "{protocol:?}");
        }
        seen.len()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Waits until the server saw `count` requests cancelled.
    async fn cancelled(&self, count: usize) {
        let wait = async {
            while self.cancelled.load(Ordering::SeqCst) < count {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(PROMPTLY, wait)
            .await
            .expect("the server saw the losing copy cancelled");
    }

    /// Waits until the server has seen `count` requests.
    async fn requests(&self, count: usize) {
        let wait = async {
            while self.seen.lock().unwrap().len() < count {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(PROMPTLY, wait)
            .await
            .expect("the server saw the request");
    }
}

/// A response with `content-length: length`, `data`, then `then`.
fn respond(
    status: u16,
    length: usize,
    then: impl futures::Stream<Item = Result<Frame<Bytes>, io::Error>> + Send + 'static,
    data: Bytes,
) -> Response<ServerBody> {
    let body = stream::iter([Ok(Frame::data(data))]).chain(then);
    let mut response = Response::new(StreamBody::new(body).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-length", length.into());
    response
}

/// `len` bytes that differ from their neighbours, so a reordered or
/// dropped chunk shows.
fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// `first` for the first request, then the whole 1,000-byte pattern.
fn once(first: Answer) -> impl Fn(usize) -> Answer + Send + Sync + 'static {
    move |n| match n {
        0 => first.clone(),
        _ => Answer::Whole(200, pattern(1000)),
    }
}

// --- the layer ----------------------------------------------------------------------

/// The whole layer (replay, read-ahead, RetryInfo) with short constant
/// delays, 3 attempts and no budget; read-ahead asked for, as it is off by
/// default.
fn layer(policy: HttpPolicy) -> HttpRetryLayer {
    HttpRetryLayer::builder()
        .policy(policy)
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .buffer_limit(DEFAULT_RESPONSE_BUFFER_LIMIT)
        .build()
        .unwrap()
}

fn attempts<B>(response: &Response<B>) -> u32 {
    response.extensions().get::<RetryInfo>().unwrap().attempts
}

fn reqwest_attempts(response: &reqwest::Response) -> u32 {
    response.extensions().get::<RetryInfo>().unwrap().attempts
}

/// A GET through the layer and hyper-util over `protocol`: the attempts it
/// took and the body it returned, which must come with a 200.
async fn hyper_get(protocol: Protocol, server: &Server) -> Result<(u32, Bytes), BoxError> {
    let svc = layer(HttpPolicy::new()).layer(hyper_client(protocol));
    let request = Request::get(server.url())
        .body(Full::<Bytes>::default())
        .unwrap();
    let response = svc.oneshot(request).await?;
    assert_eq!(response.status(), StatusCode::OK);
    let attempts = attempts(&response);
    Ok((attempts, response.into_body().collect().await?.to_bytes()))
}

/// [`hyper_get`] through reqwest.
async fn reqwest_get(protocol: Protocol, server: &Server) -> Result<(u32, Bytes), BoxError> {
    let svc = layer(HttpPolicy::new()).layer(reqwest_client(protocol));
    let request = reqwest::Request::new(Method::GET, server.url().parse().unwrap());
    let response = svc.oneshot(request).await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), protocol.version());
    let attempts = reqwest_attempts(&response);
    Ok((attempts, response.bytes().await?))
}

// --- read-ahead: bodies cut short or reset mid-read -----------------------------------

#[tokio::test(start_paused = true)]
async fn a_get_whose_body_is_reset_mid_read_is_retried_and_returns_the_whole_body() {
    for protocol in Protocol::BOTH {
        let server = Server::start(once(Answer::ResetMidBody)).await;
        let got = hyper_get(protocol, &server).await;
        assert_eq!(got.unwrap(), (2, pattern(1000)), "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 2);

        let server = Server::start(once(Answer::ResetMidBody)).await;
        let got = reqwest_get(protocol, &server).await;
        assert_eq!(got.unwrap(), (2, pattern(1000)), "reqwest, {protocol:?}");
        assert_eq!(server.requests_over(protocol), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_get_whose_body_ends_short_of_its_length_is_retried_and_returns_the_whole_body() {
    for protocol in Protocol::BOTH {
        let server = Server::start(once(Answer::CutShort)).await;
        let got = hyper_get(protocol, &server).await;
        assert_eq!(got.unwrap(), (2, pattern(1000)), "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 2);

        let server = Server::start(once(Answer::CutShort)).await;
        let got = reqwest_get(protocol, &server).await;
        assert_eq!(got.unwrap(), (2, pattern(1000)), "reqwest, {protocol:?}");
        assert_eq!(server.requests_over(protocol), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_get_whose_body_is_always_reset_returns_the_last_error_after_every_attempt() {
    for protocol in Protocol::BOTH {
        let server = Server::start(|_| Answer::ResetMidBody).await;
        let error = hyper_get(protocol, &server).await.unwrap_err();
        assert!(
            error.downcast_ref::<hyper::Error>().is_some(),
            "{protocol:?}: the body's own error, {error:?}"
        );
        assert_eq!(server.requests_over(protocol), 3, "{protocol:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_post_whose_body_is_reset_mid_read_is_sent_once() {
    for protocol in Protocol::BOTH {
        let server = Server::start(once(Answer::ResetMidBody)).await;
        let svc = layer(HttpPolicy::new()).layer(hyper_client(protocol));
        let post = Request::post(server.url())
            .body(Full::<Bytes>::from("order"))
            .unwrap();
        assert!(svc.oneshot(post).await.is_err(), "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 1, "{protocol:?}");
    }
}

// --- resets before the headers --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_get_reset_before_its_headers_is_retried() {
    for reason in [h2::Reason::INTERNAL_ERROR, h2::Reason::REFUSED_STREAM] {
        for protocol in Protocol::BOTH {
            let server = Server::start(once(Answer::Reset(reason))).await;
            let got = hyper_get(protocol, &server).await;
            assert_eq!(got.unwrap(), (2, pattern(1000)), "{reason:?}, {protocol:?}");
            assert_eq!(server.requests_over(protocol), 2);

            // reqwest retries a refused stream itself, once the layer has
            // sent it: the layer sees one attempt, the server two.
            let by_reqwest = protocol == Http2 && reason == h2::Reason::REFUSED_STREAM;
            let server = Server::start(once(Answer::Reset(reason))).await;
            let got = reqwest_get(protocol, &server).await;
            let context = format!("reqwest, {reason:?}, {protocol:?}");
            let attempts = if by_reqwest { 1 } else { 2 };
            assert_eq!(got.unwrap(), (attempts, pattern(1000)), "{context}");
            assert_eq!(server.requests_over(protocol), 2);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_post_the_server_refused_to_process_is_retried_only_over_http2() {
    for protocol in Protocol::BOTH {
        let server = Server::start(once(Answer::Reset(h2::Reason::REFUSED_STREAM))).await;
        let svc = layer(HttpPolicy::new().retry_unsent()).layer(hyper_client(protocol));
        let post = Request::post(server.url())
            .body(Full::<Bytes>::from("order"))
            .unwrap();
        let result = svc.oneshot(post).await;
        match protocol {
            // REFUSED_STREAM: the server says it did nothing with it.
            Http2 => {
                let response = result.unwrap();
                assert_eq!(attempts(&response), 2);
                assert_eq!(server.requests_over(protocol), 2);
            }
            // The connection closed before a response: it may have been
            // processed.
            Http1 => {
                assert!(result.is_err());
                assert_eq!(server.requests_over(protocol), 1);
            }
        }
        // What the server saw of the retry is what the client sent.
        assert!(server.seen().iter().all(|seen| seen.body == "order"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_post_reset_before_its_headers_for_another_reason_is_sent_once() {
    for protocol in Protocol::BOTH {
        let server = Server::start(once(Answer::Reset(h2::Reason::INTERNAL_ERROR))).await;
        let svc = layer(HttpPolicy::new().retry_unsent()).layer(hyper_client(protocol));
        let post = Request::post(server.url())
            .body(Full::<Bytes>::from("order"))
            .unwrap();
        assert!(svc.oneshot(post).await.is_err(), "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 1, "{protocol:?}");
    }
}

/// An HTTP/2 server whose first connection answers the first request's
/// headers with `GOAWAY` naming stream 0 as the last it processed, and
/// `reason`: the request was not processed (RFC 9113, 6.8). It answers the
/// next connections' requests with 200 "ok". Raw frames on the first
/// connection, as h2's server names the streams it accepted.
async fn going_away_server(reason: h2::Reason) -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PREFACE: usize = 24;
    const HEADERS: u8 = 0x1;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        // An empty SETTINGS frame; then read frames until a HEADERS one.
        stream
            .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        let mut read = Vec::new();
        let mut buf = [0; 4096];
        'headers: loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before its request");
            read.extend_from_slice(&buf[..n]);
            let mut at = PREFACE;
            while at + 9 <= read.len() {
                if read[at + 3] == HEADERS {
                    break 'headers;
                }
                let len = usize::from(read[at]) << 16
                    | usize::from(read[at + 1]) << 8
                    | usize::from(read[at + 2]);
                at += 9 + len;
            }
        }
        counter.fetch_add(1, Ordering::SeqCst);
        let mut go_away = vec![0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        go_away.extend_from_slice(&u32::from(reason).to_be_bytes());
        stream.write_all(&go_away).await.unwrap();
        // Until the client closes the connection.
        while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        drop(stream);

        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(stream).await.unwrap();
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let mut send = respond.send_response(Response::new(()), false).unwrap();
                    send.send_data(Bytes::from_static(b"ok"), true).unwrap();
                }
            });
        }
    });
    (addr, requests)
}

/// HTTP/2 only: HTTP/1 has no GOAWAY; its closed connection is the
/// "connection closed before message completed" of the HTTP/1 tests.
#[tokio::test(start_paused = true)]
async fn a_request_after_the_last_stream_a_goaway_names_is_retried_even_a_post_when_unsent_are() {
    for reason in [h2::Reason::NO_ERROR, h2::Reason::INTERNAL_ERROR] {
        let (addr, requests) = going_away_server(reason).await;
        let svc = layer(HttpPolicy::new()).layer(hyper_client(Http2));
        let request = Request::get(format!("http://{addr}/"))
            .body(Full::<Bytes>::default())
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(attempts(&response), 2, "{reason:?}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        assert_eq!(requests.load(Ordering::SeqCst), 2);

        let (addr, requests) = going_away_server(reason).await;
        let svc = layer(HttpPolicy::new().retry_unsent()).layer(hyper_client(Http2));
        let post = Request::post(format!("http://{addr}/"))
            .body(Full::<Bytes>::from("order"))
            .unwrap();
        let response = svc.oneshot(post).await.unwrap();
        assert_eq!(attempts(&response), 2, "{reason:?}");
        assert_eq!(requests.load(Ordering::SeqCst), 2);

        // reqwest retries a graceful GOAWAY (NO_ERROR) itself.
        let (addr, requests) = going_away_server(reason).await;
        let svc = layer(HttpPolicy::new()).layer(reqwest_client(Http2));
        let get = reqwest::Request::new(Method::GET, format!("http://{addr}/").parse().unwrap());
        let response = svc.oneshot(get).await.unwrap();
        let by_reqwest = reason == h2::Reason::NO_ERROR;
        let attempts = if by_reqwest { 1 } else { 2 };
        assert_eq!(reqwest_attempts(&response), attempts, "reqwest, {reason:?}");
        assert_eq!(response.bytes().await.unwrap(), "ok");
        assert_eq!(requests.load(Ordering::SeqCst), 2);
    }
}

// --- replay: streaming request bodies -------------------------------------------------

type Chunk = Result<Frame<Bytes>, io::Error>;

fn chunk(data: &'static str) -> Chunk {
    Ok(Frame::data(Bytes::from_static(data.as_bytes())))
}

/// 503 for the first request, then 200.
fn unavailable_once(n: usize) -> Answer {
    match n {
        0 => Answer::Whole(503, Bytes::new()),
        _ => Answer::Whole(200, Bytes::new()),
    }
}

#[tokio::test(start_paused = true)]
async fn a_streaming_put_is_replayed_whole_on_the_retry() {
    let chunks = ["first-", "second-", "third"];
    for protocol in Protocol::BOTH {
        let server = Server::start(unavailable_once).await;
        let svc = layer(HttpPolicy::new()).layer(hyper_client(protocol));
        let body = ReplayBody::new(StreamBody::new(stream::iter(chunks.map(chunk))));
        let put = Request::put(server.url()).body(body).unwrap();
        let response = svc.oneshot(put).await.unwrap();
        assert_eq!(attempts(&response), 2, "{protocol:?}");
        for seen in server.seen() {
            assert_eq!(seen.body, "first-second-third", "{protocol:?}");
        }
        assert_eq!(server.requests_over(protocol), 2);

        let server = Server::start(unavailable_once).await;
        let svc = layer(HttpPolicy::new()).layer(reqwest_client(protocol));
        let mut put = reqwest::Request::new(Method::PUT, server.url().parse().unwrap());
        let body = StreamBody::new(stream::iter(chunks.map(chunk)));
        *put.body_mut() = Some(reqwest::Body::wrap(body));
        let response = svc.oneshot(put).await.unwrap();
        assert_eq!(reqwest_attempts(&response), 2, "reqwest, {protocol:?}");
        for seen in server.seen() {
            assert_eq!(seen.body, "first-second-third", "reqwest, {protocol:?}");
        }
        assert_eq!(server.requests_over(protocol), 2);
    }
}

/// On the real clock: the paused one would fire the test's timeout while
/// the runtime waits for the sockets.
#[tokio::test]
async fn an_answer_before_the_upload_ends_is_retried_with_what_was_sent_then_the_rest() {
    for protocol in Protocol::BOTH {
        let server = Server::start(|n| match n {
            0 => Answer::Early(503),
            _ => Answer::Whole(200, Bytes::new()),
        })
        .await;
        let (source, frames) = mpsc::unbounded::<Chunk>();
        source.unbounded_send(chunk("first-chunk ")).unwrap();
        let svc = layer(HttpPolicy::new()).layer(hyper_client(protocol));
        let put = Request::put(server.url())
            .body(ReplayBody::new(StreamBody::new(frames)))
            .unwrap();
        let response = tokio::spawn(svc.oneshot(put));

        // The retry replays the recording, then waits on the source.
        server.requests(1).await;
        tokio::time::sleep(STEP * 5).await;
        source.unbounded_send(chunk("second-chunk")).unwrap();
        drop(source);
        let response = tokio::time::timeout(PROMPTLY, response)
            .await
            .unwrap_or_else(|_| panic!("{protocol:?}: the request did not end"))
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{protocol:?}");
        assert_eq!(attempts(&response), 2, "{protocol:?}");
        let seen = server.seen();
        assert_eq!(seen[0].body, "first-chunk ", "{protocol:?}");
        assert_eq!(seen[1].body, "first-chunk second-chunk", "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 2);
    }
}

// --- hedging ------------------------------------------------------------------------

const HEDGE_DELAY: Duration = Duration::from_millis(50);

/// Hedges after `HEDGE_DELAY`, stamping each copy's attempt number in
/// `x-attempt`.
fn hedging_layer(stats: &Stats) -> HttpRetryLayer {
    HttpRetryLayer::builder()
        .policy(HttpPolicy::new().attempt_header(http::HeaderName::from_static("x-attempt")))
        .stats(stats.clone())
        // The load cap grants hedges from the last second's requests: one
        // warm-up request, at 100 %, grants one.
        .hedge(Hedging::after(HEDGE_DELAY).max_extra_load(1.0))
        .build()
        .unwrap()
}

/// The warm-up answers, the next request hangs, the hedge answers.
fn hang_second(n: usize) -> Answer {
    match n {
        1 => Answer::Hang,
        _ => Answer::Whole(200, Bytes::from_static(b"ok")),
    }
}

async fn warm_up<S, R>(svc: &mut S, request: R)
where
    S: Service<R, Response = Response<tower_backoff::http::BufferedBody<Incoming>>>,
    S::Error: std::fmt::Debug,
{
    let answer = svc.ready().await.unwrap().call(request).await;
    assert_eq!(answer.unwrap().status(), StatusCode::OK);
    // Into an earlier tenth of a second than the hedge: the cap counts
    // full ones.
    tokio::time::sleep(Duration::from_millis(120)).await;
}

#[tokio::test]
async fn a_get_still_pending_is_hedged_and_the_server_sees_the_loser_cancelled() {
    for protocol in Protocol::BOTH {
        let server = Server::start(hang_second).await;
        let stats = Stats::new();
        let mut svc = hedging_layer(&stats).layer(hyper_client(protocol));
        let get = || {
            Request::get(server.url())
                .body(Full::<Bytes>::default())
                .unwrap()
        };
        warm_up(&mut svc, get()).await;

        let started = tokio::time::Instant::now();
        let response = svc.ready().await.unwrap().call(get()).await.unwrap();
        let took = started.elapsed();
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
        assert!(took >= HEDGE_DELAY && took < HEDGE_DELAY * 10, "{took:?}");
        let seen = server.seen();
        assert_eq!(seen.len(), 3, "{protocol:?}: {seen:?}");
        assert_eq!(seen[2].headers["x-attempt"], "2", "{protocol:?}");
        server.cancelled(1).await;
        let counted = stats.snapshot();
        assert_eq!(
            (counted.hedges, counted.hedges_won, counted.hedges_cancelled),
            (1, 1, 1),
            "{protocol:?}"
        );
        // HTTP/2 sends the copy as another stream of the one connection;
        // HTTP/1 needs a second connection while the first copy waits.
        let connections = match protocol {
            Http1 => 2,
            Http2 => 1,
        };
        assert_eq!(server.connections(), connections, "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 3);
    }
}

#[tokio::test]
async fn reqwest_get_still_pending_is_hedged_over_both() {
    for protocol in Protocol::BOTH {
        let server = Server::start(hang_second).await;
        let stats = Stats::new();
        let mut svc = hedging_layer(&stats).layer(reqwest_client(protocol));
        let get = || reqwest::Request::new(Method::GET, server.url().parse().unwrap());
        let warm = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(warm.status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(120)).await;

        let response = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.bytes().await.unwrap(), "ok", "{protocol:?}");
        server.cancelled(1).await;
        assert_eq!(stats.snapshot().hedges_won, 1, "{protocol:?}");
        assert_eq!(server.requests_over(protocol), 3);
    }
}
