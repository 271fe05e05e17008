//! A live price leaderboard over five local "store" servers, kept by a
//! `Poller`.
//!
//! The stores are real hyper servers on 127.0.0.1: one steady, one failing one
//! request in three, one sometimes slower than the per-poll timeout, one down
//! for a while and then back, and one dead for good. The poller polls each
//! through hyper-util's client, quarantines the failing ones, evicts the dead,
//! re-probes the evicted, and the board only ever shows fresh prices.
//!
//! Run it with `cargo run --example price_board`; it stops by itself after
//! about 12 seconds.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower_backoff::poll::{Event, Poller, State};
use tower_backoff::{Exponential, Jitter};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const RUN_FOR: Duration = Duration::from_secs(12);
const POLL_TIMEOUT: Duration = Duration::from_millis(500);

/// How a store answers its `n`-th request (from 0), `since` it started.
#[derive(Clone, Copy)]
enum Behaviour {
    Steady,
    /// Fails one request in three with a 500.
    Flaky,
    /// One request in three takes longer than the poller's timeout.
    Slow,
    /// Answers 503 until `back_after`, then works.
    DownFor(Duration),
}

impl Behaviour {
    async fn answer(self, n: u32, since: Duration, price: u32) -> (StatusCode, String) {
        // Prices drift a little, so the board has something to show.
        let price = price + n % 4 * 7;
        match self {
            Behaviour::Flaky if n % 3 == 2 => (StatusCode::INTERNAL_SERVER_ERROR, String::new()),
            Behaviour::Slow if n % 3 == 2 => {
                tokio::time::sleep(POLL_TIMEOUT * 2).await;
                (StatusCode::OK, price.to_string())
            }
            Behaviour::DownFor(down) if since < down => {
                (StatusCode::SERVICE_UNAVAILABLE, String::new())
            }
            _ => (StatusCode::OK, price.to_string()),
        }
    }
}

/// Starts a store answering GET with its price in cents.
async fn serve(behaviour: Behaviour, price: u32) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let started = Instant::now();
    let requests = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let requests = Arc::clone(&requests);
            let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                let n = requests.fetch_add(1, Ordering::Relaxed);
                async move {
                    let (status, body) = behaviour.answer(n, started.elapsed(), price).await;
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    Ok(addr)
}

/// An address where nothing listens: connections are refused.
async fn dead_store() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    listener.local_addr()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stores = [
        ("steady", serve(Behaviour::Steady, 1999).await?),
        ("flaky", serve(Behaviour::Flaky, 1949).await?),
        ("slow", serve(Behaviour::Slow, 2049).await?),
        (
            "comeback",
            serve(Behaviour::DownFor(Duration::from_secs(6)), 1899).await?,
        ),
        ("dead", dead_store().await?),
    ];
    let uris: HashMap<&'static str, Uri> = stores
        .iter()
        .map(|&(name, addr)| Ok((name, format!("http://{addr}/price").parse()?)))
        .collect::<Result<_, BoxError>>()?;

    let poller = Poller::builder(move |store: &&'static str| {
        Request::get(uris[store].clone())
            .body(Empty::<Bytes>::new())
            .expect("a GET with a parsed URI is a valid request")
    })
    .interval(Duration::from_secs(1))
    .timeout(POLL_TIMEOUT)
    .schedule(Exponential::new(Duration::from_millis(500)).max_delay(Duration::from_secs(4)))
    // Never less than half the schedule's delay, so a retry is never instant.
    .jitter(Jitter::Equal)
    .seed(7)
    .max_failures(3)
    .reprobe_after(Duration::from_secs(4))
    .rank_by(|cents: &u32| *cents)
    .build()?;

    let started = Instant::now();
    let mut events = poller.subscribe();
    let log = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            let at = started.elapsed().as_secs_f32();
            match event {
                Event::Polled {
                    key,
                    outcome: Err(failure),
                    ..
                } => println!("{at:5.1}s  {key:<8} poll failed: {failure}"),
                Event::Quarantined { key, failures, next_poll } => println!(
                    "{at:5.1}s  {key:<8} quarantined after {failures} failure(s), next poll in {:.1}s",
                    (next_poll - Instant::now()).as_secs_f32()
                ),
                Event::Recovered { key, failures } => {
                    println!("{at:5.1}s  {key:<8} recovered after {failures} failure(s)")
                }
                Event::Evicted { key, failures, .. } => {
                    println!("{at:5.1}s  {key:<8} evicted after {failures} failures")
                }
                _ => {}
            }
        }
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for (name, _) in stores {
        let client = client.clone();
        let price = tower::service_fn(move |request: Request<Empty<Bytes>>| {
            let client = client.clone();
            async move {
                let response = client.request(request).await?;
                let status = response.status();
                if !status.is_success() {
                    return Err::<u32, BoxError>(format!("HTTP {status}").into());
                }
                let body = response.into_body().collect().await?.to_bytes();
                Ok(std::str::from_utf8(&body)?.trim().parse()?)
            }
        });
        poller.add(name, price);
    }

    let mut tick = tokio::time::interval(Duration::from_millis(1500));
    tick.tick().await;
    while started.elapsed() < RUN_FOR {
        tick.tick().await;
        print_board(&poller.board(), started.elapsed());
    }

    poller.shutdown().await;
    // The event stream closes once every poll has stopped.
    log.await?;
    println!("done in {:.1}s", started.elapsed().as_secs_f32());
    Ok(())
}

fn print_board(board: &tower_backoff::poll::Board<&'static str, u32>, at: Duration) {
    println!("{:5.1}s  ---- leaderboard ----", at.as_secs_f32());
    for (rank, leader) in board.leaders().iter().enumerate() {
        let cents = *leader.value();
        println!(
            "        {}. {:<8} ${}.{:02}",
            rank + 1,
            leader.key(),
            cents / 100,
            cents % 100
        );
    }
    for (key, state) in board.providers() {
        let note = match state {
            State::Healthy { .. } => continue,
            State::Pending => "waiting for its first answer".to_string(),
            State::Quarantined { failures, .. } => {
                format!("quarantined, {failures} failed poll(s)")
            }
            State::Evicted {
                reprobe_at: Some(at),
                ..
            } => format!(
                "evicted, re-probe in {:.1}s",
                at.saturating_duration_since(Instant::now()).as_secs_f32()
            ),
            State::Evicted { .. } => "evicted".to_string(),
            other => format!("{other:?}"),
        };
        println!("           {key:<8} {note}");
    }
}
