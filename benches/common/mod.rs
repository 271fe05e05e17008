//! What the benches share: the request, the backends, every column's service,
//! and the loop that drives them. The criterion bench and the instruction
//! counter run exactly the same code.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use tower::retry::backoff::{
    Backoff as _, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff,
};
use tower::retry::budget::{Budget as _, TpsBudget};
use tower::{Service, ServiceExt};

pub type Req = Request<Bytes>;
pub type Res = Response<Bytes>;

/// The backend's error; `Clone` because tower-resilience-retry requires it.
#[derive(Debug, Clone)]
pub struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed")
    }
}

impl std::error::Error for Failed {}

/// A GET with a small JSON body and the headers a real client sends.
pub fn request() -> Req {
    Request::builder()
        .method(Method::GET)
        .uri("http://api.internal:8080/v1/items/42?fields=price")
        .header("accept", "application/json")
        .header("user-agent", "tower-backoff-bench/0.1")
        .header("x-request-id", "4bf92f3577b34da6a3ce929d0e0e4736")
        .body(Bytes::from_static(br#"{"id":42}"#))
        .unwrap()
}

/// A backend whose clone costs what a real client's does: one `Arc`.
/// `fail_first` of every `fail_first + 1` calls fail (0: never fails).
#[derive(Clone)]
pub struct Backend {
    state: Arc<BackendState>,
}

struct BackendState {
    fail_first: u64,
    calls: AtomicU64,
}

impl Backend {
    pub fn healthy() -> Self {
        Self::failing_first(0)
    }

    pub fn failing_first(fail_first: u64) -> Self {
        Self {
            state: Arc::new(BackendState {
                fail_first,
                calls: AtomicU64::new(0),
            }),
        }
    }
}

impl Service<Req> for Backend {
    type Response = Res;
    type Error = Failed;
    type Future = Ready<Result<Res, Failed>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        std::hint::black_box(&request);
        if self.state.fail_first > 0 {
            let n = self.state.calls.fetch_add(1, Ordering::Relaxed);
            if n % (self.state.fail_first + 1) < self.state.fail_first {
                return ready(Err(Failed));
            }
        }
        ready(Ok(Response::new(Bytes::from_static(b"{\"price\":7}"))))
    }
}

/// Sends `iters` requests one after another through `svc`, each a fresh copy
/// of `template` (the caller's own clone, the same for every column).
pub async fn drive<S>(svc: &mut S, template: &Req, iters: u64)
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..iters {
        let request = std::hint::black_box(template.clone());
        let response = svc.ready().await.unwrap().call(request).await;
        assert!(response.is_ok(), "every request must end in success");
        std::hint::black_box(response.ok());
    }
}

/// backon retries a closure rather than wrapping a service.
pub async fn drive_backon(svc: &Backend, template: &Req, iters: u64, zero_delay: bool) {
    use backon::{ExponentialBuilder, Retryable};
    let mut backoff = ExponentialBuilder::default().with_max_times(2);
    if zero_delay {
        backoff = backoff
            .with_min_delay(Duration::ZERO)
            .with_max_delay(Duration::ZERO);
    }
    for _ in 0..iters {
        let request = std::hint::black_box(template.clone());
        let attempt = || {
            let mut svc = svc.clone();
            let request = request.clone();
            async move { svc.ready().await?.call(request).await }
        };
        let response = attempt.retry(backoff).await;
        assert!(response.is_ok(), "every request must end in success");
        std::hint::black_box(response.ok());
    }
}

/// tower::retry with the simplest policy: copy the request, retry errors up to
/// 3 attempts, no backoff.
#[derive(Clone)]
pub struct Attempts(pub usize);

