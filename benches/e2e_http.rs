//! `HttpRetryLayer` end to end: a real hyper server on loopback (in a child
//! process, so the client's side can be profiled alone) and real clients,
//! the layer beside the bare client and beside reqwest-retry in one run.
//!
//! - `--rounds R --requests N` (the default): GETs answered at once with an
//!   11-byte JSON body, 8 and 32 in flight from one client; each round sends
//!   N requests through every stack, the starting stack rotated round by
//!   round; requests/s, p50 and p99 of each round as ratios to the bare
//!   client of the same round, and the medians of those ratios.
//! - `--large`: bodies of 16 KiB to 1 MiB, one request at a time: the time
//!   to the caller's first body byte and to its last, and the peak heap bytes
//!   the client holds per request while the caller streams the body.
//! - `--client ADDR --stack NAME --requests N [--in-flight K]`: one stack
//!   only, for `benches/callgrind_http.sh`; `--serve`: the server alone.
//!
//! Run by `benches/e2e_http.sh`; not a criterion bench.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use tower::{Layer, Service, ServiceExt};
use tower_backoff::http::{HttpRetry, HttpRetryLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type HyperClient = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// Counts the bytes the process holds on the heap, and the most it held
/// since the last [`reset_peak`].
struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        grew(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn grew(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

/// Starts a new peak at what is held now, and returns it.
fn reset_peak() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// The small answer: 11 bytes of JSON.
const SMALL: &[u8] = br#"{"price":7}"#;

// ---------------------------------------------------------------- server

/// Serves `GET /small` with [`SMALL`] and `GET /bytes/N` with N bytes, each
/// with its `content-length`, on one thread, as fast as it can.
fn serve(addr_out: impl FnOnce(SocketAddr)) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on loopback");
        addr_out(listener.local_addr().expect("bound"));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(answer);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, BoxError> {
    let path = request.uri().path();
    let body = match path.strip_prefix("/bytes/") {
        Some(n) => Bytes::from(vec![b'x'; n.parse()?]),
        None => Bytes::from_static(SMALL),
    };
    Ok(Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(Full::new(body))?)
}

/// The server in a child process (this binary with `--serve`), so that it
/// neither shares the client's runtime nor shows in the client's profile.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the server prints its address");
        let addr = line.trim().parse().expect("an address");
        Self { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- clients

/// One client stack, cloned into every task that sends through it.
#[derive(Clone)]
enum Stack {
    Reqwest(reqwest::Client),
    ReqwestLayer(HttpRetry<reqwest::Client>),
    ReqwestRetry(reqwest_middleware::ClientWithMiddleware),
    Hyper(HyperClient),
    HyperLayer(HttpRetry<HyperClient>),
}

const STACKS: [&str; 7] = [
    "reqwest",
    "reqwest + HttpRetryLayer::new()",
    "reqwest + HttpRetryLayer, read-ahead to 1 MiB",
    "reqwest + reqwest-retry",
    "hyper-util",
    "hyper-util + HttpRetryLayer::new()",
    "hyper-util + HttpRetryLayer, read-ahead to 1 MiB",
];

/// Where the hyper-util stacks start in [`STACKS`]: each stack's ratios
/// are to the bare client of its kind.
const HYPER: usize = 4;

/// The layer with response bodies read ahead whenever their
/// `content-length` is within 1 MiB.
fn reading_ahead() -> HttpRetryLayer {
    HttpRetryLayer::new().buffer_limit(1024 * 1024)
}

/// The stacks of the table, in [`STACKS`]' order, over one reqwest client
/// and one hyper-util client, each with TCP_NODELAY.
fn stacks() -> Vec<Stack> {
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("a client");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let retry = RetryTransientMiddleware::new_with_policy(
        ExponentialBackoff::builder().build_with_max_retries(2),
    );
    vec![
        Stack::Reqwest(reqwest.clone()),
        Stack::ReqwestLayer(HttpRetryLayer::new().layer(reqwest.clone())),
        Stack::ReqwestLayer(reading_ahead().layer(reqwest.clone())),
        Stack::ReqwestRetry(
            reqwest_middleware::ClientBuilder::new(reqwest)
                .with(retry)
                .build(),
        ),
        Stack::Hyper(hyper.clone()),
        Stack::HyperLayer(HttpRetryLayer::new().layer(hyper.clone())),
        Stack::HyperLayer(reading_ahead().layer(hyper)),
    ]
}

fn stack(name: &str) -> Stack {
    let index = STACKS
        .iter()
        .position(|stack| *stack == name)
        .unwrap_or_else(|| panic!("no stack {name:?}; one of {STACKS:?}"));
    stacks().swap_remove(index)
}

impl Stack {
    /// Sends a GET of `url` and reads its body to the end: its length.
    async fn get(&mut self, url: &reqwest::Url) -> usize {
        let request = || reqwest::Request::new(reqwest::Method::GET, url.clone());
        let response = match self {
            Self::Reqwest(client) => client.execute(request()).await.expect("a response"),
            Self::ReqwestLayer(client) => client
                .ready()
                .await
                .expect("ready")
                .call(request())
                .await
                .expect("a response"),
            Self::ReqwestRetry(client) => client.execute(request()).await.expect("a response"),
            Self::Hyper(client) => {
                let response = client.request(hyper_get(url)).await.expect("a response");
                return body_len(response.into_body()).await;
            }
            Self::HyperLayer(client) => {
                let response = client
                    .ready()
                    .await
                    .expect("ready")
                    .call(hyper_get(url))
                    .await
                    .expect("a response");
                return body_len(response.into_body()).await;
            }
        };
        response.bytes().await.expect("the whole body").len()
    }

    /// Sends a GET of `url` and streams its body, dropping each chunk:
    /// the time to the first body byte and to the last.
    async fn stream(&mut self, url: &reqwest::Url) -> (Duration, Duration) {
        let start = Instant::now();
        let mut first = None;
        let request = reqwest::Request::new(reqwest::Method::GET, url.clone());
        let mut response = match self {
            Self::Reqwest(client) => client.execute(request).await.expect("a response"),
            Self::ReqwestLayer(client) => client
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("a response"),
            _ => unreachable!("only the reqwest stacks stream"),
        };
        while let Some(chunk) = response.chunk().await.expect("the body") {
            if !chunk.is_empty() && first.is_none() {
                first = Some(start.elapsed());
            }
        }
        (first.unwrap_or_default(), start.elapsed())
    }
}

fn hyper_get(url: &reqwest::Url) -> Request<Full<Bytes>> {
    Request::get(url.as_str())
        .body(Full::new(Bytes::new()))
        .expect("a request")
}

async fn body_len<B>(body: B) -> usize
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    body.collect()
        .await
        .expect("the whole body")
        .to_bytes()
        .len()
}

// ---------------------------------------------------------------- rounds

/// What one stack did in one round.
struct Round {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Sends `requests` GETs through `stack` from `in_flight` tasks.
async fn round(stack: &Stack, url: &reqwest::Url, in_flight: usize, requests: usize) -> Round {
    let left = Arc::new(AtomicUsize::new(requests));
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (mut stack, url, left) = (stack.clone(), url.clone(), left.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(requests / in_flight + 1);
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let sent = Instant::now();
                    assert_eq!(stack.get(&url).await, SMALL.len());
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(requests);
    for task in tasks {
        latencies.extend(task.await.expect("the task ends"));
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Round {
        per_second: requests as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Small bodies: the table of ratios to the bare client of each round.
fn small(rounds: usize, requests: usize, in_flights: &[usize]) {
    let server = Server::start();
    let url: reqwest::Url = format!("http://{}/small", server.addr)
        .parse()
        .expect("a URL");
    let runtime = client_runtime();
    println!("| in flight | stack | requests/s | p50 µs | p99 µs | requests/s vs bare | p50 vs bare | p99 vs bare |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for &in_flight in in_flights {
        let stacks = stacks();
        // Every stack's connections opened and its code paged in.
        for stack in &stacks {
            runtime.block_on(round(stack, &url, in_flight, requests / 10 + in_flight));
        }
        let mut results: Vec<Vec<Round>> = stacks.iter().map(|_| Vec::new()).collect();
        for r in 0..rounds {
            for i in 0..stacks.len() {
                let s = (i + r) % stacks.len();
                let result = runtime.block_on(round(&stacks[s], &url, in_flight, requests));
                results[s].push(result);
            }
        }
        for (s, name) in STACKS.iter().enumerate() {
            // hyper-util's stacks against bare hyper-util, reqwest's against reqwest.
            let bare = if s >= HYPER { HYPER } else { 0 };
            let ratio = |value: &dyn Fn(&Round) -> f64| {
                median(
                    (0..rounds)
                        .map(|r| value(&results[s][r]) / value(&results[bare][r]))
                        .collect(),
                )
            };
            let abs =
                |value: &dyn Fn(&Round) -> f64| median(results[s].iter().map(value).collect());
            let rps = |round: &Round| round.per_second;
            let p50 = |round: &Round| round.p50.as_secs_f64() * 1e6;
            let p99 = |round: &Round| round.p99.as_secs_f64() * 1e6;
            println!(
                "| {in_flight} | {name} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} |",
                abs(&rps),
                abs(&p50),
                abs(&p99),
                ratio(&rps),
                ratio(&p50),
                ratio(&p99),
            );
        }
    }
    println!();
    println!(
        "({rounds} rounds of {requests} requests per stack, starting stack rotated; medians of the rounds; {}, {} cores)",
        env!("CARGO_PKG_NAME"),
        std::thread::available_parallelism().map_or(0, usize::from),
    );
}

/// Large bodies, one at a time: time to first byte, to last byte, and the
/// peak heap the client held above what it held before the request.
fn large(requests: usize) {
    let server = Server::start();
    let runtime = client_runtime();
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("a client");
    let columns = [
        ("reqwest", Stack::Reqwest(reqwest.clone())),
        (
            "HttpRetryLayer::new()",
            Stack::ReqwestLayer(HttpRetryLayer::new().layer(reqwest.clone())),
        ),
        (
            "HttpRetryLayer, read-ahead to 1 MiB",
            Stack::ReqwestLayer(reading_ahead().layer(reqwest)),
        ),
    ];
    println!("| body | stack | first byte µs | last byte µs | heap held per request |");
    println!("|---:|---|---:|---:|---:|");
    for size in [16 << 10, 64 << 10, 256 << 10, 1 << 20] {
        let url: reqwest::Url = format!("http://{}/bytes/{size}", server.addr)
            .parse()
            .expect("a URL");
        for (_, stack) in &columns {
            let mut stack = stack.clone();
            runtime.block_on(async {
                for _ in 0..10 {
                    stack.stream(&url).await;
                }
            });
        }
        let mut first: Vec<Vec<f64>> = columns.iter().map(|_| Vec::new()).collect();
        let mut last = first.clone();
        let mut heap = first.clone();
        for r in 0..requests {
            for i in 0..columns.len() {
                let c = (i + r) % columns.len();
                let mut stack = columns[c].1.clone();
                let before = reset_peak();
                let (to_first, to_last) = runtime.block_on(stack.stream(&url));
                heap[c].push(PEAK.load(Ordering::Relaxed).saturating_sub(before) as f64);
                first[c].push(to_first.as_secs_f64() * 1e6);
                last[c].push(to_last.as_secs_f64() * 1e6);
            }
        }
        for (c, (name, _)) in columns.iter().enumerate() {
            println!(
                "| {} KiB | {name} | {:.0} | {:.0} | {:.0} KiB |",
                size >> 10,
                median(first[c].clone()),
                median(last[c].clone()),
                median(heap[c].clone()) / 1024.0,
            );
        }
    }
    println!();
    println!(
        "(medians of {requests} requests per cell, one in flight, stacks rotated; heap held: \
         the most the client held above what it held before the request, while the caller \
         read the body chunk by chunk)"
    );
}

/// One stack alone, for a profiler: `requests` GETs from `in_flight` tasks.
fn client(addr: &str, name: &str, requests: usize, in_flight: usize) {
    let url: reqwest::Url = format!("http://{addr}/small").parse().expect("a URL");
    let runtime = client_runtime();
    let stack = stack(name);
    // Warmed up first, so that what is counted is the steady state.
    runtime.block_on(round(&stack, &url, in_flight, in_flight * 10));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    runtime.block_on(round(&stack, &url, in_flight, requests));
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    eprintln!(
        "allocations/request: {:.1}",
        allocations as f64 / requests as f64
    );
}

/// The client's runtime: one thread, as the server's, so that on two cores
/// each has its own.
fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let number =
        |flag: &str, default: usize| value(flag).map_or(default, |v| v.parse().expect("a number"));
    if args.iter().any(|arg| arg == "--serve") {
        // The parent holds our stdin: when it goes, so do we.
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
        serve(|addr| println!("{addr}"));
    } else if let Some(addr) = value("--client") {
        let name = value("--stack").unwrap_or_else(|| STACKS[0].to_owned());
        client(
            &addr,
            &name,
            number("--requests", 2_000),
            number("--in-flight", 8),
        );
    } else if args.iter().any(|arg| arg == "--large") {
        large(number("--requests", 50));
    } else {
        let in_flights = value("--in-flight").map_or(vec![8, 32], |v| {
            v.split(',').map(|n| n.parse().expect("a number")).collect()
        });
        small(
            number("--rounds", 9),
            number("--requests", 20_000),
            &in_flights,
        );
    }
}
