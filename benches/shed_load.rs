//! The server half under a real load generator (issue 52): a hyper server
//! with one of two server models behind one of three protections, driven by
//! `benches/shed_load.sh` with oha at a constant rate.
//!
//! Server models, each with a capacity of 200 requests a second:
//! - `queue`: 20 workers, each request holds one for 100 ms; beyond 20,
//!   requests wait their turn;
//! - `thrash`: the same, but every request held past 20 (waiting or not)
//!   slows each worker by 1.5 %: throughput falls as concurrency grows.
//!
//! Protections: `none`; `tower`, tower's `load_shed` over
//! `concurrency_limit(20)` (the knee, known), a 503 when full; `shed`,
//! `ShedLayer` with its defaults.
//!
//! `shed_load <queue|thrash> <none|tower|shed>` serves on two ports of
//! 127.0.0.1 it prints (`load <port> stats <port>`): the load on the first,
//! and on the second `/stats` (what was answered since the last `/stats`:
//! `ok`, the 200s answered within 2 s, `late`, those answered after, `shed`,
//! the 503s, and `p99_ms`, the 99th percentile time from the server's call
//! to the end of each 200's body) without protection. With
//! `SHED_LOAD_TRACE` set, `shed` prints its limit each second.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backoff::shed::ShedLayer;

const KNEE: usize = 20;
const WORK: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(2);

/// What was answered since the last `/stats`.
#[derive(Default)]
struct Stats {
    ok: u64,
    late: u64,
    shed: u64,
    latencies: Vec<Duration>,
}

type Shared = Arc<Mutex<Stats>>;

/// The handler: one server model.
#[derive(Clone)]
struct Model {
    thrash: bool,
    workers: Arc<Semaphore>,
    held: Arc<AtomicUsize>,
}

impl Service<Request<Incoming>> for Model {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Incoming>) -> Self::Future {
        let model = self.clone();
        Box::pin(async move {
            // Counted while it waits too: contention slows every worker.
            let held = Held::new(&model.held);
            let worker = model.workers.acquire().await.unwrap();
            let work = if model.thrash {
                let excess = held.now().saturating_sub(KNEE) as i32;
                WORK.mul_f64(1.015f64.powi(excess))
            } else {
                WORK
            };
            tokio::time::sleep(work).await;
            drop(worker);
            Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
        })
    }
}

/// A request in the handler, counted until it is done or dropped.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    fn new(held: &'a AtomicUsize) -> Self {
        held.fetch_add(1, Ordering::Relaxed);
        Self(held)
    }

    fn now(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `service` on `listener`, recording every answer in `stats` once
/// its body ended.
async fn serve<S, B>(listener: TcpListener, service: S, stats: Shared)
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Debug + Send + Sync + std::error::Error + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (service, stats) = (service.clone(), stats.clone());
        let recorded = tower::service_fn(move |req: Request<Incoming>| {
            let (service, stats) = (service.clone(), stats.clone());
            async move {
                let called = Instant::now();
                let response = service.oneshot(req).await?;
                let status = response.status();
                let (parts, body) = response.into_parts();
                // Read here so that the time ends with the body.
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let took = called.elapsed();
                let mut stats = stats.lock().unwrap();
                if status == StatusCode::OK {
                    if took <= TIMEOUT {
                        stats.ok += 1;
                    } else {
                        stats.late += 1;
                    }
                    stats.latencies.push(took);
                } else {
                    stats.shed += 1;
                }
                Ok::<_, Infallible>(Response::from_parts(parts, Full::new(bytes)))
            }
        });
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(recorded))
                .await;
        });
    }
}

async fn serve_stats(listener: TcpListener, stats: Shared) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let stats = stats.clone();
        let report = tower::service_fn(move |_req: Request<Incoming>| {
            let taken = std::mem::take(&mut *stats.lock().unwrap());
            let mut latencies = taken.latencies;
            latencies.sort_unstable();
            let p99 = latencies
                .get(latencies.len() * 99 / 100)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3);
            let json = format!(
                "{{\"ok\":{},\"late\":{},\"shed\":{},\"p99_ms\":{p99:.1}}}",
                taken.ok, taken.late, taken.shed
            );
            async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(json)))) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(report))
                .await;
        });
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, protection] = args.as_slice() else {
        eprintln!("usage: shed_load <queue|thrash> <none|tower|shed>");
        std::process::exit(2);
    };
    let model = Model {
        thrash: match model.as_str() {
            "queue" => false,
            "thrash" => true,
            other => panic!("unknown model {other:?}"),
        },
        workers: Arc::new(Semaphore::new(KNEE)),
        held: Arc::new(AtomicUsize::new(0)),
    };
    // One thread: the load generator has the other core.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let load = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let control = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!(
            "load {} stats {}",
            load.local_addr().unwrap().port(),
            control.local_addr().unwrap().port()
        );
        let stats = Shared::default();
        tokio::spawn(serve_stats(control, stats.clone()));
        match protection.as_str() {
            "none" => serve(load, model, stats).await,
            "tower" => {
                let limited = ServiceBuilder::new()
                    .load_shed()
                    .concurrency_limit(KNEE)
                    .service(model);
                // Overloaded: a 503, as a server would answer.
                let limited = tower::service_fn(move |req: Request<Incoming>| {
                    let limited = limited.clone();
                    async move {
                        Ok::<_, Infallible>(limited.oneshot(req).await.unwrap_or_else(|_| {
                            let mut shed = Response::new(Full::new(Bytes::new()));
                            *shed.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            shed
                        }))
                    }
                });
                serve(load, limited, stats).await
            }
            "shed" => {
                let layer = ShedLayer::builder().build().unwrap();
                if std::env::var_os("SHED_LOAD_TRACE").is_some() {
                    // The limit, what is in flight and the baseline, each second.
                    let limiter = layer.limiter().clone();
                    tokio::spawn(async move {
                        loop {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            eprintln!(
                                "limit {} in flight {} baseline {:?}",
                                limiter.limit(),
                                limiter.in_flight(),
                                limiter.baseline()
                            );
                        }
                    });
                }
                serve(
                    load,
                    ServiceBuilder::new().layer(layer).service(model),
                    stats,
                )
                .await
            }
            other => panic!("unknown protection {other:?}"),
        }
    });
}
