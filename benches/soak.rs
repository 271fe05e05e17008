//! The layer under sustained load (issue 28): a million requests on a
//! multi-threaded runtime, with random failures, retries, futures dropped
//! mid-flight, and every worker thread contending on one budget. It checks,
//! and exits non-zero unless:
//! - every call resolves: requests sent = completed + dropped;
//! - the budget's accounts balance: every retry sent was granted by the
//!   budget once, and every success was reported to it once;
//! - memory stays flat after warm-up: resident size at 10% and at 100% of
//!   the run within 8 MiB of each other.
//!
//! It prints those figures and the latency per call (p50, p99) through the
//! layer and through the bare service, measured in the same run.
//!
//! `cargo bench --bench soak -- [requests] [threads]` (default 1,000,000
//! requests on 4 threads). Not part of the test run: it takes a while.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::{Service, ServiceExt};
use tower_backoff::budget::{Budget, TokenBucket};
use tower_backoff::{BackoffLayer, Cause, Constant, Stats};

/// Concurrent callers, each sending its share of the requests in a loop.
const CALLERS: u64 = 64;
/// One call in this many fails.
const FAIL_ONE_IN: u64 = 5;
/// One call in this many is pending once before it answers.
const PENDING_ONE_IN: u64 = 3;
/// One request in this many is dropped after its first poll.
const DROP_ONE_IN: u64 = 20;

/// A cheap, well-mixed number from a counter (SplitMix64).
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The service under the layer: fails one call in [`FAIL_ONE_IN`], and
/// is pending once on one in [`PENDING_ONE_IN`], so a dropped future is
/// often dropped mid-flight.
#[derive(Clone)]
struct Backend {
    calls: Arc<AtomicU64>,
}

impl Service<u64> for Backend {
    type Response = u64;
    type Error = u64;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), u64>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Answer {
        let n = mix(self.calls.fetch_add(1, Ordering::Relaxed));
        Answer {
            outcome: if n.is_multiple_of(FAIL_ONE_IN) {
                Err(request)
            } else {
                Ok(request)
            },
            pending: (n >> 32).is_multiple_of(PENDING_ONE_IN),
        }
    }
}

struct Answer {
    outcome: Result<u64, u64>,
    pending: bool,
}

impl Future for Answer {
    type Output = Result<u64, u64>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if std::mem::take(&mut self.pending) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.outcome)
    }
}

/// The shared token bucket, with every grant and every success report
/// counted, to check the accounts at the end.
struct Audited {
    bucket: TokenBucket,
    granted: AtomicU64,
    refused: AtomicU64,
    successes: AtomicU64,
}

impl Budget for Audited {
    fn on_first_attempt(&self) {
        self.bucket.on_first_attempt();
    }

    fn would_allow(&self, cause: Cause) -> bool {
        self.bucket.would_allow(cause)
    }

    fn try_retry(&self, cause: Cause) -> bool {
        let granted = self.bucket.try_retry(cause);
        let tally = if granted {
            &self.granted
        } else {
            &self.refused
        };
        tally.fetch_add(1, Ordering::Relaxed);
        granted
    }

    fn on_success(&self, last_retry: Option<Cause>) {
        self.successes.fetch_add(1, Ordering::Relaxed);
        self.bucket.on_success(last_retry);
    }
}

/// Resident set size, in bytes (Linux).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// What the callers saw.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    completed: AtomicU64,
    dropped: AtomicU64,
}