impl tower::retry::Policy<Req, Res, Failed> for Attempts {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, Failed>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 1 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

/// tower::retry as it is typically set up in production: exponential backoff
/// with jitter from `ExponentialBackoffMaker`, and a shared `TpsBudget`.
#[derive(Clone)]
pub struct BackoffWithBudget {
    attempts: usize,
    backoff: ExponentialBackoff,
    budget: Arc<TpsBudget>,
}

impl BackoffWithBudget {
    pub fn new(zero_delay: bool) -> Self {
        let (min, max) = if zero_delay {
            (Duration::ZERO, Duration::from_nanos(1))
        } else {
            (Duration::from_millis(100), Duration::from_secs(20))
        };
        let mut maker = ExponentialBackoffMaker::new(min, max, 1.0, Default::default()).unwrap();
        Self {
            attempts: 3,
            backoff: maker.make_backoff(),
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000_000, 0.2)),
        }
    }
}

impl tower::retry::Policy<Req, Res, Failed> for BackoffWithBudget {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, Failed>) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) if self.attempts > 1 && self.budget.withdraw() => {
                self.attempts -= 1;
                Some(self.backoff.next_backoff())
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

pub fn tower_retry(backend: Backend) -> tower::retry::Retry<Attempts, Backend> {
    tower::retry::Retry::new(Attempts(3), backend)
}

pub fn tower_retry_backoff_budget(
    backend: Backend,
    zero_delay: bool,
) -> tower::retry::Retry<BackoffWithBudget, Backend> {
    tower::retry::Retry::new(BackoffWithBudget::new(zero_delay), backend)
}

pub fn resilience(
    backend: Backend,
    zero_delay: bool,
) -> impl Service<Req, Response = Res, Error = Failed> + Clone {
    let builder = tower_resilience_retry::RetryLayer::<Req, Res, Failed>::builder().max_attempts(3);
    let layer = if zero_delay {
        builder.fixed_backoff(Duration::ZERO)
    } else {
        builder.exponential_backoff(Duration::from_millis(100))
    }
    .build();
    tower::Layer::layer(&layer, backend)
}

/// Ours with the defaults: exponential from 100 ms with full jitter, 3 attempts.
pub fn ours_plain(backend: Backend) -> tower_backoff::BackoffRetry<Backend> {
    tower::Layer::layer(&tower_backoff::BackoffLayer::new(), backend)
}

/// Ours retrying at once (a zero delay must not touch the timer). The budget is
/// the default one's type, sized never to run dry: here two of every three
/// attempts fail forever, which the default bucket rightly stops retrying
/// after its 500-token reserve.
pub fn ours_plain_zero(
    backend: Backend,
) -> tower_backoff::BackoffRetry<Backend, tower_backoff::RetryOnError> {
    let layer = tower_backoff::BackoffLayer::builder()
        .schedule(tower_backoff::Constant::new(Duration::ZERO))
        .budget(
            tower_backoff::TokenBucket::builder()
                .capacity(1 << 40)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    tower::Layer::layer(&layer, backend)
}

/// Ours with everything a production set-up turns on: full jitter, a token
/// bucket shared by clones, and stats. The bucket is large enough never to run
/// dry while two of every three attempts fail (as `TpsBudget` is configured).
pub fn ours_full(
    backend: Backend,
    zero_delay: bool,
) -> tower_backoff::BackoffRetry<Backend, tower_backoff::RetryOnError> {
    use tower_backoff::{BackoffLayer, Constant, Jitter, Stats, TokenBucket};
    let delay = if zero_delay {
        Duration::ZERO
    } else {
        Duration::from_millis(100)
    };
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(delay))
        .jitter(Jitter::Full)
        .budget(TokenBucket::builder().capacity(1 << 40).build().unwrap())
        .stats(Stats::new())
        .build()
        .unwrap();
    tower::Layer::layer(&layer, backend)
}

/// The two request scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// The first attempt succeeds.
    Happy,
    /// Two attempts fail, the third succeeds; every delay is zero.
    Retry,
}

