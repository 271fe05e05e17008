//! The happy path allocates nothing beyond the one copy of the request the
//! layer must keep, and an attempt that cannot be retried is sent without
//! one. Counted, not timed: a regression fails CI.

use crate::common;

use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tower::Service;
use tower_backoff::{BackoffLayer, Constant, Exponential, Jitter, TokenBucket};

use common::allocations;

fn allocations_of(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

type Req = Request<Bytes>;

fn request() -> Req {
    Request::get("http://api.internal/v1/items/42")
        .header("accept", "application/json")
        .header("x-request-id", "4bf92f3577b34da6")
        .body(Bytes::from_static(b"{\"id\":42}"))
        .unwrap()
}

/// Answers at once; cloning it costs an `Arc`, like a real client.
#[derive(Clone, Default)]
struct Backend {
    _clone_costs_an_arc: std::sync::Arc<()>,
}

impl Service<Req> for Backend {
    type Response = Response<Bytes>;
    type Error = std::io::Error;
    type Future = Ready<Result<Response<Bytes>, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(Ok(Response::new(Bytes::from_static(b"ok"))))
    }
}

/// One request through `svc`, polled to completion without a runtime: the
/// happy path must not need one.
fn send<S: Service<Req>>(svc: &mut S, template: &Req) {
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut future = pin!(svc.call(template.clone()));
    assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
}

/// Asserts that a request through `svc` allocates what the bare backend
/// does, plus `copies` copies of the request, plus `extra`.
fn assert_happy_path_allocates<S: Service<Req>>(mut svc: S, copies: u64, extra: u64) {
    let template = request();
    let mut bare = Backend::default();
    // Warm up: the first use of some of std's and http's machinery allocates once.
    send(&mut bare, &template);
    send(&mut svc, &template);
    let one_copy = allocations_of(|| drop(template.clone()));
    assert!(one_copy > 0, "the request copy allocates (its header map)");
    let expected = allocations_of(|| send(&mut bare, &template)) + one_copy * copies + extra;
    for _ in 0..3 {
        assert_eq!(allocations_of(|| send(&mut svc, &template)), expected);
    }
}

/// The same for `layer` over the backend: one request copy and nothing more.
fn assert_happy_path_allocates_only_the_request_copy<L>(layer: &L)
where
    L: tower::Layer<Backend>,
    L::Service: Service<Req>,
{
    assert_happy_path_allocates(layer.layer(Backend::default()), 1, 0);
}

#[test]
fn happy_path_with_defaults_allocates_only_the_request_copy() {
    let layer = BackoffLayer::new();
    assert_happy_path_allocates_only_the_request_copy(&layer);
}

/// A time limit is tracked with the retry state, out of the response future,
/// so that the future of a request without one stays as small as
/// `tower::retry`'s: it costs one allocation per request.
#[test]
fn happy_path_with_time_limit_allocates_the_request_copy_and_its_tracking() {
    let layer = BackoffLayer::builder()
        .schedule(Exponential::new(Duration::from_millis(50)))
        .jitter(Jitter::Decorrelated)
        .max_elapsed(Duration::from_secs(5))
        .seed(3)
        .build()
        .unwrap();
    // A time limit reads the clock, which needs a runtime context (not a poll).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    assert_happy_path_allocates(tower::Layer::layer(&layer, Backend::default()), 1, 1);
}

#[test]
fn happy_path_with_a_seed_allocates_only_the_request_copy() {
    let layer = BackoffLayer::builder()
        .jitter(Jitter::Decorrelated)
        .seed(3)
        .build()
        .unwrap();
    assert_happy_path_allocates_only_the_request_copy(&layer);
}

/// A closed circuit breaker checks and counts every attempt in atomics of
/// its own: nothing allocated per request.
#[test]
fn happy_path_with_a_closed_breaker_allocates_only_the_request_copy() {
    let layer = BackoffLayer::builder()
        .circuit_breaker(tower_backoff::breaker::CircuitBreaker::new())
        .build()
        .unwrap();
    assert_happy_path_allocates_only_the_request_copy(&layer);
}

