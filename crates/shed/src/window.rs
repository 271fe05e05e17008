//! [`Window`]: what the limiter measured since its last adjustment, and the
//! rule that turns it into the next limit.
//!
//! Overload is queueing: latency that grows with concurrency. A server that
//! is merely slow (a slower dependency, variable work, slow requests) is not
//! overloaded, so the rule compares latency with the **baseline**, what the
//! server does at low concurrency, never with the fastest it ever was:
//! - the baseline is a mean of the latency of successful requests admitted
//!   beside at most half the limit, while the limit is not reached (a
//!   minimum would be dragged down by ordinary variance, as Netflix's
//!   `Gradient2Limit` notes);
//! - while the limit is reached (half of it may then be past the knee), a
//!   **probe** re-measures it: half the limit is admitted until a cohort of
//!   requests is, and the mean latency of the whole cohort, once every one
//!   of it finished, is the baseline (Envoy's adaptive concurrency filter
//!   re-measures at its minimum concurrency). A probe that finds latency
//!   about as high as at the limit has shown that latency does not grow
//!   with concurrency, and the baseline rises to it; one that finds it
//!   lower lowers it; otherwise the baseline stays;
//! - the limit shrinks only while it is reached (a limit no request meets
//!   cannot be what queues them), in proportion as latency passes
//!   `tolerance × baseline` by more than the window's noise, and grows by a
//!   fifth of `√limit` while latency stays within it and the limit is in
//!   use.
//!
//! A window closes when it has lasted `window` and holds `min_samples`
//! measurements, however long that takes: ten requests a second adapt as
//! ten thousand do, only more slowly.

use std::time::{Duration, Instant};

use crate::config::Config;

/// Samples of the baseline's running mean: a new mean moves it by
/// `n / (n + BASELINE_WEIGHT)` of the way.
const BASELINE_WEIGHT: f64 = 32.0;
/// Requests a probe admits and waits for, all of them (the first to finish
/// are the fastest, and a probe that waited only for them would learn a
/// baseline below what the server does): four per place it admits, within
/// these bounds, so that a probe lasts a few latencies.
const PROBE_SAMPLES: std::ops::RangeInclusive<u32> = 5..=20;
/// The share of the limit a probe admits its cohort beside: half, so that
/// queueing, which would halve the latency, stands out of the noise.
const PROBE_LEVEL: f64 = 0.5;
/// The soonest a probe follows the last, doubling while probes find the
/// baseline unchanged, up to [`PROBE_INTERVAL`].
const PROBE_SPACING: Duration = Duration::from_secs(5);
/// The longest between probes while the limit turns requests away and no
/// request runs at low concurrency.
const PROBE_INTERVAL: Duration = Duration::from_secs(60);
/// A probe whose requests have not all finished in this long gives up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Consecutive windows that shrank the limit before a probe checks the
/// baseline they shrank against.
const SHRINKS_BEFORE_PROBE: u32 = 3;

/// The measurements since the last adjustment, and the state of the rule.
#[derive(Debug)]
pub(crate) struct Window {
    /// When the current rate window started.
    tick: Option<Instant>,
    /// Successful requests since `tick`.
    done: u32,
    /// Completions per second, smoothed over about a second.
    pub(crate) throughput: f64,
    /// Rejections per second, smoothed over about a second.
    pub(crate) rejections: f64,
    /// When the current sample window started.
    start: Option<Instant>,
    sum: f64,
    squares: f64,
    count: u32,
    low_sum: f64,
    low_count: u32,
    /// The most requests in flight seen in this sample window.
    pub(crate) peak: usize,
    /// The limit, unrounded.
    pub(crate) limit: f64,
    /// The latency at low concurrency, seconds.
    pub(crate) baseline: Option<f64>,
    /// The samples the baseline's mean holds, up to [`BASELINE_WEIGHT`].
    baseline_weight: f64,
    /// The running mean latency while the limit is reached.
    at_limit: Option<f64>,
    probe: Option<Probe>,
    last_probe: Option<Instant>,
    /// The limit when the last probe started.
    probed_at: f64,
    spacing: Duration,
    shrinks: u32,
    /// Windows in a row the limit sat at its minimum, turning requests away.
    at_min: u32,
    last_low: Option<Instant>,
}

/// A re-measurement of the baseline at half the limit, over a cohort of
/// requests admitted at it.
#[derive(Debug, Clone, Copy)]
struct Probe {
    level: usize,
    started: Instant,
    sum: f64,
    count: u32,
    /// Of the cohort, those done: measured or failed.
    finished: u32,
    cohort: u32,
}

/// A successful request's measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// From admission to the end of its response.
    pub(crate) latency: Duration,
    /// Requests in flight when it was admitted, itself included.
    pub(crate) beside: usize,
    /// Whether it is one of a probe's cohort.
    pub(crate) cohort: bool,
}

