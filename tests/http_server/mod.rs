//! A scriptable hyper server on 127.0.0.1 for the HTTP tests: it records every
//! request it sees and answers as the test's script says.
#![allow(dead_code)] // each test binary uses part of it

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower_backoff::http::{HttpPolicy, HttpRetryLayer};
use tower_backoff::{BackoffLayer, Constant, Jitter, Schedule};

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// On tokio's clock, so paused time in tests.
    pub at: Instant,
}

/// What the script tells the server to do with a request.
pub enum Reply {
    Respond(Response<BoxBody<Bytes, Infallible>>),
    /// Never answer.
    Hang,
}

pub fn status(code: u16) -> Reply {
    status_with(code, &[])
}

pub fn status_with(code: u16, headers: &[(&str, &str)]) -> Reply {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::from_u16(code).unwrap();
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("valid header name");
        let value = http::HeaderValue::from_str(value).expect("valid header value");
        response.headers_mut().insert(name, value);
    }
    Reply::Respond(response)
}

pub fn with_body(reply: Reply, body: &'static str) -> Reply {
    match reply {
        Reply::Respond(response) => {
            Reply::Respond(response.map(|_| Full::new(Bytes::from(body)).boxed()))
        }
        Reply::Hang => Reply::Hang,
    }
}

/// The reply with a chunked body of `chunks` chunks of 100 bytes: a body the
/// client cannot have read whole with the headers.
pub fn with_chunked_body(reply: Reply, chunks: usize) -> Reply {
    match reply {
        Reply::Respond(response) => Reply::Respond(response.map(|_| {
            let frames = (0..chunks).map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; 100]))));
            StreamBody::new(futures::stream::iter(frames)).boxed()
        })),
        Reply::Hang => Reply::Hang,
    }
}

type Script = dyn Fn(usize, &Seen) -> Reply + Send + Sync;

#[derive(Clone)]
pub struct Server {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Server {
    /// Starts a server on a free port; `script(n, request)` answers the `n`th
    /// request (from 0).
    pub async fn start(script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, script)
    }

    /// Starts a server on `addr`, once it is free.
    pub async fn start_on(
        addr: SocketAddr,
        script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, script)
    }

    fn serve(
        listener: TcpListener,
        script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let server = Server {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            connections: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        };
        let script: Arc<Script> = Arc::new(script);
        let state = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        let script = script.clone();
                        async move { state.answer(request, &*script).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        server
    }

    async fn answer(
        &self,
        request: hyper::Request<Incoming>,
        script: &Script,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let seen = Seen {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            headers: parts.headers,
            body,
            at: Instant::now(),
        };
        let n = {
            let mut log = self.seen.lock().unwrap();
            log.push(seen.clone());
            log.len() - 1
        };
        let reply = script(n, &seen);
        match reply {
            Reply::Respond(response) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(response)
            }
            Reply::Hang => std::future::pending().await,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Every request seen so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

/// An address on 127.0.0.1 where, for now, nothing listens.
pub fn unused_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A request map that counts the attempts reaching the client, for placing
/// inside the retry layer (`.map_request(count)`), with the shared count.
pub fn counting<R>() -> (impl Fn(R) -> R + Clone, Arc<AtomicUsize>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let count = move |request: R| {
        counter.fetch_add(1, Ordering::SeqCst);
        request
    };
    (count, attempts)
}

/// The sleep between attempts of [`layer`]: a fixed 100 ms, no jitter.
pub const STEP: std::time::Duration = std::time::Duration::from_millis(100);

/// A layer that sleeps a fixed [`STEP`] between attempts, up to 3 attempts.
pub fn layer(policy: HttpPolicy) -> BackoffLayer<HttpPolicy> {
    layer_with(policy, Constant::new(STEP), 3, None)
}

/// [`layer`] as the HTTP front-end, which reads per-request limits and
/// records `RetryInfo`.
pub fn http_layer(policy: HttpPolicy) -> HttpRetryLayer {
    HttpRetryLayer::from(layer(policy))
}

/// [`layer_with`] as the HTTP front-end.
pub fn http_layer_with<S: Schedule + Send + Sync + 'static>(
    policy: HttpPolicy,
    schedule: S,
    max_attempts: u32,
    max_elapsed: Option<std::time::Duration>,
) -> HttpRetryLayer {
    HttpRetryLayer::from(layer_with(policy, schedule, max_attempts, max_elapsed))
}

/// A layer with no jitter, so the tests can assert exact delays, and no
/// budget, so only `max_attempts` and `max_elapsed` bound the retries (the
/// default budget starts with one retry).
pub fn layer_with<S: Schedule + Send + Sync + 'static>(
    policy: HttpPolicy,
    schedule: S,
    max_attempts: u32,
    max_elapsed: Option<std::time::Duration>,
) -> BackoffLayer<HttpPolicy> {
    let builder = BackoffLayer::builder()
        .policy(policy)
        .schedule(schedule)
        .jitter(Jitter::None)
        .max_attempts(max_attempts)
        .no_budget();
    match max_elapsed {
        Some(limit) => builder.max_elapsed(limit),
        None => builder,
    }
    .build()
    .unwrap()
}

/// Serves a tower `service` (a server stack, say behind `ShedLayer`) over
/// HTTP/1 on 127.0.0.1, port 0, each connection on a task of its own.
pub async fn serve_tower<S, B>(service: S) -> SocketAddr
where
    S: tower::Service<http::Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}