/// A layer that hedges tracks each request from its call, as a time limit
/// does: one allocation beside the request copy. (Hedging from the first
/// poll, which cost nothing for an attempt answered at once, was a type of
/// its own; it went with that type state: about 700 instructions, a fifth
/// of a microsecond, on a request that is hedged because it may be slow.)
#[test]
fn happy_path_with_hedging_allocates_the_request_copy_and_its_tracking() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    for hedging in [
        tower_backoff::Hedging::after(Duration::from_millis(20)),
        tower_backoff::Hedging::at_percentile(95.0),
    ] {
        let layer = BackoffLayer::builder().hedge(hedging).build().unwrap();
        assert_happy_path_allocates(tower::Layer::layer(&layer, Backend::default()), 1, 1);
    }
}

#[test]
fn max_attempts_one_keeps_one_copy_for_the_transparent_retry() {
    // The only attempt may still be followed by the one transparent retry
    // of a request that never left: the request is kept for it.
    let layer = BackoffLayer::builder().max_attempts(1).build().unwrap();
    assert_happy_path_allocates(tower::Layer::layer(&layer, Backend::default()), 1, 0);
}

#[test]
fn max_attempts_one_still_copies_for_a_policy_that_reads_the_request() {
    let layer = BackoffLayer::builder()
        .max_attempts(1)
        .policy(tower_backoff::classify_fn(
            |request: &Req, outcome: &Result<Response<Bytes>, std::io::Error>| match (
                request.method(),
                outcome,
            ) {
                (_, Ok(_)) => tower_backoff::Decision::Success,
                (&http::Method::GET, Err(_)) => tower_backoff::Decision::retry(),
                (_, Err(_)) => tower_backoff::Decision::Final,
            },
        ))
        .build()
        .unwrap();
    assert_happy_path_allocates_only_the_request_copy(&layer);
}

#[test]
fn happy_path_with_jitter_budget_and_stats_allocates_only_the_request_copy() {
    let layer = BackoffLayer::builder()
        .jitter(Jitter::Full)
        .budget(tower_backoff::TokenBucket::default())
        .stats(tower_backoff::Stats::new())
        .build()
        .unwrap();
    assert_happy_path_allocates_only_the_request_copy(&layer);
}

/// Fails twice, then succeeds.
#[derive(Clone, Default)]
struct FailsTwice(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl Service<Req> for FailsTwice {
    type Response = Response<Bytes>;
    type Error = std::io::Error;
    type Future = Ready<Result<Response<Bytes>, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Req) -> Self::Future {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ready(if n % 3 < 2 {
            Err(std::io::Error::other("busy"))
        } else {
            Ok(Response::new(Bytes::new()))
        })
    }
}

/// Allocations of one request that fails twice then succeeds through
/// `svc`, in copies of the request, beyond the caller's own copy and the
/// backend's two errors: `(copies, other allocations)` checked exactly.
fn assert_retry_path_allocates<S: Service<Req>>(mut svc: S, copies: u64, extra: u64) {
    let template = request();
    send(&mut svc, &template); // warm up
    let one_copy = allocations_of(|| drop(template.clone()));
    let errors =
        allocations_of(|| drop((std::io::Error::other("busy"), std::io::Error::other("busy"))));
    for _ in 0..3 {
        assert_eq!(
            allocations_of(|| send(&mut svc, &template)),
            one_copy * (1 + copies) + errors + extra
        );
    }
}

#[test]
fn retry_path_sends_the_last_attempt_without_a_copy() {
    // Zero delay, so no timer and no runtime. Three attempts: the first
    // keeps a copy and the second sends one; the third, the last allowed,
    // sends the kept request itself (`RetryOnError` judges outcomes without
    // it). The retry state is allocated once.
    // The AWS bucket's reserve pays for every retry, request after request
    // (the default one would refuse the second retry of a request that
    // follows one that failed twice).
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .budget(TokenBucket::new())
        .build()
        .unwrap();
    assert_retry_path_allocates(tower::Layer::layer(&layer, FailsTwice::default()), 2, 1);
}

