//! [`Stats`]: counters of what a layer's services did, readable at any time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{Ending, Event, HedgeEvent, Observer};

/// Counters shared by every service a layer made: requests, attempts, retries
/// and how each request ended. Cloning the handle is cheap and every clone
/// reads the same counters.
///
/// Give it to [`BackoffBuilder::stats`](crate::BackoffBuilder::stats) and keep
/// a clone to read. A layer without stats counts nothing and pays nothing;
/// with stats, each event is one relaxed atomic add.
///
/// Each request ends in exactly one way, so once no request is in flight
/// `requests` is the sum of `successes`, `budget_refusals` and the five
/// `gave_up_*` counters (a request dropped by its caller ends in none).
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower::{service_fn, ServiceExt};
/// use tower_backoff::{BackoffLayer, Stats};
///
/// let stats = Stats::new();
/// let layer = BackoffLayer::builder().max_attempts(2).stats(stats.clone()).build()?;
/// let failing = service_fn(|_: ()| async { Err::<(), _>("down") });
/// let svc = tower::Layer::layer(&layer, failing);
/// assert!(svc.oneshot(()).await.is_err());
///
/// let seen = stats.snapshot();
/// assert_eq!((seen.requests, seen.attempts, seen.retries), (1, 2, 1));
/// assert_eq!(seen.gave_up_attempts, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Stats {
    counters: Arc<Counters>,
}

// In declaration order, the ending counters in the order of `Ending`'s
// variants: the counter an ending adds to is then the ending scaled, not a
// table lookup.
#[derive(Default)]
#[repr(C)]
struct Counters {
    requests: AtomicU64,
    // No counter of attempts: every request's first attempt and every retry
    // is one, so it is `requests + retries`, worked out when read (one
    // atomic add fewer a call and a retry).
    retries: AtomicU64,
    successes: AtomicU64,
    gave_up_final: AtomicU64,
    gave_up_attempts: AtomicU64,
    gave_up_elapsed: AtomicU64,
    budget_refusals: AtomicU64,
    gave_up_not_clonable: AtomicU64,
    gave_up_breaker: AtomicU64,
    breaker_rejections: AtomicU64,
    hedges: AtomicU64,
    hedges_won: AtomicU64,
    hedges_cancelled: AtomicU64,
    slept_nanos: AtomicU64,
}

/// The counters of a [`Stats`] at one moment.
///
/// Each counter is read on its own, so a snapshot taken while requests are in
/// flight may be a few events apart between counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Requests the services were called with.
    pub requests: u64,
    /// Attempts sent to the inner service: first attempts, retries and
    /// hedges.
    pub attempts: u64,
    /// Retries sent to the inner service.
    pub retries: u64,
    /// Requests that ended with an outcome the policy called a success.
    pub successes: u64,
    /// Requests that ended because the budget refused a retry.
    pub budget_refusals: u64,
    /// Requests that ended because they ran out of attempts.
    pub gave_up_attempts: u64,
    /// Requests that ended because a retry would have passed the time limit.
    pub gave_up_elapsed: u64,
    /// Requests that ended with a failure the policy called final, or because
    /// the inner service failed to become ready for a retry.
    pub gave_up_final: u64,
    /// Requests that ended because the policy could not copy them for a
    /// retry (a POST, a streaming body past its replay limit).
    pub gave_up_not_clonable: u64,
    /// Requests that ended because the open circuit breaker stopped a retry
    /// (they return the outcome before).
    pub gave_up_breaker: u64,
    /// Attempts the open circuit breaker did not let out: requests rejected
    /// outright (which are not among `requests`) and retries stopped.
    pub breaker_rejections: u64,
    /// Hedges sent: copies of an attempt still pending (see
    /// [`hedge`](crate::hedge)).
    pub hedges: u64,
    /// Hedges whose outcome won: their request ended with it.
    pub hedges_won: u64,
    /// Copies dropped because another copy's outcome won.
    pub hedges_cancelled: u64,
    /// Total time slept between attempts (backoff delays, not pacing).
    pub slept: Duration,
}

impl Stats {
    /// Counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let c = &*self.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            requests: read(&c.requests),
            attempts: read(&c.requests)
                .saturating_add(read(&c.retries))
                .saturating_add(read(&c.hedges)),
            retries: read(&c.retries),
            successes: read(&c.successes),
            budget_refusals: read(&c.budget_refusals),
            gave_up_attempts: read(&c.gave_up_attempts),
            gave_up_elapsed: read(&c.gave_up_elapsed),
            gave_up_final: read(&c.gave_up_final),
            gave_up_not_clonable: read(&c.gave_up_not_clonable),
            gave_up_breaker: read(&c.gave_up_breaker),
            breaker_rejections: read(&c.breaker_rejections),
            hedges: read(&c.hedges),
            hedges_won: read(&c.hedges_won),
            hedges_cancelled: read(&c.hedges_cancelled),
            slept: Duration::from_nanos(read(&c.slept_nanos)),
        }
    }

    fn record_sleep(&self, slept: Duration) {
        let nanos = u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX);
        let total = &self.counters.slept_nanos;
        // Saturating: a custom schedule's `Duration::MAX` sleeps would wrap
        // the total back to small numbers.
        let _ = total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
            Some(total.saturating_add(nanos))
        });
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// Stats is an observer of the layer's events, kept beside the others and
/// called directly: counting is one relaxed atomic add an event.
impl Observer for Stats {
    fn on_event(&self, event: &Event) {
        let c = &*self.counters;
        let counter = match event {
            Event::Called => &c.requests,
            Event::Retry(_) => &c.retries,
            Event::Slept(slept) => return self.record_sleep(*slept),
            Event::Ended(end) => match end.ending() {
                Ending::Success => &c.successes,
                Ending::Final => &c.gave_up_final,
                Ending::OutOfAttempts => &c.gave_up_attempts,
                Ending::OutOfTime => &c.gave_up_elapsed,
                Ending::BudgetRefused => &c.budget_refusals,
                Ending::NotReplayable => &c.gave_up_not_clonable,
                Ending::BreakerOpen => &c.gave_up_breaker,
            },
            Event::Rejected(_) => &c.breaker_rejections,
            Event::Breaker(_) => return,
            Event::Hedge(hedge) => match hedge.event() {
                HedgeEvent::Sent => &c.hedges,
                HedgeEvent::Won => &c.hedges_won,
                HedgeEvent::Cancelled => &c.hedges_cancelled,
            },
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_slept_saturates_instead_of_wrapping() {
        let stats = Stats::new();
        stats.on_event(&Event::Slept(Duration::MAX));
        stats.on_event(&Event::Slept(Duration::from_secs(1)));
        assert_eq!(stats.snapshot().slept, Duration::from_nanos(u64::MAX));
    }
}
