//! Cells of the interaction matrix (`docs/MATRIX.md`) no other test covered:
//! two capabilities on at once, and what the crate does then. Tower
//! `service_fn`s and hand-written services on tokio's paused clock for the
//! core; a hyper server on 127.0.0.1 for HTTP.

#[cfg(feature = "hyper")]
use crate::http_server;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::breaker::{BreakerState, CircuitBreaker};
use tower_backoff::{classify_fn, AdaptivePacing, BackoffLayer, Cause, Constant, Decision, Jitter};

const STEP: Duration = Duration::from_millis(100);

/// When each attempt asked for readiness (all but the first) and went out.
#[derive(Default)]
struct Log {
    asked: Vec<Instant>,
    sent: Vec<Instant>,
}

/// A service whose first `fails` calls fail after `latency`, and whose
/// readiness before every call but the first takes `wait`.
struct SlowToReady {
    fails: usize,
    latency: Duration,
    wait: Duration,
    log: Arc<Mutex<Log>>,
    gate: Option<Pin<Box<Sleep>>>,
}

impl SlowToReady {
    fn new(fails: usize, latency: Duration, wait: Duration) -> Self {
        Self {
            fails,
            latency,
            wait,
            log: Arc::default(),
            gate: None,
        }
    }
}

impl Clone for SlowToReady {
    fn clone(&self) -> Self {
        Self {
            gate: None,
            log: self.log.clone(),
            ..*self
        }
    }
}

impl Service<u32> for SlowToReady {
    type Response = u32;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u32, io::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        if self.log.lock().unwrap().sent.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let (log, wait) = (&self.log, self.wait);
        let gate = self.gate.get_or_insert_with(|| {
            log.lock().unwrap().asked.push(Instant::now());
            Box::pin(tokio::time::sleep(wait))
        });
        ready!(gate.as_mut().poll(cx));
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, n: u32) -> Self::Future {
        self.gate = None;
        let mut log = self.log.lock().unwrap();
        log.sent.push(Instant::now());
        let fail = log.sent.len() <= self.fails;
        let latency = self.latency;
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            if fail {
                Err(io::Error::other("busy"))
            } else {
                Ok(n)
            }
        })
    }
}

/// A service that never answers, counting its calls.
fn hanging(
    calls: &Arc<AtomicU32>,
) -> impl Service<u32, Response = u32, Error = io::Error, Future = impl Send> + Clone {
    let calls = calls.clone();
    service_fn(move |n: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            Ok::<_, io::Error>(n)
        }
    })
}

/// A service whose first `fails` calls fail at once, counting its calls.
fn failing(
    fails: u32,
    calls: &Arc<AtomicU32>,
) -> impl Service<u32, Response = u32, Error = io::Error, Future = impl Send> + Clone {
    let calls = calls.clone();
    service_fn(move |n: u32| {
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if call <= fails {
                Err(io::Error::other(format!("call {call} failed")))
            } else {
                Ok(n)
            }
        }
    })
}

/// A breaker with no jitter that opens at half of `min` attempts, for 5 s.
fn breaker(min: u32) -> CircuitBreaker {
    CircuitBreaker::builder()
        .min_throughput(min)
        .break_duration(Duration::from_secs(5))
        .break_jitter(0.0)
        .build()
        .unwrap()
}

// --- breaker × attempt timeout ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn attempts_cut_by_the_attempt_timeout_open_the_breaker() {
    let calls = Arc::new(AtomicU32::new(0));
    let breaker = breaker(4);
    let svc = BackoffLayer::builder()
        .max_attempts(1)
        .attempt_timeout(STEP)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
        .layer(hanging(&calls));
    for n in 0..4 {
        assert_eq!(breaker.state(), BreakerState::Closed, "before attempt {n}");
        let error = svc.clone().oneshot(n).await.unwrap_err();
        assert!(error.is_timeout(), "{error}");
    }
    assert_eq!(
        breaker.state(),
        BreakerState::Open,
        "four time-outs of four"
    );
    let error = svc.oneshot(9).await.unwrap_err();
    assert!(error.is_breaker_open(), "{error}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the rejected request never left"
    );
}

// --- breaker × server delay ----------------------------------------------------

/// A layer whose policy asks for a retry after `delay` on every error, as a
/// server naming its delay would, through `breaker`.
fn told_to_wait(
    delay: Duration,
    breaker: &CircuitBreaker,
) -> BackoffLayer<
    impl tower_backoff::Policy<u32, u32, tower_backoff::Error<io::Error>> + Clone,
    tower_backoff::deadline::Guarded,