impl Scenario {
    pub const ALL: [Scenario; 2] = [Scenario::Happy, Scenario::Retry];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Happy => "happy_path",
            Scenario::Retry => "retry_path",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    fn backend(self) -> Backend {
        match self {
            Scenario::Happy => Backend::healthy(),
            Scenario::Retry => Backend::failing_first(2),
        }
    }
}

/// Every column of the comparison, in table order.
pub const COLUMNS: &[&str] = &[
    "bare",
    "bare + 1 clone",
    "tower::retry",
    "tower::retry + backoff + TpsBudget",
    "backon",
    "tower-resilience-retry",
    "ours",
    "ours + jitter + bucket + stats",
    #[cfg(feature = "http")]
    "ours, per host",
];

/// The columns that make sense for `scenario`: on the retry path the bare
/// column is already a loop with one copy per attempt.
pub fn columns(scenario: Scenario) -> impl Iterator<Item = &'static &'static str> {
    COLUMNS
        .iter()
        .filter(move |c| !(scenario == Scenario::Retry && **c == "bare + 1 clone"))
}

/// Builds `column` for `scenario` (not timed), then sends `iters` requests
/// through it and returns how long the requests alone took.
pub async fn run_column(scenario: Scenario, column: &str, iters: u64) -> std::time::Duration {
    let template = request();
    let backend = scenario.backend();
    let zero = scenario == Scenario::Retry;
    macro_rules! timed {
        ($svc:expr) => {{
            let mut svc = $svc;
            let start = std::time::Instant::now();
            drive(&mut svc, &template, iters).await;
            start.elapsed()
        }};
    }
    match column {
        // On the retry path the floor is a hand-written loop: copy and call
        // until it succeeds, no delay.
        "bare" if zero => {
            let mut svc = backend;
            let start = std::time::Instant::now();
            for _ in 0..iters {
                let request = std::hint::black_box(template.clone());
                let response = loop {
                    let copy = request.clone();
                    if let Ok(response) = svc.ready().await.unwrap().call(copy).await {
                        break response;
                    }
                };
                std::hint::black_box(response);
            }
            start.elapsed()
        }
        "bare" => timed!(backend),
        "bare + 1 clone" => timed!(tower::service_fn(move |request: Req| {
            // The floor of any retry layer: keep a copy to send again.
            let copy = std::hint::black_box(request.clone());
            drop(copy);
            backend.clone().call(request)
        })),
        "tower::retry" => timed!(tower_retry(backend)),
        "tower::retry + backoff + TpsBudget" => timed!(tower_retry_backoff_budget(backend, zero)),
        "backon" => {
            let start = std::time::Instant::now();
            drive_backon(&backend, &template, iters, zero).await;
            start.elapsed()
        }
        "tower-resilience-retry" => timed!(resilience(backend, zero)),
        "ours + jitter + bucket + stats" => timed!(ours_full(backend, zero)),
        "ours" if zero => timed!(ours_plain_zero(backend)),
        "ours" => timed!(ours_plain(backend)),
        #[cfg(feature = "http")]
        "ours, per host" => timed!(ours_per_host(backend, zero)),
        other => panic!("unknown column {other:?}"),
    }
}

/// "ours" (the default layer, so the default budget) behind a
/// `PerHostLayer`: one layer per authority, found for each request.
#[cfg(feature = "http")]
pub fn ours_per_host(
    backend: Backend,
    zero_delay: bool,
) -> impl Service<Req, Response = Res, Error = Failed> {
    use tower_backoff::{http::PerHostLayer, BackoffLayer, Constant};
    let delay = if zero_delay {
        Duration::ZERO
    } else {
        Duration::from_millis(100)
    };
    let layer = PerHostLayer::new(move || {
        let builder = BackoffLayer::builder().schedule(Constant::new(delay));
        // On the retry path, a bucket that never runs dry: see `ours_plain_zero`.
        let builder = if zero_delay {
            builder.budget(
                tower_backoff::TokenBucket::builder()
                    .capacity(1 << 40)
                    .build()
                    .unwrap(),
            )
        } else {
            builder
        };
        builder.build().unwrap()
    });
    tower::Layer::layer(&layer, backend)
}

