//! A hostile server: dozens of routes that fail, throttle, hang, lie about
//! their bodies and send odd headers, each run through `HttpRetryLayer`
//! with its default budget and with none, against a real hyper server on
//! 127.0.0.1 through hyper-util's client, over HTTP/1 and over HTTP/2 (h2c
//! with prior knowledge; the server speaks both), on tokio's paused clock.
//!
//! The default budget must not change how a route ends, unless failures
//! that never end have spent it: that is the budget's point. A new client's
//! first request must always end as without a budget. And a route must end
//! over HTTP/2 as over HTTP/1, but where the protocols differ, each listed
//! with why. Run with `--nocapture` for the tables.
//!
//! HTTP/2 resets are read under the `http2` feature: without it the HTTP/2
//! runs are not made.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use http::{Method, Request};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{BoxError, Layer, ServiceExt};
use tower_backoff::events::{EndArgs, Ending, Event};
use tower_backoff::http::{
    HttpRetry, HttpRetryBuilder, HttpRetryLayer, RetryInfo, DEFAULT_RESPONSE_BUFFER_LIMIT,
    IDEMPOTENCY_KEY,
};
use tower_backoff::{Constant, Jitter};

use http_server::{status, status_with, with_chunked_body, Reply};

/// The sleep between attempts: short, constant, no jitter.
const STEP: Duration = Duration::from_millis(10);

/// Each attempt's time limit: what ends a hung attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// Routes that end differently with the default budget shared by every
/// route than with no budget, each with why. A route here must differ: one
/// that ends the same again comes off the list.
const EXPECTED_DIFFERENT: &[(&str, &str)] = &[
    (
        "/502-retry-after-1-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/504-retry-after-1-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/500-should-retry-true-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/400-should-retry-true-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/503-should-retry-garbage-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/hang-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/hang-hang-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/cut-short-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/cut-short-twice-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/headers-then-close-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/stall-mid-body-then-200",
        "right after /always-429-retry-after-1, an outage whose retries the budget pays \
         (a server's delay decides when, never whether): empty until a first-try success",
    ),
    (
        "/always-502",
        "an outage: /always-503 just spent the bucket",
    ),
    (
        "/always-504",
        "an outage: /always-503 just spent the bucket",
    ),
    (
        "/always-cut-short",
        "an outage: /always-503 just spent the bucket",
    ),
    (
        "/always-hang",
        "an outage: /always-503 just spent the bucket",
    ),
    (
        "/always-503-retry-after-0",
        "an outage answering \"retry now\": a zero wait paces nothing, so the empty bucket refuses",
    ),
    (
        "/after-503-then-200",
        "the outage just before left the bucket empty",
    ),
    (
        "/after-503-503-then-200",
        "after the outage, one first-try success (/after-200) earned one retry back",
    ),
];

/// Routes that end differently over HTTP/2 than over HTTP/1 (both without
/// a budget), each with why. A route here must differ.
#[cfg(feature = "http2")]
const DIFFERENT_OVER_HTTP2: &[(&str, &str)] = &[
    (
        "/content-length-below-body",
        "HTTP/1 reads the 50 bytes promised and ignores the rest; h2 resets a stream \
         whose DATA outgrows its content-length (PROTOCOL_ERROR), which reads as a \
         body cut short: 3 attempts, then the reset",
    ),
    (
        "/huge-header-503-then-200",
        "a 64 KiB header is within HTTP/1's limit, so its 503 is retried; over HTTP/2 \
         it is over 4 times the header list size hyper's client allows (16 KiB), which \
         h2 ends the connection for (ENHANCE_YOUR_CALM): final, as HTTP/1's \
         \"response head too large\" is",
    ),
    (
        "/too-many-headers",
        "HTTP/1's parser takes at most 100 headers; HTTP/2 limits the header list's \
         size only, which 150 short headers fit",
    ),
    (
        "/head-too-large",
        "final after 1 attempt over both; the error is h2's (ENHANCE_YOUR_CALM), not \
         HTTP/1's parser's",
    ),
    (
        "/always-cut-short",
        "3 attempts over both; the error is h2's reset of a body short of its \
         content-length (PROTOCOL_ERROR), not HTTP/1's early close",
    ),
];

