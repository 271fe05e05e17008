//! The default budget against a fleet, whatever the server says: every retry
//! is charged whoever named its delay (`Retry-After`, `retry-after-ms`,
//! `RateLimit-Reset`, gRPC pushback), a server delay shorter than the
//! schedule's is raised to it, and a quiet client gets its attempts back.
//!
//! Every fleet here is 1,000 independent processes, each with a layer of its
//! own built with no option but the ones the case names, each sending one
//! request a second (open loop: no process waits for an answer before its
//! next request) through a 60 s full outage, on a current-thread runtime
//! with tokio's paused clock. The bound every case asserts is what one
//! request's retries per process come to: a default bucket starts with
//! `max_attempts - 1` tokens and nothing is earned while nothing succeeds,
//! so a 60 s outage makes at most `1 + (max_attempts - 1) / 60` attempts per
//! request (1.033 for HTTP's 3 attempts, 1.050 for a gRPC `maxAttempts` of
//! 4), and after the first 10 s at most 1 % of the requests a second retry.
//!
//! Run with `--nocapture` for the numbers. `BUDGET_FLEET_CASES` sets the
//! property tests' case count (default 8), `PROPTEST_RNG_SEED` their seed.
#![cfg(all(feature = "http", feature = "grpc"))]

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_backoff::grpc::{
    GrpcRetryLayer, ServiceConfig, PREVIOUS_RPC_ATTEMPTS, RETRY_PUSHBACK_MS,
};
use tower_backoff::http::{HttpPolicy, HttpRetryLayer, RetryInfo, X_RETRY_ATTEMPT};
use tower_backoff::{AdaptivePacing, Constant, Hedging, Jitter};

/// Independent processes in every fleet.
const PROCESSES: u64 = 1000;

/// How long each fleet's outage lasts, sending all along.
const OUTAGE_SECS: u64 = 60;

/// The first seconds of an outage, in which each process may spend what its
/// bucket started with.
const SPENDING: Duration = Duration::from_secs(10);

/// The outage, as [`OUTAGE_SECS`].
const OUTAGE: Duration = Duration::from_secs(OUTAGE_SECS);

/// The share of the requests a second that may be retries after
/// [`SPENDING`].
const LATE_SHARE: f64 = 0.01;

/// HTTP's default attempts.
const HTTP_ATTEMPTS: u32 = 3;

/// The gRPC method's `maxAttempts`.
const GRPC_ATTEMPTS: u32 = 4;

/// Attempts per request a 60 s outage of default layers stays within: one
/// request's retries per process over 60 requests each, and the slack the
/// simulation's 1.035 for 3 attempts has (`tests/sim.rs`).
fn fleet_bound(max_attempts: u32) -> f64 {
    1.0 + f64::from(max_attempts - 1) / OUTAGE_SECS as f64 + 0.0017
}

/// Most retries the fleet may send from [`SPENDING`] to the outage's end:
/// 1 % of the 1,000 requests a second, for the 50 s after the first 10. (As
/// `tests/sim.rs` counts them; the drain after the outage is bounded by the
/// attempts per request, which count every attempt until the last request
/// ended.)
fn late_retry_bound() -> u64 {
    let seconds = (OUTAGE_SECS - SPENDING.as_secs()) as f64;
    (LATE_SHARE * PROCESSES as f64 * seconds) as u64
}

fn cases() -> u32 {
    std::env::var("BUDGET_FLEET_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8)
}

/// Few cases (each is 60,000 requests), nothing written to
/// `proptest-regressions`, and a short shrink: each step is a whole fleet.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4,
        ..ProptestConfig::default()
    }
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// What the server saw
// ---------------------------------------------------------------------------

/// What every process's server saw, on tokio's clock from the outage's start.
struct Seen {
    start: Instant,
    attempts: AtomicU64,
    retries: AtomicU64,
    late_retries: AtomicU64,
    drain_retries: AtomicU64,
    /// Free retries of requests that never left, told by the layer's hook:
    /// not load the budget bounds.
    transparent: AtomicU64,
    late_transparent: AtomicU64,
}