/// The size of one response future of `column`, as a caller would store it.
pub fn future_size(column: &str) -> usize {
    use std::mem::size_of_val;
    let backend = Backend::healthy();
    let template = request();
    match column {
        "bare" | "bare + 1 clone" => size_of_val(&backend.clone().call(template)),
        "tower::retry" => size_of_val(&tower_retry(backend).call(template)),
        "tower::retry + backoff + TpsBudget" => {
            size_of_val(&tower_retry_backoff_budget(backend, false).call(template))
        }
        "backon" => {
            use backon::{ExponentialBuilder, Retryable};
            let attempt = || {
                let mut svc = backend.clone();
                let request = template.clone();
                async move { svc.call(request).await }
            };
            size_of_val(&attempt.retry(ExponentialBuilder::default()))
        }
        "tower-resilience-retry" => size_of_val(&resilience(backend, false).call(template)),
        "ours" => size_of_val(&ours_plain(backend).call(template)),
        "ours + jitter + bucket + stats" => size_of_val(&ours_full(backend, false).call(template)),
        #[cfg(feature = "http")]
        "ours, per host" => size_of_val(&ours_per_host(backend, false).call(template)),
        other => panic!("unknown column {other:?}"),
    }
}

/// `Backend`, with every call pending until the runtime has turned once, as
/// a call over a network is pending until its I/O driver wakes it: its first
/// poll registers it with [`turns`], a task that wakes every call registered
/// each time the runtime runs it. A second poll before that is pending too.
#[derive(Clone)]
pub struct PendingOnce(pub Backend);

impl Service<Req> for PendingOnce {
    type Response = Res;
    type Error = Failed;
    type Future = PendingFirst<Ready<Result<Res, Failed>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        PendingFirst {
            turn: None,
            inner: self.0.call(request),
        }
    }
}

thread_local! {
    /// The wakers of the calls waiting for the runtime to turn.
    static WAITING: std::cell::RefCell<Vec<std::task::Waker>> = const {
        std::cell::RefCell::new(Vec::new())
    };
    /// How many times [`turns`] ran.
    static TURN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Wakes the calls of [`PendingOnce`] each time the runtime runs it: spawn
/// it on the current-thread runtime that drives them, and abort it after.
pub async fn turns() {
    loop {
        TURN.with(|turn| turn.set(turn.get() + 1));
        // Woken from a list of its own, which goes back empty to keep its
        // room: no allocation a turn. Waking polls nothing, so no call
        // registers meanwhile.
        let mut woken = WAITING.with(|waiting| std::mem::take(&mut *waiting.borrow_mut()));
        woken.drain(..).for_each(std::task::Waker::wake);
        WAITING.with(|waiting| *waiting.borrow_mut() = woken);
        tokio::task::yield_now().await;
    }
}

/// A future pending until [`turns`] ran after its first poll, then `inner`.
pub struct PendingFirst<F> {
    /// The turn of its first poll.
    turn: Option<u64>,
    inner: F,
}

impl<F: std::future::Future + Unpin> std::future::Future for PendingFirst<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let now = TURN.with(|turn| turn.get());
        match self.turn {
            None => {
                self.turn = Some(now);
                WAITING.with(|waiting| waiting.borrow_mut().push(cx.waker().clone()));
                Poll::Pending
            }
            // Polled again by the same task before the runtime turned: its
            // waker is registered already.
            Some(first) if first == now => Poll::Pending,
            Some(_) => std::pin::Pin::new(&mut self.inner).poll(cx),
        }
    }
}

/// Counts every heap allocation made in this process. A bench binary that
/// counts declares `#[global_allocator] static GLOBAL: Counting = Counting;`
/// itself: a global allocator belongs to a binary, not to a module.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations made in this process so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
