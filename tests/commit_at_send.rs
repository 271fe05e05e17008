//! The rule of the state machine: the outcome of attempt *n* goes back to the
//! caller unless attempt *n + 1* actually goes out. Each test stops a decided
//! retry in a different way between its decision and its send, and checks
//! that the caller gets attempt *n*'s real outcome and that nothing (budget,
//! `on_retry`, stats) counted a retry that was never sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{service_fn, Service, ServiceExt};
use tower_backoff::budget::{Budget, TokenBucket};
use tower_backoff::events::OutcomeKind;
use tower_backoff::{
    classify_fn, BackoffLayer, Cause, Constant, Decision, Jitter, Policy, PrepareRetry,
    RetryOnError, Stats,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Retries every error after a constant `delay`, up to `attempts`.
fn constant(delay: Duration, attempts: u32) -> tower_backoff::BackoffBuilder<RetryOnError> {
    BackoffLayer::builder()
        .schedule(Constant::new(delay))
        .jitter(Jitter::None)
        .max_attempts(attempts)
}

/// Fails every call with `Err(call number)`, counting calls.
fn failing(
    calls: Arc<AtomicU32>,
) -> impl Service<(), Response = (), Error = u32, Future = impl Send> + Clone {
    service_fn(move |()| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Err::<(), u32>(n) }
    })
}

// --- dropped during the sleep ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_the_sleep_charges_the_token_bucket_nothing() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let layer = constant(secs(1), 3).budget(bucket.clone()).build().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));

    // An outer timeout, as `ServiceBuilder::new().timeout(..)` outside the
    // layer would be, drops the request in the middle of its 1 s sleep.
    let outcome = tokio::time::timeout(Duration::from_millis(500), svc.oneshot(())).await;
    assert!(outcome.is_err(), "the outer timeout fired");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry never went out");
    assert_eq!(bucket.available(), 10, "nothing was charged for it");
}

