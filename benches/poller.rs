//! Polls per second and heap allocations per poll of a `Poller` keeping 1,000
//! providers (`String` keys, in-memory services answering at once), on tokio's
//! paused clock so that only the poller's own work is timed.
//!
//! One round is one poll of every provider (one healthy interval of the paused
//! clock). Scenarios: nobody reads the board; the board is read once per round
//! and dropped at once; read once per round and held until the next read (a
//! reader always showing the latest board); ranked by values that change every
//! poll, read and held; and polls spread over the interval (one provider per
//! millisecond) with the board read every 10 ms and held, so 100 reads a round
//! with 10 polls between reads.
//!
//! `cargo bench --bench poller -- --warm-up-time 1 --measurement-time 3`
//! (criterion; its throughput in elements/s is polls per second), and
//! `cargo bench --bench poller -- --table` (polls per second and allocations
//! per poll, counted over 200 rounds), and `benches/poller_callgrind.sh`
//! (instructions per poll, with `-- --run <scenario> <rounds>`).

mod common;

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use tower::service_fn;
use tower_backoff::poll::Poller;

use common::{allocations, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const PROVIDERS: u64 = 1_000;
const INTERVAL: Duration = Duration::from_secs(1);
const TABLE_ROUNDS: u64 = 200;

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    Unread,
    Read,
    ReadAndHeld,
    RankedReadAndHeld,
    SpreadReadOften,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::Unread,
        Scenario::Read,
        Scenario::ReadAndHeld,
        Scenario::RankedReadAndHeld,
        Scenario::SpreadReadOften,
    ];

    fn slug(self) -> &'static str {
        match self {
            Scenario::Unread => "unread",
            Scenario::Read => "read",
            Scenario::ReadAndHeld => "held",
            Scenario::RankedReadAndHeld => "ranked",
            Scenario::SpreadReadOften => "spread",
        }
    }

    /// Board reads per round.
    fn reads(self) -> u32 {
        match self {
            Scenario::SpreadReadOften => 100,
            _ => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Unread => "board unread",
            Scenario::Read => "board read every round",
            Scenario::ReadAndHeld => "board read every round and held",
            Scenario::RankedReadAndHeld => "ranked, values change, board read and held",
            Scenario::SpreadReadOften => "polls spread, board read every 10 ms and held",
        }
    }
}

/// A poller over [`PROVIDERS`] providers, each counting its calls in `polls`,
/// polled once at the current (paused) instant already.
struct Running {
    poller: Poller<String, (), u64, Infallible>,
    polls: Arc<AtomicU64>,
    scenario: Scenario,
}

impl Running {
    async fn start(scenario: Scenario) -> Self {
        let mut builder = Poller::builder(|_: &String| ()).interval(INTERVAL);
        if scenario == Scenario::RankedReadAndHeld {
            builder = builder.rank_by(|value: &u64| *value);
        }
        let poller = builder.build().expect("a valid poller");
        let polls = Arc::new(AtomicU64::new(0));
        for provider in 0..PROVIDERS {
            let polls = Arc::clone(&polls);
            let mut calls = 0_u64;
            let service = service_fn(move |()| {
                polls.fetch_add(1, Ordering::Relaxed);
                calls += 1;
                // Moves every provider's rank a little on every poll.
                let value = (provider * 7 + calls * 13) % 997;
                std::future::ready(Ok::<u64, Infallible>(value))
            });
            poller.add(format!("provider-{provider:04}"), service);
            if scenario == Scenario::SpreadReadOften {
                tokio::time::sleep(INTERVAL / PROVIDERS as u32).await;
            }
        }
        let running = Self {
            poller,
            polls,
            scenario,
        };
        // The first polls, and every task's first sleep, are set-up.
        running.rounds(1).await;
        running
    }

    async fn rounds(&self, rounds: u64) {
        let mut held = None;
        let reads = self.scenario.reads();
        for _ in 0..rounds * u64::from(reads) {
            tokio::time::sleep(INTERVAL / reads).await;
            if self.scenario == Scenario::Unread {
                continue;
            }
            let board = self.poller.board();
            black_box(board.leaders().first().map(|leader| *leader.value()));
            if self.scenario != Scenario::Read {
                held = Some(board);
            }
        }
        drop(held);
    }

    fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
}

fn criterion_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("poller, 1,000 providers");
    // One iteration is one round: one poll of every provider.
    group.throughput(Throughput::Elements(PROVIDERS));
    for scenario in Scenario::ALL {
        group.bench_function(scenario.name(), |b| {
            b.iter_custom(|rounds| {
                runtime().block_on(async {
                    let running = Running::start(scenario).await;
                    let started = std::time::Instant::now();
                    running.rounds(rounds).await;
                    let took = started.elapsed();
                    running.poller.shutdown().await;
                    took
                })
            })
        });
    }
    group.finish();
}

/// Polls per second and allocations per poll, counted over [`TABLE_ROUNDS`]
/// rounds after set-up.
fn table() {
    println!("scenario\tpolls\tpolls/s\tallocations/poll");
    for scenario in Scenario::ALL {
        runtime().block_on(async {
            let running = Running::start(scenario).await;
            let polls_before = running.polls();
            let allocations_before = allocations();
            let started = std::time::Instant::now();
            running.rounds(TABLE_ROUNDS).await;
            let took = started.elapsed();
            let allocations = allocations() - allocations_before;
            let polls = running.polls() - polls_before;
            println!(
                "{}\t{polls}\t{:.0}\t{:.3}",
                scenario.name(),
                polls as f64 / took.as_secs_f64(),
                allocations as f64 / polls as f64,
            );
            running.poller.shutdown().await;
        });
    }
}

/// Runs `rounds` rounds of one scenario after set-up, for callgrind:
/// instructions per poll are the difference between two round counts,
/// divided by the polls between them.
fn run(slug: &str, rounds: &str) {
    let scenario = Scenario::ALL
        .into_iter()
        .find(|scenario| scenario.slug() == slug)
        .expect("unread, read, held, ranked or spread");
    let rounds = rounds.parse().expect("a number of rounds");
    runtime().block_on(async {
        let running = Running::start(scenario).await;
        running.rounds(rounds).await;
        running.poller.shutdown().await;
    });
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    match args.as_slice() {
        [flag] if flag == "--table" => return table(),
        [flag, slug, rounds] if flag == "--run" => return run(slug, rounds),
        _ => {}
    }
    let mut criterion = Criterion::default().configure_from_args();
    criterion_benches(&mut criterion);
    criterion.final_summary();
}