// --- the protocols ----------------------------------------------------------------

/// The protocol the client speaks; the server speaks both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// h2c with prior knowledge: HTTP/2 from the first byte.
    Http2,
}

impl Protocol {
    /// The protocols the runs use: HTTP/2 only when its resets are read.
    fn all() -> &'static [Protocol] {
        if cfg!(feature = "http2") {
            &[Protocol::Http1, Protocol::Http2]
        } else {
            &[Protocol::Http1]
        }
    }

    fn version(self) -> http::Version {
        match self {
            Protocol::Http1 => http::Version::HTTP_11,
            Protocol::Http2 => http::Version::HTTP_2,
        }
    }
}

// --- the routes -----------------------------------------------------------------

type Script = Box<dyn Fn(usize) -> Reply + Send + Sync>;

/// One route of the hostile server: the request the client sends to it, and
/// how the server answers the route's `n`th request (from 0).
struct Route {
    path: &'static str,
    method: Method,
    idempotency_key: bool,
    script: Script,
}

fn get(path: &'static str, script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Route {
    Route {
        path,
        method: Method::GET,
        idempotency_key: false,
        script: Box::new(script),
    }
}

fn with_method(method: Method, route: Route) -> Route {
    Route { method, ..route }
}

fn with_idempotency_key(route: Route) -> Route {
    Route {
        idempotency_key: true,
        ..route
    }
}

/// `first()` for the first `times` requests, then 200.
fn then_200(
    times: usize,
    first: impl Fn() -> Reply + Send + Sync + 'static,
) -> impl Fn(usize) -> Reply + Send + Sync + 'static {
    move |n| if n < times { first() } else { status(200) }
}

/// `first()` for every request.
fn always(first: impl Fn() -> Reply + Send + Sync + 'static) -> impl Fn(usize) -> Reply {
    move |_| first()
}

/// A `Retry-After` HTTP-date `secs` seconds from now (negative: past),
/// computed when the server answers: the paused clock does not move
/// `SystemTime`.
fn http_date(secs: i64) -> String {
    let now = SystemTime::now();
    let at = if secs >= 0 {
        now + Duration::from_secs(secs.unsigned_abs())
    } else {
        now - Duration::from_secs(secs.unsigned_abs())
    };
    httpdate::fmt_http_date(at)
}

/// `content-length: declared`, then `sent` bytes, then the body stops:
/// ended (`stall` false), which makes hyper close the connection, or never
/// ending.
fn short_body(declared: usize, sent: usize, stall: bool) -> Reply {
    let Reply::Respond(response) = status_with(200, &[("content-length", &declared.to_string())])
    else {
        unreachable!("status_with responds")
    };
    let data = Frame::data(Bytes::from(vec![b'x'; sent]));
    let data = stream::iter([Ok::<_, Infallible>(data)]);
    let body = if stall {
        BodyExt::boxed(StreamBody::new(data.chain(stream::pending())))
    } else {
        BodyExt::boxed(StreamBody::new(data))
    };
    Reply::Respond(response.map(|_| body))
}

/// `reply` with a body of `len` bytes, its length known.
fn big_body(reply: Reply, len: usize) -> Reply {
    match reply {
        Reply::Respond(response) => {
            Reply::Respond(response.map(|_| Full::new(Bytes::from(vec![b'x'; len])).boxed()))
        }
        Reply::Hang => Reply::Hang,
    }
}

/// `code` with `count` headers named `x-filler-<i>`, each `len` bytes long.
fn many_headers(code: u16, count: usize, len: usize) -> Reply {
    let names: Vec<String> = (0..count).map(|i| format!("x-filler-{i}")).collect();
    let value = "v".repeat(len);
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), value.as_str())).collect();
    status_with(code, &headers)
}