> {
    BackoffLayer::builder()
        .policy(classify_fn(
            move |_: &u32, result: &Result<u32, tower_backoff::Error<io::Error>>| match result {
                Ok(_) => Decision::Success,
                Err(_) => Decision::retry_after(delay),
            },
        ))
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_retry_waiting_a_server_delay_the_breaker_opened_for_returns_the_servers_answer() {
    let calls = Arc::new(AtomicU32::new(0));
    let breaker = breaker(2);
    let svc = told_to_wait(Duration::from_secs(1), &breaker).layer(failing(1, &calls));
    let call = tokio::spawn(svc.oneshot(7));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Other requests fail while this one waits the server's second.
    breaker.record(true);
    breaker.record(true);
    assert_eq!(breaker.state(), BreakerState::Open);
    let error = call.await.unwrap().unwrap_err();
    assert!(!error.is_breaker_open(), "{error}");
    assert_eq!(
        error.into_inner().unwrap().to_string(),
        "call 1 failed",
        "the server's answer, not the breaker's"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_server_delay_outlasts_the_break_goes_out_as_the_probe() {
    let calls = Arc::new(AtomicU32::new(0));
    let breaker = breaker(2);
    let svc = told_to_wait(Duration::from_secs(6), &breaker).layer(failing(1, &calls));
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(7));
    tokio::time::sleep(Duration::from_millis(500)).await;
    breaker.record(true);
    breaker.record(true);
    assert_eq!(breaker.state(), BreakerState::Open);
    // The break ends at 5.5 s, before the server's 6 s: the retry probes.
    assert_eq!(call.await.unwrap().unwrap(), 7);
    assert_eq!(start.elapsed(), Duration::from_secs(6));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(breaker.state(), BreakerState::Closed, "the probe succeeded");
}

// --- breaker × deadline --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_retry_the_deadline_stops_returns_the_real_error_and_the_breaker_counts_only_attempts_sent(
) {
    let calls = Arc::new(AtomicU32::new(0));
    let breaker = breaker(2);
    let svc = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(2)))
        .jitter(Jitter::None)
        .no_budget()
        .max_elapsed(Duration::from_secs(1))
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
        .layer(failing(u32::MAX, &calls));
    let start = Instant::now();
    for sent in 1..=2 {
        let error = svc.clone().oneshot(7).await.unwrap_err();
        assert!(error.get_ref().is_some(), "the real error: {error}");
        assert_eq!(breaker.window(), (sent, sent), "one attempt per request");
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let error = svc.oneshot(7).await.unwrap_err();
    assert!(error.is_breaker_open(), "{error}");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "nothing waited for the deadline"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// --- budget × deadline ---------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_retry_the_deadline_stops_charges_the_budget_nothing() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(2)))
        .jitter(Jitter::None)
        .max_elapsed(Duration::from_secs(1))
        .build()
        .unwrap();
    let before = layer.budget().and_then(|b| b.balance());
    assert_eq!(before, Some(2), "the default budget");
    let start = Instant::now();
    let error = layer
        .layer(failing(u32::MAX, &calls))
        .oneshot(7)
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "call 1 failed");
    assert_eq!(start.elapsed(), Duration::ZERO, "ended at once, no sleep");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.budget().and_then(|b| b.balance()), before);
}

// --- attempt timeout × server delay --------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_server_delay_longer_than_the_attempt_timeout_is_waited_in_full() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &u32, result: &Result<u32, tower_backoff::Error<io::Error>>| match result {
                Ok(_) => Decision::Success,
                Err(_) => Decision::retry_after(Duration::from_secs(5)),
            },
        ))
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
        .layer(failing(1, &calls));
    let start = Instant::now();
    assert_eq!(svc.oneshot(7).await.unwrap(), 7);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// --- attempt timeout × readiness -----------------------------------------------

#[tokio::test(start_paused = true)]
async fn waiting_for_readiness_does_not_count_against_the_attempt_timeout() {
    // The retry waits 5 s for readiness, five times the attempt timeout,
    // then answers in 10 ms: it is not cut short.
    let inner = SlowToReady::new(1, Duration::from_millis(10), Duration::from_secs(5));
    let log = inner.log.clone();
    let svc = BackoffLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
        .layer(inner);
    let start = Instant::now();
    assert_eq!(svc.oneshot(7).await.unwrap(), 7);
    let log = log.lock().unwrap();
    let sent: Vec<Duration> = log.sent.iter().map(|at| *at - start).collect();
    assert_eq!(
        sent,
        [Duration::ZERO, Duration::from_millis(10 + 100 + 5_000)],
        "two attempts: the retry went out once ready and answered"
    );
}

// --- server delay × readiness --------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_retry_waits_the_server_delay_then_readiness_and_never_goes_out_before_the_delay() {
    let inner = SlowToReady::new(1, Duration::ZERO, Duration::from_millis(500));
    let log = inner.log.clone();
    let svc = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &u32, result: &Result<u32, io::Error>| match result {
                Ok(_) => Decision::Success,
                Err(_) => Decision::retry_after(Duration::from_secs(2)),
            },
        ))
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .build()
        .unwrap()
        .layer(inner);
    let start = Instant::now();
    assert_eq!(svc.oneshot(7).await.unwrap(), 7);
    let log = log.lock().unwrap();
    let asked: Vec<Duration> = log.asked.iter().map(|at| *at - start).collect();
    let sent: Vec<Duration> = log.sent.iter().map(|at| *at - start).collect();
    assert_eq!(asked, [Duration::from_secs(2)], "readiness after the delay");
    assert_eq!(sent, [Duration::ZERO, Duration::from_millis(2_500)]);
}