impl Seen {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            attempts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            late_retries: AtomicU64::new(0),
            drain_retries: AtomicU64::new(0),
            transparent: AtomicU64::new(0),
            late_transparent: AtomicU64::new(0),
        })
    }

    /// From [`SPENDING`] to the outage's end.
    fn late(&self) -> bool {
        (SPENDING..OUTAGE).contains(&self.start.elapsed())
    }

    fn attempt(&self, retry: bool) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if retry {
            self.retries.fetch_add(1, Ordering::Relaxed);
            if self.late() {
                self.late_retries.fetch_add(1, Ordering::Relaxed);
            } else if self.start.elapsed() >= OUTAGE {
                self.drain_retries.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn transparent_retry(&self) {
        self.transparent.fetch_add(1, Ordering::Relaxed);
        if self.late() {
            self.late_transparent.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn report(&self, requests: u64) -> FleetReport {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        FleetReport {
            requests,
            attempts: get(&self.attempts),
            retries: get(&self.retries),
            late_retries: get(&self.late_retries),
            drain_retries: get(&self.drain_retries),
            transparent: get(&self.transparent),
            late_transparent: get(&self.late_transparent),
            lasted: self.start.elapsed(),
        }
    }
}

/// What a fleet's outage came to.
#[derive(Debug, Clone, Copy)]
struct FleetReport {
    requests: u64,
    /// Attempts the server saw, transparent retries included.
    attempts: u64,
    /// Of them, retries and hedges (marked by the layer).
    retries: u64,
    /// Retries from [`SPENDING`] to the outage's end.
    late_retries: u64,
    /// Retries after the outage's end, while its requests finish.
    drain_retries: u64,
    transparent: u64,
    late_transparent: u64,
    /// Until the last request ended, on the paused clock.
    lasted: Duration,
}

impl FleetReport {
    /// Attempts per request, the free transparent retries left out.
    fn attempts_per_request(&self) -> f64 {
        (self.attempts - self.transparent) as f64 / self.requests as f64
    }

    /// Paid retries from [`SPENDING`] to the outage's end.
    fn paid_late_retries(&self) -> u64 {
        self.late_retries - self.late_transparent
    }

    /// Paid retries a second from [`SPENDING`] to the outage's end.
    fn late_retries_per_second(&self) -> f64 {
        self.paid_late_retries() as f64 / (OUTAGE_SECS - SPENDING.as_secs()) as f64
    }

    fn line(&self) -> String {
        format!(
            "{:.4} attempts/request, {:.2} retries/s in 10..60 s ({} then, {} after 60 s, {} in all, {} transparent), {} requests, over {:?}",
            self.attempts_per_request(),
            self.late_retries_per_second(),
            self.paid_late_retries(),
            self.drain_retries,
            self.retries,
            self.transparent,
            self.requests,
            self.lasted,
        )
    }

    fn assert_bounded(&self, max_attempts: u32, case: &str) {
        let bound = fleet_bound(max_attempts);
        assert!(
            self.attempts_per_request() <= bound,
            "{case}: {:.4} attempts per request, over {bound:.4}: {self:?}",
            self.attempts_per_request()
        );
        assert!(
            self.paid_late_retries() <= late_retry_bound(),
            "{case}: {:.2} retries a second after the first 10 s, over 1 % of {PROCESSES}: {self:?}",
            self.late_retries_per_second()
        );
    }
}

// ---------------------------------------------------------------------------
// The open-loop fleet
// ---------------------------------------------------------------------------

/// Sends one request a second from each of `services` (process `p` at
/// `p / n` s past each second) for [`OUTAGE_SECS`], spawning each without
/// waiting for it; then waits for all of them. The requests sent.
async fn open_loop<S, Req>(services: Vec<S>, request: impl Fn() -> Req) -> u64
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    Req: Send + 'static,
{
    let start = Instant::now();
    let n = services.len() as u64;
    let total = OUTAGE_SECS * n;
    let mut pending = Vec::with_capacity(total as usize);
    for tick in 0..total {
        let (second, process) = (tick / n, tick % n);
        let at = start
            + Duration::from_secs(second)
            + Duration::from_secs(1) * process as u32 / n as u32;
        tokio::time::sleep_until(at).await;
        let service = services[process as usize].clone();
        pending.push(tokio::spawn(service.oneshot(request())));
    }
    for request in pending {
        let _ = request.await.expect("a request task panicked");
    }
    total
}

// ---------------------------------------------------------------------------
// HTTP: what the server answers
// ---------------------------------------------------------------------------

/// What every attempt gets during the outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// This status, with the delay header drawn.
    Status(u16),
    /// A refused connection (`io::ErrorKind::ConnectionRefused`): a
    /// transient error, or with `retry_unsent` a request that never left.
    Refused,
    /// After 1 s, an `io::ErrorKind::TimedOut` error: a timeout.
    TimedOut,
    /// No answer; the layer's `attempt_timeout` (1 s) ends each attempt.
    Hang,
}

/// The delay header on a status answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DelayHeader {
    None,
    RetryAfter(&'static str),
    /// `Retry-After` as an HTTP-date 2 s ahead (1 to 2 s, in whole seconds).
    RetryAfterDate,
    RetryAfterMs(&'static str),
    /// `RateLimit-Reset` with no `RateLimit-Remaining`: the quota is spent.
    RateLimitReset(&'static str),
}

const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

#[derive(Debug, Clone, Copy)]
struct HttpCase {
    answer: Answer,
    header: DelayHeader,
    pacing: bool,
    hedging: bool,
    /// `HttpPolicy::retry_unsent()`: a refused connection is a request that
    /// never left, and its first retry is the free transparent one.
    retry_unsent: bool,
}

impl HttpCase {
    const fn outage(answer: Answer, header: DelayHeader) -> Self {
        Self {
            answer,
            header,
            pacing: false,
            hedging: false,
            retry_unsent: false,
        }
    }
}

fn response(code: u16, header: DelayHeader) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::from_u16(code).unwrap();
    let headers = response.headers_mut();
    match header {
        DelayHeader::None => {}
        DelayHeader::RetryAfter(value) => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
        }
        DelayHeader::RetryAfterDate => {
            // The wall clock: the paused one does not move `SystemTime`.
            let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
            headers.insert(RETRY_AFTER, HeaderValue::from_str(&date).unwrap());
        }
        DelayHeader::RetryAfterMs(value) => {
            headers.insert(RETRY_AFTER_MS, HeaderValue::from_static(value));
        }
        DelayHeader::RateLimitReset(value) => {
            headers.insert(RATELIMIT_RESET, HeaderValue::from_static(value));
        }
    }
    response
}

/// A server down for good, answering every attempt as `case` says and
/// counting them into `seen`.
fn dead_server(
    case: HttpCase,
    seen: Arc<Seen>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |request: Request<Full<Bytes>>| {
        seen.attempt(request.headers().contains_key(X_RETRY_ATTEMPT));
        async move {
            match case.answer {
                Answer::Status(code) => Ok(response(code, case.header)),
                Answer::Refused => Err(io::Error::from(io::ErrorKind::ConnectionRefused).into()),
                Answer::TimedOut => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Err(io::Error::from(io::ErrorKind::TimedOut).into())
                }
                Answer::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(response(200, DelayHeader::None))
                }
            }
        }
    })
}