/// Every route, in the order both runs send them.
fn routes() -> Vec<Route> {
    let retry_after =
        |code, value: &'static str| move || status_with(code, &[("retry-after", value)]);
    vec![
        // Plain answers.
        get("/200", always(|| status(200))),
        get("/204", always(|| status(204))),
        get("/404", always(|| status(404))),
        get("/301", always(|| status_with(301, &[("location", "/200")]))),
        get("/200-with-retry-after", always(retry_after(200, "1"))),
        // 503, 502, 504, 408.
        get("/503-then-200", then_200(1, || status(503))),
        get("/503-503-then-200", then_200(2, || status(503))),
        get("/502-then-200", then_200(1, || status(502))),
        get("/502-502-then-200", then_200(2, || status(502))),
        get("/504-then-200", then_200(1, || status(504))),
        get("/504-504-then-200", then_200(2, || status(504))),
        get("/502-504-then-200", |n| match n {
            0 => status(502),
            1 => status(504),
            _ => status(200),
        }),
        get("/408-then-200", then_200(1, || status(408))),
        get(
            "/503-big-body-then-200",
            then_200(1, || big_body(status(503), 32 * 1024)),
        ),
        get(
            "/503-chunked-body-then-200",
            then_200(1, || with_chunked_body(status(503), 50)),
        ),
        get(
            "/503-connection-close-then-200",
            then_200(1, || status_with(503, &[("connection", "close")])),
        ),
        // 500 and other 5xx are final.
        get("/500", always(|| status(500))),
        get("/501", always(|| status(501))),
        get("/500-then-200", then_200(1, || status(500))),
        // 429 and the delay headers.
        get("/429-then-200", then_200(1, || status(429))),
        get(
            "/429-retry-after-1-then-200",
            then_200(1, retry_after(429, "1")),
        ),
        get(
            "/429-retry-after-0-then-200",
            then_200(1, retry_after(429, "0")),
        ),
        get(
            "/429-retry-after-60-then-200",
            then_200(1, retry_after(429, "60")),
        ),
        get("/429-retry-after-61", always(retry_after(429, "61"))),
        get(
            "/429-retry-after-huge",
            always(retry_after(429, "99999999999")),
        ),
        get(
            "/429-retry-after-negative-then-200",
            then_200(1, retry_after(429, "-5")),
        ),
        get(
            "/429-retry-after-garbage-then-200",
            then_200(1, retry_after(429, "soon, maybe")),
        ),
        get(
            "/429-retry-after-fraction-then-200",
            then_200(1, retry_after(429, "1.5")),
        ),
        get(
            "/429-retry-after-date-then-200",
            then_200(1, || status_with(429, &[("retry-after", &http_date(2))])),
        ),
        get(
            "/429-retry-after-past-date-then-200",
            then_200(1, || status_with(429, &[("retry-after", &http_date(-60))])),
        ),
        get(
            "/429-retry-after-ms-250-then-200",
            then_200(1, || status_with(429, &[("retry-after-ms", "250")])),
        ),
        get(
            "/429-retry-after-ms-garbage-then-200",
            then_200(1, || status_with(429, &[("retry-after-ms", "NaN")])),
        ),
        get(
            "/429-ratelimit-reset-1-then-200",
            then_200(1, || status_with(429, &[("ratelimit-reset", "1")])),
        ),
        get(
            "/429-ratelimit-reset-quota-left-then-200",
            then_200(1, || {
                status_with(
                    429,
                    &[("ratelimit-reset", "1"), ("ratelimit-remaining", "5")],
                )
            }),
        ),
        get(
            "/429-x-ratelimit-reset-unix-then-200",
            then_200(1, || {
                let at =
                    SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(2);
                status_with(429, &[("x-ratelimit-reset", &at.as_secs().to_string())])
            }),
        ),
        get(
            "/503-retry-after-1-twice-then-200",
            then_200(2, retry_after(503, "1")),
        ),
        get("/always-429-retry-after-1", always(retry_after(429, "1"))),
        get(
            "/502-retry-after-1-then-200",
            then_200(1, retry_after(502, "1")),
        ),
        get(
            "/504-retry-after-1-then-200",
            then_200(1, retry_after(504, "1")),
        ),
        // x-should-retry.
        get(
            "/500-should-retry-true-then-200",
            then_200(1, || status_with(500, &[("x-should-retry", "true")])),
        ),
        get(
            "/400-should-retry-true-then-200",
            then_200(1, || status_with(400, &[("x-should-retry", "true")])),
        ),
        get(
            "/503-should-retry-false",
            always(|| status_with(503, &[("x-should-retry", "false")])),
        ),
        get(
            "/429-retry-after-1-should-retry-false",
            always(|| status_with(429, &[("retry-after", "1"), ("x-should-retry", "false")])),
        ),
        get(
            "/503-should-retry-garbage-then-200",
            then_200(1, || status_with(503, &[("x-should-retry", "perhaps")])),
        ),
        // Hung attempts and bodies that lie.
        get("/hang-then-200", then_200(1, || Reply::Hang)),
        get("/hang-hang-then-200", then_200(2, || Reply::Hang)),
        get(
            "/cut-short-then-200",
            then_200(1, || short_body(1000, 100, false)),
        ),
        get(
            "/cut-short-twice-then-200",
            then_200(2, || short_body(1000, 100, false)),
        ),
        get(
            "/headers-then-close-then-200",
            then_200(1, || short_body(1000, 0, false)),
        ),
        get(
            "/stall-mid-body-then-200",
            then_200(1, || short_body(1000, 100, true)),
        ),
        get(
            "/content-length-below-body",
            always(|| short_body(50, 100, false)),
        ),
        get(
            "/200-chunked",
            always(|| with_chunked_body(status(200), 30)),
        ),
        // Methods.
        with_method(
            Method::POST,
            get("/post-503-then-200", then_200(1, || status(503))),
        ),
        with_idempotency_key(with_method(
            Method::POST,
            get("/post-with-key-503-then-200", then_200(1, || status(503))),
        )),
        with_idempotency_key(with_method(
            Method::POST,
            get("/post-with-key-hang-then-200", then_200(1, || Reply::Hang)),
        )),
        with_method(
            Method::PATCH,
            get("/patch-502-then-200", then_200(1, || status(502))),
        ),
        with_method(
            Method::PUT,
            get("/put-502-then-200", then_200(1, || status(502))),
        ),
        with_method(
            Method::DELETE,
            get("/delete-503-then-200", then_200(1, || status(503))),
        ),
        with_method(
            Method::HEAD,
            get("/head-503-then-200", then_200(1, || status(503))),
        ),
        // Headers a client may choke on.
        get(
            "/huge-header-503-then-200",
            then_200(1, || many_headers(503, 1, 64 * 1024)),
        ),
        get("/too-many-headers", always(|| many_headers(200, 150, 1))),
        get(
            "/head-too-large",
            always(|| many_headers(200, 8, 64 * 1024)),
        ),
        // Failures that never end, last: each spends what it may.
        get("/always-503", always(|| status(503))),
        get("/always-502", always(|| status(502))),
        get("/always-504", always(|| status(504))),
        get("/always-cut-short", always(|| short_body(1000, 100, false))),
        get("/always-hang", always(|| Reply::Hang)),
        // `Retry-After: 0` names a delay, so its retries go out at once and
        // free, however empty the bucket.
        get("/always-503-retry-after-0", always(retry_after(503, "0"))),
        // After the outage: does a flaky route still get its retries?
        get("/after-503-then-200", then_200(1, || status(503))),
        get("/after-200", always(|| status(200))),
        get("/after-503-503-then-200", then_200(2, || status(503))),
    ]
}

