//! A client that keeps a connection open to a server that goes away and comes
//! back: it backs off while the server is gone, starts again from the first
//! delay when a coordinator says the server is back, and stops when told to.
//!
//! Everything runs here on 127.0.0.1: a line-based TCP server that sends a few
//! ticks, closes the connection and its port, comes back on the same port a
//! moment later and announces it on a `watch` channel (standing in for a
//! coordination service). The example finishes by itself in about a second.
//!
//! ```text
//! cargo run --example reconnect
//! ```

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, Instant};
use tower_backoff::{Delays, Exponential, Jitter};

/// How long the server stays away: long enough for the client's delays to
/// grow past it, so only the coordinator's signal brings the client back early.
const DOWNTIME: Duration = Duration::from_millis(500);
/// Ticks the server sends on each connection before its first outage.
const TICKS_BEFORE_OUTAGE: usize = 3;
/// Ticks the client reads after reconnecting before it is told to stop.
const TICKS_AFTER_RECONNECT: usize = 3;

#[tokio::main]
async fn main() -> io::Result<()> {
    let started = Instant::now();
    for (at, event) in run().await? {
        println!("{:>6.0?} ms  {event}", at.as_secs_f64() * 1e3);
    }
    println!("done in {:?}", started.elapsed());
    Ok(())
}

/// What the client saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Connected, for the `n`-th time.
    Connected(u32),
    /// A line from the server.
    Line(String),
    /// The server closed the connection.
    Disconnected,
    /// Connecting failed; the client sleeps `retry_in` before the next try.
    ConnectFailed {
        /// Why, e.g. `ConnectionRefused`.
        error: io::ErrorKind,
        /// The delay the backoff chose.
        retry_in: Duration,
    },
    /// The coordinator said the server is back: the backoff starts again from
    /// its first delay, and the client tries at once, `slept` into a sleep of
    /// `planned`.
    Reset {
        /// How long the client had slept.
        slept: Duration,
        /// How long it was going to sleep.
        planned: Duration,
    },
    /// The done signal arrived; the client stopped.
    Stopped,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Connected(n) => write!(f, "connected (connection {n})"),
            Event::Line(line) => write!(f, "server says {line:?}"),
            Event::Disconnected => write!(f, "server closed the connection"),
            Event::ConnectFailed { error, retry_in } => {
                write!(f, "connect failed ({error:?}), retrying in {retry_in:.0?}")
            }
            Event::Reset { slept, planned } => write!(
                f,
                "coordinator: server is back; backoff reset after {slept:.0?} of {planned:.0?}"
            ),
            Event::Stopped => write!(f, "done signal: stopped"),
        }
    }
}

/// Runs the whole scenario and returns the client's events with the time since
/// the start.
pub async fn run() -> io::Result<Vec<(Duration, Event)>> {
    let started = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    let (server_back, coordinator) = watch::channel(());
    let (stop, done) = watch::channel(false);
    let (events, mut seen) = mpsc::unbounded_channel();

    let server = tokio::spawn(server(listener, server_back));
    let client = tokio::spawn(client(addr, coordinator, done, events));

    // Let the client ride out one outage, then stop it once it has heard from
    // the server that came back.
    let mut log = Vec::new();
    let mut ticks_after_reconnect = 0;
    while let Some(event) = seen.recv().await {
        if matches!(event, Event::Line(_)) && log.iter().any(|(_, e)| *e == Event::Connected(2)) {
            ticks_after_reconnect += 1;
            if ticks_after_reconnect == TICKS_AFTER_RECONNECT {
                let _ = stop.send(true);
            }
        }
        log.push((started.elapsed(), event));
    }
    client.await?;
    server.abort();
    Ok(log)
}