/// A process's layer: the defaults, and only the options `case` draws.
fn http_layer(case: HttpCase, seen: &Arc<Seen>) -> HttpRetryLayer {
    let mut builder = HttpRetryLayer::builder();
    if case.pacing {
        builder = builder.pacing(AdaptivePacing::new());
    }
    if case.hedging {
        builder = builder.hedge(Hedging::after(Duration::from_millis(50)));
    }
    if case.answer == Answer::Hang {
        builder = builder.attempt_timeout(Duration::from_secs(1));
    }
    if case.retry_unsent {
        let seen = Arc::clone(seen);
        builder = builder
            .policy(HttpPolicy::new().retry_unsent())
            .on_retry(move |retry, _| {
                if retry.is_transparent() {
                    seen.transparent_retry();
                }
            });
    }
    builder.build().unwrap()
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://backend.test/")
        .body(Full::default())
        .unwrap()
}

/// 1,000 processes, a layer each, through a 60 s outage answered as `case`
/// says.
async fn http_fleet(case: HttpCase) -> FleetReport {
    let seen = Seen::new();
    let services: Vec<_> = (0..PROCESSES)
        .map(|_| http_layer(case, &seen).layer(dead_server(case, Arc::clone(&seen))))
        .collect();
    let requests = open_loop(services, get).await;
    seen.report(requests)
}