// --- replay × server delay, over HTTP ------------------------------------------

#[cfg(feature = "hyper")]
mod http {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, StatusCode};
    use http_body::Frame;
    use http_body_util::StreamBody;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::{ServiceBuilder, ServiceExt};
    use tower_backoff::http::{HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo};
    use tower_backoff::{BackoffLayer, Constant, Jitter};

    use super::http_server::{http_layer, status, status_with, Server};

    /// A streaming upload of 16 KiB, and the bytes it sends.
    fn upload() -> (
        impl http_body::Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
        Bytes,
    ) {
        let frames: Vec<Bytes> = (0..16u8).map(|i| Bytes::from(vec![i; 1024])).collect();
        let whole = Bytes::from(frames.concat());
        let body = StreamBody::new(futures::stream::iter(
            frames
                .into_iter()
                .map(|f| Ok::<_, Infallible>(Frame::data(f))),
        ));
        (body, whole)
    }

    #[tokio::test(start_paused = true)]
    async fn an_upload_told_to_come_back_in_two_seconds_is_replayed_whole_after_two_seconds() {
        let server = Server::start(|n, _| {
            if n == 0 {
                status_with(503, &[("retry-after", "2")])
            } else {
                status(200)
            }
        })
        .await;
        // Exact delays: no upward jitter on the server's.
        let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
        let svc = ServiceBuilder::new()
            .layer(http_layer(policy))
            .service(Client::builder(TokioExecutor::new()).build_http());
        let (body, whole) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let info = *response.extensions().get::<RetryInfo>().unwrap();
        assert_eq!(info, RetryInfo::new(2, Duration::from_secs(2)));
        let seen = server.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!((&seen[0].body, &seen[1].body), (&whole, &whole));
        let gap = seen[1].at - seen[0].at;
        assert!(
            gap >= Duration::from_secs(2) && gap < Duration::from_millis(2_050),
            "{gap:?}"
        );
    }
    #[tokio::test(start_paused = true)]
    async fn an_upload_past_its_replay_limit_returns_the_503_and_charges_the_budget_nothing() {
        let server = Server::start(|_, _| status(503)).await;
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .build()
            .unwrap();
        let before = layer.budget().and_then(|b| b.balance());
        assert_eq!(before, Some(2), "the default budget");
        let svc = ServiceBuilder::new()
            .layer(HttpRetryLayer::from(layer.clone()))
            .service(Client::builder(TokioExecutor::new()).build_http());
        let (body, whole) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::with_limit(body, 4 * 1024))
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let seen = server.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].body, whole, "the one attempt is sent whole");
        assert_eq!(layer.budget().and_then(|b| b.balance()), before);
    }
}

// --- breaker × readiness -------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_retry_the_breaker_stops_after_readiness_gives_the_concurrency_permit_back() {
    use futures::FutureExt;
    use tower::limit::ConcurrencyLimit;

    let calls = Arc::new(AtomicU32::new(0));
    let breaker = breaker(2);
    let limited = ConcurrencyLimit::new(failing(u32::MAX, &calls), 1);
    let mut other = limited.clone();
    let mut svc = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .no_budget()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
        .layer(limited);
    svc.ready().await.unwrap();
    let mut call = Box::pin(svc.call(7));
    let sleeping = tokio::time::timeout(Duration::from_millis(500), call.as_mut()).await;
    assert!(
        sleeping.is_err(),
        "the first attempt failed: its retry sleeps"
    );
    // Other requests fail while this one sleeps: the breaker opens, and the
    // retry, once its service is ready, is stopped at send.
    breaker.record(true);
    breaker.record(true);
    assert_eq!(breaker.state(), BreakerState::Open);
    let error = call.as_mut().await.unwrap_err();
    assert!(!error.is_breaker_open(), "{error}");
    assert_eq!(
        error.into_inner().unwrap().to_string(),
        "call 1 failed",
        "the real outcome"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry never went out");
    assert_the_permit_is_free(&other);
    drop(call);
    assert!(
        other.ready().now_or_never().is_some(),
        "dropped, it gives it back"
    );
}

/// `other`, a clone of a concurrency limit of one, can take the permit: the
/// one a retry's readiness took must be back once the retry was stopped at
/// send, while its finished future is still held.
fn assert_the_permit_is_free<S: Service<u32> + Clone>(other: &tower::limit::ConcurrencyLimit<S>) {
    use futures::FutureExt;
    assert!(
        other.clone().ready_oneshot().now_or_never().is_some(),
        "the permit the retry's readiness took is free for another caller"
    );
}

// --- breaker × readiness: a retry the budget or the deadline stops at send ----