/// The hostile server, on 127.0.0.1 (port 0), speaking HTTP/1 and HTTP/2
/// (hyper-util's `auto` builder): each route counts its own requests.
#[derive(Clone)]
struct Server {
    addr: SocketAddr,
    routes: Arc<Vec<Route>>,
    /// The path and version of every request seen, in order.
    seen: Arc<Mutex<Vec<(String, http::Version)>>>,
}

impl Server {
    async fn start(routes: Arc<Vec<Route>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server {
            addr: listener.local_addr().unwrap(),
            routes,
            seen: Arc::default(),
        };
        let state = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                stream.set_nodelay(true).unwrap();
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

    async fn answer(
        &self,
        request: Request<Incoming>,
    ) -> Result<http::Response<BoxBody<Bytes, Infallible>>, Infallible> {
        let path = request.uri().path().to_owned();
        let version = request.version();
        let _ = request.into_body().collect().await;
        let n = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.iter().filter(|(p, _)| *p == path).count();
            seen.push((path.clone(), version));
            n
        };
        let reply = match self.routes.iter().find(|route| route.path == path) {
            Some(route) => (route.script)(n),
            None => status(418),
        };
        match reply {
            Reply::Respond(response) => Ok(response),
            Reply::Hang => std::future::pending().await,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// How many requests for `path` the server saw, each asserted to have
    /// come over `protocol`.
    fn seen(&self, path: &str, protocol: Protocol) -> usize {
        let seen = self.seen.lock().unwrap();
        let mut count = 0;
        for (seen_path, version) in seen.iter().filter(|(p, _)| p == path) {
            assert_eq!(*version, protocol.version(), "{seen_path}");
            count += 1;
        }
        count
    }
}

// --- the clients ------------------------------------------------------------------

type Retried = HttpRetry<Client<HttpConnector, Full<Bytes>>>;

/// The settings both runs share, all but the budget: short constant
/// delays, no jitter, an attempt timeout, and the default 3 attempts.
fn settings() -> HttpRetryBuilder {
    HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .attempt_timeout(ATTEMPT_TIMEOUT)
        // Routes lie about their bodies and hang in them: read ahead (off
        // by default), a body is part of the attempt, which the attempt
        // timeout ends.
        .buffer_limit(DEFAULT_RESPONSE_BUFFER_LIMIT)
}

/// A hyper-util client speaking `protocol` behind the layer `builder`
/// builds, and what the layer's observer heard of the last request to end.
struct Retrying {
    protocol: Protocol,
    layer: HttpRetryLayer,
    service: Retried,
    ended: Arc<Mutex<Option<EndArgs>>>,
}

impl Retrying {
    fn new(protocol: Protocol, builder: HttpRetryBuilder) -> Self {
        let ended: Arc<Mutex<Option<EndArgs>>> = Arc::default();
        let heard = ended.clone();
        let layer = builder
            .observer(move |event: &Event| {
                if let Event::Ended(end) = event {
                    *heard.lock().unwrap() = Some(*end);
                }
            })
            .build()
            .unwrap();
        // TCP_NODELAY, as reqwest and tonic set it: without it, a small
        // HTTP/2 frame can wait in the kernel for a delayed ACK, long
        // enough for the paused clock to end the attempt.
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .http2_only(protocol == Protocol::Http2)
            .build(connector);
        Retrying {
            protocol,
            service: layer.layer(client),
            layer,
            ended,
        }
    }

    /// Sends `route`'s request and reads how it ended, its response body
    /// to the end. No timer runs while a body streams: on the paused clock
    /// it would fire whenever the runtime waits for the socket (a chunked
    /// body waits some 40 ms for delayed ACKs on loopback), and nothing
    /// here streams forever.
    async fn send(&self, server: &Server, route: &Route) -> Outcome {
        let mut request = Request::builder()
            .method(route.method.clone())
            .uri(server.url(route.path));
        if route.idempotency_key {
            request = request.header(IDEMPOTENCY_KEY, route.path);
        }
        let body = match route.method {
            Method::POST | Method::PUT | Method::PATCH => Full::from("hostile"),
            _ => Full::default(),
        };
        let request = request.body(body).unwrap();
        *self.ended.lock().unwrap() = None;
        let ends = match self.service.clone().oneshot(request).await {
            Ok(response) => {
                let code = response.status().as_u16();
                let info = *response
                    .extensions()
                    .get::<RetryInfo>()
                    .expect("every response carries RetryInfo");
                let ends = match response.into_body().collect().await {
                    Ok(_) => Ends::Status(code),
                    Err(_) => Ends::BodyError(code),
                };
                (ends, Some(info.attempts))
            }
            Err(error) => (Ends::Error(error_kind(&error)), None),
        };
        let ended = self
            .ended
            .lock()
            .unwrap()
            .expect("the observer hears every request end");
        if let Some(attempts) = ends.1 {
            assert_eq!(attempts, ended.attempts(), "{}: RetryInfo", route.path);
        }
        let seen = server.seen(route.path, self.protocol);
        Outcome {
            ends: ends.0,
            attempts: ended.attempts(),
            seen,
            ending: ended.ending(),
            tokens: self
                .layer
                .backoff()
                .budget()
                .and_then(|budget| budget.balance()),
        }
    }
}

/// How one request ended: its status (and whether its body read whole), or
/// the kind of its error; the attempts the layer made and the server saw;
/// why the layer stopped; what the budget held after.
#[derive(Clone, PartialEq, Eq)]
struct Outcome {
    ends: Ends,
    attempts: u32,
    seen: usize,
    ending: Ending,
    /// The tokens the budget held after it, if it has one.
    tokens: Option<u64>,
}

#[derive(Clone, PartialEq, Eq)]
enum Ends {
    Status(u16),
    /// A status whose body then failed to read.
    BodyError(u16),
    Error(String),
}

impl fmt::Display for Ends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ends::Status(code) => write!(f, "{code}"),
            Ends::BodyError(code) => write!(f, "{code}, body failed"),
            Ends::Error(kind) => f.write_str(kind),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{} after {} ({:?})", self.ends, self.attempts, self.ending);
        f.pad(&text)
    }
}