fn run_http_fleet(case: HttpCase) -> FleetReport {
    let wall = std::time::Instant::now();
    let report = paused_runtime().block_on(http_fleet(case));
    println!(
        "{case:?}\n    {} ({:?} wall)",
        report.line(),
        wall.elapsed()
    );
    report
}

// ---------------------------------------------------------------------------
// gRPC: UNAVAILABLE with or without pushback
// ---------------------------------------------------------------------------

const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// `maxAttempts` 4, `UNAVAILABLE` retryable, no `retryThrottling`: the
/// layer's default budget, `TokenBucket::fleet_safe(4)`.
fn grpc_config() -> ServiceConfig {
    ServiceConfig::from_json(
        r#"{"methodConfig": [{
            "name": [{"service": "grpc.health.v1.Health"}],
            "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
        }]}"#,
    )
    .unwrap()
}

/// A gRPC server down for good: every call a trailers-only `UNAVAILABLE`,
/// with `grpc-retry-pushback-ms: pushback` if given.
fn dead_grpc_server(
    pushback: Option<&'static str>,
    seen: Arc<Seen>,
) -> impl Service<
    http::Request<tonic::body::Body>,
    Response = http::Response<tonic::body::Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |request: http::Request<tonic::body::Body>| {
        seen.attempt(request.headers().contains_key(PREVIOUS_RPC_ATTEMPTS));
        async move {
            let mut response = tonic::Status::unavailable("down").into_http();
            if let Some(value) = pushback {
                response
                    .headers_mut()
                    .insert(RETRY_PUSHBACK_MS, HeaderValue::from_static(value));
            }
            Ok(response)
        }
    })
}

fn health_check() -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://backend.test{HEALTH_CHECK}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap()
}

async fn grpc_fleet(pushback: Option<&'static str>) -> FleetReport {
    let seen = Seen::new();
    let config = grpc_config();
    let services: Vec<_> = (0..PROCESSES)
        .map(|_| {
            GrpcRetryLayer::new(&config)
                .unwrap()
                .layer(dead_grpc_server(pushback, Arc::clone(&seen)))
        })
        .collect();
    let requests = open_loop(services, health_check).await;
    seen.report(requests)
}

fn run_grpc_fleet(pushback: Option<&'static str>) -> FleetReport {
    let wall = std::time::Instant::now();
    let report = paused_runtime().block_on(grpc_fleet(pushback));
    println!(
        "gRPC, pushback {pushback:?}\n    {} ({:?} wall)",
        report.line(),
        wall.elapsed()
    );
    report
}

// ---------------------------------------------------------------------------
// 1. The fleet bound over generated server behaviour
// ---------------------------------------------------------------------------

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => prop_oneof![Just(429u16), Just(503)].prop_map(Answer::Status),
        1 => prop_oneof![Just(500u16), Just(502), Just(504)].prop_map(Answer::Status),
        1 => Just(Answer::Refused),
        1 => Just(Answer::TimedOut),
        1 => Just(Answer::Hang),
    ]
}

fn delay_header() -> impl Strategy<Value = DelayHeader> {
    prop_oneof![
        Just(DelayHeader::None),
        Just(DelayHeader::RetryAfter("0")),
        Just(DelayHeader::RetryAfter("1")),
        Just(DelayHeader::RetryAfter("60")),
        Just(DelayHeader::RetryAfterDate),
        Just(DelayHeader::RetryAfterMs("0")),
        Just(DelayHeader::RetryAfterMs("1")),
        Just(DelayHeader::RetryAfterMs("1000")),
        Just(DelayHeader::RateLimitReset("1")),
    ]
}

