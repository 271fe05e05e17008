//! The poller against scripted providers on tokio's paused clock, and once
//! against a real hyper server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::broadcast::Receiver;
use tokio::time::{sleep, sleep_until, Instant};
use tower::Service;
use tower_backoff::poll::{Event, Failure, Poller, State};
use tower_backoff::{classify_fn, Budget, Cause, Decision, Exponential, Jitter};

const SECOND: Duration = Duration::from_secs(1);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// What a scripted provider does on one call.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Value(u32),
    Fail,
    /// Answers `value` after the delay.
    After(Duration, u32),
    /// Never answers.
    Hang,
    /// A bug in the provider.
    Panic,
}

/// What a test can see of a provider: when it was called, what its last
/// finished call returned, how many calls overlapped, and (through the `Arc`
/// count) whether the poller still holds the provider or one of its calls.
#[derive(Default)]
struct Probe {
    calls: Mutex<Vec<Instant>>,
    last: Mutex<Option<Result<u32, String>>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl Probe {
    fn new() -> Arc<Self> {
        Arc::default()
    }

    fn calls(&self) -> Vec<Instant> {
        self.calls.lock().unwrap().clone()
    }

    fn call_count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn last(&self) -> Option<Result<u32, String>> {
        self.last.lock().unwrap().clone()
    }
}

struct InFlight(Arc<Probe>);

impl InFlight {
    fn enter(probe: Arc<Probe>) -> Self {
        let now = probe.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        probe.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(probe)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A provider answering call `n` (from 0) with `script(n)`.
struct Scripted<F> {
    probe: Arc<Probe>,
    script: F,
}

fn scripted<F>(probe: &Arc<Probe>, script: F) -> Scripted<F>
where
    F: Fn(usize) -> Answer,
{
    Scripted {
        probe: Arc::clone(probe),
        script,
    }
}

impl<F: Fn(usize) -> Answer> Service<()> for Scripted<F> {
    type Response = u32;
    type Error = String;
    type Future = Pin<Box<dyn Future<Output = Result<u32, String>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), String>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        let n = {
            let mut calls = self.probe.calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len() - 1
        };
        let answer = (self.script)(n);
        let flight = InFlight::enter(Arc::clone(&self.probe));
        Box::pin(async move {
            let result = match answer {
                Answer::Value(v) => Ok(v),
                Answer::Fail => Err(format!("call {n} failed")),
                Answer::After(delay, v) => {
                    sleep(delay).await;
                    Ok(v)
                }
                Answer::Hang => std::future::pending().await,
                Answer::Panic => panic!("provider bug on call {n}"),
            };
            *flight.0.last.lock().unwrap() = Some(result.clone());
            result
        })
    }
}

type Script = fn(usize) -> Answer;

fn gaps(calls: &[Instant]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1] - w[0]).collect()
}

fn drain<K: Clone>(events: &mut Receiver<Event<K>>) -> Vec<Event<K>> {
    let mut out = Vec::new();
    loop {
        match events.try_recv() {
            Ok(event) => out.push(event),
            Err(TryRecvError::Empty | TryRecvError::Closed) => return out,
            Err(TryRecvError::Lagged(n)) => panic!("missed {n} events"),
        }
    }
}

fn polled_ok<K>(key: K) -> Event<K> {
    Event::Polled {
        key,
        outcome: Ok(()),
        took: Duration::ZERO,
    }
}

fn polled_err<K>(key: K, message: &str) -> Event<K> {
    Event::Polled {
        key,
        outcome: Err(Failure::Error(message.to_string())),
        took: Duration::ZERO,
    }
}

type TestPoller = Poller<&'static str, (), u32, String>;

fn exact_poller(
    interval: Duration,
    first_backoff: Duration,
) -> tower_backoff::poll::PollerBuilder<&'static str, (), u32, String> {
    TestPoller::builder(|_| ())
        .interval(interval)
        .schedule(Exponential::new(first_backoff))
        .jitter(Jitter::None)
}