impl Outcome {
    /// What the runs are compared on: how the request ended, after how many
    /// attempts.
    fn ended(&self) -> (&Ends, u32) {
        (&self.ends, self.attempts)
    }
}

/// What a failed request's error is: a timeout, or from the client's
/// error's source chain.
fn error_kind(error: &BoxError) -> String {
    if error.is::<tower_backoff::error::TimedOut>() {
        return "attempt timed out".into();
    }
    client_error_kind(&**error)
}

fn client_error_kind(error: &(dyn StdError + 'static)) -> String {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(reason) = error
            .downcast_ref::<h2::Error>()
            .and_then(h2::Error::reason)
        {
            return format!("HTTP/2 reset ({reason:?})");
        }
        if let Some(error) = error.downcast_ref::<hyper::Error>() {
            if error.is_incomplete_message() {
                return "connection closed early".into();
            }
            if error.is_parse_too_large() {
                return "response head too large".into();
            }
            if error.is_parse() {
                return "response unparsable".into();
            }
        }
        if let Some(error) = error.downcast_ref::<std::io::Error>() {
            if error.kind() == std::io::ErrorKind::UnexpectedEof {
                return "body cut short".into();
            }
        }
        next = error.source();
    }
    format!("other: {error}")
}

// --- the runs -----------------------------------------------------------------------

