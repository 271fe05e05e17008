//! [`ShedMetrics`]: the limiter's events as metrics through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), in the client's naming:
//!
//! | metric | kind | recorded |
//! |---|---|---|
//! | `tower_backoff.shed.limit` | gauge | the concurrency limit after each change |
//! | `tower_backoff.shed.admitted` | counter | requests admitted |
//! | `tower_backoff.shed.rejected` | counter, label `reason` | requests shed, by reason (`limit`, `priority`, `drain`) |
//! | `tower_backoff.shed.queue_time` | histogram | the queueing-time estimate, seconds, per window |
//!
//! Every limiter built under the feature has it among its observers.

use crate::events::{ShedEvent, ShedObserver};

/// Records the metrics above.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShedMetrics;

impl ShedObserver for ShedMetrics {
    fn on_event(&self, event: &ShedEvent) {
        match event {
            ShedEvent::Admitted(_) => metrics::counter!("tower_backoff.shed.admitted").increment(1),
            ShedEvent::Rejected(r) => {
                metrics::counter!("tower_backoff.shed.rejected", "reason" => r.reason().as_str())
                    .increment(1)
            }
            ShedEvent::Limit(args) => {
                metrics::gauge!("tower_backoff.shed.limit").set(args.limit() as f64);
                metrics::histogram!("tower_backoff.shed.queue_time")
                    .record(args.queue_time().as_secs_f64());
            }
            ShedEvent::QueueTime(queue_time) => {
                metrics::histogram!("tower_backoff.shed.queue_time")
                    .record(queue_time.as_secs_f64());
            }
        }
    }
}