/// Sends `requests` through `svc` from [`CALLERS`] tasks; returns each
/// completed call's latency in ns. Calls `at_tenth` once a tenth are sent.
async fn drive<S>(
    svc: S,
    requests: u64,
    tally: Arc<Tally>,
    at_tenth: impl Fn() + Send + Sync + 'static,
) -> Vec<u32>
where
    S: Service<u64, Response = u64, Error = u64> + Clone + Send + 'static,
    S::Future: Send,
{
    let at_tenth = Arc::new(at_tenth);
    let share = requests / CALLERS;
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let mut svc = svc.clone();
        let tally = Arc::clone(&tally);
        let at_tenth = Arc::clone(&at_tenth);
        callers.push(tokio::spawn(async move {
            // Written up front, so its pages are resident before the 10%
            // reading: the run's own growth is then the layer's.
            let mut latencies = vec![u32::MAX; share as usize];
            let mut kept = 0;
            for i in 0..share {
                let id = caller * share + i;
                if caller == 0 && i == share / 10 {
                    at_tenth();
                }
                tally.sent.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                let ready = svc.ready().await.expect("always ready");
                let mut call = pin!(ready.call(id));
                if mix(!id).is_multiple_of(DROP_ONE_IN) {
                    // Polled once, then dropped: mid-flight if it was pending.
                    let _ = futures::poll!(call.as_mut());
                    tally.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let _ = call.await;
                latencies[kept] = u32::try_from(started.elapsed().as_nanos()).unwrap_or(u32::MAX);
                kept += 1;
                tally.completed.fetch_add(1, Ordering::Relaxed);
            }
            latencies.truncate(kept);
            latencies
        }));
    }
    let mut all = Vec::new();
    for caller in callers {
        all.extend(caller.await.expect("a caller panicked"));
    }
    all
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(at).copied().unwrap_or(0)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .filter_map(|a| a.replace('_', "").parse().ok())
        .collect();
    let requests = args.first().copied().unwrap_or(1_000_000);
    let threads = args.get(1).copied().unwrap_or(4) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();

    let budget = Arc::new(Audited {
        bucket: TokenBucket::default(),
        granted: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        successes: AtomicU64::new(0),
    });
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .budget(Arc::clone(&budget))
        .stats(stats.clone())
        .build()
        .expect("valid settings");
    let backend = Backend {
        calls: Arc::new(AtomicU64::new(0)),
    };

    let tally = Arc::new(Tally::default());
    let at_tenth = Arc::new(AtomicU64::new(0));
    let noted = Arc::clone(&at_tenth);
    let started = Instant::now();
    let mut through_layer = runtime.block_on(drive(
        tower::Layer::layer(&layer, backend.clone()),
        requests,
        Arc::clone(&tally),
        move || noted.store(resident(), Ordering::Relaxed),
    ));
    let took = started.elapsed();
    let at_end = resident();

    let bare_tally = Arc::new(Tally::default());
    let mut bare = runtime.block_on(drive(backend, requests, bare_tally, || {}));

    through_layer.sort_unstable();
    bare.sort_unstable();
    let seen = stats.snapshot();
    let sent = tally.sent.load(Ordering::Relaxed);
    let completed = tally.completed.load(Ordering::Relaxed);
    let dropped = tally.dropped.load(Ordering::Relaxed);
    let granted = budget.granted.load(Ordering::Relaxed);
    let refused = budget.refused.load(Ordering::Relaxed);
    let successes = budget.successes.load(Ordering::Relaxed);
    let tenth = at_tenth.load(Ordering::Relaxed);

    println!("requests {sent} on {threads} threads, {CALLERS} callers, in {took:.2?}");
    println!("completed {completed}, dropped mid-flight {dropped}");
    println!(
        "retries sent {} (budget grants {granted}, refusals {refused}), successes {} (budget told {successes}), budget left {} of {}",
        seen.retries,
        seen.successes,
        budget.bucket.available(),
        budget.bucket.capacity()
    );
    println!(
        "resident at 10%: {:.1} MiB, at 100%: {:.1} MiB",
        tenth as f64 / 1048576.0,
        at_end as f64 / 1048576.0
    );
    println!(
        "latency through the layer: p50 {} ns, p99 {} ns; bare: p50 {} ns, p99 {} ns",
        percentile(&through_layer, 0.5),
        percentile(&through_layer, 0.99),
        percentile(&bare, 0.5),
        percentile(&bare, 0.99)
    );

    let mut failed = Vec::new();
    if sent != completed + dropped || sent != requests / CALLERS * CALLERS {
        failed.push("not every call resolved");
    }
    if granted != seen.retries {
        failed.push("retries sent differ from the budget's grants");
    }
    if successes != seen.successes {
        failed.push("successes differ from the budget's success reports");
    }
    if at_end.abs_diff(tenth) > 8 * 1024 * 1024 {
        failed.push("resident size grew more than 8 MiB after warm-up");
    }
    if failed.is_empty() {
        println!("ok");
    } else {
        eprintln!("FAILED: {}", failed.join("; "));
        std::process::exit(1);
    }
}