/// Keeps one connection open and reads lines from it, reconnecting with backoff.
async fn client(
    addr: SocketAddr,
    mut coordinator: watch::Receiver<()>,
    mut done: watch::Receiver<bool>,
    events: mpsc::UnboundedSender<Event>,
) {
    // Jitter::Equal never sleeps less than half the delay, so the example's
    // output reads the same each run; a fleet of clients would use Full.
    let mut delays =
        Delays::new(Exponential::new(Duration::from_millis(40)).max_delay(Duration::from_secs(10)))
            .jitter(Jitter::Equal);
    let mut connections = 0;
    loop {
        let connected = tokio::select! {
            _ = done.wait_for(|done| *done) => break,
            connected = TcpStream::connect(addr) => connected,
        };
        match connected {
            Ok(stream) => {
                // A connection that works ends the outage: the next one starts
                // from the first delay, and news of the server's return that
                // came meanwhile is stale.
                delays.reset();
                coordinator.mark_unchanged();
                connections += 1;
                let _ = events.send(Event::Connected(connections));
                let mut lines = BufReader::new(stream).lines();
                loop {
                    tokio::select! {
                        biased;
                        _ = done.wait_for(|done| *done) => {
                            let _ = events.send(Event::Stopped);
                            return;
                        }
                        line = lines.next_line() => match line {
                            Ok(Some(line)) => { let _ = events.send(Event::Line(line)); }
                            Ok(None) | Err(_) => break,
                        },
                    }
                }
                let _ = events.send(Event::Disconnected);
            }
            Err(error) => {
                // Unlimited: only the done signal ends this loop.
                let Some(delay) = delays.next_delay() else {
                    break;
                };
                let _ = events.send(Event::ConnectFailed {
                    error: error.kind(),
                    retry_in: delay,
                });
                let asleep = Instant::now();
                tokio::select! {
                    // Signals first: news that lands as the sleep ends still counts.
                    biased;
                    _ = done.wait_for(|done| *done) => break,
                    Ok(()) = coordinator.changed() => {
                        delays.reset();
                        let _ = events.send(Event::Reset { slept: asleep.elapsed(), planned: delay });
                    }
                    _ = sleep(delay) => {}
                }
            }
        }
    }
    let _ = events.send(Event::Stopped);
}

/// Serves ticks, goes away (connection and port closed) for [`DOWNTIME`], then
/// comes back on the same port and tells the coordinator.
async fn server(listener: TcpListener, server_back: watch::Sender<()>) -> io::Result<()> {
    let addr = listener.local_addr()?;
    let (mut stream, _) = listener.accept().await?;
    for n in 1..=TICKS_BEFORE_OUTAGE {
        stream.write_all(format!("tick {n}\n").as_bytes()).await?;
        sleep(Duration::from_millis(20)).await;
    }
    drop(stream);
    drop(listener);

    sleep(DOWNTIME).await;
    let socket = TcpSocket::new_v4()?;
    // The old connection's TIME_WAIT must not keep the port from being reused.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(16)?;
    let _ = server_back.send(());

    loop {
        let (mut stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            for n in 1.. {
                let tick = format!("tick {n}\n");
                if stream.write_all(tick.as_bytes()).await.is_err() {
                    break;
                }
                sleep(Duration::from_millis(20)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test --all-features` runs this (the example sets `test = true`):
    /// the example's own scenario, in real time, well under a second or two.
    #[tokio::test]
    async fn reconnects_with_backoff_resets_on_signal_and_stops_when_done() {
        let log = tokio::time::timeout(Duration::from_secs(10), run())
            .await
            .expect("the example finishes by itself")
            .expect("no I/O error");
        let events: Vec<_> = log.iter().map(|(_, e)| e.clone()).collect();

        let first_lost = events
            .iter()
            .position(|e| *e == Event::Disconnected)
            .unwrap();
        let second = events
            .iter()
            .position(|e| *e == Event::Connected(2))
            .unwrap();
        assert_eq!(events[0], Event::Connected(1));
        assert_eq!(events.last(), Some(&Event::Stopped));
        assert!(!events.contains(&Event::Connected(3)), "{events:#?}");

        // While the server was gone: failed connects, each waiting longer.
        let planned: Vec<_> = events[first_lost..second]
            .iter()
            .filter_map(|e| match e {
                Event::ConnectFailed { error, retry_in } => {
                    assert_eq!(*error, io::ErrorKind::ConnectionRefused);
                    Some(*retry_in)
                }
                _ => None,
            })
            .collect();
        assert!(planned.len() >= 3, "{events:#?}");
        assert!(planned.windows(2).all(|w| w[1] >= w[0]), "{planned:?}");
        assert!(planned.last().unwrap() > &planned[0], "{planned:?}");

        // The coordinator's signal ended the last sleep (short of its planned
        // length but for a sleep that ran out in the same instant: the
        // biased select takes the signal even when the task is polled a
        // little after the sleep's end, as it was once on a loaded machine,
        // 261.8 ms into 259.8) and the client connected right after it.
        let Event::Reset { slept, planned } = events[second - 1] else {
            panic!("expected a reset just before reconnecting: {events:#?}");
        };
        const LATE_POLL: Duration = Duration::from_millis(50);
        assert!(slept <= planned + LATE_POLL, "{slept:?} of {planned:?}");

        // Stopped on the done signal, after the ticks of the second connection.
        let after: Vec<_> = events[second..]
            .iter()
            .filter(|e| matches!(e, Event::Line(_)))
            .collect();
        // (One more may slip in if the thread stalls past the next tick.)
        assert!(after.len() >= TICKS_AFTER_RECONNECT, "{events:#?}");
        assert!(log.last().unwrap().0 < Duration::from_secs(5));
    }
}