#[tokio::test(start_paused = true)]
async fn a_retry_the_budget_refuses_after_readiness_gives_the_concurrency_permit_back() {
    use tower::limit::ConcurrencyLimit;
    use tower_backoff::{Budget, TokenBucket};

    let calls = Arc::new(AtomicU32::new(0));
    let limited = ConcurrencyLimit::new(failing(u32::MAX, &calls), 1);
    let other = limited.clone();
    // One retry's worth: enough when the retry is decided.
    let bucket = Arc::new(
        TokenBucket::builder()
            .initial_tokens(5)
            .retry_cost(5)
            .build()
            .unwrap(),
    );
    let mut svc = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .budget(bucket.clone())
        .build()
        .unwrap()
        .layer(limited);
    svc.ready().await.unwrap();
    let mut call = Box::pin(svc.call(7));
    let sleeping = tokio::time::timeout(Duration::from_millis(500), call.as_mut()).await;
    assert!(
        sleeping.is_err(),
        "the first attempt failed: its retry sleeps"
    );
    // Another request spends the budget during the sleep: the retry, once
    // its service is ready, is refused at send.
    assert!(bucket.try_retry(Cause::Transient));
    assert_eq!(bucket.balance(), Some(0));
    let error = call.as_mut().await.unwrap_err();
    assert_eq!(error.to_string(), "call 1 failed", "the real outcome");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry never went out");
    assert_the_permit_is_free(&other);
}

