//! The four front-ends over the one retry engine — the layer, `retry(..)`,
//! `Delays` in a loop written by hand, and the poller — driven by the same
//! script of outcomes on tokio's paused clock: the same attempts at the same
//! times, the same delays (jittered alike from the same seed), and hooks
//! that fire when a retry is sent, never when it is decided.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, Instant};
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::poll::Poller;
use tower_backoff::{retry, BackoffLayer, Delays, Exponential, Jitter};

/// Three failures, then a success.
const FAILURES: usize = 3;
const SEED: u64 = 7;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 100 ms doubling, capped at 250 ms: the third delay shows the cap.
fn schedule() -> Exponential {
    Exponential::new(ms(100)).max_delay(ms(250))
}

/// What one front-end did, in time since the first attempt.
#[derive(Debug, Default, Clone, PartialEq)]
struct Run {
    /// When each attempt went out.
    attempts: Vec<Duration>,
    /// The delay before each retry.
    delays: Vec<Duration>,
    /// When the front-end's retry hook fired (`on_retry` on the layer and on `retry(..)`), if it
    /// has one.
    hooks: Vec<Duration>,
}

/// The script shared by every front-end: attempt `n` (from 0) fails while
/// `n < FAILURES`. Records when it was called.
#[derive(Clone)]
struct Script {
    start: Instant,
    run: Arc<Mutex<Run>>,
}

impl Script {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            run: Arc::default(),
        }
    }

    /// One attempt: `Ok(n)` or `Err(n)`, `n` its number from 0.
    fn attempt(&self) -> Result<usize, usize> {
        let mut run = self.run.lock().unwrap();
        run.attempts.push(self.start.elapsed());
        let n = run.attempts.len() - 1;
        if n < FAILURES {
            Err(n)
        } else {
            Ok(n)
        }
    }

    fn hook(&self, delay: Duration) {
        let mut run = self.run.lock().unwrap();
        run.delays.push(delay);
        run.hooks.push(self.start.elapsed());
    }

    fn run(&self) -> Run {
        self.run.lock().unwrap().clone()
    }
}

async fn through_the_layer(jitter: Jitter) -> Run {
    let script = Script::new();
    let hooked = script.clone();
    let layer = BackoffLayer::builder()
        .schedule(schedule())
        .jitter(jitter)
        .seed(SEED)
        .max_attempts(4)
        .no_budget()
        .on_retry(move |retry, _| hooked.hook(retry.delay()))
        .build()
        .unwrap();
    let attempts = script.clone();
    let svc = layer.layer(service_fn(move |()| {
        let outcome = attempts.attempt();
        async move { outcome }
    }));
    assert_eq!(svc.oneshot(()).await, Ok(FAILURES));
    script.run()
}

async fn through_retry(jitter: Jitter) -> Run {
    let script = Script::new();
    let hooked = script.clone();
    let outcome = retry(|| {
        let outcome = script.attempt();
        async move { outcome }
    })
    .schedule(schedule())
    .jitter(jitter)
    .seed(SEED)
    .max_attempts(4)
    .no_budget()
    .on_retry(move |retry, _| hooked.hook(retry.delay()))
    .await;
    assert_eq!(outcome, Ok(FAILURES));
    script.run()
}

async fn through_delays(jitter: Jitter) -> Run {
    let script = Script::new();
    let mut delays = Delays::new(schedule())
        .jitter(jitter)
        .seed(SEED)
        .max_attempts(4);
    let outcome = loop {
        match script.attempt() {
            Ok(n) => break Ok(n),
            Err(n) => match delays.next() {
                Some(delay) => {
                    sleep(delay).await;
                    script.hook(delay);
                }
                None => break Err(n),
            },
        }
    };
    assert_eq!(outcome, Ok(FAILURES));
    script.run()
}

async fn through_the_poller(jitter: Jitter) -> Run {
    let script = Script::new();
    let poller: Poller<&str, (), usize, usize> = Poller::builder(|_| ())
        .interval(Duration::from_secs(3600))
        .schedule(schedule())
        .jitter(jitter)
        .seed(SEED)
        .max_failures(10)
        .no_timeout()
        .build()
        .unwrap();
    let attempts = script.clone();
    poller.add(
        "provider",
        service_fn(move |()| {
            let outcome = attempts.attempt();
            async move { outcome }
        }),
    );
    sleep(Duration::from_secs(60)).await;
    assert_eq!(poller.board().value(&"provider"), Some(&FAILURES));
    poller.shutdown().await;
    let mut run = script.run();
    // The poller has no retry hook: its retries are its polls.
    run.delays = run.attempts.windows(2).map(|w| w[1] - w[0]).collect();
    run
}

/// Every front-end's run; the layer's comes first.
async fn every_front_end(jitter: Jitter) -> [(&'static str, Run); 4] {
    [
        ("layer", through_the_layer(jitter).await),
        ("retry", through_retry(jitter).await),
        ("delays", through_delays(jitter).await),
        ("poller", through_the_poller(jitter).await),
    ]
}

#[tokio::test(start_paused = true)]
async fn every_front_end_makes_the_same_attempts_after_the_same_delays() {
    let runs = every_front_end(Jitter::None).await;
    let expected = Run {
        attempts: [0, 100, 300, 550].map(ms).to_vec(),
        delays: [100, 200, 250].map(ms).to_vec(),
        hooks: [100, 300, 550].map(ms).to_vec(),
    };
    for (name, run) in &runs[..3] {
        assert_eq!(run, &expected, "{name}");
    }
    let (_, poller) = &runs[3];
    assert_eq!(poller.attempts, expected.attempts);
    assert_eq!(poller.delays, expected.delays);
}

#[tokio::test(start_paused = true)]
async fn every_front_end_draws_the_same_jittered_delays_from_one_seed() {
    let runs = every_front_end(Jitter::Full).await;
    let (_, layer) = &runs[0];
    // Jittered: within the schedule, and not all of them the schedule's own.
    assert_eq!(layer.delays.len(), FAILURES);
    assert!(layer
        .delays
        .iter()
        .zip([100, 200, 250].map(ms))
        .all(|(d, max)| *d <= max));
    assert_ne!(layer.delays, [100, 200, 250].map(ms));
    for (name, run) in &runs[1..3] {
        assert_eq!(run, layer, "{name}");
    }
    let (_, poller) = &runs[3];
    assert_eq!(poller.attempts, layer.attempts);
    // The poller's delays are read off its polls, which tokio's timer wakes
    // on its millisecond tick.
    let on_the_tick = |d: &Duration| ms(d.as_nanos().div_ceil(1_000_000) as u64);
    assert_eq!(
        poller.delays,
        layer.delays.iter().map(on_the_tick).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn hooks_fire_when_a_retry_is_sent_not_when_it_is_decided() {
    for (name, run) in &every_front_end(Jitter::None).await[..3] {
        // Hook n fires as attempt n + 1 goes out, after its sleep.
        assert_eq!(run.hooks, run.attempts[1..], "{name}");
    }
}