#[tokio::test(start_paused = true)]
async fn fails_twice_then_recovers_with_the_exact_backoff_delays() {
    let probe = Probe::new();
    let poller = exact_poller(secs(5), SECOND)
        .max_failures(3)
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    let start = Instant::now();
    poller.add(
        "store",
        scripted(&probe, |n| match n {
            1 | 2 => Answer::Fail,
            n => Answer::Value(n as u32 * 100),
        }),
    );

    // Calls at 0 (ok), 5 (fails), 6 (fails), 8 (ok), 13 (ok).
    sleep_until(start + Duration::from_millis(5500)).await;
    let board = poller.board();
    assert_eq!(
        board.state(&"store"),
        Some(State::Quarantined {
            failures: 1,
            next_poll: start + secs(6)
        })
    );
    assert_eq!(board.value(&"store"), None);

    sleep_until(start + Duration::from_millis(6500)).await;
    assert_eq!(
        poller.board().state(&"store"),
        Some(State::Quarantined {
            failures: 2,
            next_poll: start + secs(8)
        })
    );

    sleep_until(start + Duration::from_millis(13500)).await;
    let board = poller.board();
    assert_eq!(
        board.state(&"store"),
        Some(State::Healthy {
            next_poll: start + secs(18)
        })
    );
    assert_eq!(board.value(&"store"), Some(&400));

    let calls = probe.calls();
    assert_eq!(calls[0], start);
    assert_eq!(gaps(&calls), [secs(5), secs(1), secs(2), secs(5)]);
    assert_eq!(
        drain(&mut events),
        [
            Event::Added { key: "store" },
            polled_ok("store"),
            polled_err("store", "call 1 failed"),
            Event::Quarantined {
                key: "store",
                failures: 1,
                next_poll: start + secs(6)
            },
            polled_err("store", "call 2 failed"),
            Event::Quarantined {
                key: "store",
                failures: 2,
                next_poll: start + secs(8)
            },
            polled_ok("store"),
            Event::Recovered {
                key: "store",
                failures: 2
            },
            polled_ok("store"),
        ]
    );
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn always_failing_provider_is_evicted_after_exactly_n_failures_and_never_polled_again() {
    for n in [1, 3, 5] {
        let probe = Probe::new();
        let poller = TestPoller::builder(|_| ())
            .schedule(Exponential::new(SECOND))
            .seed(n.into())
            .max_failures(n)
            .build()
            .unwrap();
        let mut events = poller.subscribe();
        poller.add("dead", scripted(&probe, |_| Answer::Fail));

        sleep(Duration::from_secs(3600)).await;
        assert_eq!(probe.call_count(), n as usize, "max_failures({n})");
        assert_eq!(
            poller.board().state(&"dead"),
            Some(State::Evicted {
                failures: n,
                reprobe_at: None
            })
        );
        let events = drain(&mut events);
        let evictions = events
            .iter()
            .filter(|e| matches!(e, Event::Evicted { .. }))
            .count();
        let quarantines = events
            .iter()
            .filter(|e| matches!(e, Event::Quarantined { .. }))
            .count();
        assert_eq!((evictions, quarantines), (1, n as usize - 1));
        // Its task has ended and dropped the service.
        assert_eq!(Arc::strong_count(&probe), 1);
        poller.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn evicted_provider_is_reprobed_after_the_interval_when_enabled() {
    let probe = Probe::new();
    let poller = exact_poller(secs(5), SECOND)
        .max_failures(2)
        .reprobe_after(secs(60))
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    let start = Instant::now();
    poller.add(
        "back-later",
        scripted(&probe, |n| match n {
            0..=2 => Answer::Fail,
            _ => Answer::Value(7),
        }),
    );

    // Fails at 0 and 1 (evicted), the re-probe at 61 fails, the one at 121 works.
    sleep_until(start + secs(62)).await;
    assert_eq!(
        poller.board().state(&"back-later"),
        Some(State::Evicted {
            failures: 3,
            reprobe_at: Some(start + secs(121))
        })
    );
    sleep_until(start + secs(127)).await;
    assert_eq!(gaps(&probe.calls()), [secs(1), secs(60), secs(60), secs(5)]);
    assert_eq!(poller.board().value(&"back-later"), Some(&7));

    let events = drain(&mut events);
    let evicted: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, Event::Evicted { .. }))
        .collect();
    assert_eq!(
        evicted,
        [&Event::Evicted {
            key: "back-later",
            failures: 2,
            reprobe_at: Some(start + secs(61))
        }]
    );
    assert!(events.contains(&Event::Recovered {
        key: "back-later",
        failures: 3
    }));
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn board_never_shows_a_value_from_a_quarantined_or_evicted_provider() {
    // Each provider's value encodes its key and call number, so a stale value
    // on the board cannot pass for a fresh one.
    let scripts: [(&str, Script); 5] = [
        ("steady", |n| Answer::Value(1000 + n as u32)),
        ("flaky", |n| {
            if n % 3 == 2 {
                Answer::Fail
            } else {
                Answer::Value(2000 + n as u32)
            }
        }),
        ("bursty", |n| {
            if (n / 4) % 2 == 1 {
                Answer::Fail
            } else {
                Answer::Value(3000 + n as u32)
            }
        }),
        ("dead", |_| Answer::Fail),
        ("cheap-then-gone", |n| {
            if n < 3 {
                Answer::Value(1 + n as u32)
            } else {
                Answer::Fail
            }
        }),
    ];
    let poller = TestPoller::builder(|_| ())
        .interval(SECOND)
        .schedule(Exponential::new(Duration::from_millis(500)))
        .seed(11)
        .max_failures(3)
        .reprobe_after(secs(10))
        .rank_by(|v: &u32| *v)
        .build()
        .unwrap();
    let probes: HashMap<&str, Arc<Probe>> = scripts
        .iter()
        .map(|&(key, script)| {
            let probe = Probe::new();
            assert!(poller.add(key, scripted(&probe, script)));
            (key, probe)
        })
        .collect();

    let (mut quarantined, mut evicted, mut healthy) = (0, 0, 0);
    for _ in 0..160 {
        sleep(Duration::from_millis(250)).await;
        let board = poller.board();
        for leader in board.leaders() {
            assert!(board.state(leader.key()).unwrap().is_healthy());
        }
        for (key, probe) in &probes {
            let state = board.state(key).unwrap();
            match probe.last() {
                Some(Ok(value)) => {
                    assert_eq!(board.value(key), Some(&value), "{key}");
                    assert!(state.is_healthy(), "{key} is {state:?}");
                    healthy += 1;
                }
                Some(Err(_)) => {
                    assert_eq!(board.value(key), None, "{key} is {state:?}");
                    match state {
                        State::Quarantined { .. } => quarantined += 1,
                        State::Evicted { .. } => evicted += 1,
                        other => panic!("{key} failed its last poll but is {other:?}"),
                    }
                }
                None => assert_eq!(state, State::Pending),
            }
        }
    }
    // The test saw every kind of state, so its assertions were exercised.
    assert!(quarantined > 0 && evicted > 0 && healthy > 0);
    // The cheap provider led the board until it failed.
    assert!(probes["cheap-then-gone"].call_count() > 3);
    assert_ne!(poller.board().leaders()[0].key(), &"cheap-then-gone");
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn removing_a_provider_mid_backoff_stops_its_polls() {
    let failing = Probe::new();
    let steady = Probe::new();
    let poller = exact_poller(SECOND, secs(10))
        .max_failures(5)
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    let start = Instant::now();
    poller.add("failing", scripted(&failing, |_| Answer::Fail));
    poller.add("steady", scripted(&steady, |_| Answer::Value(1)));

    sleep_until(start + secs(3)).await;
    assert!(matches!(
        poller.board().state(&"failing"),
        Some(State::Quarantined { failures: 1, .. })
    ));
    assert!(poller.remove(&"failing").await);
    assert!(!poller.remove(&"failing").await, "already removed");
    // Its task is gone with the service it owned.
    assert_eq!(Arc::strong_count(&failing), 1);
    assert!(drain(&mut events).contains(&Event::Removed { key: "failing" }));

    let steady_calls = steady.call_count();
    sleep(secs(3600)).await;
    assert_eq!(failing.call_count(), 1);
    assert!(
        steady.call_count() > steady_calls,
        "others keep being polled"
    );
    assert_eq!(poller.board().state(&"failing"), None);
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_every_task_and_drops_every_provider_promptly() {
    let probes: Vec<Arc<Probe>> = (0..4).map(|_| Probe::new()).collect();
    let poller = exact_poller(SECOND, SECOND)
        .no_timeout()
        .max_failures(2)
        .reprobe_after(secs(30))
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    poller.add("healthy", scripted(&probes[0], |_| Answer::Value(1)));
    poller.add(
        "quarantined",
        scripted(&probes[1], |n| {
            if n == 0 {
                Answer::Value(1)
            } else {
                Answer::Fail
            }
        }),
    );
    poller.add("evicted", scripted(&probes[2], |_| Answer::Fail));
    poller.add("hanging", scripted(&probes[3], |_| Answer::Hang));

    sleep(Duration::from_millis(1500)).await;
    let board = poller.board();
    assert!(matches!(
        board.state(&"quarantined"),
        Some(State::Quarantined { .. })
    ));
    assert!(matches!(
        board.state(&"evicted"),
        Some(State::Evicted { .. })
    ));
    assert_eq!(probes[3].in_flight.load(Ordering::SeqCst), 1);

    let before = Instant::now();
    poller.shutdown().await;
    assert_eq!(Instant::now(), before, "shutdown waits for no timer");
    for probe in &probes {
        assert_eq!(Arc::strong_count(probe), 1, "a task still holds a provider");
        assert_eq!(probe.in_flight.load(Ordering::SeqCst), 0);
    }
    // The event stream closes once the last task has let the poller's state go.
    drain(&mut events);
    assert!(matches!(events.try_recv(), Err(TryRecvError::Closed)));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_provider_is_evicted_and_its_value_leaves_the_board() {
    let probe = Probe::new();
    let poller = exact_poller(SECOND, SECOND).build().unwrap();
    let mut events = poller.subscribe();
    poller.add(
        "buggy",
        scripted(&probe, |n| {
            if n == 0 {
                Answer::Value(1)
            } else {
                Answer::Panic
            }
        }),
    );
    sleep(Duration::from_millis(500)).await;
    assert_eq!(poller.board().value(&"buggy"), Some(&1));

    sleep(secs(60)).await;
    assert_eq!(probe.call_count(), 2);
    assert_eq!(poller.board().value(&"buggy"), None);
    assert_eq!(
        poller.board().state(&"buggy"),
        Some(State::Evicted {
            failures: 1,
            reprobe_at: None
        })
    );
    assert!(drain(&mut events).contains(&Event::Evicted {
        key: "buggy",
        failures: 1,
        reprobe_at: None
    }));
    assert_eq!(Arc::strong_count(&probe), 1);
    poller.shutdown().await;
}

#[test]
fn poller_and_board_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TestPoller>();
    send_sync::<tower_backoff::poll::Board<&'static str, u32>>();
    send_sync::<Event<&'static str>>();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_poller_stops_every_poll() {
    let probe = Probe::new();
    let poller = exact_poller(SECOND, SECOND).build().unwrap();
    poller.add("store", scripted(&probe, |_| Answer::Value(1)));
    sleep(Duration::from_millis(2500)).await;
    let calls = probe.call_count();
    assert_eq!(calls, 3);

    drop(poller);
    sleep(secs(60)).await;
    assert_eq!(probe.call_count(), calls);
    assert_eq!(Arc::strong_count(&probe), 1);
}

#[tokio::test(start_paused = true)]
async fn providers_are_polled_concurrently_with_one_poll_in_flight_each() {
    let slow_a = Probe::new();
    let slow_b = Probe::new();
    let fast = Probe::new();
    let poller = exact_poller(SECOND, SECOND)
        .timeout(secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    poller.add("slow-a", scripted(&slow_a, |_| Answer::After(secs(3), 1)));
    poller.add("slow-b", scripted(&slow_b, |_| Answer::After(secs(3), 2)));
    poller.add("fast", scripted(&fast, |_| Answer::Value(3)));

    sleep_until(start + Duration::from_millis(9500)).await;
    // Both slow providers started together, and each waits for its own
    // answer plus the interval: no overlap, no waiting for the other.
    for slow in [&slow_a, &slow_b] {
        let calls = slow.calls();
        assert_eq!(calls[0], start);
        assert_eq!(gaps(&calls), [secs(4), secs(4)]);
        assert_eq!(slow.max_in_flight.load(Ordering::SeqCst), 1);
    }
    assert_eq!(gaps(&fast.calls()), [SECOND; 9]);
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn poll_that_exceeds_the_timeout_is_a_failure_and_is_cancelled() {
    let probe = Probe::new();
    let poller = exact_poller(secs(5), SECOND)
        .timeout(secs(2))
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    let start = Instant::now();
    poller.add(
        "slow",
        scripted(&probe, |n| {
            if n == 0 {
                Answer::After(secs(30), 1)
            } else {
                Answer::Value(2)
            }
        }),
    );

    sleep_until(start + Duration::from_millis(2500)).await;
    assert_eq!(
        probe.in_flight.load(Ordering::SeqCst),
        0,
        "the slow call was dropped"
    );
    assert_eq!(
        drain(&mut events)[1..],
        [
            Event::Polled {
                key: "slow",
                outcome: Err(Failure::TimedOut),
                took: secs(2)
            },
            Event::Quarantined {
                key: "slow",
                failures: 1,
                next_poll: start + secs(3)
            },
        ]
    );
    sleep_until(start + Duration::from_millis(3500)).await;
    assert_eq!(gaps(&probe.calls()), [secs(3)]);
    assert_eq!(poller.board().value(&"slow"), Some(&2));
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn policy_decides_success_and_a_retry_after_sets_the_next_poll() {
    let polite = Probe::new();
    let greedy = Probe::new();
    // 503 asks to come back later; 418 is rejected outright.
    let poller = TestPoller::builder(|_| ())
        .interval(secs(5))
        .schedule(Exponential::new(SECOND).max_delay(secs(30)))
        .jitter(Jitter::None)
        .policy(classify_fn(
            |_: &(), result: &Result<u32, String>| match result {
                Ok(503) => Decision::retry_after(secs(7)).because(Cause::Throttled),
                Ok(429) => Decision::retry_after(secs(3600)),
                Ok(418) => Decision::Final,
                Ok(_) => Decision::Success,
                Err(_) => Decision::retry(),
            },
        ))
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    poller.add(
        "polite",
        scripted(&polite, |n| Answer::Value([503, 418, 200][n.min(2)])),
    );
    poller.add(
        "greedy",
        scripted(&greedy, |n| Answer::Value(if n == 0 { 429 } else { 200 })),
    );

    sleep(secs(40)).await;
    // 7 s as asked; then 418 is a failure on the schedule, which starts over
    // after a delay the server named (the first delay, 1 s), as the layer's.
    assert_eq!(gaps(&polite.calls())[..2], [secs(7), SECOND]);
    // An hour was asked: past the schedule's cap, but never sooner than the
    // server asked, as the layer (the policy is what bounds such a delay).
    assert_eq!(greedy.calls().len(), 1);
    assert_eq!(poller.board().value(&"polite"), Some(&200));
    assert!(drain(&mut events).contains(&Event::Polled {
        key: "polite",
        outcome: Err(Failure::Rejected),
        took: Duration::ZERO
    }));
    sleep(secs(3600)).await;
    assert_eq!(gaps(&greedy.calls())[0], secs(3600));
    poller.shutdown().await;
}

/// Counts what the poller asks of it; refuses retries while `allow` is off.
#[derive(Default)]
struct GateBudget {
    allow: AtomicBool,
    first_attempts: AtomicUsize,
    retries_asked: AtomicUsize,
    successes_after_retry: AtomicUsize,
}

impl Budget for GateBudget {
    fn on_first_attempt(&self) {
        self.first_attempts.fetch_add(1, Ordering::SeqCst);
    }

    fn try_retry(&self, _cause: Cause) -> bool {
        self.retries_asked.fetch_add(1, Ordering::SeqCst);
        self.allow.load(Ordering::SeqCst)
    }

    fn on_success(&self, last_retry: Option<Cause>) {
        if last_retry.is_some() {
            self.successes_after_retry.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn budget_refusal_defers_quarantined_polls_without_counting_failures() {
    let probe = Probe::new();
    let budget = Arc::new(GateBudget::default());
    let poller = exact_poller(secs(5), SECOND)
        .max_failures(2)
        .budget(Arc::clone(&budget))
        .build()
        .unwrap();
    let mut events = poller.subscribe();
    let start = Instant::now();
    poller.add(
        "store",
        scripted(&probe, |n| {
            if n == 0 {
                Answer::Fail
            } else {
                Answer::Value(5)
            }
        }),
    );

    // Failed at 0; its polls at 1, 2, 3 are refused by the budget.
    sleep_until(start + Duration::from_millis(3500)).await;
    assert_eq!(probe.call_count(), 1);
    assert_eq!(budget.retries_asked.load(Ordering::SeqCst), 3);
    assert_eq!(
        poller.board().state(&"store"),
        Some(State::Quarantined {
            failures: 1,
            next_poll: start + secs(4)
        })
    );
    let deferred: Vec<_> = drain(&mut events)
        .into_iter()
        .filter(|e| matches!(e, Event::Deferred { .. }))
        .collect();
    assert_eq!(
        deferred,
        [2, 3, 4].map(|s| Event::Deferred {
            key: "store",
            next_poll: start + secs(s)
        })
    );

    budget.allow.store(true, Ordering::SeqCst);
    sleep_until(start + Duration::from_millis(4500)).await;
    assert_eq!(gaps(&probe.calls()), [secs(4)]);
    assert_eq!(poller.board().value(&"store"), Some(&5));
    assert_eq!(budget.successes_after_retry.load(Ordering::SeqCst), 1);
    assert_eq!(budget.first_attempts.load(Ordering::SeqCst), 1);
    poller.shutdown().await;
}

/// The gaps between the polls of an always-failing provider, jittered by `seed`.
async fn jittered_gaps(seed: u64, providers: usize) -> Vec<Vec<Duration>> {
    let poller = TestPoller::builder(|_| ())
        .schedule(Exponential::new(SECOND).max_delay(secs(10)))
        .jitter(Jitter::Full)
        .seed(seed)
        .max_failures(6)
        .build()
        .unwrap();
    let probes: Vec<_> = (0..providers).map(|_| Probe::new()).collect();
    for (key, probe) in ["a", "b", "c"].into_iter().zip(&probes) {
        poller.add(key, scripted(probe, |_| Answer::Fail));
    }
    sleep(secs(120)).await;
    poller.shutdown().await;
    probes.iter().map(|p| gaps(&p.calls())).collect()
}

#[tokio::test(start_paused = true)]
async fn seeded_jitter_is_reproducible_per_provider_and_within_the_schedule() {
    let first = jittered_gaps(42, 2).await;
    assert_eq!(first, jittered_gaps(42, 2).await);
    assert_ne!(first, jittered_gaps(43, 2).await);
    assert_ne!(first[0], first[1], "each provider draws its own stream");
    for gaps in &first {
        assert_eq!(gaps.len(), 5);
        for (n, gap) in gaps.iter().enumerate() {
            // Full jitter: within [0, 1 s × 2^n], capped at 10 s.
            assert!(*gap <= (SECOND * (1 << n)).min(secs(10)), "{gaps:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn leaderboard_is_sorted_by_the_rank_key_with_ties_in_added_order() {
    let values = [("a", 30), ("b", 10), ("c", 20), ("d", 10)];
    for descending in [false, true] {
        let builder = TestPoller::builder(|_| ());
        let poller = if descending {
            builder.rank_by(|v: &u32| std::cmp::Reverse(*v))
        } else {
            builder.rank_by(|v: &u32| *v)
        }
        .build()
        .unwrap();
        for (key, value) in values {
            poller.add(key, scripted(&Probe::new(), move |_| Answer::Value(value)));
        }
        sleep(SECOND).await;
        let board = poller.board();
        let keys: Vec<_> = board.leaders().iter().map(|l| *l.key()).collect();
        let expected = if descending {
            ["a", "c", "b", "d"]
        } else {
            ["b", "d", "c", "a"]
        };
        assert_eq!(keys, expected);
        let providers: Vec<_> = board.providers().iter().map(|(k, _)| *k).collect();
        assert_eq!(providers, ["a", "b", "c", "d"]);
        poller.shutdown().await;
    }
}

/// What a board shows, to compare with an earlier copy.
type Shown = (Vec<(u32, u32)>, Vec<(u32, State)>);

fn shown(board: &tower_backoff::poll::Board<u32, u32>) -> Shown {
    let leaders = board
        .leaders()
        .iter()
        .map(|l| (*l.key(), *l.value()))
        .collect();
    (leaders, board.providers().to_vec())
}

#[tokio::test(start_paused = true)]
async fn ranked_board_follows_every_change_in_place_and_earlier_boards_never_change() {
    // Values change on every poll (with many ties), one poll in seven fails, and
    // providers come and go, while a reader holds each board until the next one.
    let script = |provider: u32| {
        move |n: usize| {
            let n = n as u32;
            if (provider + n).is_multiple_of(7) {
                Answer::Fail
            } else {
                Answer::Value((provider * 37 + n * 11) % 20)
            }
        }
    };
    let poller = Poller::<u32, (), u32, String>::builder(|_| ())
        .interval(SECOND)
        .schedule(Exponential::new(Duration::from_millis(500)))
        .jitter(Jitter::None)
        .max_failures(1_000)
        .rank_by(|v: &u32| std::cmp::Reverse(*v))
        .build()
        .unwrap();
    let mut probes: Vec<(u32, Arc<Probe>)> = Vec::new();
    let mut next_key = 0;
    let mut held: Option<(tower_backoff::poll::Board<u32, u32>, Shown)> = None;
    let (mut moves, mut quarantined) = (0, 0);
    for step in 0..120 {
        if step % 10 == 0 {
            // Every tenth step one provider leaves (the second) and two join.
            if probes.len() > 2 {
                let (gone, _) = probes.remove(1);
                assert!(poller.remove(&gone).await);
            }
            for _ in 0..2 {
                let probe = Probe::new();
                assert!(poller.add(next_key, scripted(&probe, script(next_key))));
                probes.push((next_key, probe));
                next_key += 1;
            }
        }
        sleep(Duration::from_millis(250)).await;
        let board = poller.board();
        // Expected: the healthy providers' last values, highest first, ties
        // in the order the providers were added (which is key order here).
        let mut expected: Vec<(u32, u32)> = probes
            .iter()
            .filter_map(|(key, probe)| match probe.last() {
                Some(Ok(value)) => Some((*key, value)),
                _ => None,
            })
            .collect();
        expected.sort_by_key(|&(_, value)| std::cmp::Reverse(value));
        let now = shown(&board);
        assert_eq!(now.0, expected, "step {step}");
        let keys: Vec<u32> = now.1.iter().map(|&(key, _)| key).collect();
        let added: Vec<u32> = probes.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, added, "step {step}");
        quarantined += now
            .1
            .iter()
            .filter(|(_, state)| matches!(state, State::Quarantined { .. }))
            .count();
        if let Some((earlier, as_it_was)) = held.take() {
            assert_eq!(
                shown(&earlier),
                as_it_was,
                "a board changed after step {step}"
            );
            moves += usize::from(as_it_was.0 != now.0);
        }
        held = Some((board, now));
    }
    // The leaders really moved, and providers really failed, along the way.
    assert!(moves > 40, "{moves}");
    assert!(quarantined > 40, "{quarantined}");
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_rank_that_is_not_an_order_still_shows_every_healthy_value_once() {
    // Every call of the rank key answers differently, so the leaders can never
    // be in order: the board must still show each healthy provider once, with
    // its latest value, and nothing else.
    let draws = Arc::new(AtomicUsize::new(0));
    let poller = Poller::<u32, (), u32, String>::builder(|_| ())
        .interval(SECOND)
        .schedule(Exponential::new(Duration::from_millis(500)))
        .jitter(Jitter::None)
        .max_failures(1_000)
        .rank_by({
            let draws = Arc::clone(&draws);
            move |_: &u32| {
                draws
                    .fetch_add(1, Ordering::Relaxed)
                    .wrapping_mul(2_654_435_761)
                    % 101
            }
        })
        .build()
        .unwrap();
    let probes: Vec<(u32, Arc<Probe>)> = (0..30)
        .map(|key| {
            let probe = Probe::new();
            let script = move |n: usize| {
                if (key as usize + n).is_multiple_of(5) {
                    Answer::Fail
                } else {
                    Answer::Value(key * 1000 + n as u32)
                }
            };
            assert!(poller.add(key, scripted(&probe, script)));
            (key, probe)
        })
        .collect();
    for step in 0..40 {
        sleep(Duration::from_millis(250)).await;
        let mut shown: Vec<(u32, u32)> = poller
            .board()
            .leaders()
            .iter()
            .map(|l| (*l.key(), *l.value()))
            .collect();
        shown.sort_unstable();
        let healthy: Vec<(u32, u32)> = probes
            .iter()
            .filter_map(|(key, probe)| match probe.last() {
                Some(Ok(value)) => Some((*key, value)),
                _ => None,
            })
            .collect();
        assert_eq!(shown, healthy, "step {step}");
    }
    assert!(draws.load(Ordering::Relaxed) > 1_000);
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_is_polled_once_and_providers_added_later_start_at_once() {
    let first = Probe::new();
    let duplicate = Probe::new();
    let late = Probe::new();
    let poller = exact_poller(secs(5), SECOND).build().unwrap();
    let start = Instant::now();
    assert!(poller.add("store", scripted(&first, |_| Answer::Value(1))));
    assert!(!poller.add("store", scripted(&duplicate, |_| Answer::Value(2))));
    assert_eq!(
        Arc::strong_count(&duplicate),
        1,
        "the refused service is dropped"
    );

    sleep_until(start + secs(7)).await;
    assert_eq!(poller.board().state(&"late"), None);
    assert!(poller.add("late", scripted(&late, |_| Answer::Value(3))));
    assert_eq!(poller.board().state(&"late"), Some(State::Pending));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(late.calls(), [start + secs(7)]);
    assert_eq!(duplicate.call_count(), 0);
    assert_eq!(poller.board().value(&"store"), Some(&1));
    poller.shutdown().await;
}

#[tokio::test]
async fn invalid_settings_are_rejected_naming_the_field() {
    let builder = || TestPoller::builder(|_| ());
    let year_and_a_day = Duration::from_secs(366 * 24 * 3600);
    let cases = [
        ("interval", builder().interval(Duration::ZERO)),
        ("interval", builder().interval(year_and_a_day)),
        ("timeout", builder().timeout(Duration::ZERO)),
        ("reprobe_after", builder().reprobe_after(Duration::ZERO)),
        ("max_failures", builder().max_failures(0)),
        ("events_capacity", builder().events_capacity(0)),
        ("jitter", builder().jitter(Jitter::Proportional(2.0))),
        (
            "factor",
            builder().schedule(Exponential::new(SECOND).factor(0.5)),
        ),
        (
            "max_delay",
            builder().schedule(Exponential::new(secs(10)).max_delay(SECOND)),
        ),
    ];
    for (field, builder) in cases {
        let error = builder.build().unwrap_err();
        assert_eq!(error.field(), field, "{error}");
        assert!(error.to_string().contains(field));
    }
}

#[test]
fn building_outside_a_tokio_runtime_is_a_config_error() {
    let error = TestPoller::builder(|_| ()).build().unwrap_err();
    assert_eq!(error.field(), "runtime");
}

mod http {
    //! A real hyper server polled through hyper-util's client, on the real clock
    //! (real sockets and a paused clock do not mix: time jumps while I/O waits).

    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty, Full};
    use hyper::body::Incoming;
    use hyper::{Request, Response, StatusCode, Uri};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpListener;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// Serves 503 to its first `failures` requests, then `price`.
    async fn store(failures: usize, price: u32) -> (Uri, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/price", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let served = Arc::clone(&served);
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let n = served.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = if n < failures {
                        (StatusCode::SERVICE_UNAVAILABLE, String::new())
                    } else {
                        (StatusCode::OK, price.to_string())
                    };
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (uri, server)
    }

    #[tokio::test]
    async fn polls_a_real_http_store_through_hyper_util_and_recovers_from_503s() {
        let (uri, server) = store(2, 1999).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let price = tower::service_fn(move |request: Request<Empty<Bytes>>| {
            let client = client.clone();
            async move {
                let response = client.request(request).await?;
                if !response.status().is_success() {
                    return Err::<u32, BoxError>(format!("HTTP {}", response.status()).into());
                }
                let body = response.into_body().collect().await?.to_bytes();
                Ok(std::str::from_utf8(&body)?.trim().parse()?)
            }
        });
        let poller =
            Poller::builder(move |_: &&str| Request::get(uri.clone()).body(Empty::new()).unwrap())
                .interval(Duration::from_millis(20))
                .schedule(Exponential::new(Duration::from_millis(10)))
                .jitter(Jitter::None)
                .timeout(secs(2))
                .build()
                .unwrap();
        let mut events = poller.subscribe();
        poller.add("store", price);

        let mut seen = Vec::new();
        tokio::time::timeout(secs(10), async {
            loop {
                let event = events.recv().await.unwrap();
                let recovered = matches!(event, Event::Recovered { .. });
                seen.push(event);
                if recovered {
                    return;
                }
            }
        })
        .await
        .expect("the store recovers within 10 s");
        let kinds: Vec<_> = seen
            .iter()
            .map(|event| match event {
                Event::Added { .. } => "added".to_string(),
                Event::Polled {
                    outcome: Ok(()), ..
                } => "ok".to_string(),
                Event::Polled {
                    outcome: Err(failure),
                    ..
                } => failure.to_string(),
                Event::Quarantined { failures, .. } => format!("quarantined {failures}"),
                Event::Recovered { failures, .. } => format!("recovered from {failures}"),
                other => format!("{other:?}"),
            })
            .collect();
        let failed = "HTTP 503 Service Unavailable";
        assert_eq!(
            kinds,
            [
                "added",
                failed,
                "quarantined 1",
                failed,
                "quarantined 2",
                "ok",
                "recovered from 2"
            ]
        );
        assert_eq!(poller.board().value(&"store"), Some(&1999));
        poller.shutdown().await;
        server.abort();
    }
}
