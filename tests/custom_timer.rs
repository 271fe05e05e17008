//! The layer on an executor other than tokio: `futures`' `block_on`, with no
//! Tokio runtime anywhere, and a timer of the test's own installed with
//! `timer::set_timer`. One test binary of its own, since the timer is
//! installed for the whole program.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::timer::{self, Timer, TimerAlreadySet};
use tower_backoff::{BackoffLayer, Constant, Jitter, Stats, TokenBucket};

/// Sleeps on a thread of its own per sleep, and counts its sleeps.
struct ThreadTimer(Arc<AtomicU32>);

impl Timer for ThreadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let (done, wait) = futures::channel::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(duration);
            let _ = done.send(());
        });
        Box::pin(async move {
            let _ = wait.await;
        })
    }
}

#[test]
fn retries_sleep_and_time_out_on_an_installed_timer_without_tokio() {
    let sleeps = Arc::new(AtomicU32::new(0));
    timer::set_timer(ThreadTimer(sleeps.clone())).unwrap();
    assert_eq!(
        timer::set_timer(ThreadTimer(sleeps.clone())),
        Err(TimerAlreadySet)
    );
    assert!(tokio::runtime::Handle::try_current().is_err());

    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_millis(20)))
        .jitter(Jitter::None)
        .attempt_timeout(Duration::from_millis(30))
        // The AWS bucket: two retries from the start, where the default
        // budget earns them from successes first.
        .budget(TokenBucket::new())
        .stats(stats.clone())
        .build()
        .unwrap();
    // The first attempt never answers (its timeout ends it), the second
    // fails, the third answers.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = layer.layer(service_fn(move |n: u32| {
        let call = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            match call {
                1 => std::future::pending().await,
                2 => Err(io::Error::other("refused")),
                _ => Ok::<_, io::Error>(n + call),
            }
        }
    }));

    let started = Instant::now();
    let answer = futures::executor::block_on(svc.oneshot(10)).unwrap();
    assert_eq!(answer, 13);
    // The timeout, then two delays.
    assert!(started.elapsed() >= Duration::from_millis(30 + 20 + 20));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let seen = stats.snapshot();
    assert_eq!((seen.attempts, seen.retries, seen.successes), (3, 2, 1));
    // Three attempt timers and two delays, all on the installed timer.
    assert_eq!(sleeps.load(Ordering::SeqCst), 5);
}
