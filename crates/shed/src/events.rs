//! [`ShedEvent`]: what the limiter did, told to every [`ShedObserver`]: the
//! metrics (feature `metrics`), `tracing` (feature `tracing`) and your own
//! ([`LimiterBuilder::observer`](crate::LimiterBuilder::observer)).

use std::time::Duration;

use crate::criticality::Priority;
use crate::rejection::Rejection;

/// Something the limiter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShedEvent {
    /// A request of this priority was admitted.
    Admitted(Priority),
    /// A request was rejected, before any work was done.
    Rejected(Rejection),
    /// A window closed and the limit changed.
    Limit(LimitArgs),
    /// A window closed with the limit unchanged: the queueing-time estimate.
    QueueTime(Duration),
}

/// A change of limit: [`ShedEvent::Limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitArgs {
    pub(crate) limit: usize,
    pub(crate) baseline: Duration,
    pub(crate) mean: Duration,
    pub(crate) queue_time: Duration,
}

impl LimitArgs {
    /// The new limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The baseline: the mean latency at low concurrency (zero before
    /// one was measured).
    pub fn baseline(&self) -> Duration {
        self.baseline
    }

    /// The mean latency of the window that just closed.
    pub fn mean(&self) -> Duration {
        self.mean
    }

    /// The queueing-time estimate.
    pub fn queue_time(&self) -> Duration {
        self.queue_time
    }
}

/// Hears every [`ShedEvent`]. Closures `Fn(&ShedEvent)` are observers.
pub trait ShedObserver: Send + Sync + 'static {
    /// Called for every event, on the request's task: keep it short.
    fn on_event(&self, event: &ShedEvent);
}

impl<F> ShedObserver for F
where
    F: Fn(&ShedEvent) + Send + Sync + 'static,
{
    fn on_event(&self, event: &ShedEvent) {
        self(event)
    }
}

/// Logs rejections and changes of limit through `tracing` (feature
/// `tracing`), at debug level under the target `tower_backoff::shed`.
#[cfg(feature = "tracing")]
#[derive(Debug, Clone, Copy, Default)]
pub struct ShedTracing;

#[cfg(feature = "tracing")]
impl ShedObserver for ShedTracing {
    fn on_event(&self, event: &ShedEvent) {
        match event {
            ShedEvent::Rejected(r) => tracing::debug!(
                target: "tower_backoff::shed",
                reason = r.reason().as_str(),
                priority = r.priority().level(),
                retry_after_ms = r.retry_after().map(|d| d.as_millis() as u64),
                limit = r.limit(),
                "request shed"
            ),
            ShedEvent::Limit(args) => tracing::debug!(
                target: "tower_backoff::shed",
                limit = args.limit(),
                baseline_ms = args.baseline().as_secs_f64() * 1e3,
                mean_ms = args.mean().as_secs_f64() * 1e3,
                "concurrency limit changed"
            ),
            _ => {}
        }
    }
}
