//! [`Metrics`]: the layer's events as metrics, through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), which every exporter reads: Prometheus,
//! OpenTelemetry, StatsD. Every layer has it among its observers under that
//! feature; without a recorder installed, recording costs a load and a
//! branch.
//!
//! The names follow gRPC's per-call retry metrics (gRFC A96), under this
//! crate's prefix, so one dashboard reads HTTP and gRPC alike:
//!
//! | metric | kind | recorded |
//! |---|---|---|
//! | `tower_backoff.call.attempts` | histogram | attempts of each request, the first included |
//! | `tower_backoff.call.retries` | histogram | retries of each request that had any (A96 reports no 0); hedges are not retries |
//! | `tower_backoff.call.hedges` | histogram | hedges of each request that had any |
//! | `tower_backoff.call.transparent_retries` | histogram | free retries of requests that never left, when any |
//! | `tower_backoff.call.retry_delay` | histogram | seconds each retried request slept in all |
//! | `tower_backoff.call.ended` | counter, label `ending` | requests, by how they ended (`success`, `final`, `out_of_attempts`, `out_of_time`, `budget_refused`, `not_replayable`, `breaker_open`) |
//! | `tower_backoff.budget.refusals` | counter | retries the budget refused |
//! | `tower_backoff.breaker.state` | gauge | the circuit breaker's state after its last change: 0 closed, 1 open, 2 half-open |
//! | `tower_backoff.breaker.rejections` | counter | attempts the open breaker did not let out |
//!
//! Every series of a layer copy with an [`Origin`] carries its labels too:
//! `target`, the host (authority) a per-host stack gave the copy (gRFC A96's
//! target label), and `layer`, the layer's
//! [name](crate::BackoffBuilder::name). A per-host stack thus shows a series
//! per host; a plain unnamed layer, series without labels.
//!
//! The facade was chosen over OpenTelemetry's own API because it is one small
//! dependency with a global recorder and no runtime of its own; an
//! OpenTelemetry exporter for it exists.

use std::sync::Arc;

use metrics::{Label, SharedString};

use crate::breaker::BreakerState;
use crate::engine::Ending;
use crate::events::{Event, Observer, Origin};

/// The counter of requests by how they ended.
const ENDED: &str = "tower_backoff.call.ended";

/// Records the metrics above from every request's [`Event::Ended`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics;

/// Records every series of `event` but the [`ENDED`] counter, whose label
/// differs between the two paths, and evaluates to the ending, if any. Each
/// key is the name alone, or with `$labels` when given: a macro, so that an
/// unlabelled key stays a literal the facade keeps in a static.
macro_rules! record {
    ($event:expr $(, $labels:expr)?) => {{
        match $event {
            Event::Ended(end) => {
                metrics::histogram!("tower_backoff.call.attempts" $(, $labels)?)
                    .record(f64::from(end.attempts()));
                if end.hedges() > 0 {
                    metrics::histogram!("tower_backoff.call.hedges" $(, $labels)?)
                        .record(f64::from(end.hedges()));
                }
                if end.retries() > 0 {
                    metrics::histogram!("tower_backoff.call.retries" $(, $labels)?)
                        .record(f64::from(end.retries()));
                    metrics::histogram!("tower_backoff.call.retry_delay" $(, $labels)?)
                        .record(end.slept().as_secs_f64());
                }
                if end.transparent_retries() > 0 {
                    metrics::histogram!("tower_backoff.call.transparent_retries" $(, $labels)?)
                        .record(f64::from(end.transparent_retries()));
                }
                if end.ending() == Ending::BudgetRefused {
                    metrics::counter!("tower_backoff.budget.refusals" $(, $labels)?).increment(1);
                }
                Some(end.ending())
            }
            Event::Breaker(state) => {
                let value = match state {
                    BreakerState::Closed => 0.0,
                    BreakerState::Open => 1.0,
                    BreakerState::HalfOpen => 2.0,
                };
                metrics::gauge!("tower_backoff.breaker.state" $(, $labels)?).set(value);
                None
            }
            Event::Rejected(_) => {
                metrics::counter!("tower_backoff.breaker.rejections" $(, $labels)?).increment(1);
                None
            }
            _ => None,
        }
    }};
}

impl Observer for Metrics {
    /// The same series, labelled with `origin` unless it names nothing. A
    /// labelled key is made per event: a per-host or named layer pays a
    /// small allocation (the labels' list; the strings are shared) per
    /// series recorded.
    fn on_event_from(&self, event: &Event, origin: &Origin) {
        if origin.is_unknown() {
            return self.on_event(event);
        }
        let Some(ending) = record!(event, labels(origin)) else {
            return;
        };
        let mut labels = labels(origin);
        labels.push(Label::from_static_parts("ending", ending_label(ending)));
        metrics::counter!(ENDED, labels).increment(1);
    }

    fn on_event(&self, event: &Event) {
        let Some(ending) = record!(event) else { return };
        // A literal label per arm: the facade keeps such a key in a static,
        // where a label from a variable would allocate on every request.
        let ended = match ending {
            Ending::Success => metrics::counter!(ENDED, "ending" => "success"),
            Ending::Final => metrics::counter!(ENDED, "ending" => "final"),
            Ending::OutOfAttempts => metrics::counter!(ENDED, "ending" => "out_of_attempts"),
            Ending::OutOfTime => metrics::counter!(ENDED, "ending" => "out_of_time"),
            Ending::BudgetRefused => metrics::counter!(ENDED, "ending" => "budget_refused"),
            Ending::NotReplayable => metrics::counter!(ENDED, "ending" => "not_replayable"),
            Ending::BreakerOpen => metrics::counter!(ENDED, "ending" => "breaker_open"),
        };
        ended.increment(1);
    }
}

/// The labels of a series of the layer copy `origin` names.
fn labels(origin: &Origin) -> Vec<Label> {
    let mut labels = Vec::with_capacity(3);
    if let Some(host) = &origin.host {
        labels.push(Label::new("target", SharedString::from(Arc::clone(host))));
    }
    if let Some(name) = &origin.layer_name {
        labels.push(Label::new("layer", SharedString::from(Arc::clone(name))));
    }
    labels
}

/// The value of the `ending` label.
fn ending_label(ending: Ending) -> &'static str {
    match ending {
        Ending::Success => "success",
        Ending::Final => "final",
        Ending::OutOfAttempts => "out_of_attempts",
        Ending::OutOfTime => "out_of_time",
        Ending::BudgetRefused => "budget_refused",
        Ending::NotReplayable => "not_replayable",
        Ending::BreakerOpen => "breaker_open",
    }
}