/// A bucket that earns on first attempts: five requests dropped in their
/// sleeps leave it exactly their five deposits, none spent on a retry that
/// never went out.
#[tokio::test(start_paused = true)]
async fn dropping_futures_during_the_sleep_spends_none_of_a_bucket_earning_on_requests() {
    let budget = Arc::new(
        TokenBucket::builder()
            .capacity(100)
            .initial_tokens(0)
            .retry_cost(1)
            .request_deposit(1)
            .success_refund(0)
            .build()
            .unwrap(),
    );
    let layer = constant(secs(1), 3).budget(budget.clone()).build().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    for _ in 0..5 {
        let outcome =
            tokio::time::timeout(Duration::from_millis(500), svc.clone().oneshot(())).await;
        assert!(outcome.is_err());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(budget.available(), 5, "five deposits, no retry paid");
}

#[tokio::test(start_paused = true)]
async fn on_retry_and_stats_hear_nothing_of_a_retry_dropped_during_its_sleep() {
    let stats = Stats::new();
    let hooked = Arc::new(AtomicU32::new(0));
    let seen = hooked.clone();
    let layer = constant(secs(1), 3)
        .stats(stats.clone())
        .on_retry(move |_, _| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let svc = tower::Layer::layer(&layer, failing(Arc::default()));
    let _ = tokio::time::timeout(Duration::from_millis(500), svc.oneshot(())).await;
    assert_eq!(hooked.load(Ordering::SeqCst), 0);
    let counted = stats.snapshot();
    assert_eq!(
        (counted.requests, counted.attempts, counted.retries),
        (1, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn on_retry_fires_once_per_retry_sent_with_the_outcome_it_replaces() {
    let hooked = Arc::new(Mutex::new(Vec::new()));
    let seen = hooked.clone();
    let prepared = Arc::new(Mutex::new(Vec::new()));
    let layer = constant(secs(1), 3)
        .no_budget()
        .policy(Recording(prepared.clone()))
        .on_retry(move |retry, _| {
            seen.lock()
                .unwrap()
                .push((retry.attempt(), retry.delay(), retry.replaced()));
        })
        .build()
        .unwrap();
    let svc = tower::Layer::layer(&layer, failing(Arc::default()));
    assert_eq!(svc.oneshot(()).await, Err(3));
    let error = OutcomeKind::Error;
    assert_eq!(
        *hooked.lock().unwrap(),
        vec![(1, secs(1), error), (2, secs(1), error)]
    );
    // The policy sees the same retries, with the very outcomes they replace.
    assert_eq!(
        *prepared.lock().unwrap(),
        vec![(1, secs(1), Err(1)), (2, secs(1), Err(2))]
    );
}

/// Retries every error, recording each retry its `prepare_retry` sees: the
/// attempt that failed, the delay, and the outcome replaced.
#[derive(Clone)]
struct Recording(Arc<Mutex<Vec<Prepared>>>);

/// The attempt that failed, the delay and the outcome replaced.
type Prepared = (u32, Duration, Result<(), u32>);

impl Policy<(), (), u32> for Recording {
    fn classify(&self, request: &(), outcome: &Result<(), u32>) -> Decision {
        RetryOnError.classify(request, outcome)
    }
    fn clone_request(&self, _: &()) -> Option<()> {
        Some(())
    }
    fn prepare_retry(&self, retry: PrepareRetry<'_, (), (), u32>) {
        let args = *retry.args();
        let replaced = retry.into_replaced();
        self.0
            .lock()
            .unwrap()
            .push((args.attempt(), args.delay(), replaced));
    }
}

// --- readiness fails before the retry ------------------------------------------

/// Ready for its first call; every later `poll_ready` fails.
#[derive(Clone)]
struct BreaksAfterFirstCall {
    calls: Arc<AtomicU32>,
}

impl Service<()> for BreaksAfterFirstCall {
    type Response = &'static str;
    type Error = &'static str;
    type Future = std::future::Ready<Result<&'static str, &'static str>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        if self.calls.load(Ordering::SeqCst) == 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Ready(Err("not ready"))
        }
    }

    fn call(&mut self, (): ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err("attempt 1 failed"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_readiness_error_before_a_retry_returns_the_last_outcome_and_charges_nothing() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let stats = Stats::new();
    let layer = constant(secs(1), 3)
        .budget(bucket.clone())
        .stats(stats.clone())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(
        &layer,
        BreaksAfterFirstCall {
            calls: calls.clone(),
        },
    );
    assert_eq!(svc.oneshot(()).await, Err("attempt 1 failed"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(bucket.available(), 10);
    let counted = stats.snapshot();
    assert_eq!((counted.attempts, counted.retries), (1, 0));
    assert_eq!(counted.gave_up_final, 1);
}

// --- the budget says no only at send ------------------------------------------

/// Looks generous when asked, refuses when the retry is paid for: another
/// client spent the room during this request's sleep.
struct SpentMeanwhile {
    refused: AtomicU32,
}

impl Budget for SpentMeanwhile {
    fn would_allow(&self, _: Cause) -> bool {
        true
    }
    fn try_retry(&self, _: Cause) -> bool {
        self.refused.fetch_add(1, Ordering::SeqCst);
        false
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_refusing_at_send_returns_the_kept_outcome_after_the_sleep() {
    let budget = Arc::new(SpentMeanwhile {
        refused: AtomicU32::new(0),
    });
    let stats = Stats::new();
    let layer = constant(secs(1), 3)
        .budget(budget.clone())
        .stats(stats.clone())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(1));
    assert_eq!(started.elapsed(), secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(budget.refused.load(Ordering::SeqCst), 1);
    assert_eq!(stats.snapshot().budget_refusals, 1);
}

/// Refuses when asked at decision time.
struct Empty;

impl Budget for Empty {
    fn would_allow(&self, _: Cause) -> bool {
        false
    }
    fn try_retry(&self, _: Cause) -> bool {
        panic!("a retry refused at decision time is never sent")
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_that_would_refuse_ends_the_request_at_once_without_sleeping() {
    let layer = constant(secs(1), 3).budget(Empty).build().unwrap();
    let svc = tower::Layer::layer(&layer, failing(Arc::default()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(1));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

// --- the time limit passes while waiting for readiness ---------------------------

/// Ready at once for its first call; before each later call it is busy for
/// `busy`, then ready.
struct SlowToReady {
    busy: Duration,
    calls: Arc<AtomicU32>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Clone for SlowToReady {
    fn clone(&self) -> Self {
        Self {
            busy: self.busy,
            calls: self.calls.clone(),
            sleep: None,
        }
    }
}

impl Service<()> for SlowToReady {
    type Response = ();
    type Error = u32;
    type Future = std::future::Ready<Result<(), u32>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), u32>> {
        if self.calls.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(Ok(()));
        }
        let busy = self.busy;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(busy)));
        std::task::ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        self.sleep = None;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Err(n))
    }
}

#[tokio::test(start_paused = true)]
async fn a_time_limit_passed_while_waiting_for_readiness_returns_the_kept_outcome() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let layer = constant(Duration::from_millis(100), 3)
        .max_elapsed(secs(1))
        .budget(bucket.clone())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(
        &layer,
        SlowToReady {
            busy: secs(5),
            calls: calls.clone(),
            sleep: None,
        },
    );
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(1));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no attempt started past the limit"
    );
    // Returned at the time limit, not when the service got ready at last
    // (5.1 s): the readiness wait races the deadline.
    assert_eq!(started.elapsed(), secs(1));
    assert_eq!(bucket.available(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_readiness_ends_exactly_at_the_deadline_still_goes_out() {
    // Sleep 100 ms, then the service is busy 900 ms: ready at exactly 1 s.
    let layer = constant(Duration::from_millis(100), 2)
        .max_elapsed(secs(1))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(
        &layer,
        SlowToReady {
            busy: Duration::from_millis(900),
            calls: calls.clone(),
            sleep: None,
        },
    );
    assert_eq!(svc.oneshot(()).await, Err(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_sleep_allowed_to_end_at_the_deadline_is_not_late_for_the_timers_rounding() {
    // Off the millisecond grid, tokio's timer wakes a 1 s sleep 0.5 ms late:
    // past the 1 s deadline, but only by the timer's rounding.
    tokio::time::advance(Duration::from_micros(500)).await;
    let layer = constant(secs(1), 2).max_elapsed(secs(1)).build().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    let started = Instant::now();
    assert_eq!(svc.oneshot(()).await, Err(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(started.elapsed() > secs(1), "the wake-up was rounded up");
}

// --- zero delays cooperate with the runtime --------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn zero_delay_retries_yield_to_other_tasks() {
    let ticked = Arc::new(AtomicBool::new(false));
    let ticker = {
        let ticked = ticked.clone();
        tokio::spawn(async move { ticked.store(true, Ordering::SeqCst) })
    };
    let saw_tick = Arc::new(AtomicU32::new(0));
    let seen = saw_tick.clone();
    let failing = service_fn(move |()| {
        if ticked.load(Ordering::SeqCst) {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        async { Err::<(), ()>(()) }
    });
    let layer = constant(Duration::ZERO, 10_000)
        .no_budget()
        .build()
        .unwrap();
    let svc = tower::Layer::layer(&layer, failing);
    assert!(svc.oneshot(()).await.is_err());
    ticker.await.unwrap();
    // On one thread the ticker can only run if the retries gave way: without
    // cooperation all 10,000 attempts run inside one poll and none sees it.
    assert!(saw_tick.load(Ordering::SeqCst) > 0);
}

// --- transparent retries ----------------------------------------------------------

/// The first attempt never left the client; every later one fails transiently.
fn not_sent_first() -> impl Policy<(), (), u32> + Clone {
    classify_fn(|_: &(), outcome: &Result<(), u32>| match outcome {
        Ok(()) => Decision::Success,
        Err(1) => Decision::retry().because(Cause::NotSent),
        Err(_) => Decision::retry(),
    })
}

#[tokio::test(start_paused = true)]
async fn a_transparent_retry_does_not_count_against_max_attempts_nor_the_budget() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .capacity(10)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let layer = constant(secs(1), 2)
        .policy(not_sent_first())
        .budget(bucket.clone())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    let started = Instant::now();
    // 1: not sent, retried at once and for free; 2: fails, retried after 1 s
    // (the one counted retry of max_attempts(2)); 3: fails, returned.
    assert_eq!(svc.oneshot(()).await, Err(3));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(started.elapsed(), secs(1));
    assert_eq!(bucket.available(), 5, "only the counted retry paid");
}

#[tokio::test(start_paused = true)]
async fn only_one_transparent_retry_per_request() {
    let always_not_sent = classify_fn(|_: &(), outcome: &Result<(), u32>| match outcome {
        Ok(()) => Decision::Success,
        Err(_) => Decision::retry().because(Cause::NotSent),
    });
    let layer = constant(secs(1), 2)
        .policy(always_not_sent)
        .no_budget()
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    assert_eq!(svc.oneshot(()).await, Err(3));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_one_turns_transparent_retries_off_too() {
    let layer = constant(secs(1), 1)
        .policy(not_sent_first())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = tower::Layer::layer(&layer, failing(calls.clone()));
    assert_eq!(svc.oneshot(()).await, Err(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// --- each retry is prepared from the unprepared request -----------------------------

/// Appends the attempt number to the request of each retry.
#[derive(Clone)]
struct Stamping;

impl Policy<Vec<u32>, (), Vec<u32>> for Stamping {
    fn classify(&self, _: &Vec<u32>, outcome: &Result<(), Vec<u32>>) -> Decision {
        match outcome {
            Ok(()) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }
    fn clone_request(&self, request: &Vec<u32>) -> Option<Vec<u32>> {
        Some(request.clone())
    }
    fn prepare_retry(&self, mut retry: PrepareRetry<'_, Vec<u32>, (), Vec<u32>>) {
        let attempt = retry.args().attempt() + 1;
        retry.request_mut().push(attempt);
    }
}

#[tokio::test(start_paused = true)]
async fn prepare_retry_stamps_each_retry_once_and_never_the_first_attempt() {
    let layer = BackoffLayer::builder()
        .policy(Stamping)
        .schedule(Constant::new(secs(1)))
        .max_attempts(3)
        .no_budget()
        .build()
        .unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let echo = service_fn(move |request: Vec<u32>| {
        log.lock().unwrap().push(request.clone());
        async move { Err::<(), _>(request) }
    });
    let svc = tower::Layer::layer(&layer, echo);
    assert_eq!(svc.oneshot(vec![0]).await, Err(vec![0, 3]));
    assert_eq!(*sent.lock().unwrap(), vec![vec![0], vec![0, 2], vec![0, 3]]);
}

// --- a replay body that outgrew its limit during the sleep -----------------------------

#[cfg(feature = "hyper")]
mod replay {
    use super::*;
    use bytes::Bytes;
    use http::{Method, Request, Response, StatusCode};
    use http_body::Frame;
    use http_body_util::{BodyExt, Empty, StreamBody};
    use tower_backoff::http::{HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo};

    type Body = ReplayBody<
        StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>>,
    >;

    /// A 100 KiB upload in 4 KiB chunks: more than the 64 KiB a replay body
    /// records by default.
    fn upload() -> Request<Body> {
        let chunks: Vec<_> = (0..25)
            .map(|_| Ok(Frame::data(Bytes::from(vec![b'u'; 4096]))))
            .collect();
        let body = ReplayBody::new(StreamBody::new(futures::stream::iter(chunks)));
        Request::builder()
            .method(Method::PUT)
            .uri("http://store.test/object")
            .body(body)
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_upload_that_outgrows_its_replay_limit_during_the_sleep_returns_the_503() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        // Like hyper: answers 503 before reading the body, and keeps writing
        // the abandoned upload in the background.
        let server = service_fn(move |request: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = request.into_body().collect().await;
            });
            async {
                let mut response = Response::new(Empty::<Bytes>::new());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, std::io::Error>(response)
            }
        });
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(secs(1)))
            .build()
            .unwrap();
        let svc = tower::Layer::layer(&HttpRetryLayer::from(layer), server);
        let response = svc
            .oneshot(upload())
            .await
            .expect("the real 503, not an error");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "no retry of a body it cannot replay"
        );
        let info = response.extensions().get::<RetryInfo>().unwrap();
        assert_eq!(info.attempts, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_future_shows_its_attempts_and_time_slept() {
    let layer = constant(secs(1), 3).build().unwrap();
    let mut svc = tower::Layer::layer(&layer, failing(Arc::default()));
    let future = svc.ready().await.unwrap().call(());
    let shown = format!("{future:?}");
    assert!(shown.starts_with("ResponseFuture"), "{shown}");
    assert!(shown.contains("attempts: 1"), "{shown}");
    assert!(shown.contains("slept: 0ns"), "{shown}");
}
