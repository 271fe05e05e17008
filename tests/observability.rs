//! What a layer reports: the stats handle, the `on_retry` hook and the events
//! its observers hear (tracing events are in tests/tracing.rs). Real tower
//! layers, paused clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::budget::Budget;
use tower_backoff::events::{Ending, Event, OutcomeKind};
use tower_backoff::{
    BackoffLayer, Cause, Decision, Exponential, Jitter, Policy, PrepareRetry, Stats,
};

type Outcome = Result<&'static str, String>;

/// A service whose requests name how they behave; records every attempt.
fn store(
    attempts: Arc<Mutex<Vec<(&'static str, u32)>>>,
) -> impl Service<&'static str, Response = &'static str, Error = String> + Clone {
    let seen = Arc::new(Mutex::new(HashMap::<&'static str, u32>::new()));
    service_fn(move |request: &'static str| {
        let attempt = {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(request).or_default();
            *n += 1;
            *n
        };
        attempts.lock().unwrap().push((request, attempt));
        let outcome: Outcome = match request {
            "ok" => Ok("done"),
            "flaky" if attempt > 1 => Ok("done"),
            "twice-flaky" if attempt > 2 => Ok("done"),
            _ => Err(format!("{request}: attempt {attempt} failed")),
        };
        async move { outcome }
    })
}

/// Classifies by request name: "final" fails for good, "slow" is told to come
/// back in 5 s, "refused" fails as a timeout, "once" cannot be copied.
#[derive(Clone)]
struct ByName;

impl Policy<&'static str, &'static str, String> for ByName {
    fn classify(&self, request: &&'static str, result: &Outcome) -> Decision {
        match (*request, result) {
            (_, Ok(_)) => Decision::Success,
            ("final", Err(_)) => Decision::Final,
            ("slow", Err(_)) => Decision::retry_after(Duration::from_secs(5)),
            ("refused", Err(_)) => Decision::retry().because(Cause::Timeout),
            (_, Err(_)) => Decision::retry(),
        }
    }

    fn clone_request(&self, request: &&'static str) -> Option<&'static str> {
        (*request != "once").then_some(*request)
    }
}

/// `ByName`, recording each retry its `prepare_retry` sees: the request, the
/// attempt that failed, the delay, and the error replaced.
#[derive(Clone)]
struct Prepared(Arc<Mutex<Vec<PreparedRetry>>>);

/// The request, the attempt that failed, the delay and the error replaced.
type PreparedRetry = (&'static str, u32, Duration, String);

impl Policy<&'static str, &'static str, String> for Prepared {
    fn classify(&self, request: &&'static str, result: &Outcome) -> Decision {
        ByName.classify(request, result)
    }

    fn clone_request(&self, request: &&'static str) -> Option<&'static str> {
        ByName.clone_request(request)
    }

    fn prepare_retry(&self, retry: PrepareRetry<'_, &'static str, &'static str, String>) {
        let (request, args) = (*retry.request(), *retry.args());
        let error = retry.into_replaced().unwrap_err();
        self.0
            .lock()
            .unwrap()
            .push((request, args.attempt(), args.delay(), error));
    }
}

/// Refuses retries after timeouts, allows the others.
struct NoRetryAfterTimeout;

impl Budget for NoRetryAfterTimeout {
    fn try_retry(&self, cause: Cause) -> bool {
        cause != Cause::Timeout
    }
}

#[tokio::test(start_paused = true)]
async fn stats_count_each_way_a_request_ends() {
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .policy(ByName)
        .max_attempts(3)
        .max_elapsed(Duration::from_secs(1))
        .schedule(Exponential::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .budget(NoRetryAfterTimeout)
        .stats(stats.clone())
        .build()
        .unwrap();
    assert!(layer.stats().is_some());
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let service = layer.layer(store(attempts.clone()));

    for (request, succeeds) in [
        ("ok", true),
        ("flaky", true),
        ("final", false),
        ("down", false),
        ("slow", false),
        ("refused", false),
        ("once", false),
    ] {
        let outcome = service.clone().oneshot(request).await;
        assert_eq!(outcome.is_ok(), succeeds, "{request}: {outcome:?}");
    }

    let seen = stats.snapshot();
    assert_eq!(seen.requests, 7);
    assert_eq!(seen.attempts, attempts.lock().unwrap().len() as u64);
    assert_eq!(seen.attempts, 1 + 2 + 1 + 3 + 1 + 1 + 1);
    assert_eq!(seen.retries, 1 + 2);
    assert_eq!(seen.successes, 2);
    assert_eq!(seen.gave_up_final, 1);
    assert_eq!(seen.gave_up_attempts, 1);
    assert_eq!(seen.gave_up_elapsed, 1);
    assert_eq!(seen.budget_refusals, 1);
    assert_eq!(seen.gave_up_not_clonable, 1);
    // "refused" sleeps its 100 ms too: this budget says no only when the
    // retry is about to be sent (it has no `would_allow`).
    assert_eq!(seen.slept, Duration::from_millis(100 + (100 + 200) + 100));
}

#[tokio::test(start_paused = true)]
async fn a_layer_without_stats_has_none() {
    let layer = BackoffLayer::builder().build().unwrap();
    assert!(layer.stats().is_none());
    assert!(layer.pacing().is_none());
}

/// Allows a fixed number of retries in all.
struct Allow(Mutex<u32>);

impl Budget for Allow {
    fn try_retry(&self, _: Cause) -> bool {
        let mut left = self.0.lock().unwrap();
        let allowed = *left > 0;
        *left = left.saturating_sub(1);
        allowed
    }
}

#[tokio::test(start_paused = true)]
async fn on_retry_sees_exactly_the_retries_that_happened() {
    let hooked = Arc::new(Mutex::new(Vec::new()));
    let record = hooked.clone();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let told = heard.clone();
    let layer = BackoffLayer::builder()
        .policy(Prepared(record))
        .on_retry(move |retry, _| {
            told.lock()
                .unwrap()
                .push((retry.attempt(), retry.delay(), retry.replaced()));
        })
        .max_attempts(4)
        .schedule(Exponential::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .budget(Allow(Mutex::new(5)))
        .build()
        .unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let service = layer.layer(store(attempts.clone()));

    // Two retries, then success; three retries, then out of attempts; a final
    // failure, never retried; a fourth request whose retry the budget (5 in
    // all) refuses.
    assert!(service.clone().oneshot("twice-flaky").await.is_ok());
    assert!(service.clone().oneshot("down").await.is_err());
    assert!(service.clone().oneshot("final").await.is_err());
    assert!(service.clone().oneshot("refused-by-budget").await.is_err());

    let ms = Duration::from_millis;
    let failed = |request: &str, attempt| format!("{request}: attempt {attempt} failed");
    assert_eq!(
        *hooked.lock().unwrap(),
        [
            ("twice-flaky", 1, ms(100), failed("twice-flaky", 1)),
            ("twice-flaky", 2, ms(200), failed("twice-flaky", 2)),
            ("down", 1, ms(100), failed("down", 1)),
            ("down", 2, ms(200), failed("down", 2)),
            ("down", 3, ms(400), failed("down", 3)),
        ]
    );
    // The hook heard the same retries, in the same order.
    let error = OutcomeKind::Error;
    assert_eq!(
        *heard.lock().unwrap(),
        [
            (1, ms(100), error),
            (2, ms(200), error),
            (1, ms(100), error),
            (2, ms(200), error),
            (3, ms(400), error),
        ]
    );
    // The same retries the service saw: every attempt after a first one.
    let retried: Vec<_> = attempts
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, attempt)| *attempt > 1)
        .map(|&(request, attempt)| (request, attempt - 1))
        .collect();
    let hooked: Vec<_> = hooked
        .lock()
        .unwrap()
        .iter()
        .map(|(request, attempt, _, _)| (*request, *attempt))
        .collect();
    assert_eq!(retried, hooked);
}

// --- observers of the layer's events ------------------------------------------

/// An observer that keeps every event it hears.
fn recorder() -> (
    Arc<Mutex<Vec<Event>>>,
    impl Fn(&Event) + Send + Sync + 'static,
) {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let record = heard.clone();
    (heard, move |event: &Event| {
        record.lock().unwrap().push(*event)
    })
}

#[tokio::test(start_paused = true)]
async fn an_observer_hears_the_call_each_sleep_each_retry_sent_and_the_ending() {
    let (heard, observer) = recorder();
    // Adding an observer changes no type: this is the default layer's type.
    let layer: BackoffLayer = BackoffLayer::builder()
        .schedule(Exponential::new(Duration::from_millis(100)))
        .jitter(Jitter::None)
        .no_budget()
        .observer(observer)
        .build()
        .unwrap();
    let service = layer.layer(store(Arc::default()));
    assert_eq!(service.oneshot("twice-flaky").await, Ok("done"));

    let ms = Duration::from_millis;
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 6, "{heard:?}");
    assert_eq!(heard[0], Event::Called);
    assert_eq!(heard[1], Event::Slept(ms(100)));
    assert_eq!(heard[3], Event::Slept(ms(200)));
    for (event, attempt, delay) in [(&heard[2], 1, ms(100)), (&heard[4], 2, ms(200))] {
        let Event::Retry(retry) = event else {
            panic!("a retry, not {event:?}")
        };
        assert_eq!(
            (retry.attempt(), retry.delay(), retry.cause()),
            (attempt, delay, Cause::Transient)
        );
        assert_eq!(retry.replaced(), OutcomeKind::Error);
        assert!(!retry.is_transparent());
    }
    let Event::Ended(end) = heard[5] else {
        panic!("the ending, not {:?}", heard[5])
    };
    assert_eq!(
        (end.attempts(), end.slept(), end.ending(), end.outcome()),
        (3, ms(300), Ending::Success, OutcomeKind::Response)
    );
}

#[tokio::test(start_paused = true)]
async fn an_observer_hears_no_retry_that_was_stopped_before_it_went_out() {
    let (heard, observer) = recorder();
    let layer = BackoffLayer::builder()
        .schedule(Exponential::new(Duration::from_secs(1)))
        .jitter(Jitter::None)
        .observer(observer)
        .build()
        .unwrap();
    let service = layer.layer(store(Arc::default()));
    // Dropped during the sleep before its first retry.
    let call = service.oneshot("down");
    assert!(tokio::time::timeout(Duration::from_millis(500), call)
        .await
        .is_err());
    assert_eq!(*heard.lock().unwrap(), [Event::Called]);
}

#[tokio::test(start_paused = true)]
async fn stats_and_other_observers_hear_the_same_requests() {
    let (heard, observer) = recorder();
    let stats = Stats::new();
    let layer = BackoffLayer::builder()
        .max_attempts(2)
        .schedule(Exponential::new(Duration::from_millis(10)))
        .stats(stats.clone())
        .observer(observer)
        .build()
        .unwrap();
    let service = layer.layer(store(Arc::default()));
    assert!(service.clone().oneshot("down").await.is_err());
    assert_eq!(service.oneshot("ok").await, Ok("done"));

    let heard = heard.lock().unwrap();
    let count = |wanted: fn(&Event) -> bool| heard.iter().filter(|e| wanted(e)).count() as u64;
    let seen = stats.snapshot();
    assert_eq!(seen.requests, count(|e| matches!(e, Event::Called)));
    assert_eq!(seen.retries, count(|e| matches!(e, Event::Retry(_))));
    assert_eq!(
        seen.gave_up_attempts,
        count(|e| matches!(e, Event::Ended(end) if end.ending() == Ending::OutOfAttempts))
    );
    assert_eq!(
        seen.successes,
        count(|e| matches!(e, Event::Ended(end) if end.ending() == Ending::Success))
    );
    assert_eq!((seen.requests, seen.retries), (2, 1));
}