/// Every route in order through `client`, on a server of its own.
async fn run_through(client: &Retrying, routes: &Arc<Vec<Route>>) -> Vec<Outcome> {
    let server = Server::start(routes.clone()).await;
    let mut outcomes = Vec::with_capacity(routes.len());
    for route in routes.iter() {
        outcomes.push(client.send(&server, route).await);
    }
    outcomes
}

/// Every route in order, each through a layer built for it alone: a new
/// client's first request.
async fn run_each_fresh(protocol: Protocol, routes: &Arc<Vec<Route>>) -> Vec<Outcome> {
    let server = Server::start(routes.clone()).await;
    let mut outcomes = Vec::with_capacity(routes.len());
    for route in routes.iter() {
        let client = Retrying::new(protocol, settings());
        outcomes.push(client.send(&server, route).await);
    }
    outcomes
}

/// Prints the table, and returns the routes that end differently in the
/// two runs; `expected` lists the routes expected to.
fn compare(
    routes: &[Route],
    (first_title, unrestricted): (&str, &[Outcome]),
    (title, budgeted): (&str, &[Outcome]),
    expected: &[(&str, &str)],
) -> Vec<&'static str> {
    let rows: Vec<_> = routes.iter().zip(unrestricted).zip(budgeted).collect();
    let width = |cells: &mut dyn Iterator<Item = usize>| cells.max().unwrap_or(0);
    let path_width = width(&mut rows.iter().map(|((route, _), _)| route.path.len()));
    let free_width = width(&mut rows.iter().map(|((_, free), _)| free.to_string().len()));
    let held_width = width(&mut rows.iter().map(|(_, held)| held.to_string().len()));
    println!(
        "\n{:path_width$}  {:free_width$}  {:held_width$}  tokens after",
        "route", first_title, title
    );
    let mut different = Vec::new();
    for ((route, free), held) in rows {
        let mark = if free.ended() == held.ended() {
            ""
        } else {
            different.push(route.path);
            match expected.iter().find(|(path, _)| *path == route.path) {
                Some(_) => "  differs, as listed",
                None => "  DIFFERS",
            }
        };
        let tokens = held
            .tokens
            .map_or_else(|| "-".to_owned(), |tokens| tokens.to_string());
        println!(
            "{:path_width$}  {free:free_width$}  {held:held_width$}  {tokens:>12}{mark}",
            route.path
        );
    }
    for ((route, free), held) in routes.iter().zip(unrestricted).zip(budgeted) {
        for outcome in [free, held] {
            assert_eq!(
                outcome.attempts as usize, outcome.seen,
                "{}: the server sees every attempt, and only those",
                route.path
            );
        }
    }
    different
}