#[tokio::test(start_paused = true)]
async fn a_retry_ready_only_past_the_deadline_gives_the_concurrency_permit_back() {
    use futures::FutureExt;
    use tower::limit::ConcurrencyLimit;

    let calls = Arc::new(AtomicU32::new(0));
    let limited = ConcurrencyLimit::new(failing(u32::MAX, &calls), 1);
    let mut holder = limited.clone();
    let other = limited.clone();
    let mut svc = BackoffLayer::builder()
        .schedule(Constant::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .no_budget()
        .max_elapsed(Duration::from_millis(1_500))
        .build()
        .unwrap()
        .layer(limited);
    svc.ready().await.unwrap();
    // Polled by hand, so the permit can come back past the deadline before
    // the future sees its alarm: readiness is then answered first.
    let mut call = Box::pin(svc.call(7));
    assert!(call.as_mut().now_or_never().is_none(), "the retry sleeps");
    holder.ready().await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        call.as_mut().now_or_never().is_none(),
        "the retry waits for the permit"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(holder);
    let error = call
        .as_mut()
        .now_or_never()
        .expect("ready past the deadline: ended at send")
        .unwrap_err();
    assert_eq!(error.to_string(), "call 1 failed", "the real outcome");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry never went out");
    assert_the_permit_is_free(&other);
}

// --- pacing --------------------------------------------------------------------

/// The interval [`engaged_pacing`] leaves: one send every 1.5 s.
const PACED: Duration = Duration::from_millis(1_500);

/// Pacing with unrandomized slots, engaged by another client of it: two
/// throttled answers a second apart, the second closing the round the first
/// opened with one send in it and nothing accepted (an outage), cut it one
/// ×1.5 step below that send a second.
async fn engaged_pacing() -> AdaptivePacing {
    let pacing = AdaptivePacing::builder()
        .randomization(0.0)
        .build()
        .unwrap();
    let throttled = BackoffLayer::builder()
        .policy(classify_fn(|_: &u32, _: &Result<u32, io::Error>| {
            Decision::retry().because(Cause::Throttled)
        }))
        .max_attempts(1)
        .pacing(pacing.clone())
        .build()
        .unwrap()
        .layer(service_fn(|n: u32| async move { Ok::<_, io::Error>(n) }));
    throttled.clone().oneshot(0).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    throttled.oneshot(1).await.unwrap();
    assert_eq!(pacing.interval(), PACED);
    pacing
}

/// A service whose first `fails` calls fail after `latency` and whose others
/// answer after it, recording when each call went out.
fn logged(
    fails: usize,
    latency: Duration,
    sent: &Arc<Mutex<Vec<Instant>>>,
) -> impl Service<u32, Response = u32, Error = io::Error, Future = impl Send> + Clone {
    let sent = sent.clone();
    service_fn(move |n: u32| {
        let call = {
            let mut sent = sent.lock().unwrap();
            sent.push(Instant::now());
            sent.len()
        };
        async move {
            tokio::time::sleep(latency).await;
            if call <= fails {
                Err(io::Error::other(format!("call {call} failed")))
            } else {
                Ok(n)
            }
        }
    })
}

// --- breaker × pacing ----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_open_breaker_rejects_a_paced_request_at_call_and_the_pacing_counts_no_send() {
    let pacing = engaged_pacing().await;
    let breaker = breaker(2);
    breaker.record(true);
    breaker.record(true);
    assert_eq!(breaker.state(), BreakerState::Open);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = BackoffLayer::builder()
        .no_budget()
        .pacing(pacing.clone())
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
        .layer(failing(0, &calls));
    let before = pacing.metrics();
    let start = Instant::now();
    // Pacing is backpressure in `poll_ready`; the breaker is asked at call.
    svc.ready().await.unwrap();
    assert_eq!(start.elapsed(), PACED, "the caller waited for its slot");
    let error = svc.call(7).await.unwrap_err();
    assert!(error.is_breaker_open(), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let after = pacing.metrics();
    assert_eq!(after.sleeps, before.sleeps + 1, "the wait is counted");
    assert_eq!(
        after.invocations, before.invocations,
        "but no send: nothing went out"
    );
    assert_eq!(after.interval, PACED, "and the rejection taught it nothing");
    assert_eq!(after.raised, before.raised);
}

// --- pacing × attempt timeout --------------------------------------------------

#[tokio::test(start_paused = true)]
async fn waiting_for_a_pacing_slot_does_not_count_against_the_attempt_timeout() {
    let pacing = engaged_pacing().await;
    let latency = Duration::from_millis(10);
    let sent = Arc::new(Mutex::new(Vec::new()));
    let svc = BackoffLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .max_attempts(2)
        .attempt_timeout(Duration::from_secs(1))
        .pacing(pacing.clone())
        .build()
        .unwrap()
        .layer(logged(1, latency, &sent));
    let before = pacing.metrics();
    assert_eq!(svc.oneshot(7).await.unwrap(), 7, "no attempt timed out");
    let sent = sent.lock().unwrap();
    assert_eq!(sent.len(), 2);
    // The first attempt failed after 10 ms, its retry slept STEP, then
    // waited for its slot 1.5 s after the first attempt's: longer than the
    // attempt timeout.
    let waited = sent[1] - sent[0] - latency - STEP;
    assert!(waited > Duration::from_secs(1), "{waited:?}");
    assert_eq!(sent[1] - sent[0], PACED);
    assert_eq!(pacing.metrics().sleeps, before.sleeps + 2);
}

// --- pacing × server delay -----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_retry_waits_the_server_delay_then_its_pacing_slot_and_the_delay_cuts_the_pacing() {
    let pacing = engaged_pacing().await;
    // When each call went out, and how many cuts the pacing had made then.
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let watched = pacing.clone();
    let inner = service_fn(move |n: u32| {
        let call = {
            let mut sent = log.lock().unwrap();
            sent.push((Instant::now(), watched.metrics().raised));
            sent.len()
        };
        async move {
            if call == 1 {
                Err(io::Error::other("busy"))
            } else {
                Ok(n)
            }
        }
    });
    let delay = Duration::from_secs(1);
    let svc = BackoffLayer::builder()
        .policy(classify_fn(
            move |_: &u32, result: &Result<u32, io::Error>| match result {
                Ok(_) => Decision::Success,
                // Not throttled by its cause: by the server's delay alone.
                Err(_) => Decision::retry_after(delay),
            },
        ))
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .pacing(pacing.clone())
        .build()
        .unwrap()
        .layer(inner);
    let before = pacing.metrics();
    assert_eq!(svc.oneshot(7).await.unwrap(), 7);
    let sent = sent.lock().unwrap();
    let [(first, cuts), (retry, cuts_then)] = sent[..] else {
        panic!("two attempts: {sent:?}");
    };
    // The delayed failure ended the pacing's round: a throttled round, cut
    // (a plain failure would have left it as it was). Nothing got through,
    // so the cut keeps one step below the last send rate: still 1.5 s.
    assert_eq!(cuts_then, cuts + 1, "the server's delay was a throttle");
    // The retry waited the server's 1 s, then the rest of the way to its
    // slot, 1.5 s after the first attempt's; a slot waited for before the
    // delay would have come 1.5 s + 1 s after it.
    let gap = retry - first;
    assert!(gap > delay, "{gap:?}");
    assert_eq!(gap, PACED, "the slot, not the slot plus the delay");
    assert_eq!(pacing.metrics().sleeps, before.sleeps + 2, "both waited");
}

// --- replay, buffering, breaker, budget, deadline and readiness over HTTP ------

#[cfg(feature = "hyper")]
mod http_bodies {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use futures::StreamExt;
    use http::{Request, Response, StatusCode};
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tokio::time::Instant;
    use tower::limit::ConcurrencyLimit;
    use tower::{Layer, ServiceBuilder, ServiceExt};
    use tower_backoff::breaker::CircuitBreaker;
    use tower_backoff::budget::{Budget, TokenBucket};
    use tower_backoff::http::{
        HttpPolicy, HttpRetryLayer, ReplayBody, RetryInfo, DEFAULT_RESPONSE_BUFFER_LIMIT,
    };

    /// These cells are each a seam with the read-ahead, which is off by
    /// default: every layer here asks for it.
    const READ_AHEAD: usize = DEFAULT_RESPONSE_BUFFER_LIMIT;
    use tower_backoff::{BackoffLayer, Cause, Constant, Hedging, Jitter};

