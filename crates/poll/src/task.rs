//! One provider's polling loop: poll, record, sleep for the interval or the
//! backoff, until the provider is evicted for good or removed.

use std::fmt::Display;
use std::future::poll_fn;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};
use tower_service::Service;

use tower_backoff_core::budget::Budget;
use tower_backoff_core::engine::UNLIMITED_ATTEMPTS;
use tower_backoff_core::engine::{Retry, Rules, Session};
use tower_backoff_core::error::MAX_DURATION;
use tower_backoff_core::policy::{Cause, Decision};
use tower_backoff_core::Rng;

use super::board::State;
use super::config::Config;
use super::event::Failure;
use super::registry::Shared;

/// A failed poll, as the backoff needs it.
struct Failed {
    failure: Failure,
    /// A delay the policy asked for instead of the schedule's.
    after: Option<Duration>,
    cause: Cause,
}

/// Polls `service` until the provider is evicted without re-probes or is no
/// longer registered under `id`. Aborting the task at any await is safe: the
/// registry is only touched between awaits.
pub(super) async fn run<K, Req, V, E, S>(
    shared: Arc<Shared<K, Req, V, E>>,
    id: u64,
    key: K,
    mut service: S,
    rng: Rng,
) where
    K: Clone + Eq + Hash,
    S: Service<Req, Response = V, Error = E>,
    E: Display,
{
    let _evict_on_panic = PanicGuard {
        shared: &shared,
        id,
        key: &key,
    };
    let config = &shared.config;
    let budget = config.budget.as_deref();
    // The engine decides every delay and pays every retry as for a request
    // that never ends: a run of failures is one session, started over after
    // each success.
    let rules: Rules<'_, _, dyn Budget> = Rules {
        schedule: &config.schedule,
        jitter: config.jitter,
        stop_at_cap: false,
        exact_server_delays: false,
        // Checked when the retry goes out, not when it is decided: a poller
        // refused a retry polls again later instead of giving up.
        budget: None,
    };
    let mut session = Session::new(UNLIMITED_ATTEMPTS, None).with_rng(rng);
    let mut failures = 0u32;
    // The retry the last failure decided, sent by the next poll.
    let mut retry: Option<Retry> = None;
    loop {
        match &retry {
            None => {
                if let Some(budget) = budget {
                    budget.on_first_attempt();
                }
            }
            Some(decided) => {
                if session
                    .send(decided, budget, no_clock, || Some(()))
                    .is_err()
                {
                    let delay = match config.reprobe_after {
                        Some(reprobe) if failures >= config.max_failures => reprobe,
                        _ => session.next_delay(rules.schedule, rules.jitter, no_rng),
                    };
                    let next_poll = later(Instant::now(), delay);
                    if !shared.deferred(id, &key, next_poll) {
                        return;
                    }
                    sleep_until(next_poll).await;
                    continue;
                }
            }
        }

        let started = Instant::now();
        let outcome = poll_once(config, &key, &mut service).await;
        let now = Instant::now();
        let took = now - started;
        let next_poll = match outcome {
            Ok(value) => {
                if let Some(budget) = budget {
                    budget.on_success(session.last_retry());
                }
                session.reset();
                retry = None;
                let recovered_from = std::mem::take(&mut failures);
                let next_poll = later(now, config.interval);
                if !shared.succeeded(id, &key, value, started..now, next_poll, recovered_from) {
                    return;
                }
                next_poll
            }
            Err(failed) => {
                failures = failures.saturating_add(1);
                let (state, next_poll) = if failures >= config.max_failures {
                    let reprobe_at = config.reprobe_after.map(|after| later(now, after));
                    retry = reprobe_at.map(|_| Retry::planned(failed.cause));
                    let state = State::Evicted {
                        failures,
                        reprobe_at,
                    };
                    (state, reprobe_at)
                } else {
                    let decided = session
                        .decide(&rules, failed.after, failed.cause, true, no_clock, no_rng)
                        .expect("unlimited, replayable, with no deadline and no budget to refuse");
                    let next_poll = later(now, decided.delay);
                    retry = Some(decided);
                    let state = State::Quarantined {
                        failures,
                        next_poll,
                    };
                    (state, Some(next_poll))
                };
                if !shared.failed(id, &key, failed.failure, took, state) {
                    return;
                }
                match next_poll {
                    Some(at) => at,
                    // Evicted for good: the service is dropped with the task.
                    None => return,
                }
            }
        };
        sleep_until(next_poll).await;
    }
}

/// The engine reads a clock only for a deadline, and a poll has none.
fn no_clock() -> Instant {
    unreachable!("a poller's session has no deadline")
}

/// The session draws from the provider's own stream, given at its start.
fn no_rng() -> Rng {
    unreachable!("a poller's session has its random stream from the start")
}

/// Evicts the provider if its task unwinds. Dropped without a panic (the task
/// ended or was aborted), it does nothing.
struct PanicGuard<'a, K: Clone + Eq + Hash, Req, V, E> {
    shared: &'a Shared<K, Req, V, E>,
    id: u64,
    key: &'a K,
}

impl<K: Clone + Eq + Hash, Req, V, E> Drop for PanicGuard<'_, K, Req, V, E> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.panicked(self.id, self.key);
        }
    }
}

/// One poll: readiness and call, within the timeout, classified by the policy.
async fn poll_once<K, Req, V, E, S>(
    config: &Config<K, Req, V, E>,
    key: &K,
    service: &mut S,
) -> Result<V, Failed>
where
    S: Service<Req, Response = V, Error = E>,
    E: Display,
{
    let request = (config.make_request)(key);
    let copy = config
        .policy
        .as_ref()
        .and_then(|policy| policy.clone_request(&request));
    let call = async {
        poll_fn(|cx| service.poll_ready(cx)).await?;
        service.call(request).await
    };
    let result = match config.timeout {
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_elapsed) => {
                return Err(Failed {
                    failure: Failure::TimedOut,
                    after: None,
                    cause: Cause::Timeout,
                })
            }
        },
        None => call.await,
    };
    let decision = match (&config.policy, &copy) {
        (Some(policy), Some(request)) => policy.classify(request, &result),
        _ if result.is_ok() => Decision::Success,
        _ => Decision::retry(),
    };
    let (after, cause) = match decision {
        Decision::Success => match result {
            Ok(value) => return Ok(value),
            Err(_) => (None, Cause::Transient),
        },
        Decision::Retry { after, cause } => (after, cause),
        _ => (None, Cause::Transient),
    };
    let failure = match &result {
        Ok(_) => Failure::Rejected,
        Err(error) => Failure::Error(error.to_string()),
    };
    Err(Failed {
        failure,
        after,
        cause,
    })
}

/// `now + delay`, never overflowing the clock, whatever a schedule or a
/// policy's `Retry-After` asks for.
fn later(now: Instant, delay: Duration) -> Instant {
    now + delay.min(MAX_DURATION)
}
