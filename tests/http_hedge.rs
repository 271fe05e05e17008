//! Hedging through `HttpRetryLayer`, against a real hyper server on
//! 127.0.0.1 with a real hyper-util client: an idempotent request
//! still pending after the delay gets a copy, the first answer wins, and the
//! server sees the losing copy cancelled; a POST is never sent twice unless
//! it carries an `Idempotency-Key`.
#![cfg(feature = "hyper")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};
use tower_backoff::http::{HttpPolicy, HttpRetryLayer};
use tower_backoff::{Hedging, Stats};

const DELAY: Duration = Duration::from_millis(50);
const PATIENCE: Duration = Duration::from_secs(5);

/// A server whose requests with the header `x-hang` never answer; it counts
/// the requests it saw, by method, and the handlers dropped before they
/// answered: requests the client cancelled.
#[derive(Clone, Default)]
struct Server {
    addr: Option<SocketAddr>,
    seen: Arc<Mutex<Vec<Seen>>>,
    cancelled: Arc<AtomicUsize>,
}

/// A request's method and its `x-attempt` header.
type Seen = (Method, Option<String>);

struct DropGuard(Arc<AtomicUsize>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Server {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server {
            addr: Some(listener.local_addr().unwrap()),
            ..Server::default()
        };
        let state = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { state.answer(request).await }
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
        request: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let attempt = request
            .headers()
            .get("x-attempt")
            .map(|v| v.to_str().unwrap().to_owned());
        self.seen
            .lock()
            .unwrap()
            .push((request.method().clone(), attempt));
        if request.headers().contains_key("x-hang") {
            let _guard = DropGuard(self.cancelled.clone());
            std::future::pending::<()>().await;
        }
        Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr.unwrap())
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the server saw `count` requests cancelled.
    async fn cancelled(&self, count: usize) {
        let wait = async {
            while self.cancelled.load(Ordering::SeqCst) < count {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .expect("the server saw the losing copy cancelled");
    }
}

/// The layer under test: hedges after `DELAY`, stamping each copy with its
/// attempt number in `x-attempt`.
fn layer(stats: &Stats) -> HttpRetryLayer {
    HttpRetryLayer::builder()
        .policy(HttpPolicy::new().attempt_header(http::HeaderName::from_static("x-attempt")))
        .stats(stats.clone())
        // The load cap grants hedges from the last second's requests: one
        // warm-up request, at 100 %, grants one.
        .hedge(Hedging::after(DELAY).max_extra_load(1.0))
        .build()
        .unwrap()
}

/// Hangs the first attempt only: copies carry the attempt header.
#[derive(Clone)]
struct HangFirst<S>(S);

impl<S, B> Service<Request<B>> for HangFirst<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> S::Future {
        if !request.headers().contains_key("x-attempt")
            && request.headers().contains_key("x-first-hangs")
        {
            request
                .headers_mut()
                .insert("x-hang", http::HeaderValue::from_static("1"));
        }
        self.0.call(request)
    }
}

fn request(method: Method, url: &str, hangs: bool) -> Request<Full<Bytes>> {
    let mut builder = Request::builder().method(method).uri(url);
    if hangs {
        builder = builder.header("x-first-hangs", "1");
    }
    builder.body(Full::default()).unwrap()
}

async fn warm_up<S, B>(svc: &mut S, server: &Server)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let answer = svc
        .ready()
        .await
        .unwrap()
        .call(request(Method::GET, &server.url(), false))
        .await;
    assert_eq!(answer.unwrap().status(), StatusCode::OK);
    // Into an earlier tenth of a second than the hedge: the cap counts
    // full ones.
    tokio::time::sleep(Duration::from_millis(120)).await;
}

#[tokio::test]
async fn a_get_still_pending_is_hedged_and_the_server_sees_the_loser_cancelled() {
    let server = Server::start().await;
    let stats = Stats::new();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut svc = layer(&stats).layer(HangFirst(client));
    warm_up(&mut svc, &server).await;

    let started = tokio::time::Instant::now();
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(Method::GET, &server.url(), true))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "ok"
    );
    let took = started.elapsed();
    assert!(took >= DELAY && took < DELAY * 10, "{took:?}");
    // The warm-up, the first copy (hanging), the hedge stamped attempt 2.
    let seen = server.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[2], (Method::GET, Some("2".to_owned())));
    server.cancelled(1).await;
    let counted = stats.snapshot();
    assert_eq!(
        (counted.hedges, counted.hedges_won, counted.hedges_cancelled),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_post_is_never_hedged_without_an_idempotency_key() {
    let server = Server::start().await;
    let stats = Stats::new();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut svc = layer(&stats).layer(HangFirst(client));
    warm_up(&mut svc, &server).await;

    let post = request(Method::POST, &server.url(), true);
    let pending = svc.ready().await.unwrap().call(post);
    // Well past the delay, the POST is still pending and was sent once.
    assert!(tokio::time::timeout(DELAY * 4, pending).await.is_err());
    let posts = server
        .seen()
        .into_iter()
        .filter(|(m, _)| m == Method::POST)
        .count();
    assert_eq!(posts, 1);
    assert_eq!(stats.snapshot().hedges, 0);
}

#[tokio::test]
async fn a_post_with_an_idempotency_key_is_hedged() {
    let server = Server::start().await;
    let stats = Stats::new();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut svc = layer(&stats).layer(HangFirst(client));
    warm_up(&mut svc, &server).await;

    let mut post = request(Method::POST, &server.url(), true);
    post.headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static("k-1"));
    let response = tokio::time::timeout(PATIENCE, svc.ready().await.unwrap().call(post))
        .await
        .expect("the hedge answers")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let posts: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|(m, _)| m == Method::POST)
        .collect();
    assert_eq!(
        posts,
        [(Method::POST, None), (Method::POST, Some("2".to_owned()))]
    );
    server.cancelled(1).await;
}
