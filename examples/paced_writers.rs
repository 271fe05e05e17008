//! Parallel writers against a store that throttles above its rate, as a batch
//! job writing to DynamoDB does: adaptive pacing finds the rate.
//!
//! A real hyper server on 127.0.0.1 admits `--rate` PUTs in any rolling second
//! and answers 429 to the rest. Workers PUT through hyper-util's client, behind
//! a `BackoffLayer` with `HttpPolicy` and `AdaptivePacing`, until they have
//! written `--writes` records or `--seconds` have passed. Then it prints the
//! rate the pacing found, the share of 429s and the pacing's metrics, and
//! exits with an error if any record was not stored in time.
//!
//! ```text
//! cargo run --release --example paced_writers --features http
//! cargo run --release --example paced_writers --features http -- --rate 100 --workers 64
//! cargo run --release --example paced_writers --features http -- --processes 4
//! ```
//!
//! `--processes N` starts the server, then runs this binary again as N OS
//! processes (`--worker ADDR`), each with its own layer and pacing, sharing
//! nothing but the server: independent clients finding a fair share.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backoff::http::HttpPolicy;
use tower_backoff::{AdaptivePacing, BackoffLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: paced_writers [--rate R] [--workers W] [--writes N] [--seconds S] [--processes P]
  --rate R        writes the server admits in any rolling second (default 20)
  --workers W     concurrent writers per process (default 8)
  --writes N      records to write in all, then stop (default 500)
  --seconds S     stop after S seconds anyway (default 40)
  --processes P   run P worker processes against one server (default: none, in-process)
  --worker ADDR   (internal) be one worker process writing to ADDR";

#[derive(Debug, Clone)]
struct Options {
    rate: usize,
    workers: usize,
    writes: u64,
    seconds: u64,
    processes: usize,
    worker: Option<SocketAddr>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        rate: 20,
        workers: 8,
        writes: 500,
        seconds: 40,
        processes: 0,
        worker: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}\n{USAGE}");
        match flag.as_str() {
            "--rate" => options.rate = value()?.parse().map_err(|e| bad(&e))?,
            "--workers" => options.workers = value()?.parse().map_err(|e| bad(&e))?,
            "--writes" => options.writes = value()?.parse().map_err(|e| bad(&e))?,
            "--seconds" => options.seconds = value()?.parse().map_err(|e| bad(&e))?,
            "--processes" => options.processes = value()?.parse().map_err(|e| bad(&e))?,
            "--worker" => options.worker = Some(value()?.parse().map_err(|e| bad(&e))?),
            _ => return Err(USAGE.to_string()),
        }
    }
    if options.rate == 0 || options.workers == 0 || options.seconds == 0 {
        return Err(format!(
            "rate, workers and seconds must be above 0\n{USAGE}"
        ));
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let options = options()?;
    if let Some(addr) = options.worker {
        // One of several processes: write, then report on one line.
        let run = write(addr, &options, options.writes).await?;
        println!("{}", run.line());
        return Ok(());
    }
    let store = Arc::new(Store::new(options.rate));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, store.clone()));
    println!(
        "server on {addr}: admits {} writes in any rolling second, 429 above",
        options.rate
    );

    if options.processes == 0 {
        let run = write(addr, &options, options.writes).await?;
        print_run(&run, options.rate);
    } else {
        run_processes(addr, &options).await?;
    }
    let (ok, throttled) = store.totals();
    println!(
        "server: {ok} admitted, {throttled} throttled ({:.1} % of attempts)",
        100.0 * throttled as f64 / (ok + throttled).max(1) as f64
    );
    // The records must all be stored in time. A write the layer gives back
    // (the budget pays for throttled retries too: a 429 decides when a
    // retry goes, never whether) is written again by the job, and counted
    // above. The exit status tells a script or test.
    if ok < options.writes {
        return Err(format!("{ok} of {} records stored in time", options.writes).into());
    }
    Ok(())
}