fn http_case() -> impl Strategy<Value = HttpCase> {
    (
        answer(),
        delay_header(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(answer, header, pacing, hedging, retry_unsent)| HttpCase {
            answer,
            // A header comes with a status; an error has none.
            header: match answer {
                Answer::Status(_) => header,
                _ => DelayHeader::None,
            },
            pacing,
            hedging,
            // Only a refused connection can prove a request never left.
            retry_unsent: retry_unsent && answer == Answer::Refused,
        })
}

fn pushback() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        Just(None),
        Just(Some("-1")),
        Just(Some("0")),
        Just(Some("1")),
        Just(Some("1000")),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Whatever the server answers and whatever the process turned on, 1,000
    /// default HTTP layers through a 60 s outage make at most 1.035 attempts
    /// per request, and after 10 s retry at most 1 % of the requests a second.
    #[test]
    fn a_fleet_of_default_http_layers_stays_within_the_bound_whatever_the_server_says(
        case in http_case()
    ) {
        let report = run_http_fleet(case);
        report.assert_bounded(HTTP_ATTEMPTS, &format!("{case:?}"));
    }

    /// 1,000 gRPC layers without `retryThrottling` (`maxAttempts` 4), whatever
    /// the pushback, make at most one call's retries per process: 1.05
    /// attempts per call over 60 s, and after 10 s at most 1 % retries.
    #[test]
    fn a_fleet_of_grpc_layers_without_throttling_stays_within_the_bound_whatever_the_pushback(
        pushback in pushback()
    ) {
        let report = run_grpc_fleet(pushback);
        report.assert_bounded(GRPC_ATTEMPTS, &format!("pushback {pushback:?}"));
    }
}

// ---------------------------------------------------------------------------
// 2. Named cases
// ---------------------------------------------------------------------------

/// (a) The defaults against a 503 + `Retry-After: 1` outage: the server's
/// delay paces the retry, but the budget still pays for it.
#[test]
fn a_fleet_of_default_layers_told_retry_after_1_makes_at_most_1_035_attempts_per_request() {
    let report = run_http_fleet(HttpCase::outage(
        Answer::Status(503),
        DelayHeader::RetryAfter("1"),
    ));
    println!(
        "503 + Retry-After: 1, 1,000 default layers: {}",
        report.line()
    );
    report.assert_bounded(HTTP_ATTEMPTS, "503 + Retry-After: 1");
}

/// (b) The same outage with no delay header.
#[test]
fn a_fleet_of_default_layers_told_nothing_makes_at_most_1_035_attempts_per_request() {
    let report = run_http_fleet(HttpCase::outage(Answer::Status(503), DelayHeader::None));
    println!("503, no header, 1,000 default layers: {}", report.line());
    report.assert_bounded(HTTP_ATTEMPTS, "503, no header");
}

/// (c) One gRPC layer without `retryThrottling` (`maxAttempts` 4), 20 calls
/// one after another to a dead server that pushes back 1 s: the budget's 3
/// retries and no more, 23 attempts in all.
#[tokio::test(start_paused = true)]
async fn grpc_calls_to_a_dead_server_pushing_back_1_s_make_at_most_23_attempts_for_20_calls() {
    let seen = Seen::new();
    let mut service = GrpcRetryLayer::new(&grpc_config())
        .unwrap()
        .layer(dead_grpc_server(Some("1000"), Arc::clone(&seen)));
    for _ in 0..20 {
        let response = ServiceExt::<http::Request<Full<Bytes>>>::ready(&mut service)
            .await
            .unwrap()
            .call(health_check())
            .await
            .unwrap();
        assert_eq!(
            response
                .headers()
                .get("grpc-status")
                .map(HeaderValue::as_bytes),
            Some(&b"14"[..])
        );
    }
    let report = seen.report(20);
    println!(
        "20 gRPC calls, UNAVAILABLE + pushback 1000 ms: {} attempts ({} retries), {:?}",
        report.attempts, report.retries, report.lasted
    );
    assert!(report.attempts <= 23, "{report:?}");
}

/// What one layer's requests, sent one after another, met: each request's
/// attempt times.
async fn sequential_requests(
    layer: HttpRetryLayer,
    header: DelayHeader,
    requests: usize,
) -> Vec<Vec<Instant>> {
    let times = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let log = Arc::clone(&times);
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        log.lock().unwrap().push(Instant::now());
        async move { Ok::<_, BoxError>(response(503, header)) }
    });
    let mut service = layer.layer(server);
    let mut each = Vec::new();
    for _ in 0..requests {
        let before = times.lock().unwrap().len();
        let response = service.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        each.push(times.lock().unwrap()[before..].to_vec());
    }
    each
}

