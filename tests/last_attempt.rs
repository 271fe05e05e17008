//! The last attempt allowed goes out without a copy when the policy judges
//! outcomes without their request (`Policy::needs_request` is `false`, as for
//! `RetryOnError`): the kept request itself is sent, and its outcome is
//! judged by `classify_outcome`. Every other policy gets a copy for every
//! attempt, the last one too, so that each outcome is judged with its
//! request at hand and a request that never left can be retried even after
//! the last attempt. Either way the last outcome is judged like the others:
//! a success refunds the budget and counts as one, a failure ends the
//! request as out of attempts. Real tower layers, paused clock. (How many
//! allocations are made is counted in tests/allocations.rs.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::{
    BackoffLayer, Cause, Constant, Decision, Policy, RetryOnError, Stats, StatsSnapshot,
    TokenBucket,
};

/// A request that counts its copies, so a test sees which attempt got one.
#[derive(Debug)]
struct Counted {
    copies: Arc<AtomicU32>,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.copies.fetch_add(1, Ordering::Relaxed);
        Self {
            copies: Arc::clone(&self.copies),
        }
    }
}

/// Fails the first `failures` attempts, then answers.
fn backend(
    failures: u32,
) -> impl Service<Counted, Response = &'static str, Error = String, Future: Send> + Clone {
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |_: Counted| {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        async move {
            if n < failures {
                Err(format!("attempt {} failed", n + 1))
            } else {
                Ok("done")
            }
        }
    })
}

/// Sends one request through `policy` with 3 attempts, zero delays and the
/// AWS reserve of a token bucket (room for every retry); returns its outcome,
/// the copies made and the stats.
async fn send<P>(policy: P, failures: u32) -> (Result<&'static str, String>, u32, StatsSnapshot)
where
    P: Policy<Counted, &'static str, String> + Clone + Send + Sync + 'static,
{
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .policy(policy)
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .budget(TokenBucket::new())
        .stats(stats.clone())
        .build()
        .unwrap();
    let copies = Arc::new(AtomicU32::new(0));
    let request = Counted {
        copies: Arc::clone(&copies),
    };
    let outcome = layer.layer(backend(failures)).oneshot(request).await;
    (outcome, copies.load(Ordering::Relaxed), stats.snapshot())
}

#[tokio::test(start_paused = true)]
async fn the_last_attempt_goes_out_without_a_copy_and_is_judged() {
    // A copy kept at the call and one sent as the second attempt; the third,
    // the last, is the kept request itself.
    let (outcome, copies, stats) = send(RetryOnError, 2).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies, 2);
    assert_eq!(stats.attempts, 3, "{stats:?}");
    assert_eq!(stats.successes, 1, "the last outcome was judged: {stats:?}");
}