// --- the tests ------------------------------------------------------------------------

/// Asserts that exactly the `expected` routes are `different`.
fn assert_listed(different: &[&str], expected: &[(&str, &str)], context: &str) {
    let unexpected: Vec<_> = different
        .iter()
        .filter(|path| !expected.iter().any(|(listed, _)| listed == *path))
        .collect();
    let stale: Vec<_> = expected
        .iter()
        .filter(|(listed, _)| !different.contains(listed))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{context}: end differently: {unexpected:?}"
    );
    assert!(
        stale.is_empty(),
        "{context}: listed but ending the same: {stale:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_route_ends_as_without_a_budget_through_one_shared_default_layer_but_the_listed() {
    let routes = Arc::new(routes());
    for &protocol in Protocol::all() {
        let free = Retrying::new(protocol, settings().no_budget());
        let unrestricted = run_through(&free, &routes).await;
        let shared = run_through(&Retrying::new(protocol, settings()), &routes).await;
        let mut expected = EXPECTED_DIFFERENT.to_vec();
        if protocol != Protocol::Http1 {
            expected.push((
                "/content-length-below-body",
                "a reset over HTTP/2, so a retry (see DIFFERENT_OVER_HTTP2), asked while \
                 the bucket is still empty after /always-429-retry-after-1",
            ));
        }
        let different = compare(
            &routes,
            ("no budget", &unrestricted),
            (&format!("default budget, shared, {protocol:?}"), &shared),
            &expected,
        );
        assert_listed(&different, &expected, &format!("{protocol:?}"));
    }
}

#[tokio::test(start_paused = true)]
async fn every_route_ends_as_without_a_budget_on_a_fresh_default_layer() {
    let routes = Arc::new(routes());
    for &protocol in Protocol::all() {
        let free = Retrying::new(protocol, settings().no_budget());
        let unrestricted = run_through(&free, &routes).await;
        let fresh = run_each_fresh(protocol, &routes).await;
        let different = compare(
            &routes,
            ("no budget", &unrestricted),
            (&format!("default budget, fresh, {protocol:?}"), &fresh),
            &[],
        );
        assert!(
            different.is_empty(),
            "{protocol:?}: a new client's first request ends differently: {different:?}"
        );
    }
}

#[cfg(feature = "http2")]
#[tokio::test(start_paused = true)]
async fn every_route_ends_over_http2_as_over_http1_but_the_listed() {
    let routes = Arc::new(routes());
    let http1 = Retrying::new(Protocol::Http1, settings().no_budget());
    let over_http1 = run_through(&http1, &routes).await;
    let http2 = Retrying::new(Protocol::Http2, settings().no_budget());
    let over_http2 = run_through(&http2, &routes).await;
    let different = compare(
        &routes,
        ("HTTP/1", &over_http1),
        ("HTTP/2", &over_http2),
        DIFFERENT_OVER_HTTP2,
    );
    assert_listed(&different, DIFFERENT_OVER_HTTP2, "HTTP/2 against HTTP/1");
}