/// (d) `retry-after-ms: 1` is a retry like any other: charged to the budget
/// and waited no less than the schedule's delay, as `retry-after-ms: 0`
/// (ignored: the schedule decides) is. A layer with the default budget and a
/// constant 100 ms schedule without jitter.
#[tokio::test(start_paused = true)]
async fn retry_after_ms_1_is_charged_and_backed_off_like_retry_after_ms_0() {
    const STEP: Duration = Duration::from_millis(100);
    const REQUESTS: usize = 10;
    let layer = || {
        HttpRetryLayer::builder()
            .schedule(Constant::new(STEP))
            .jitter(Jitter::None)
            .build()
            .unwrap()
    };
    let mut attempts = Vec::new();
    for value in ["0", "1"] {
        let each = sequential_requests(layer(), DelayHeader::RetryAfterMs(value), REQUESTS).await;
        let gaps: Vec<Duration> = each
            .iter()
            .flat_map(|times| times.windows(2).map(|pair| pair[1] - pair[0]))
            .collect();
        let total: usize = each.iter().map(Vec::len).sum();
        println!(
            "503 + retry-after-ms: {value}, {REQUESTS} requests in sequence: {total} attempts, gaps {gaps:?}"
        );
        for gap in &gaps {
            assert!(
                *gap >= STEP && *gap < STEP + Duration::from_millis(10),
                "retry-after-ms: {value}: a gap of {gap:?}, the schedule says {STEP:?}"
            );
        }
        attempts.push(total);
    }
    assert_eq!(
        attempts[0], attempts[1],
        "retry-after-ms: 0 and 1 make the same attempts"
    );
}

// ---------------------------------------------------------------------------
// 3. A 100 ms blip on a busy layer
// ---------------------------------------------------------------------------

const BLIP_AT: Duration = Duration::from_secs(20);
const BLIP: Duration = Duration::from_millis(100);

/// One layer serving 1,000 requests a second of successes for 20 s, then
/// 100 ms where every attempt gets a 503 (no header), then healthy for the
/// rest of a 21 s run: how many of the requests that started in the blip
/// failed, of how many.
async fn blip(layer: HttpRetryLayer) -> (usize, usize) {
    let start = Instant::now();
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        let at = start.elapsed();
        let code = if at >= BLIP_AT && at < BLIP_AT + BLIP {
            503
        } else {
            200
        };
        async move { Ok::<_, BoxError>(response(code, DelayHeader::None)) }
    });
    let service = layer.layer(server);
    let total = 21_000u64;
    let mut pending = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = Duration::from_millis(i);
        tokio::time::sleep_until(start + at).await;
        let in_blip = at >= BLIP_AT && at < BLIP_AT + BLIP;
        pending.push((in_blip, tokio::spawn(service.clone().oneshot(get()))));
    }
    let (mut started, mut failed) = (0, 0);
    for (in_blip, request) in pending {
        let response = request.await.unwrap().unwrap();
        if in_blip {
            started += 1;
            if response.status() != StatusCode::OK {
                failed += 1;
            }
        }
    }
    (failed, started)
}

#[tokio::test(start_paused = true)]
async fn a_100_ms_blip_at_1000_requests_a_second_fails_at_most_10_of_its_100_requests() {
    // Seeded, so both runs draw the same delays: with no budget about 8 of
    // the 100 fail whatever the budget does (6 to 11 over seeds 1 to 12),
    // their retries landing in the blip too.
    let seeded = || HttpRetryLayer::builder().seed(1);
    let (unbudgeted, _) = blip(seeded().no_budget().build().unwrap()).await;
    let (failed, started) = blip(seeded().build().unwrap()).await;
    println!(
        "100 ms blip at 1,000 req/s: {failed} of {started} requests started in it failed \
         with the default budget, {unbudgeted} with no budget"
    );
    assert_eq!(started, 100);
    assert!(failed <= 10, "{failed} of {started} failed");
}