/// What closing a window changed.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Closed {
    /// A rate window closed: the new queueing-time estimate, seconds.
    pub(crate) drain: Option<f64>,
    /// A sample window closed: its mean latency, seconds.
    pub(crate) mean: Option<f64>,
    /// The requests to admit beside each other from now on, when that
    /// changed: the limit, or a probe's level.
    pub(crate) admit: Option<usize>,
    /// A probe started (its cohort's size) or ended (zero).
    pub(crate) cohort: Option<u32>,
}

impl Window {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            tick: None,
            done: 0,
            throughput: 0.0,
            rejections: 0.0,
            start: None,
            sum: 0.0,
            squares: 0.0,
            count: 0,
            low_sum: 0.0,
            low_count: 0,
            peak: 0,
            limit: limit as f64,
            baseline: None,
            baseline_weight: 0.0,
            at_limit: None,
            probe: None,
            last_probe: None,
            probed_at: limit as f64,
            spacing: PROBE_SPACING,
            shrinks: 0,
            at_min: 0,
            last_low: None,
        }
    }

    /// The limit as admitted: rounded.
    pub(crate) fn rounded(&self) -> usize {
        self.limit.round() as usize
    }

    /// Adds a successful request's latency; `in_flight` were in flight at
    /// its end, itself included.
    pub(crate) fn record(&mut self, sample: Sample, in_flight: usize, now: Instant) {
        self.start.get_or_insert(now);
        self.tick.get_or_insert(now);
        let latency = sample.latency.as_secs_f64();
        self.done = self.done.saturating_add(1);
        self.peak = self.peak.max(in_flight);
        if sample.cohort {
            if let Some(probe) = &mut self.probe {
                probe.sum += latency;
                probe.count += 1;
                probe.finished += 1;
            }
            return;
        }
        self.sum += latency;
        self.squares += latency * latency;
        self.count = self.count.saturating_add(1);
        if sample.beside as f64 <= (self.limit / 2.0).max(1.0) {
            self.low_sum += latency;
            self.low_count = self.low_count.saturating_add(1);
        }
    }

    /// One of a probe's cohort failed: it finished, unmeasured.
    pub(crate) fn cohort_failed(&mut self) {
        if let Some(probe) = &mut self.probe {
            probe.finished += 1;
        }
    }

    /// Closes what is due at `now`: the rate window (every `window`), a
    /// probe that has its samples, and the sample window (once it lasted
    /// `window` with `min_samples`). `rejected` is read for the rates,
    /// `turned_away` (requests rejected since the last sample window) only
    /// when a sample window closes.
    pub(crate) fn close(
        &mut self,
        config: &Config,
        now: Instant,
        in_flight: usize,
        rejected: impl FnOnce() -> u64,
        turned_away: impl FnOnce() -> u64,
    ) -> Closed {
        let mut closed = Closed::default();
        let tick = *self.tick.get_or_insert(now);
        let elapsed = now.saturating_duration_since(tick);
        if elapsed >= config.window {
            let secs = elapsed.as_secs_f64();
            // Rates smoothed over about a second, whatever the windows' length.
            let alpha = 1.0 - (-secs).exp();
            self.throughput += alpha * (f64::from(self.done) / secs - self.throughput);
            self.rejections += alpha * (rejected() as f64 / secs - self.rejections);
            closed.drain = Some(if self.rejections < 1e-9 {
                0.0
            } else if self.throughput < 1e-9 {
                f64::INFINITY
            } else {
                self.rejections / self.throughput
            });
            self.tick = Some(now);
            self.done = 0;
        }
        if let Some(probe) = self.probe {
            let long = now.saturating_duration_since(probe.started);
            if probe.finished >= probe.cohort || long >= PROBE_TIMEOUT {
                self.probe = None;
                if probe.count > 0 && probe.finished >= probe.cohort {
                    self.end_probe(probe, config, now);
                }
                closed.admit = Some(self.rounded());
                closed.cohort = Some(0);
            }
        }
        let start = *self.start.get_or_insert(now);
        if self.count < config.min_samples || now.saturating_duration_since(start) < config.window {
            return closed;
        }
        let count = f64::from(self.count);
        let mean = self.sum / count;
        // The mean's standard error: what noise alone moves it by.
        let error = ((self.squares / count - mean * mean).max(0.0) / count).sqrt();
        closed.mean = Some(mean);
        let turned_away = turned_away() as f64;
        let bound = turned_away > 0.0 || self.peak >= self.rounded();
        // While the limit is reached, half of it may still be far past the
        // knee: only a probe measures the baseline then.
        if self.low_count > 0 && !bound {
            let low = self.low_sum / f64::from(self.low_count);
            let n = f64::from(self.low_count);
            // A plain mean until it holds BASELINE_WEIGHT samples, then a
            // running one: the first few to finish are the fastest.
            let b = self.baseline.unwrap_or(low);
            self.baseline = Some(b + n / (n + self.baseline_weight) * (low - b));
            self.baseline_weight = (self.baseline_weight + n).min(BASELINE_WEIGHT);
            self.last_low = Some(now);
        }
        if bound && self.probe.is_none() {
            let a = self.at_limit.unwrap_or(mean);
            self.at_limit = Some(a + count / (count + BASELINE_WEIGHT) * (mean - a));
        }
        if self.probe.is_none() {
            let before = self.rounded();
            self.adjust(config, mean, error, bound);
            let at_min = bound && self.limit <= config.min_limit as f64;
            self.at_min = if at_min { self.at_min + 1 } else { 0 };
            if bound && self.probe_due(now) {
                let level = (self.limit * PROBE_LEVEL).floor().max(1.0) as usize;
                let cohort = u32::try_from(level.saturating_mul(4))
                    .unwrap_or(u32::MAX)
                    .clamp(*PROBE_SAMPLES.start(), *PROBE_SAMPLES.end());
                self.probe = Some(Probe {
                    level,
                    started: now,
                    sum: 0.0,
                    count: 0,
                    finished: 0,
                    cohort,
                });
                closed.cohort = Some(cohort);
                self.last_probe = Some(now);
                self.probed_at = self.limit;
                self.shrinks = 0;
                self.at_min = 0;
                closed.admit = Some(level);
            } else if self.rounded() != before {
                closed.admit = Some(self.rounded());
            }
        }
        self.start = Some(now);
        self.sum = 0.0;
        self.squares = 0.0;
        self.count = 0;
        self.low_sum = 0.0;
        self.low_count = 0;
        self.peak = in_flight;
        closed
    }

    /// The gradient step: shrink while the limit is reached and latency is
    /// past the tolerance by more than noise, grow by a share of `√limit`
    /// while it is within and the limit in use.
    fn adjust(&mut self, config: &Config, mean: f64, error: f64, bound: bool) {
        let old = self.limit;
        let in_use = bound || self.peak as f64 >= old / 2.0;
        let allowed = self.baseline.map(|b| config.tolerance * b);
        let limit = match allowed {
            Some(allowed) if mean > allowed => {
                if !bound || mean - 2.0 * error <= allowed {
                    return;
                }
                self.shrinks += 1;
                let gradient = (allowed / mean).max(0.5);
                old + config.smoothing * (old * gradient - old)
            }
            _ => {
                self.shrinks = 0;
                if !in_use {
                    return;
                }
                old + config.smoothing * old.sqrt()
            }
        };
        self.limit = limit.clamp(config.min_limit as f64, config.max_limit as f64);
    }

    /// Whether the baseline needs re-measuring: never measured, the limit
    /// shrank against it window after window (at once when it halved, or
    /// sat at its minimum), or no request has run at low concurrency for
    /// long.
    fn probe_due(&self, now: Instant) -> bool {
        let since = |at: Option<Instant>| at.map(|at| now.saturating_duration_since(at));
        let urgent = self.at_min >= SHRINKS_BEFORE_PROBE || self.limit <= self.probed_at / 2.0;
        if urgent && since(self.last_probe).is_none_or(|d| d >= PROBE_SPACING / 5) {
            return true;
        }
        let spaced = since(self.last_probe).is_none_or(|d| d >= self.spacing);
        let stale = since(self.last_low).is_none_or(|d| d >= PROBE_INTERVAL);
        spaced && (self.baseline.is_none() || self.shrinks >= SHRINKS_BEFORE_PROBE || stale)
    }

    fn end_probe(&mut self, probe: Probe, config: &Config, now: Instant) {
        self.probe = None;
        self.last_low = Some(now);
        let measured = probe.sum / f64::from(probe.count);
        let before = self.baseline;
        // Latency at half the limit about as high as at the limit does not
        // grow with concurrency (queueing would have halved it): the
        // baseline is it.
        let ratio = (self.probed_at / probe.level as f64).max(1.0).sqrt();
        let flat = self
            .at_limit
            .is_none_or(|at_limit| at_limit <= config.tolerance.max(ratio) * measured);
        let accept = before.is_none_or(|b| measured <= b || flat);
        if accept {
            self.baseline = Some(measured);
            self.baseline_weight = f64::from(probe.count);
            self.at_limit = None;
        }
        let changed = match before {
            Some(b) => accept && (measured / b - 1.0).abs() > 0.2,
            None => true,
        };
        self.spacing = if changed {
            PROBE_SPACING
        } else {
            (self.spacing * 2).min(PROBE_INTERVAL)
        };
    }
}
