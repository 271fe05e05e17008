//! Behaviour of `BackoffLayer` around plain tower services, on tokio's paused clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_backoff::{
    classify_fn, retry_if, BackoffLayer, Constant, Decision, Exponential, Jitter, Policy,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A service failing the first `failures` calls with `Err(call number)`, then
/// answering `Ok(call number)`; it records when each call was made.
#[derive(Clone)]
struct Flaky {
    failures: u32,
    calls: Arc<Mutex<Vec<Instant>>>,
}

impl Flaky {
    fn new(failures: u32) -> Self {
        Self {
            failures,
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> Vec<Instant> {
        self.calls.lock().unwrap().clone()
    }
}

impl Service<&'static str> for Flaky {
    type Response = u32;
    type Error = u32;
    type Future = std::future::Ready<Result<u32, u32>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), u32>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: &'static str) -> Self::Future {
        let mut calls = self.calls.lock().unwrap();
        calls.push(Instant::now());
        let n = calls.len() as u32;
        std::future::ready(if n <= self.failures { Err(n) } else { Ok(n) })
    }
}

/// Retries every error after a constant `delay`, up to `attempts`, with no
/// budget.
fn constant(delay: Duration, attempts: u32) -> BackoffLayer<tower_backoff::RetryOnError> {
    BackoffLayer::builder()
        .schedule(Constant::new(delay))
        .jitter(Jitter::None)
        .max_attempts(attempts)
        .no_budget()
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retries_errors_then_returns_the_success() {
    let flaky = Flaky::new(2);
    let svc = ServiceBuilder::new()
        .layer(constant(ms(100), 3))
        .service(flaky.clone());
    assert_eq!(svc.oneshot("req").await, Ok(3));
    let calls = flaky.calls();
    assert_eq!(calls[1] - calls[0], ms(100));
    assert_eq!(calls[2] - calls[1], ms(100));
}

#[tokio::test(start_paused = true)]
async fn stops_after_max_attempts_and_returns_the_last_error() {
    let flaky = Flaky::new(u32::MAX);
    let svc = constant(ms(10), 4);
    let result = ServiceBuilder::new()
        .layer(svc)
        .service(flaky.clone())
        .oneshot("req")
        .await;
    assert_eq!(result, Err(4), "the error of the 4th (last) attempt");
    assert_eq!(flaky.calls().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn returns_the_last_response_when_the_policy_keeps_retrying_it() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = service_fn(move |_: ()| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, BoxError>(format!("503 #{n}")) }
    });
    let layer = BackoffLayer::builder()
        .policy(retry_if(
            |r: &Result<String, BoxError>| matches!(r, Ok(body) if body.starts_with("503")),
        ))
        .schedule(Constant::new(ms(5)))
        .max_attempts(3)
        .no_budget()
        .build()
        .unwrap();
    let response = layer.layer_service(svc).oneshot(()).await.unwrap();
    assert_eq!(response, "503 #3");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

trait LayerExt {
    fn layer_service<S>(&self, s: S) -> <Self as tower::Layer<S>>::Service
    where
        Self: tower::Layer<S>;
}

impl<P> LayerExt for BackoffLayer<P> {
    fn layer_service<S>(&self, s: S) -> <Self as tower::Layer<S>>::Service
    where
        Self: tower::Layer<S>,
    {
        tower::Layer::layer(self, s)
    }
}

#[tokio::test(start_paused = true)]
async fn a_final_failure_is_returned_without_retrying() {
    let flaky = Flaky::new(u32::MAX);
    let layer = BackoffLayer::builder()
        .policy(classify_fn(|_: &&str, r: &Result<u32, u32>| match r {
            Err(_) => Decision::Final,
            Ok(_) => Decision::Success,
        }))
        .build()
        .unwrap();
    assert_eq!(
        layer.layer_service(flaky.clone()).oneshot("req").await,
        Err(1)
    );
    assert_eq!(flaky.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_is_honoured_exactly() {
    // Attempts at 0, 1, 2, 3 s; a retry at 4 s would end past 3.5 s.
    let flaky = Flaky::new(u32::MAX);
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .max_attempts(100)
        .max_elapsed(ms(3_500))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let result = layer.layer_service(flaky.clone()).oneshot("req").await;
    assert_eq!(result, Err(4));
    assert_eq!(start.elapsed(), Duration::from_secs(3));

    // A sleep ending exactly at the limit is allowed.
    let flaky = Flaky::new(u32::MAX);
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .max_attempts(100)
        .max_elapsed(Duration::from_secs(3))
        .no_budget()
        .build()
        .unwrap();
    assert_eq!(
        layer.layer_service(flaky.clone()).oneshot("req").await,
        Err(4)
    );
}

#[test]
fn zero_delay_retries_without_touching_the_timer() {
    // A runtime without a time driver: any `tokio::time::sleep` would panic. A
    // zero sleep on a real timer would also cost a 1 ms tick per retry.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let flaky = Flaky::new(4);
    let svc = constant(Duration::ZERO, 5).layer_service(flaky.clone());
    assert_eq!(runtime.block_on(svc.oneshot("req")), Ok(5));
    assert_eq!(flaky.calls().len(), 5);
}

/// A request type that cannot be cloned.
struct Stream(u32);

#[tokio::test(start_paused = true)]
async fn a_request_the_policy_cannot_copy_goes_out_once_and_comes_back_unchanged() {
    struct NoCopy;
    impl Policy<Stream, u32, String> for NoCopy {
        fn classify(&self, _: &Stream, _: &Result<u32, String>) -> Decision {
            unreachable!("an uncopyable request's outcome is never classified")
        }
        fn clone_request(&self, _: &Stream) -> Option<Stream> {
            None
        }
    }
    impl Clone for NoCopy {
        fn clone(&self) -> Self {
            NoCopy
        }
    }
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = service_fn(move |s: Stream| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Err::<u32, _>(format!("failed #{}", s.0)) }
    });
    let layer = BackoffLayer::builder().policy(NoCopy).build().unwrap();
    let result = layer.layer_service(svc).oneshot(Stream(7)).await;
    assert_eq!(result, Err("failed #7".to_string()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Panics when called without a successful `poll_ready` since the last call;
/// counts readiness checks.
#[derive(Clone)]
struct StrictReadiness {
    ready: bool,
    polls: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

impl Service<u32> for StrictReadiness {
    type Response = u32;
    type Error = u32;
    type Future = std::future::Ready<Result<u32, u32>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), u32>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u32) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(if n < 3 { Err(n) } else { Ok(req) })
    }
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_called_before_each_retry() {
    let inner = StrictReadiness {
        ready: false,
        polls: Arc::default(),
        calls: Arc::default(),
    };
    let (polls, calls) = (inner.polls.clone(), inner.calls.clone());
    let svc = constant(ms(1), 5).layer_service(inner);
    assert_eq!(svc.oneshot(9).await, Ok(9));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        polls.load(Ordering::SeqCst),
        3,
        "one readiness check per attempt"
    );
}

/// Readiness that is pending until a permit is released, like a concurrency limit.
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_the_inner_service_to_be_ready() {
    let flaky = Flaky::new(1);
    let svc = ServiceBuilder::new()
        .layer(constant(ms(10), 3))
        .concurrency_limit(1)
        .service(flaky.clone());
    // Hold the only permit through a second handle.
    let mut holder = svc.clone();
    std::future::poll_fn(|cx| holder.poll_ready(cx))
        .await
        .unwrap();
    let mut svc = svc;
    // svc cannot become ready while `holder` keeps the permit.
    let pending = tokio::time::timeout(ms(50), std::future::poll_fn(|cx| svc.poll_ready(cx))).await;
    assert!(pending.is_err());
    drop(holder);
    assert_eq!(svc.oneshot("req").await, Ok(2));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_a_sleep_stops_further_attempts() {
    let flaky = Flaky::new(u32::MAX);
    let svc = constant(Duration::from_secs(10), 5).layer_service(flaky.clone());
    let future = svc.oneshot("req");
    // The first attempt fails at once; the future is now sleeping 10 s.
    assert!(tokio::time::timeout(Duration::from_secs(5), future)
        .await
        .is_err());
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    assert_eq!(flaky.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_failing_requests_spread_their_retries() {
    // 1,000 requests fail together at t = 0; with full jitter over [0, 1 s] their
    // retries must not bunch up in any 10 ms bucket.
    let bucket_share = |jitter: Jitter| async move {
        let flaky = Flaky::new(1_000);
        let layer = BackoffLayer::builder()
            .schedule(Constant::new(Duration::from_secs(1)))
            .jitter(jitter)
            .max_attempts(2)
            // About jitter, not budgets: every one of the 1,000 retries.
            .no_budget()
            .build()
            .unwrap();
        let svc = layer.layer_service(flaky.clone());
        let start = Instant::now();
        let requests = (0..1_000).map(|_| svc.clone().oneshot("req"));
        futures::future::join_all(requests).await;
        let retries = &flaky.calls()[1_000..];
        let mut buckets: HashMap<u128, usize> = HashMap::new();
        for t in retries {
            *buckets.entry((*t - start).as_millis() / 10).or_default() += 1;
        }
        *buckets.values().max().unwrap() as f64 / retries.len() as f64
    };
    // Uniform over 100 buckets is 1% each; allow random bunching up to 3%.
    let jittered = bucket_share(Jitter::Full).await;
    assert!(
        jittered <= 0.03,
        "largest 10 ms bucket held {:.1}%",
        jittered * 100.0
    );
    // Without jitter every retry lands together: the measure can see lock-step.
    assert_eq!(bucket_share(Jitter::None).await, 1.0);
}

#[tokio::test(start_paused = true)]
async fn clones_draw_independent_delays() {
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .max_attempts(2)
        .build()
        .unwrap();
    let a = Flaky::new(1);
    let b = Flaky::new(1);
    // Two services of one layer, and a clone: each request draws its own delays.
    let svc_a = layer.layer_service(a.clone());
    let svc_b = tower_backoff::BackoffRetry::new(b.clone(), &layer);
    let (_, _) = tokio::join!(svc_a.clone().oneshot("req"), svc_b.clone().oneshot("req"));
    let gap = |calls: Vec<Instant>| calls[1] - calls[0];
    assert_ne!(gap(a.calls()), gap(b.calls()));
}

#[tokio::test(start_paused = true)]
async fn a_seeded_layer_repeats_its_delays() {
    let run = || async {
        let layer = BackoffLayer::builder()
            .schedule(Exponential::new(ms(100)))
            .max_attempts(5)
            .seed(1234)
            .no_budget()
            .build()
            .unwrap();
        let flaky = Flaky::new(4);
        layer
            .layer_service(flaky.clone())
            .oneshot("req")
            .await
            .unwrap();
        let calls = flaky.calls();
        calls.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    };
    let first = run().await;
    assert_eq!(first, run().await);
    assert!(first
        .iter()
        .zip([100, 200, 400, 800])
        .all(|(d, cap)| *d <= ms(cap)));
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_times_out_inside_the_layer_and_the_retry_succeeds() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let slow_then_fast = service_fn(move |_: ()| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok::<_, BoxError>(n)
        }
    });
    let svc = ServiceBuilder::new()
        .layer(constant(ms(10), 3))
        .timeout(Duration::from_secs(1))
        .service(slow_then_fast);
    let start = Instant::now();
    assert_eq!(svc.oneshot(()).await.unwrap(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(1_010));
}

#[test]
fn invalid_layer_settings_fail_at_build_time_naming_the_field() {
    let field = |e: tower_backoff::ConfigError| e.field();
    assert_eq!(
        field(BackoffLayer::builder().max_attempts(0).build().unwrap_err()),
        "max_attempts"
    );
    assert_eq!(
        field(
            BackoffLayer::builder()
                .max_elapsed(Duration::ZERO)
                .build()
                .unwrap_err()
        ),
        "max_elapsed"
    );
    assert_eq!(
        field(
            BackoffLayer::builder()
                .max_elapsed(Duration::from_secs(u64::MAX))
                .build()
                .unwrap_err()
        ),
        "max_elapsed"
    );
    assert_eq!(
        field(
            BackoffLayer::builder()
                .jitter(Jitter::Proportional(2.0))
                .build()
                .unwrap_err()
        ),
        "jitter"
    );
    assert_eq!(
        field(
            BackoffLayer::builder()
                .schedule(Exponential::new(ms(1)).factor(f64::INFINITY))
                .build()
                .unwrap_err()
        ),
        "factor"
    );
    let message = BackoffLayer::builder()
        .max_attempts(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(message.contains("max_attempts"), "{message}");
}

/// Issue 27, item 3: outside a Tokio runtime, the first retry's sleep panics
/// with a message that names what is missing: a runtime with tokio's time
/// driver.
#[test]
fn outside_a_tokio_runtime_the_first_retry_names_the_time_driver() {
    let layer = tower_backoff::BackoffLayer::builder()
        .schedule(tower_backoff::Constant::new(
            std::time::Duration::from_millis(10),
        ))
        .build()
        .unwrap();
    let svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|()| async { Err::<(), _>("down") }),
    );
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        futures::executor::block_on(tower::ServiceExt::oneshot(svc, ()))
    }))
    .expect_err("no runtime, no timer");
    let message = panicked
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("no Tokio runtime"), "{message}");
    assert!(message.contains("enable_time()"), "{message}");
}