#[tokio::test(start_paused = true)]
async fn an_earlier_success_makes_no_copy_it_does_not_need() {
    // The second attempt succeeds: the copy kept at the call and the one it
    // went out as.
    let (outcome, copies, stats) = send(RetryOnError, 1).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies, 2);
    assert_eq!(stats.successes, 1, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_last_attempt_that_fails_ends_out_of_attempts() {
    let (outcome, copies, stats) = send(RetryOnError, 5).await;
    assert_eq!(outcome, Err("attempt 3 failed".to_string()));
    assert_eq!(copies, 2);
    assert_eq!(stats.gave_up_attempts, 1, "{stats:?}");
    assert_eq!(stats.gave_up_final, 0, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_policy_behind_an_arc_copies_and_judges_as_the_policy_does() {
    let (outcome, copies, stats) = send(Arc::new(RetryOnError), 5).await;
    assert_eq!(outcome, Err("attempt 3 failed".to_string()));
    assert_eq!(copies, 2);
    assert_eq!(stats.gave_up_attempts, 1, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_if_judges_the_last_outcome_with_its_predicate() {
    // Retries errors; the third attempt's error is final by its predicate,
    // which the last attempt, sent without a copy, is judged by too.
    let policy = tower_backoff::retry_if(|r: &Result<&'static str, String>| {
        r.as_ref().is_err_and(|e| !e.contains("attempt 3"))
    });
    let (outcome, copies, stats) = send(policy, 5).await;
    assert_eq!(outcome, Err("attempt 3 failed".to_string()));
    assert_eq!(copies, 2);
    assert_eq!(stats.gave_up_final, 1, "{stats:?}");
    assert_eq!(stats.gave_up_attempts, 0, "{stats:?}");
}

/// Says it needs no request, then asks for the transparent retry of the
/// last attempt anyway: a broken promise, which must cost only that retry.
#[derive(Clone)]
struct BrokenPromise;

impl Policy<Counted, &'static str, String> for BrokenPromise {
    fn classify(&self, _: &Counted, result: &Result<&'static str, String>) -> Decision {
        self.classify_outcome(result)
    }

    fn clone_request(&self, request: &Counted) -> Option<Counted> {
        Some(request.clone())
    }

    fn needs_request(&self) -> bool {
        false
    }

    fn classify_outcome(&self, result: &Result<&'static str, String>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(e) if e.contains("attempt 3") => Decision::retry().because(Cause::NotSent),
            Err(_) => Decision::retry(),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_transparent_retry_asked_without_the_request_returns_the_last_outcome() {
    let (outcome, copies, stats) = send(BrokenPromise, 5).await;
    assert_eq!(outcome, Err("attempt 3 failed".to_string()));
    assert_eq!(copies, 2);
    assert_eq!(stats.attempts, 3, "{stats:?}");
}

/// Pays for the first retry and refuses the second when it is sent, after
/// allowing it when it was decided: the last attempt's request is already
/// taken when the refusal comes.
struct RefusesTheSecondAtSend(AtomicU32);

impl tower_backoff::budget::Budget for RefusesTheSecondAtSend {
    fn try_retry(&self, _: Cause) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed) == 0
    }
}

#[tokio::test(start_paused = true)]
async fn a_last_retry_refused_at_send_returns_the_outcome_it_would_replace() {
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .budget(RefusesTheSecondAtSend(AtomicU32::new(0)))
        .stats(stats.clone())
        .build()
        .unwrap();
    let copies = Arc::new(AtomicU32::new(0));
    let request = Counted {
        copies: Arc::clone(&copies),
    };
    let outcome = layer.layer(backend(5)).oneshot(request).await;
    assert_eq!(outcome, Err("attempt 2 failed".to_string()));
    assert_eq!(copies.load(Ordering::Relaxed), 2);
    let stats = stats.snapshot();
    assert_eq!(stats.attempts, 2, "{stats:?}");
    assert_eq!(stats.budget_refusals, 1, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_hedging_layer_copies_every_attempt() {
    // Its copies are made while an attempt is pending; with hedges due only
    // after a second, none goes out here.
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .budget(TokenBucket::new())
        .hedge(tower_backoff::Hedging::after(Duration::from_secs(1)))
        .build()
        .unwrap();
    let copies = Arc::new(AtomicU32::new(0));
    let request = Counted {
        copies: Arc::clone(&copies),
    };
    let outcome = layer.layer(backend(2)).oneshot(request).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies.load(Ordering::Relaxed), 3);
}

/// Judges outcomes alone, and stamps each retry with its attempt number.
#[derive(Clone)]
struct Stamps;

/// A request that says which attempt it is.
#[derive(Debug, Clone, Default)]
struct Stamped(u32);

impl Policy<Stamped, u32, u32> for Stamps {
    fn classify(&self, _: &Stamped, result: &Result<u32, u32>) -> Decision {
        self.classify_outcome(result)
    }

    fn clone_request(&self, request: &Stamped) -> Option<Stamped> {
        Some(request.clone())
    }

    fn needs_request(&self) -> bool {
        false
    }

    fn classify_outcome(&self, result: &Result<u32, u32>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }

    fn prepare_retry(&self, mut retry: tower_backoff::PrepareRetry<'_, Stamped, u32, u32>) {
        let attempt = retry.args().attempt() + 1;
        retry.request_mut().0 = attempt;
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_attempt_sent_without_a_copy_is_stamped_like_the_others() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let backend = service_fn(move |request: Stamped| {
        log.lock().unwrap().push(request.0);
        async move { Err::<u32, u32>(request.0) }
    });
    let layer = BackoffLayer::builder()
        .policy(Stamps)
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .no_budget()
        .build()
        .unwrap();
    let outcome = layer.layer(backend).oneshot(Stamped::default()).await;
    assert_eq!(outcome, Err(3));
    assert_eq!(*seen.lock().unwrap(), [0, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_request_s_own_attempt_limit_decides_which_attempt_is_the_last() {
    // The layer allows 3; this request 2: its second attempt is the last and
    // goes out without a copy, so only the copy kept at the call is made.
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .budget(TokenBucket::new())
        .stats(stats.clone())
        .build()
        .unwrap();
    let copies = Arc::new(AtomicU32::new(0));
    let request = Counted {
        copies: Arc::clone(&copies),
    };
    let mut svc = layer.layer(backend(5));
    let svc = svc.ready().await.unwrap();
    let limits = tower_backoff::RetryLimits::new().max_attempts(2);
    let outcome = svc.call_with_limits(request, limits).await;
    assert_eq!(outcome, Err("attempt 2 failed".to_string()));
    assert_eq!(copies.load(Ordering::Relaxed), 1);
    let stats = stats.snapshot();
    assert_eq!(
        (stats.attempts, stats.gave_up_attempts),
        (2, 1),
        "{stats:?}"
    );
}

/// Reads the request to decide.
#[derive(Clone)]
struct ReadsTheRequest;

impl Policy<Counted, &'static str, String> for ReadsTheRequest {
    fn classify(&self, request: &Counted, result: &Result<&'static str, String>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) if request.copies.load(Ordering::Relaxed) < 100 => Decision::retry(),
            Err(_) => Decision::Final,
        }
    }

    fn clone_request(&self, request: &Counted) -> Option<Counted> {
        Some(request.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_reads_the_request_gets_a_copy_for_every_attempt() {
    let (outcome, copies, stats) = send(ReadsTheRequest, 2).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies, 3);
    assert_eq!(stats.successes, 1, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_policy_behind_an_arc_that_reads_the_request_gets_a_copy_for_every_attempt() {
    // The `Arc` says what the policy says: it needs the request.
    let (outcome, copies, stats) = send(Arc::new(ReadsTheRequest), 2).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies, 3);
    assert_eq!(stats.successes, 1, "{stats:?}");
}

/// Says it needs no request and leaves `classify_outcome` to the trait's
/// default, which calls a response a success and an error final (its own
/// `classify` retries errors: only the last attempt tells the two apart).
#[derive(Clone)]
struct DefaultOutcome;

impl Policy<Counted, &'static str, String> for DefaultOutcome {
    fn classify(&self, _: &Counted, result: &Result<&'static str, String>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }

    fn clone_request(&self, request: &Counted) -> Option<Counted> {
        Some(request.clone())
    }

    fn needs_request(&self) -> bool {
        false
    }
}

#[tokio::test(start_paused = true)]
async fn the_default_classify_outcome_judges_the_last_attempt() {
    // cargo-mutants cannot mutate the default (`Decision` has no `Default`
    // to return): this is its only check.
    let (outcome, copies, stats) = send(DefaultOutcome, 5).await;
    assert_eq!(outcome, Err("attempt 3 failed".to_string()));
    assert_eq!(copies, 2);
    assert_eq!(stats.gave_up_final, 1, "the last error is final: {stats:?}");
    assert_eq!(stats.gave_up_attempts, 0, "{stats:?}");
    let (outcome, copies, stats) = send(DefaultOutcome, 2).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(copies, 2);
    assert_eq!(stats.successes, 1, "the last response succeeds: {stats:?}");
}

/// Judges outcomes alone, but cannot copy a request: the first attempt is
/// the only one, and no request is kept to classify its outcome with.
#[derive(Clone)]
struct CannotCopy;

impl Policy<Counted, &'static str, String> for CannotCopy {
    fn classify(&self, _: &Counted, result: &Result<&'static str, String>) -> Decision {
        self.classify_outcome(result)
    }

    fn clone_request(&self, _: &Counted) -> Option<Counted> {
        None
    }

    fn needs_request(&self) -> bool {
        false
    }

    fn classify_outcome(&self, result: &Result<&'static str, String>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }
}

/// One request through `CannotCopy` whose first attempt succeeds, tracked
/// from the call (a time limit) or not: its outcome and stats.
async fn send_uncopied(tracked: bool) -> (Result<&'static str, String>, StatsSnapshot) {
    let stats = Stats::new();
    let builder = BackoffLayer::builder()
        .policy(CannotCopy)
        .schedule(Constant::new(Duration::ZERO))
        .max_attempts(3)
        .stats(stats.clone());
    let builder = match tracked {
        true => builder.max_elapsed(Duration::from_secs(60)),
        false => builder,
    };
    let layer = builder.build().unwrap();
    let copies = Arc::new(AtomicU32::new(0));
    let request = Counted {
        copies: Arc::clone(&copies),
    };
    let outcome = layer.layer(backend(0)).oneshot(request).await;
    assert_eq!(copies.load(Ordering::Relaxed), 0);
    (outcome, stats.snapshot())
}

#[tokio::test(start_paused = true)]
async fn an_uncopyable_request_goes_back_unjudged_though_the_policy_needs_no_request() {
    // No request was kept, and no retry went out: the first attempt's
    // outcome is returned as is, as not replayable, not judged by
    // `classify_outcome` (which only judges a last attempt sent without a
    // copy).
    let (outcome, stats) = send_uncopied(false).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(stats.gave_up_not_clonable, 1, "{stats:?}");
    assert_eq!(stats.successes, 0, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn an_uncopyable_request_tracked_from_the_call_goes_back_unjudged() {
    // The same with a time limit, which tracks the request from the call:
    // its first outcome is judged where a retry's is, and one attempt is no
    // retry.
    let (outcome, stats) = send_uncopied(true).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(stats.gave_up_not_clonable, 1, "{stats:?}");
    assert_eq!(stats.successes, 0, "{stats:?}");
}

/// Judges outcomes alone but asks for the transparent retry, which may
/// follow the last attempt.
#[derive(Clone)]
struct RetriesUnsent;

impl Policy<Counted, &'static str, String> for RetriesUnsent {
    fn classify(&self, _: &Counted, result: &Result<&'static str, String>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(e) if e.contains("attempt 3") => Decision::retry().because(Cause::NotSent),
            Err(_) => Decision::retry(),
        }
    }

    fn clone_request(&self, request: &Counted) -> Option<Counted> {
        Some(request.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_never_left_is_retried_past_the_last_attempt() {
    // The third attempt "never left": its transparent retry is a fourth.
    let (outcome, copies, stats) = send(RetriesUnsent, 3).await;
    assert_eq!(outcome, Ok("done"));
    assert_eq!(stats.attempts, 4, "{stats:?}");
    assert_eq!(copies, 4);
}

/// The same through `HttpPolicy`, whose request bodies are any `Clone` type.
#[cfg(feature = "hyper")]
mod http_policy {
    use super::*;
    use http::{Request, Response, StatusCode};
    use tower_backoff::http::HttpPolicy;

    /// 503 for the first `failures` attempts, then 200.
    fn server(
        failures: u32,
    ) -> impl Service<Request<Counted>, Response = Response<String>, Error = std::io::Error> + Clone
    {
        let calls = Arc::new(AtomicU32::new(0));
        service_fn(move |_: Request<Counted>| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            let status = if n < failures {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            let mut response = Response::new(String::new());
            *response.status_mut() = status;
            async move { Ok::<_, std::io::Error>(response) }
        })
    }

    /// Copies of the body one GET made through `policy`, 3 attempts allowed.
    async fn copies_through(policy: HttpPolicy, failures: u32) -> (StatusCode, u32) {
        let layer = BackoffLayer::builder()
            .policy(policy)
            .schedule(Constant::new(Duration::ZERO))
            .max_attempts(3)
            .no_budget()
            .build()
            .unwrap();
        let copies = Arc::new(AtomicU32::new(0));
        let body = Counted {
            copies: Arc::clone(&copies),
        };
        let request = Request::get("http://localhost/").body(body).unwrap();
        let response = layer
            .layer(server(failures))
            .oneshot(request)
            .await
            .unwrap();
        (response.status(), copies.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_goes_out_as_a_copy() {
        assert_eq!(
            copies_through(HttpPolicy::new(), 2).await,
            (StatusCode::OK, 3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_retry_unsent_every_attempt_gets_a_copy() {
        // A request that never left may be retried past the last attempt.
        assert_eq!(
            copies_through(HttpPolicy::new().retry_unsent(), 2).await,
            (StatusCode::OK, 3)
        );
    }
}
