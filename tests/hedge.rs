//! Hedging in the layer, on tokio's paused clock: a copy of an attempt still
//! pending after the delay, the first acceptable outcome wins and the other
//! copies are dropped, a failed copy brings the next hedge at once, and
//! hedges obey the attempt limit, the budget, the per-second load cap and
//! the policy. The tail-latency tables are in `tests/sim_hedge.rs`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::events::{Event, HedgeEvent, Observer};
use tower_backoff::{
    BackoffLayer, ConfigError, Constant, Decision, Hedging, Jitter, Policy, Stats, TokenBucket,
};

const DELAY: Duration = Duration::from_millis(10);
/// What a call the script does not cover takes: long enough to be pending
/// at its first poll, short of the hedging delay.
const WAITED: Duration = Duration::from_millis(1);

/// What each call of the host does, in the order of the calls: answer `Ok`
/// or fail after a latency. Calls beyond the script answer `Ok` at once.
#[derive(Clone, Default)]
struct Host {
    script: Arc<Mutex<VecDeque<(Duration, bool)>>>,
    calls: Arc<AtomicU32>,
    /// Calls dropped before they answered: the server saw them cancelled.
    cancelled: Arc<AtomicU32>,
}

struct Cancelled(Arc<AtomicU32>, bool);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Host {
    fn script(steps: &[(u64, bool)]) -> Self {
        watchdog();
        let host = Self::default();
        host.script.lock().unwrap().extend(
            steps
                .iter()
                .map(|&(ms, ok)| (Duration::from_millis(ms), ok)),
        );
        host
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> u32 {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<u32, Response = u32, Error = io::Error, Future = impl Send> + Clone {
        let host = self.clone();
        service_fn(move |n: u32| {
            let call = host.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let (latency, ok) = host
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or((WAITED, true));
            let cancelled = host.cancelled.clone();
            async move {
                let mut guard = Cancelled(cancelled, false);
                tokio::time::sleep(latency).await;
                guard.1 = true;
                if ok {
                    Ok(n * 100 + call)
                } else {
                    Err(io::Error::other(format!("call {call} failed")))
                }
            }
        })
    }
}

/// How long one test may run, in real time, before the watchdog fails the
/// binary. Its tests take milliseconds on the paused clock; a minute leaves
/// room for a loaded CI machine, and is still under `.ci/mutants.sh`'s default
/// timeout of 120 s, so that a mutant that spins fails rather than times out.
const WATCHDOG: Duration = Duration::from_secs(60);

thread_local! {
    /// Lives as long as the thread of the test that started a watchdog:
    /// libtest runs each test on a thread of its own, so the watchdog knows
    /// the test has ended when this is gone.
    static RUNNING: Arc<()> = Arc::new(());
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

/// Fails the whole binary once the test that calls this has run for
/// `WATCHDOG`: a hedged attempt whose poll never returns (its state machine
/// going round without end) would hang the test in that poll, where no
/// timeout of tokio's can reach it, and with it the binary, instead of
/// failing. Per test, not per binary: these tests share their binary with
/// the rest of the suite, which runs for minutes. Started by the first host
/// a test makes.
fn watchdog() {
    if WATCHED.with(|watched| watched.replace(true)) {
        return;
    }
    let running = RUNNING.with(Arc::downgrade);
    std::thread::spawn(move || {
        std::thread::sleep(WATCHDOG);
        if running.upgrade().is_none() {
            return;
        }
        // Not `eprintln!`: the test that started this thread would
        // capture it, and its output is lost with the process.
        let _ = writeln!(
            std::io::stderr(),
            "tests/hedge.rs: a test still running after {WATCHDOG:?}: a poll that never returns?"
        );
        std::process::exit(101);
    });
}

/// Polls `attempt` once, which must leave it pending: what goes out at the
/// first poll has gone out when this returns.
async fn poll_once_pending<F: std::future::Future>(mut attempt: std::pin::Pin<&mut F>) {
    std::future::poll_fn(|cx| {
        assert!(attempt.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
}

/// The hedge events a layer emitted, in order.
#[derive(Clone, Default)]
struct Hedges(Arc<Mutex<Vec<(u32, HedgeEvent)>>>);

impl Observer for Hedges {
    fn on_event(&self, event: &Event) {
        if let Event::Hedge(hedge) = event {
            self.0
                .lock()
                .unwrap()
                .push((hedge.attempt(), hedge.event()));
        }
    }
}

impl Hedges {
    fn seen(&self) -> Vec<(u32, HedgeEvent)> {
        self.0.lock().unwrap().clone()
    }
}

fn layer(
    hedging: Hedging,
    stats: &Stats,
    hedges: &Hedges,
) -> Result<BackoffLayer<tower_backoff::RetryOnError>, ConfigError> {
    builder(stats, hedges).hedge(hedging).build()
}

/// `layer`'s settings, with 30 ms for each attempt and hedges after `DELAY`.
fn timed_layer(
    stats: &Stats,
    hedges: &Hedges,
) -> BackoffLayer<tower_backoff::RetryOnError, tower_backoff::deadline::Guarded> {
    builder(stats, hedges)
        .attempt_timeout(Duration::from_millis(30))
        .hedge(Hedging::after(DELAY))
        .build()
        .unwrap()
}

/// A constant 100 ms between attempts, no jitter, a token bucket, and
/// `stats` and `hedges` told of everything.
fn builder(stats: &Stats, hedges: &Hedges) -> tower_backoff::BackoffBuilder {
    BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .budget(TokenBucket::new())
        .stats(stats.clone())
        .observer(hedges.clone())
}

/// Calls `svc` `count` times with quick requests: the traffic the load cap
/// grants hedges from. Each waits (the script's 1 ms, or `WAITED` once the
/// script is out): an answer ready at the first poll is not counted.
async fn warm_up<S>(svc: &mut S, count: u32)
where
    S: Service<u32, Response = u32>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..count {
        svc.ready().await.unwrap().call(0).await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(100)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_is_hedged_and_the_first_answer_wins() {
    // 10 quick calls, then one that takes a second, then its hedge.
    let mut steps = vec![(1, true); 10];
    steps.extend([(1_000, true), (5, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;

    let start = Instant::now();
    let answer = svc.ready().await.unwrap().call(7).await.unwrap();
    // The hedge (call 12) answered 10 + 5 ms after the call.
    assert_eq!(answer, 712);
    assert_eq!(start.elapsed(), DELAY + Duration::from_millis(5));
    assert_eq!(host.calls(), 12);
    // The slow first copy was dropped: the host saw it cancelled.
    assert_eq!(host.cancelled(), 1);
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (2, HedgeEvent::Won)
        ]
    );
    let seen = stats.snapshot();
    assert_eq!((seen.requests, seen.attempts, seen.retries), (11, 12, 0));
    assert_eq!(
        (seen.hedges, seen.hedges_won, seen.hedges_cancelled),
        (1, 1, 1)
    );
    assert_eq!(seen.successes, 11);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_that_answers_before_the_delay_sends_no_hedge() {
    let host = Host::script(&[(9, true)]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    // Calls 1 to 10 were the warm-up's (the script's one step went to the
    // first of them); this one answers at once.
    assert_eq!(svc.ready().await.unwrap().call(3).await.unwrap(), 311);
    assert_eq!((host.calls(), host.cancelled()), (11, 0));
    assert!(hedges.seen().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_attempt_that_answers_at_its_first_poll_is_neither_hedged_nor_counted() {
    // Ten calls ready at their first poll give the load cap no traffic to
    // grant a hedge from: the slow call after them gets none.
    let mut steps = vec![(0, true); 10];
    steps.push((1_000, true));
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(7).await.unwrap(), 711);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(host.calls(), 11);
    assert!(hedges.seen().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_cancels_a_first_copy_hedged_from_its_first_poll() {
    // The first copy and its hedge both outlast the attempt's 30 ms: both
    // are dropped then, and the retry, 100 ms later, answers in 5 ms.
    let mut steps = vec![(1, true); 10];
    steps.extend([(1_000, true), (1_000, true), (5, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = timed_layer(&stats, &hedges).layer(host.service());
    warm_up(&mut svc, 10).await;
    let start = Instant::now();
    let mut call = std::pin::pin!(svc.ready().await.unwrap().call(7));
    // Both are dropped when the time is up, not when the request ends: at
    // 50 ms the retry is asleep and neither copy is held.
    let asleep = tokio::time::timeout(Duration::from_millis(50), call.as_mut()).await;
    assert!(asleep.is_err(), "the retry answers at 135 ms");
    assert_eq!(host.cancelled(), 2);
    let answer = call.await.unwrap();
    assert_eq!(answer, 713);
    assert_eq!(start.elapsed(), Duration::from_millis(30 + 100 + 5));
    assert_eq!((host.calls(), host.cancelled()), (13, 2));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (2, HedgeEvent::Cancelled)
        ]
    );
    let seen = stats.snapshot();
    assert_eq!((seen.attempts, seen.retries, seen.hedges), (13, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_still_holds_a_hedge_once_a_first_copy_hedged_from_its_first_poll_failed(
) {
    // The first copy fails at 15 ms, after its hedge went out at 10 ms (the
    // load cap grants no second hedge). The hedge outlasts the attempt's
    // 30 ms, which still holds for it although the copy beside the timer is
    // gone: it is dropped at 30 ms, and the retry, 100 ms later, answers in
    // 5 ms. Had the timer gone with the first copy, the hedge would have
    // answered at 1,010 ms.
    let mut steps = vec![(1, true); 10];
    steps.extend([(15, false), (1_000, true), (5, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = timed_layer(&stats, &hedges).layer(host.service());
    warm_up(&mut svc, 10).await;
    let start = Instant::now();
    let answer = svc.ready().await.unwrap().call(7).await.unwrap();
    assert_eq!(answer, 713);
    assert_eq!(start.elapsed(), Duration::from_millis(30 + 100 + 5));
    assert_eq!((host.calls(), host.cancelled()), (13, 1));
    assert_eq!(
        hedges.seen(),
        [(2, HedgeEvent::Sent), (2, HedgeEvent::Cancelled)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_copy_sends_the_next_hedge_at_once() {
    // Three copies at most: the first is slow, the first hedge fails after
    // 2 ms, the second hedge goes out then, not after another delay.
    let mut steps = vec![(1, true); 10];
    steps.extend([(1_000, true), (2, false), (4, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let hedging = Hedging::after(DELAY).max_copies(3).max_extra_load(1.0);
    let mut svc = layer(hedging, &stats, &hedges)
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;

    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 113);
    assert_eq!(start.elapsed(), DELAY + Duration::from_millis(2 + 4));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (3, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (3, HedgeEvent::Won)
        ]
    );
    assert_eq!(stats.snapshot().retries, 0);
}

#[tokio::test(start_paused = true)]
async fn when_every_copy_fails_the_attempt_is_retried_and_hedged_again() {
    let mut steps = vec![(1, true); 10];
    // Attempt 1 and its hedge fail together; the retry is slow and its
    // hedge wins.
    steps.extend([(20, false), (10, false), (1_000, true), (1, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        // Two copies of two attempts: every one counts.
        .max_attempts(4)
        .budget(TokenBucket::new())
        .stats(stats.clone())
        .observer(hedges.clone())
        .hedge(Hedging::after(DELAY).max_extra_load(1.0))
        .build()
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;

    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(2).await.unwrap(), 214);
    // Both copies fail at 20 ms; the retry goes out 100 ms later, its hedge
    // 10 ms after it and answers in 1 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(20 + 100 + 10 + 1));
    let seen = stats.snapshot();
    assert_eq!((seen.attempts - 10, seen.retries, seen.hedges), (4, 1, 2));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (4, HedgeEvent::Sent),
            (3, HedgeEvent::Cancelled),
            (4, HedgeEvent::Won)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_delay_sends_every_copy_at_once() {
    // Two copies of the first request a layer sees: a cap of `1.0` allows
    // one hedge per request of the second, and when every request hedges at
    // once no second has room for more.
    let host = Host::script(&[(30, true), (10, true)]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let hedging = Hedging::after(Duration::ZERO)
        .max_copies(2)
        .max_extra_load(1.0);
    let mut svc = layer(hedging, &stats, &hedges)
        .unwrap()
        .layer(host.service());
    // Between two of the timer's millisecond ticks, where a zero sleep would
    // wait for the next one.
    tokio::time::advance(Duration::from_micros(500)).await;
    let start = Instant::now();
    let mut attempt = std::pin::pin!(svc.ready().await.unwrap().call(0));
    // Both go out in the first poll: none waits for a timer.
    poll_once_pending(attempt.as_mut()).await;
    assert_eq!(host.calls(), 2, "every copy at the first poll");
    assert_eq!(attempt.await.unwrap(), 2);
    // The second copy's 10 ms, ending on the timer's next tick.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(10) && took <= Duration::from_millis(11),
        "{took:?}"
    );
    assert_eq!((host.calls(), host.cancelled()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn hedges_count_against_the_attempt_limit() {
    let mut steps = vec![(1, true); 10];
    steps.extend([(50, false), (50, false)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = BackoffLayer::builder()
        .max_attempts(2)
        .stats(stats.clone())
        .observer(hedges.clone())
        .hedge(Hedging::after(DELAY).max_copies(5).max_extra_load(1.0))
        .build()
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    let error = svc.ready().await.unwrap().call(0).await.unwrap_err();
    // The hedge's failure, the last, is returned; no third attempt.
    assert_eq!(error.to_string(), "call 12 failed");
    assert_eq!(host.calls(), 12);
    assert_eq!(stats.snapshot().gave_up_attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_without_traffic_to_grant_it() {
    // The load cap grants 10 % of the last second's requests: one request
    // alone gets no hedge.
    let host = Host::script(&[(1_000, true)]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 101);
    assert_eq!(host.calls(), 1);
    assert!(hedges.seen().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_load_cap_holds_when_every_attempt_is_slow() {
    // Everything slows down: 100 requests at once, each slower than the
    // delay, 100 ms after 100 quick ones. At 10 % of the 200 requests of
    // the second that ends at the hedges, 20 get one.
    let host = Host::script(&[]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 100).await;
    host.script
        .lock()
        .unwrap()
        .extend((0..200).map(|_| (Duration::from_millis(50), true)));
    let calls = (0..100).map(|n| svc.clone().oneshot(n));
    let answers = futures::future::join_all(calls).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(stats.snapshot().hedges, 20);
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_sends_no_hedge() {
    let mut steps = vec![(1, true); 10];
    steps.push((1_000, true));
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = BackoffLayer::builder()
        .budget(
            TokenBucket::builder()
                .initial_tokens(0)
                .success_refund(0)
                .build()
                .unwrap(),
        )
        .stats(stats.clone())
        .observer(hedges.clone())
        .hedge(Hedging::after(DELAY))
        .build()
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    let start = Instant::now();
    svc.ready().await.unwrap().call(0).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(stats.snapshot().hedges, 0);
}

#[tokio::test(start_paused = true)]
async fn a_percentile_delay_hedges_only_past_its_percentile() {
    // A second of attempts at 10 ms (15 % of them at 30 ms) sets the 90th
    // percentile; then an attempt of 1 s is hedged at about 30 ms, one of
    // 20 ms is not.
    let host = Host::script(&[]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let hedging = Hedging::at_percentile(90.0).window(Duration::from_secs(1), 100);
    let mut svc = layer(hedging, &stats, &hedges)
        .unwrap()
        .layer(host.service());
    let steps = (0..200).map(|n| {
        (
            Duration::from_millis(if n % 20 < 3 { 30 } else { 10 }),
            true,
        )
    });
    host.script.lock().unwrap().extend(steps);
    for _ in 0..200 {
        svc.ready().await.unwrap().call(0).await.unwrap();
    }
    assert!(hedges.seen().is_empty(), "no hedge before a window");
    host.script.lock().unwrap().extend([
        (Duration::from_millis(20), true),
        (Duration::from_secs(1), true),
        (Duration::from_millis(1), true),
    ]);
    svc.ready().await.unwrap().call(0).await.unwrap();
    assert!(
        hedges.seen().is_empty(),
        "20 ms is within the 90th percentile"
    );
    let start = Instant::now();
    svc.ready().await.unwrap().call(0).await.unwrap();
    let took = start.elapsed();
    assert!(
        took > Duration::from_millis(10) && took < Duration::from_millis(33),
        "{took:?}"
    );
    assert_eq!(stats.snapshot().hedges_won, 1);
}

#[test]
fn invalid_hedging_fails_at_build_naming_the_field() {
    let error = BackoffLayer::builder()
        .hedge(Hedging::at_percentile(120.0))
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "hedge.percentile");
}

#[test]
fn a_hedged_future_is_made_outside_a_runtime_and_polled_inside_one() {
    // Made in plain code (no runtime): no timer may be made yet.
    let host = Host::script(&[(5, true)]);
    let mut svc = BackoffLayer::builder()
        .hedge(Hedging::after(DELAY))
        .build()
        .unwrap()
        .layer(host.service());
    futures::executor::block_on(svc.ready()).unwrap();
    let future = svc.call(4);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    assert_eq!(runtime.block_on(future).unwrap(), 401);
}

/// A layer that hedges and has a circuit breaker: its open breaker rejects a
/// request at once with the breaker's own error, as without hedging, and
/// calls nothing.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_rejects_a_hedging_layers_request_with_its_own_error() {
    use tower_backoff::breaker::{BreakerState, CircuitBreaker};
    let breaker = CircuitBreaker::builder().min_throughput(2).build().unwrap();
    for _ in 0..2 {
        breaker.record(true);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let host = Host::script(&[]);
    let svc = BackoffLayer::builder()
        .hedge(Hedging::after(DELAY))
        .circuit_breaker(breaker)
        .build()
        .unwrap()
        .layer(host.service());
    let error = svc.oneshot(7).await.unwrap_err();
    assert!(error.is_breaker_open(), "{error}");
    assert_eq!(host.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_load_cap_counts_a_request_once_not_once_an_attempt() {
    // One request: its first attempt fails, its retry is slow. At a cap of
    // half the requests, its one request grants no hedge; counted again for
    // its retry, it would grant one.
    let host = Host::script(&[(1, false), (1_000, true), (5, true)]);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = layer(Hedging::after(DELAY).max_extra_load(0.5), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 102);
    assert_eq!(host.calls(), 2);
    assert!(hedges.seen().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_request_tracked_from_its_call_counts_towards_the_load_cap() {
    // With a deadline, a request is tracked from its call, and its hedging
    // starts from there rather than from its first poll: its first attempt
    // counts as a request all the same.
    let mut steps = vec![(1, true); 10];
    steps.extend([(1_000, true), (5, true)]);
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let mut svc = builder(&stats, &hedges)
        .max_elapsed(Duration::from_secs(10))
        .hedge(Hedging::after(DELAY))
        .build()
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    assert_eq!(svc.ready().await.unwrap().call(7).await.unwrap(), 712);
    assert_eq!(stats.snapshot().hedges, 1);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_cap_turned_away_goes_out_once_later_requests_make_room() {
    // The first request a layer sees has no room for a hedge (10 % of one
    // request is none); nine quick ones that come while it is pending make
    // room for one, and its hedge goes out then instead of never.
    let mut steps = vec![(1_000, true)];
    steps.extend([(1, true); 9]);
    steps.push((5, true));
    let host = Host::script(&steps);
    let (stats, hedges) = (Stats::new(), Hedges::default());
    let svc = layer(Hedging::after(DELAY), &stats, &hedges)
        .unwrap()
        .layer(host.service());
    let start = Instant::now();
    let slow = tokio::spawn(svc.clone().oneshot(0));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(stats.snapshot().hedges, 0, "no room yet");
    for n in 1..10 {
        svc.clone().oneshot(n).await.unwrap();
    }
    assert_eq!(slow.await.unwrap().unwrap(), 11);
    assert_eq!(stats.snapshot().hedges, 1);
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

// --- copies that end the request, server-named delays, copies the request runs out of ---

/// A policy the tests set. An error asks for `on_error` (a final failure, or
/// a retry after a delay a server named); an answer to request `REFUSED` is
/// a final failure (a 4xx), the other answers succeed. It copies requests
/// until, with `spend_at_hedge`, a hedge is made: none after it, as a
/// streaming body past its replay limit. It lets no copy of request 0 (the
/// warm-ups') go out as a hedge.
#[derive(Clone)]
struct Scripted {
    on_error: Decision,
    spend_at_hedge: bool,
    spent: Arc<AtomicBool>,
}

const REFUSED: u32 = 9;

impl Scripted {
    fn new(on_error: Decision) -> Self {
        Self {
            on_error,
            spend_at_hedge: false,
            spent: Arc::default(),
        }
    }

    /// The same, copying no request once a hedge was made.
    fn spent_at_hedge(on_error: Decision) -> Self {
        Self {
            spend_at_hedge: true,
            ..Self::new(on_error)
        }
    }
}

impl Policy<u32, u32, io::Error> for Scripted {
    fn classify(&self, request: &u32, result: &io::Result<u32>) -> Decision {
        match result {
            Ok(_) if *request == REFUSED => Decision::Final,
            Ok(_) => Decision::Success,
            Err(_) => self.on_error,
        }
    }

    fn clone_request(&self, request: &u32) -> Option<u32> {
        (!self.spent.load(Ordering::SeqCst)).then_some(*request)
    }

    fn prepare_hedge(&self, copy: &mut u32, _: u32) -> bool {
        if self.spend_at_hedge {
            self.spent.store(true, Ordering::SeqCst);
        }
        *copy != 0
    }
}

/// `hedging` with `policy`, over `host`, after 10 quick calls: the traffic
/// the load cap grants hedges from.
async fn scripted(
    policy: Scripted,
    hedging: Hedging,
    host: &Host,
    hedges: &Hedges,
) -> impl Service<u32, Response = u32, Error = io::Error> {
    let mut svc = builder(&Stats::new(), hedges)
        .policy(policy)
        .hedge(hedging)
        .build()
        .unwrap()
        .layer(host.service());
    warm_up(&mut svc, 10).await;
    svc
}

/// A slow first copy of `request` and its hedge, after `scripted`'s
/// warm-up: `first` and `hedge` are the two copies' (latency ms, ok). What
/// the caller got, when, and the host's calls and cancelled calls.
async fn first_and_hedge(
    policy: Scripted,
    request: u32,
    first: (u64, bool),
    hedge: (u64, bool),
    hedges: &Hedges,
) -> (io::Result<u32>, Duration, u32, u32) {
    let mut steps = vec![(1, true); 10];
    steps.extend([first, hedge]);
    let host = Host::script(&steps);
    let hedging = Hedging::after(DELAY).max_extra_load(1.0);
    let mut svc = scripted(policy, hedging, &host, hedges).await;
    let start = Instant::now();
    let outcome = svc.ready().await.unwrap().call(request).await;
    (outcome, start.elapsed(), host.calls(), host.cancelled())
}

#[tokio::test(start_paused = true)]
async fn a_final_failure_of_one_copy_ends_the_request_at_once_and_cancels_the_others() {
    // The hedge fails for good at 15 ms: the caller hears it then, not the
    // slow first copy's success a second later.
    let hedges = Hedges::default();
    let policy = Scripted::new(Decision::Final);
    let (outcome, took, calls, cancelled) =
        first_and_hedge(policy, 1, (1_000, true), (5, false), &hedges).await;
    assert_eq!(outcome.unwrap_err().to_string(), "call 12 failed");
    assert_eq!(took, DELAY + Duration::from_millis(5));
    assert_eq!((calls, cancelled), (12, 1));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (2, HedgeEvent::Won)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn once_the_request_can_no_longer_be_copied_a_success_still_wins_at_once() {
    let hedges = Hedges::default();
    let policy = Scripted::spent_at_hedge(Decision::Final);
    let (outcome, took, calls, cancelled) =
        first_and_hedge(policy, 1, (1_000, true), (5, true), &hedges).await;
    assert_eq!(outcome.unwrap(), 112);
    assert_eq!(took, DELAY + Duration::from_millis(5));
    assert_eq!((calls, cancelled), (12, 1));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (2, HedgeEvent::Won)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn once_the_request_can_no_longer_be_copied_a_final_failure_waits_for_the_other_copies() {
    // The first copy's final answer comes at 30 ms, while the hedge sent at
    // 10 ms is pending; the hedge's outcome comes at 50 ms. Of the two
    // failures the caller gets the last, but a response over an error.
    for (hedge_ok, expected) in [(true, REFUSED * 100 + 12), (false, REFUSED * 100 + 11)] {
        let hedges = Hedges::default();
        let policy = Scripted::spent_at_hedge(Decision::Final);
        let (outcome, took, calls, cancelled) =
            first_and_hedge(policy, REFUSED, (30, true), (40, hedge_ok), &hedges).await;
        let answer = outcome.unwrap_or_else(|e| panic!("hedge ok: {hedge_ok}: the caller got {e}"));
        assert_eq!(answer, expected, "hedge ok: {hedge_ok}");
        assert_eq!(took, Duration::from_millis(50), "hedge ok: {hedge_ok}");
        assert_eq!((calls, cancelled), (12, 0), "hedge ok: {hedge_ok}");
        assert_eq!(
            hedges.seen(),
            [(2, HedgeEvent::Sent)],
            "hedge ok: {hedge_ok}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_copy_whose_server_named_a_delay_sends_no_further_hedge() {
    // As in `a_failed_copy_sends_the_next_hedge_at_once`, but the hedge's
    // failure asks for 50 ms: the next hedge would not honour them, so none
    // goes out, at once or after another delay, and the slow first copy
    // answers.
    let mut steps = vec![(1, true); 10];
    steps.extend([(1_000, true), (2, false), (4, true)]);
    let host = Host::script(&steps);
    let hedges = Hedges::default();
    let policy = Scripted::new(Decision::retry_after(Duration::from_millis(50)));
    let hedging = Hedging::after(DELAY).max_copies(3).max_extra_load(1.0);
    let mut svc = scripted(policy, hedging, &host, &hedges).await;

    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 111);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!((host.calls(), host.cancelled()), (12, 0));
    assert_eq!(hedges.seen(), [(2, HedgeEvent::Sent)]);
}

#[tokio::test(start_paused = true)]
async fn a_zero_delay_sends_every_copy_in_the_first_poll_however_many() {
    // Three copies: the second hedge goes out in the same poll as the
    // first, not on the timer's next tick. Two warm-up requests the policy
    // lets no hedge give the load cap room for two.
    let host = Host::script(&[(1, true), (1, true), (30, true), (30, true), (10, true)]);
    let hedges = Hedges::default();
    let hedging = Hedging::after(Duration::ZERO)
        .max_copies(3)
        .max_extra_load(1.0);
    let mut svc = builder(&Stats::new(), &hedges)
        .policy(Scripted::new(Decision::retry()))
        .hedge(hedging)
        .build()
        .unwrap()
        .layer(host.service());
    for _ in 0..2 {
        svc.ready().await.unwrap().call(0).await.unwrap();
    }
    assert!(hedges.seen().is_empty());
    // Between two of the timer's millisecond ticks, where a zero sleep would
    // wait for the next one.
    tokio::time::advance(Duration::from_micros(500)).await;
    let start = Instant::now();
    let mut attempt = std::pin::pin!(svc.ready().await.unwrap().call(1));
    poll_once_pending(attempt.as_mut()).await;
    assert_eq!(host.calls(), 5, "every copy at the first poll");
    assert_eq!(attempt.await.unwrap(), 105);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(10) && took <= Duration::from_millis(11),
        "{took:?}"
    );
    assert_eq!((host.calls(), host.cancelled()), (5, 2));
    assert_eq!(
        hedges.seen(),
        [
            (2, HedgeEvent::Sent),
            (3, HedgeEvent::Sent),
            (1, HedgeEvent::Cancelled),
            (2, HedgeEvent::Cancelled),
            (3, HedgeEvent::Won)
        ]
    );
}