/// Runs `--processes` copies of this binary in worker mode, each writing its
/// share of the records, and prints what each got. Returns the writes their
/// layers gave up on.
async fn run_processes(addr: SocketAddr, options: &Options) -> Result<u64, BoxError> {
    let exe = std::env::current_exe()?;
    let share = options.writes / options.processes as u64;
    let mut children = Vec::new();
    for _ in 0..options.processes {
        let child = Command::new(&exe)
            .args(["--worker", &addr.to_string()])
            .args(["--workers", &options.workers.to_string()])
            .args(["--writes", &share.to_string()])
            .args(["--seconds", &options.seconds.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(tokio::task::spawn_blocking(move || {
            child.wait_with_output()
        }));
    }
    let mut goodputs = Vec::new();
    let mut gave_up = 0;
    for (i, child) in children.into_iter().enumerate() {
        let output = child.await??;
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text.lines().last().unwrap_or("").to_string();
        println!("process {i}: {line}");
        let run = Run::parse(&line).ok_or_else(|| format!("process {i} said: {text}"))?;
        gave_up += run.failed;
        goodputs.push(run.ok as f64 / run.elapsed.as_secs_f64().max(1e-9));
    }
    let sum: f64 = goodputs.iter().sum();
    let squares: f64 = goodputs.iter().map(|x| x * x).sum();
    let jain = sum * sum / (goodputs.len() as f64 * squares.max(1e-12));
    println!(
        "together: {sum:.1} writes/s ({:.0} % of the server's {}), Jain's fairness index {jain:.3}",
        100.0 * sum / options.rate as f64,
        options.rate
    );
    Ok(gave_up)
}

/// What one process's workers did.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    ok: u64,
    throttled: u64,
    failed: u64,
    elapsed: Duration,
    interval: Duration,
    invocations: u64,
    raised: u64,
    lowered: u64,
    sleeps: u64,
    slept: Duration,
}

impl Run {
    fn line(&self) -> String {
        format!(
            "ok={} throttled={} failed={} elapsed_ms={} interval_us={} invocations={} raised={} lowered={} sleeps={} slept_ms={}",
            self.ok,
            self.throttled,
            self.failed,
            self.elapsed.as_millis(),
            self.interval.as_micros(),
            self.invocations,
            self.raised,
            self.lowered,
            self.sleeps,
            self.slept.as_millis()
        )
    }

    fn parse(line: &str) -> Option<Run> {
        let field = |name: &str| -> Option<u64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(Run {
            ok: field("ok")?,
            throttled: field("throttled")?,
            failed: field("failed")?,
            elapsed: Duration::from_millis(field("elapsed_ms")?),
            interval: Duration::from_micros(field("interval_us")?),
            invocations: field("invocations")?,
            raised: field("raised")?,
            lowered: field("lowered")?,
            sleeps: field("sleeps")?,
            slept: Duration::from_millis(field("slept_ms")?),
        })
    }
}

fn print_run(run: &Run, rate: usize) {
    let goodput = run.ok as f64 / run.elapsed.as_secs_f64();
    let found = if run.interval.is_zero() {
        "off".to_string()
    } else {
        format!("{:.1} sends/s", 1.0 / run.interval.as_secs_f64())
    };
    println!(
        "{} records in {:.1} s: {goodput:.1} writes/s ({:.0} % of {rate}); pacing's rate at the end: {found}",
        run.ok,
        run.elapsed.as_secs_f64(),
        100.0 * goodput / rate as f64,
    );
    println!(
        "attempts answered 429: {} of {} ({:.1} %); requests the layer gave up on (written again): {}",
        run.throttled,
        run.ok + run.throttled,
        100.0 * run.throttled as f64 / (run.ok + run.throttled).max(1) as f64,
        run.failed
    );
    println!(
        "pacing: invocations {}, went up {}, went down {}, slept {} times, {:.1} s in all",
        run.invocations,
        run.raised,
        run.lowered,
        run.sleeps,
        run.slept.as_secs_f64()
    );
}

/// Writes `writes` records to `addr` with `options.workers` workers through
/// one paced layer, or until `options.seconds` pass.
async fn write(addr: SocketAddr, options: &Options, writes: u64) -> Result<Run, BoxError> {
    let pacing = AdaptivePacing::new();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let throttled = Arc::new(AtomicU64::new(0));
    let seen = throttled.clone();
    let service = ServiceBuilder::new()
        .layer(
            BackoffLayer::builder()
                .policy(HttpPolicy::new())
                .max_attempts(10)
                .pacing(pacing.clone())
                .build()?,
        )
        // Inside the retry layer: sees every attempt.
        .map_response(move |response: Response<Incoming>| {
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                seen.fetch_add(1, Ordering::Relaxed);
            }
            response
        })
        .timeout(Duration::from_secs(5))
        .service(client);

    let started = Instant::now();
    let deadline = started + Duration::from_secs(options.seconds);
    let next = Arc::new(AtomicU64::new(0));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..options.workers)
        .map(|_| {
            let (mut service, next) = (service.clone(), next.clone());
            let (ok, failed) = (ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut record = next.fetch_add(1, Ordering::Relaxed);
                while record < writes && Instant::now() < deadline {
                    let request = Request::put(format!("http://{addr}/records/{record}"))
                        .body(Full::new(Bytes::from(format!("record {record}"))))
                        .expect("a valid request");
                    let outcome = match service.ready().await {
                        Ok(service) => service.call(request).await,
                        Err(error) => Err(error),
                    };
                    match outcome {
                        Ok(response) if response.status().is_success() => {
                            let _ = response.into_body().collect().await;
                            ok.fetch_add(1, Ordering::Relaxed);
                            record = next.fetch_add(1, Ordering::Relaxed);
                        }
                        // The layer gave up (attempts or budget): the job
                        // keeps the record and writes it again.
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await?;
    }
    let metrics = pacing.metrics();
    Ok(Run {
        ok: ok.load(Ordering::Relaxed),
        throttled: throttled.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        interval: metrics.interval,
        invocations: metrics.invocations,
        raised: metrics.raised,
        lowered: metrics.lowered,
        sleeps: metrics.sleeps,
        slept: metrics.slept,
    })
}

/// Admits `rate` writes in any rolling second.
struct Store {
    rate: usize,
    admitted: Mutex<VecDeque<Instant>>,
    ok: AtomicU64,
    throttled: AtomicU64,
}

impl Store {
    fn new(rate: usize) -> Self {
        Self {
            rate,
            admitted: Mutex::new(VecDeque::new()),
            ok: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        }
    }

    fn admit(&self) -> StatusCode {
        let now = Instant::now();
        let mut admitted = self.admitted.lock().expect("never poisoned");
        while admitted
            .front()
            .is_some_and(|&t| now - t >= Duration::from_secs(1))
        {
            admitted.pop_front();
        }
        if admitted.len() < self.rate {
            admitted.push_back(now);
            self.ok.fetch_add(1, Ordering::Relaxed);
            StatusCode::OK
        } else {
            self.throttled.fetch_add(1, Ordering::Relaxed);
            StatusCode::TOO_MANY_REQUESTS
        }
    }

    fn totals(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.throttled.load(Ordering::Relaxed),
        )
    }
}

async fn serve(listener: TcpListener, store: Arc<Store>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let store = store.clone();
        let answer = hyper::service::service_fn(move |request: Request<Incoming>| {
            let store = store.clone();
            async move {
                // Read the record, then store it or not.
                let _ = request.into_body().collect().await;
                let mut response = Response::new(Empty::<Bytes>::new());
                *response.status_mut() = store.admit();
                Ok::<_, Infallible>(response)
            }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), answer),
        );
    }
}