    use super::http_server::{http_layer, http_layer_with, status, with_body, Reply, Server};

    /// `len` bytes that differ from their neighbours, so a dropped or
    /// reordered chunk shows.
    fn pattern(len: usize) -> Bytes {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// A `200` with its whole body and its `content-length`.
    fn whole(body: Bytes) -> Reply {
        let mut response = Response::new(http_body_util::Full::new(body).boxed());
        *response.status_mut() = StatusCode::OK;
        Reply::Respond(response)
    }

    /// A `200` that promises `content-length: 1000`, sends 100 bytes, then
    /// either ends (hyper closes the connection mid-body) or, with `stall`,
    /// sends nothing more.
    fn cut_short(stall: bool) -> Reply {
        let sent = futures::stream::once(async { Ok::<_, Infallible>(Frame::data(pattern(100))) });
        let body = if stall {
            BodyExt::boxed(StreamBody::new(sent.chain(futures::stream::pending())))
        } else {
            BodyExt::boxed(StreamBody::new(sent))
        };
        let mut response = Response::new(body);
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, "1000".parse().unwrap());
        Reply::Respond(response)
    }

    /// A streaming upload of 16 KiB, the bytes it sends, and how many of its
    /// frames were read.
    fn upload() -> (
        impl http_body::Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
        Bytes,
        Arc<AtomicUsize>,
    ) {
        let frames: Vec<Bytes> = (0..16u8).map(|i| Bytes::from(vec![i; 1024])).collect();
        let whole = Bytes::from(frames.concat());
        let read = Arc::new(AtomicUsize::new(0));
        let counter = read.clone();
        let body = StreamBody::new(futures::stream::iter(frames).map(move |f| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Frame::data(f))
        }));
        (body, whole, read)
    }

    fn get(server: &Server) -> Request<http_body_util::Empty<Bytes>> {
        Request::get(server.url("/"))
            .body(Default::default())
            .unwrap()
    }

    fn attempts<B>(response: &Response<B>) -> u32 {
        response.extensions().get::<RetryInfo>().unwrap().attempts
    }

    // --- breaker × replay ----------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_streaming_upload_the_open_breaker_rejects_is_not_sent_and_its_body_not_read() {
        let server = Server::start(|_, _| status(503)).await;
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .max_attempts(1)
                    .circuit_breaker(super::breaker(2))
                    .buffer_limit(READ_AHEAD)
                    .build()
                    .unwrap(),
            )
            .service(Client::builder(TokioExecutor::new()).build_http());
        // Two 503s of two open the host's breaker.
        for _ in 0..2 {
            let request = Request::get(server.url("/")).body(ReplayBody::new(upload().0));
            let response = svc.clone().oneshot(request.unwrap()).await.unwrap();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        let (body, _, read) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let error = svc.oneshot(request).await.unwrap_err();
        assert!(error.is::<tower_backoff::error::BreakerOpen>(), "{error}");
        assert_eq!(server.requests(), 2, "the upload never reached the server");
        assert_eq!(read.load(Ordering::SeqCst), 0, "nor was its body read");
    }

    // --- breaker × buffering -------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_body_cut_short_while_read_ahead_is_a_failed_attempt_for_the_breaker() {
        let server = Server::start(|_, _| cut_short(false)).await;
        let breaker = CircuitBreaker::builder()
            .min_throughput(2)
            .break_duration(Duration::from_secs(5))
            .break_jitter(0.0)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .max_attempts(1)
                    .circuit_breaker_for_all_hosts(breaker.clone())
                    .buffer_limit(READ_AHEAD)
                    .build()
                    .unwrap(),
            )
            .service(Client::builder(TokioExecutor::new()).build_http());
        for sent in 1..=2 {
            let error = svc.clone().oneshot(get(&server)).await.unwrap_err();
            assert!(
                !error.is::<tower_backoff::error::BreakerOpen>(),
                "the read's own error: {error}"
            );
            assert_eq!(breaker.window(), (sent, sent), "every attempt a failure");
        }
        let error = svc.oneshot(get(&server)).await.unwrap_err();
        assert!(error.is::<tower_backoff::error::BreakerOpen>(), "{error}");
        assert_eq!(server.requests(), 2);
    }

    // --- budget × buffering --------------------------------------------------------

    /// A token bucket that records the cause of every retry it is asked to
    /// pay for.
    #[derive(Clone)]
    struct Recording {
        bucket: Arc<TokenBucket>,
        paid: Arc<Mutex<Vec<Cause>>>,
    }

    impl Budget for Recording {
        fn on_first_attempt(&self) {
            self.bucket.on_first_attempt();
        }
        fn would_allow(&self, cause: Cause) -> bool {
            self.bucket.would_allow(cause)
        }
        fn try_retry(&self, cause: Cause) -> bool {
            self.paid.lock().unwrap().push(cause);
            self.bucket.try_retry(cause)
        }
        fn on_success(&self, last_retry: Option<Cause>) {
            self.bucket.on_success(last_retry);
        }
        fn balance(&self) -> Option<u64> {
            self.bucket.balance()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_cut_short_while_read_ahead_is_retried_as_transient_and_charged_to_the_budget() {
        let server = Server::start(|n, _| match n {
            0 => cut_short(false),
            _ => whole(pattern(1000)),
        })
        .await;
        let budget = Recording {
            bucket: Arc::new(
                TokenBucket::builder()
                    .initial_tokens(5)
                    .retry_cost(5)
                    .build()
                    .unwrap(),
            ),
            paid: Arc::default(),
        };
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .budget(budget.clone())
            .build()
            .unwrap();
        let svc = HttpRetryLayer::from(layer)
            .buffer_limit(READ_AHEAD)
            .layer(Client::builder(TokioExecutor::new()).build_http());
        let response = svc.oneshot(get(&server)).await.unwrap();
        assert_eq!(attempts(&response), 2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, pattern(1000), "the retry's whole body");
        assert_eq!(*budget.paid.lock().unwrap(), [Cause::Transient]);
        // Paid at send (a refusal would have returned the cut body's error),
        // then put back by the success it led to, as for any retry.
        assert_eq!(budget.balance(), Some(5));
    }

    // --- deadline × replay ---------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_streaming_upload_whose_retry_the_deadline_stops_returns_the_503_and_is_sent_once() {
        let server = Server::start(|_, _| status(503)).await;
        let svc = ServiceBuilder::new()
            .layer(http_layer_with(
                HttpPolicy::new(),
                Constant::new(Duration::from_secs(2)),
                3,
                Some(Duration::from_secs(1)),
            ))
            .service(Client::builder(TokioExecutor::new()).build_http());
        let (body, whole, _) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let start = Instant::now();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(attempts(&response), 1);
        assert!(start.elapsed() < Duration::from_secs(1), "no sleep");
        let seen = server.seen();
        assert_eq!(seen.len(), 1, "the body was not sent again");
        assert_eq!(seen[0].body, whole);
    }

    // --- deadline × buffering ------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_body_still_read_ahead_at_the_deadline_is_cut_there_and_the_request_times_out() {
        let server = Server::start(|_, _| cut_short(true)).await;
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new())
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .no_budget()
            .attempt_timeout(Duration::from_secs(10))
            .max_elapsed(Duration::from_secs(1))
            .build()
            .unwrap();
        let svc = HttpRetryLayer::from(layer)
            .buffer_limit(READ_AHEAD)
            .layer(Client::builder(TokioExecutor::new()).build_http());
        let start = Instant::now();
        let error = svc.oneshot(get(&server)).await.unwrap_err();
        assert!(error.is::<tower_backoff::error::TimedOut>(), "{error}");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "cut at the deadline"
        );
        assert_eq!(server.requests(), 1);
    }

    // --- replay × buffering --------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn an_upload_answered_with_a_body_cut_short_is_replayed_whole_and_returns_the_retrys_whole_body(
    ) {
        let server = Server::start(|n, _| match n {
            0 => cut_short(false),
            _ => whole(pattern(1000)),
        })
        .await;
        let svc = ServiceBuilder::new()
            .layer(http_layer(HttpPolicy::new()))
            .service(Client::builder(TokioExecutor::new()).build_http());
        let (body, sent, _) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(attempts(&response), 2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, pattern(1000));
        let seen = server.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!((&seen[0].body, &seen[1].body), (&sent, &sent));
    }

    // --- replay × readiness --------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_replayed_retry_waits_for_readiness_and_is_sent_whole_once_ready() {
        let server = Server::start(|n, _| match n {
            0 => status(503),
            _ => status(200),
        })
        .await;
        let limited = ConcurrencyLimit::new(Client::builder(TokioExecutor::new()).build_http(), 1);
        let mut other = limited.clone();
        let svc = ServiceBuilder::new()
            .layer(http_layer(HttpPolicy::new()))
            .service(limited);
        let (body, sent, _) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let call = tokio::spawn(svc.oneshot(request));
        while server.requests() == 0 {
            tokio::task::yield_now().await;
        }
        // Another caller takes the permit once the first attempt gives it
        // back, and keeps it for three seconds.
        other.ready().await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let released = Instant::now();
        drop(other);
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let seen = server.seen();
        assert_eq!(seen.len(), 2);
        assert!(seen[1].at >= released, "the retry waited for the permit");
        assert_eq!((&seen[0].body, &seen[1].body), (&sent, &sent));
    }

    // --- hedge × buffering ---------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_hedged_copy_whose_body_arrives_whole_wins_over_a_first_copy_whose_body_stalls() {
        let server = Server::start(|n, _| match n {
            0 => whole(Bytes::from_static(b"warm")),
            1 => cut_short(true),
            _ => whole(pattern(1000)),
        })
        .await;
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    // One warm-up request at 100 % grants one hedge.
                    .hedge(Hedging::after(Duration::from_millis(100)).max_extra_load(1.0))
                    .buffer_limit(READ_AHEAD)
                    .build()
                    .unwrap(),
            )
            .service(Client::builder(TokioExecutor::new()).build_http());
        let warm = svc.clone().oneshot(get(&server)).await.unwrap();
        assert_eq!(warm.into_body().collect().await.unwrap().to_bytes(), "warm");
        // The first copy's headers come at once; its body stalls, so it has
        // not won when the hedge goes out 100 ms later.
        let response = svc.oneshot(get(&server)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, pattern(1000), "the hedge's whole body");
        assert_eq!(server.requests(), 3);
    }

    // --- pacing × replay -----------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_replayed_retry_waits_its_pacing_slot_and_is_sent_whole_after_the_wait() {
        let pacing = super::engaged_pacing().await;
        let server = Server::start(|n, _| match n {
            0 => status(502),
            _ => status(200),
        })
        .await;
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .schedule(Constant::new(super::STEP))
                    .jitter(Jitter::None)
                    .no_budget()
                    .pacing(pacing.clone())
                    .buffer_limit(READ_AHEAD)
                    .build()
                    .unwrap(),
            )
            .service(Client::builder(TokioExecutor::new()).build_http());
        let before = pacing.metrics();
        let (body, sent, _) = upload();
        let request = Request::put(server.url("/upload"))
            .body(ReplayBody::new(body))
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(attempts(&response), 2);
        let seen = server.seen();
        assert_eq!(seen.len(), 2);
        // Its slot 1.5 s after the first attempt's, far past the 100 ms sleep.
        let gap = seen[1].at - seen[0].at;
        assert!(
            gap >= super::PACED && gap < super::PACED + super::STEP,
            "{gap:?}"
        );
        assert_eq!((&seen[0].body, &seen[1].body), (&sent, &sent));
        let after = pacing.metrics();
        assert_eq!(after.invocations, before.invocations + 2, "two sends");
        assert_eq!(after.sleeps, before.sleeps + 2, "each waited its slot");
    }

    // --- pacing × buffering --------------------------------------------------------

    /// The interval a fresh pacing sets for a round that a 429 opens and
    /// another closes a second later, with four answers from `answer` in it
    /// (one attempt each, so nothing sleeps): what the pacing made of them.
    async fn interval_after(answer: fn() -> Reply) -> Duration {
        let server = Server::start(move |n, _| match n {
            0 | 5 => status(429),
            _ => answer(),
        })
        .await;
        let pacing = tower_backoff::AdaptivePacing::builder()
            .randomization(0.0)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(
                HttpRetryLayer::builder()
                    .max_attempts(1)
                    .no_budget()
                    .pacing(pacing.clone())
                    .buffer_limit(READ_AHEAD)
                    .build()
                    .unwrap(),
            )
            .service(Client::builder(TokioExecutor::new()).build_http());
        for _ in 0..5 {
            let _ = svc.clone().oneshot(get(&server)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = svc.oneshot(get(&server)).await;
        assert_eq!(server.requests(), 6);
        assert_eq!(pacing.metrics().raised, 1, "the second 429 cut the rate");
        pacing.interval()
    }

    #[tokio::test(start_paused = true)]
    async fn the_pacing_hears_bodies_cut_short_while_read_ahead_as_failures_not_as_accepted_sends()
    {
        let cut = interval_after(|| cut_short(false)).await;
        let failed = interval_after(|| status(502)).await;
        let accepted = interval_after(|| whole(pattern(1000))).await;
        // Nothing accepted in the round: an outage, one ×1.5 step below the
        // five sends it counted.
        assert_eq!(cut, Duration::from_millis(300));
        assert_eq!(cut, failed, "as it hears 502s");
        assert_ne!(cut, accepted, "not as it hears whole 200s");
    }

    // --- buffering × readiness -----------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_buffered_response_retried_away_gives_its_connection_back_before_the_retry_asks_for_readiness(
    ) {
        let server = Server::start(|n, _| match n {
            0 => with_body(status(502), "busy"),
            _ => status(200),
        })
        .await;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let limited = ConcurrencyLimit::new(client.clone(), 1);
        let mut other = limited.clone();
        let svc = ServiceBuilder::new()
            .layer(http_layer(HttpPolicy::new()))
            .service(limited);
        let call = tokio::spawn(svc.oneshot(get(&server)));
        while server.requests() == 0 {
            tokio::task::yield_now().await;
        }
        // The retry, after its 100 ms sleep, waits for the permit another
        // caller holds.
        other.ready().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Meanwhile the kept 502, read ahead whole, has left its connection
        // idle in the pool: another request of the same client reuses it.
        let meanwhile = client.request(get(&server)).await.unwrap();
        assert_eq!(meanwhile.status(), StatusCode::OK);
        assert_eq!(server.connections(), 1, "the kept response's connection");
        drop(other);
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(attempts(&response), 2);
        assert_eq!(server.requests(), 3);
        assert_eq!(server.connections(), 1, "the retry reused it too");
    }
}