// ---------------------------------------------------------------------------
// 4. A quiet client after one dead request
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_quiet_client_after_one_dead_request_and_ten_quiet_minutes_gets_all_its_attempts() {
    let calls = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&calls);
    // Attempts 1 to 3: the dead request. 4 and 5 fail, 6 succeeds.
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        let n = count.fetch_add(1, Ordering::Relaxed) + 1;
        let code = if n >= 6 { 200 } else { 503 };
        async move { Ok::<_, BoxError>(response(code, DelayHeader::None)) }
    });
    let mut service = HttpRetryLayer::new().layer(server);
    let dead = service.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(dead.status(), StatusCode::SERVICE_UNAVAILABLE);
    let dead_attempts = calls.load(Ordering::Relaxed);
    assert_eq!(dead_attempts, 3, "the dead request makes every attempt");

    tokio::time::advance(Duration::from_secs(600)).await;

    let response = service.ready().await.unwrap().call(get()).await.unwrap();
    let attempts = calls.load(Ordering::Relaxed) - dead_attempts;
    println!(
        "after one dead request and 10 quiet minutes: {} after {attempts} attempts",
        response.status()
    );
    assert_eq!(response.status(), StatusCode::OK, "{attempts} attempts");
    assert_eq!(
        response
            .extensions()
            .get::<RetryInfo>()
            .map(|info| info.attempts),
        Some(3)
    );
}

// ---------------------------------------------------------------------------
// 5. Unlimited attempts and a request's own attempts
// ---------------------------------------------------------------------------

/// The budget bounds a fleet, not one request: unlimited attempts without a
/// time limit are refused at build, naming the field, and with one a request
/// against a server answering `503` + `Retry-After: 1` forever ends by it,
/// with the server's last answer.
#[tokio::test(start_paused = true)]
async fn unlimited_attempts_need_a_time_limit_and_a_request_ends_by_it() {
    let refused = HttpRetryLayer::builder().unlimited_attempts().build();
    assert_eq!(refused.unwrap_err().field(), "max_attempts");
    let refused = tower_backoff::BackoffLayer::builder()
        .unlimited_attempts()
        .build();
    assert_eq!(refused.unwrap_err().field(), "max_attempts");

    let layer = HttpRetryLayer::builder()
        .unlimited_attempts()
        .max_elapsed(Duration::from_secs(10))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&calls);
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        count.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, BoxError>(response(503, DelayHeader::RetryAfter("1"))) }
    });
    let start = Instant::now();
    let answer = layer.layer(server).oneshot(get()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        start.elapsed() <= Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    // The budget's two retries, paid, then the request waits each delay
    // the server names and is refused at send: no attempt beyond them.
    assert_eq!(calls.load(Ordering::Relaxed), 3);
}

/// A request's own `RetryLimits::max_attempts`, as its docs say: fewer than
/// the layer's always hold; more than the layer's get what the layer's
/// budget holds, which on a fresh layer is the layer's own `max_attempts - 1`
/// retries, and on a layer built for that many attempts all of them.
#[tokio::test(start_paused = true)]
async fn a_requests_own_attempts_are_bounded_by_the_layers_budget_as_documented() {
    async fn attempts(layer: HttpRetryLayer, limit: u32) -> u64 {
        let calls = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&calls);
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            count.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, BoxError>(response(503, DelayHeader::None)) }
        });
        let mut request = get();
        request
            .extensions_mut()
            .insert(tower_backoff::RetryLimits::new().max_attempts(limit));
        layer.layer(server).oneshot(request).await.unwrap();
        calls.load(Ordering::Relaxed)
    }
    assert_eq!(attempts(HttpRetryLayer::new(), 2).await, 2, "fewer: held");
    assert_eq!(
        attempts(HttpRetryLayer::new(), 5).await,
        3,
        "more than the layer's 3: its budget's 2 retries"
    );
    let five = || HttpRetryLayer::builder().max_attempts(5).build().unwrap();
    assert_eq!(attempts(five(), 5).await, 5, "a layer built for 5");
    assert_eq!(
        attempts(five(), 50).await,
        5,
        "50 on that layer: its 4 retries"
    );
}