#[test]
fn retry_path_with_more_attempts_allowed_copies_for_every_attempt() {
    // The third attempt is not the last allowed: it goes out as a copy.
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(4)
        .budget(TokenBucket::new())
        .build()
        .unwrap();
    assert_retry_path_allocates(tower::Layer::layer(&layer, FailsTwice::default()), 3, 1);
}

/// tower::retry's simplest policy: copy the request, retry errors, 3 attempts.
#[derive(Clone)]
struct TowerAttempts(usize);

impl tower::retry::Policy<Req, Response<Bytes>, std::io::Error> for TowerAttempts {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Req,
        result: &mut Result<Response<Bytes>, std::io::Error>,
    ) -> Option<Self::Future> {
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

/// The response future is no larger than `tower::retry`'s for the same
/// service and request (the benches print both sizes: benches/callgrind.sh),
/// with the defaults and with jitter, a budget and stats.
#[test]
fn the_response_future_is_no_larger_than_tower_retrys() {
    let tower_size = {
        let mut svc = tower::retry::Retry::new(TowerAttempts(3), Backend::default());
        size_of_val(&svc.call(request()))
    };
    let defaults = BackoffLayer::new();
    let full = BackoffLayer::builder()
        .jitter(Jitter::Full)
        .budget(tower_backoff::TokenBucket::default())
        .stats(tower_backoff::Stats::new())
        .build()
        .unwrap();
    for layer in [defaults, full] {
        let mut svc = tower::Layer::layer(&layer, Backend::default());
        let ours = size_of_val(&svc.call(request()));
        assert!(
            ours <= tower_size,
            "{ours} bytes against tower's {tower_size}"
        );
    }
}

/// Hedging makes the future no larger: its state is tracked out of it. A
/// breaker (or an attempt timeout) makes the layer's error its own
/// (`Guarded`), whose future has room for a boxed attempt timer: one
/// pointer. And the type does not depend on the order the options were set
/// in: `same` takes only two of one type.
#[test]
fn hedging_adds_no_bytes_a_guarded_layer_one_pointer_and_the_type_is_one() {
    fn size<L>(layer: &L) -> usize
    where
        L: tower::Layer<Backend>,
        L::Service: Service<Req>,
    {
        size_of_val(&layer.layer(Backend::default()).call(request()))
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let defaults = size(&BackoffLayer::new());
    let breaker = BackoffLayer::builder()
        .circuit_breaker(tower_backoff::breaker::CircuitBreaker::new())
        .build()
        .unwrap();
    assert_eq!(size(&breaker), defaults + size_of::<usize>());
    let hedging = tower_backoff::Hedging::after(Duration::from_millis(20));
    let hedged = BackoffLayer::builder().hedge(hedging).build().unwrap();
    assert_eq!(size(&hedged), defaults);
    let hedged_breaker = BackoffLayer::builder()
        .hedge(hedging)
        .circuit_breaker(tower_backoff::breaker::CircuitBreaker::new())
        .build()
        .unwrap();
    assert_eq!(size(&hedged_breaker), size(&breaker));
    fn same<P, T>(_: &BackoffLayer<P, T>, _: &BackoffLayer<P, T>) {}
    same(&hedged, &BackoffLayer::new());
    let timeout_then_hedge = BackoffLayer::builder()
        .attempt_timeout(Duration::from_secs(1))
        .hedge(hedging)
        .build()
        .unwrap();
    let hedge_then_timeout = BackoffLayer::builder()
        .hedge(hedging)
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    same(&timeout_then_hedge, &hedge_then_timeout);
    let breaker_then_hedge = BackoffLayer::builder()
        .circuit_breaker(tower_backoff::breaker::CircuitBreaker::new())
        .hedge(hedging)
        .build()
        .unwrap();
    same(&breaker_then_hedge, &hedged_breaker);
    same(&breaker_then_hedge, &timeout_then_hedge);
}
