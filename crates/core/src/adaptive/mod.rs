//! [`AdaptivePacing`]: a send rate shared by every clone of a service, which
//! falls to what the server accepts while it throttles and climbs back as it
//! recovers.
//!
//! # The algorithm
//!
//! Many workers write to a store that throttles above a rate it does not
//! announce, and that rate changes. Backoff slows down only the request that
//! was throttled; pacing spaces *every* send, first attempts and retries, of
//! every clone, so the aggregate rate follows what the store accepts. It is
//! built like AWS SDKs' *adaptive* retry mode (a client-side token bucket
//! whose fill rate CUBIC drives), with four changes:
//!
//! 1. **Rounds, not responses.** Outcomes are counted over rounds (1 s by
//!    default) and the rate changes at most once a round: 64 workers
//!    throttled together cut it once, not 64 times. Throttled answers to
//!    attempts sent before the last cut answer a rate no longer in force and
//!    are not counted.
//! 2. **Cut to what was accepted.** A throttling store admits up to its rate
//!    and turns the rest away, so a throttled round's successes *are* its
//!    rate: the cut sets `down_multiplier` (0.9) times that, where a fixed
//!    factor overshoots or takes many rounds. The round measuring at full
//!    speed slows down by at most `up_multiplier` (×1.5), and the round right
//!    after a cut does not cut again unless it is far off: a store counting
//!    over a rolling window still digests the burst before it. With fewer
//!    than `success_threshold` successes (an outage) the rate falls one ×1.5
//!    step below the fastest rate that was going, and no further: an outage
//!    says nothing about the rate the store will accept once back.
//! 3. **A count taken in a burst is a lower bound: slow start from it.** Sent
//!    faster than its rate, a rolling-window store admits one burst a window,
//!    and a round counts whatever share of it falls inside. So the round at
//!    full speed, and any round paced more than `up_multiplier`² above what
//!    it got accepted, only bound the rate from below: the rate falls one
//!    ×1.5 step below what was going, no further (a server coming back from
//!    an outage mid-round shows as few successes, and a rate cut to them
//!    strands every caller queued behind it); the round right after keeps
//!    the larger of both counts. From a bound each clean round raises
//!    the rate ×1.5 (a slow start, as TCP's) until a paced round is
//!    throttled: it crosses the rate by ×1.5 at most, and its count is the
//!    rate.
//! 4. **Climb along CUBIC's curve, per round.** Each clean round raises the
//!    rate along `peak × (1 + 0.01 (t − K)³)`, `t` rounds after the cut:
//!    back near the peak in two rounds, flat around it, convex beyond, and
//!    never more than 15 % a round above the peak, so a rising rate never
//!    releases a burst. Where CUBIC's curve in absolute sends (AWS's
//!    constant) is faster it is taken: the same gain for every client makes
//!    unequal clients converge on fair shares.
//!
//! Pacing turns itself off when a clean round would set a rate above the peak
//! and the rate in force let through at least twice what was sent, and a
//! send or so more (below the peak, clients queued behind it would all leave
//! at once). The next throttled outcome turns it back on, with one round
//! measuring at full speed.
//!
//! **Backpressure, not sleeps.** Sends take slots on one shared timeline,
//! `1 / rate` apart, in `poll_ready`, as `tower::limit::RateLimit` does: the
//! clone that was readied is the one that sends, and a waiting clone holds
//! nothing of the inner service (see `gate.rs`).
//!
//! All state is atomics in one `Arc`; a round is closed by whichever outcome
//! arrives after it ends, and only by one. Time is tokio's clock, so paused
//! tests and simulations work. Measured in the simulator's `Pacing`
//! (`crates/sim`) and `examples/paced_writers.rs`.

mod builder;
mod control;
mod gate;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use builder::AdaptivePacingBuilder;
pub(crate) use gate::Gate;

use crate::decision::{Cause, Decision};
use control::{Change, Course, Law, Round};

/// `round_start` when no round runs: pacing is off and idle.
const IDLE: u64 = u64::MAX;

/// A send rate shared by every request through every clone of a service,
/// first attempts included, for jobs whose parallel workers write to a
/// rate-limited store. See the [module docs](self) for the algorithm and
/// [`AdaptivePacingBuilder`] for the settings and their defaults.
///
/// Off until the first throttled outcome (the policy decided
/// [`Cause::Throttled`], or a retry after a server-given delay); then every send waits for its slot at the rate the
/// server was found to accept. While off, a request costs two atomic loads
/// and one uncontended add: no timer, no clock. Clones share the rate and the
/// metrics.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{AdaptivePacing, BackoffLayer};
///
/// let pacing = AdaptivePacing::builder()
///     .max_interval(Duration::from_secs(30))
///     .build()?;
/// let layer = BackoffLayer::builder().pacing(pacing.clone()).build()?;
/// assert_eq!(pacing.interval(), Duration::ZERO);
/// // ...later, when an operator knows the store recovered:
/// pacing.reset();
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AdaptivePacing {
    state: Arc<State>,
}

struct State {
    /// Time zero of every nanosecond count below.
    origin: Instant,
    /// Nanoseconds between sends; zero when not pacing.
    interval: AtomicU64,
    /// The slot last taken on the send timeline.
    last_slot: AtomicU64,
    /// Bumped by every cut and reset: slots and stamps of an older epoch are
    /// void.
    epoch: AtomicU64,
    /// When the current round started, or [`IDLE`].
    round_start: AtomicU64,
    /// The current round's counts.
    sends: AtomicU64,
    successes: AtomicU64,
    throttles: AtomicU64,
    /// Whether the last round cut the rate.
    settling: AtomicBool,
    /// Clones waiting for a slot without one.
    queued: AtomicU64,
    /// Held by the one outcome that closes a round.
    closing: AtomicBool,
    /// The accepted rate at the last cut, per second (f64 bits).
    peak: AtomicU64,
    /// Whether that peak is only a lower bound (counted in a burst).
    at_least: AtomicBool,
    /// The rate the last cut set, per second (f64 bits).
    floor: AtomicU64,
    /// When the last cut was.
    cut_at: AtomicU64,
    invocations: AtomicU64,
    raised: AtomicU64,
    lowered: AtomicU64,
    sleeps: AtomicU64,
    slept_nanos: AtomicU64,
    settings: Settings,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    /// Nanoseconds.
    round: u64,
    law: Law,
    randomization: f64,
    /// Nanoseconds.
    max_spread: u64,
}

/// What an [`AdaptivePacing`] has done, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PacingMetrics {
    /// The interval between sends now; zero when not pacing.
    pub interval: Duration,
    /// Attempts that went out through the pacing (invocations).
    pub invocations: u64,
    /// Times the interval went up: rounds that cut the rate.
    pub raised: u64,
    /// Times it went down: rounds that raised the rate, turning pacing off
    /// included (but not resets).
    pub lowered: u64,
    /// Sends that had to wait for their slot.
    pub sleeps: u64,
    /// Total time they waited.
    pub slept: Duration,
}

impl State {
    /// A pacing that has sent nothing yet.
    fn starting(settings: Settings) -> Self {
        State {
            origin: Instant::now(),
            interval: AtomicU64::new(0),
            last_slot: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            round_start: AtomicU64::new(IDLE),
            sends: AtomicU64::new(0),
            successes: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            settling: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            peak: AtomicU64::new(0),
            at_least: AtomicBool::new(false),
            floor: AtomicU64::new(0),
            cut_at: AtomicU64::new(0),
            invocations: AtomicU64::new(0),
            raised: AtomicU64::new(0),
            lowered: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            slept_nanos: AtomicU64::new(0),
            settings,
        }
    }
}

impl AdaptivePacing {
    /// Another pacing with the same settings, that has sent nothing yet:
    /// what each host of a per-host stack gets.
    pub fn fresh(&self) -> Self {
        Self {
            state: Arc::new(State::starting(self.state.settings)),
        }
    }

    /// Pacing with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> AdaptivePacingBuilder {
        AdaptivePacingBuilder::default()
    }

    /// The interval between sends now; zero when not pacing.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.pacing_interval())
    }

    /// Nanoseconds between sends; zero when off. Off is a round that is not
    /// running: a reset racing with the close of a round may leave an
    /// interval behind, never a pace.
    pub(super) fn pacing_interval(&self) -> u64 {
        let s = &*self.state;
        let interval = s.interval.load(Ordering::Acquire);
        if interval != 0 && s.round_start.load(Ordering::Acquire) == IDLE {
            return 0;
        }
        interval
    }

    /// Turns pacing off now, as if it had never been throttled: waiting
    /// clones send at once, and throttled answers to attempts sent before are
    /// ignored. The next throttled answer turns it back on.
    pub fn reset(&self) {
        let s = &*self.state;
        s.round_start.store(IDLE, Ordering::Release);
        s.interval.store(0, Ordering::Release);
        s.epoch.fetch_add(1, Ordering::AcqRel);
        s.peak.store(0, Ordering::Relaxed);
    }

    /// Reads the interval and the counters.
    pub fn metrics(&self) -> PacingMetrics {
        let s = &*self.state;
        PacingMetrics {
            interval: self.interval(),
            invocations: s.invocations.load(Ordering::Relaxed),
            raised: s.raised.load(Ordering::Relaxed),
            lowered: s.lowered.load(Ordering::Relaxed),
            sleeps: s.sleeps.load(Ordering::Relaxed),
            slept: Duration::from_nanos(s.slept_nanos.load(Ordering::Relaxed)),
        }
    }

    /// Learns from one attempt's outcome; `stamp` is what
    /// [`sent`](Self::sent) gave when the attempt went out.
    pub(crate) fn observe(&self, decision: &Decision, stamp: u16) {
        // Only a throttle says what the server accepts: its law cuts to what
        // a round got accepted. A timeout does not (a server coming back
        // from an outage answers few in time), and cutting to it stranded
        // the callers queued behind the pacing after an outage.
        let throttled = matches!(
            *decision,
            Decision::Retry {
                cause: Cause::Throttled,
                ..
            } | Decision::Retry { after: Some(_), .. }
        );
        let s = &*self.state;
        let start = s.round_start.load(Ordering::Acquire);
        if start == IDLE {
            if throttled {
                self.engage();
            }
            return;
        }
        if throttled {
            if stamp == s.epoch.load(Ordering::Acquire) as u16 {
                s.throttles.fetch_add(1, Ordering::Relaxed);
            }
        } else if *decision == Decision::Success {
            s.successes.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.now_nanos();
        if now.saturating_sub(start) >= s.settings.round && !s.closing.swap(true, Ordering::Acquire)
        {
            // Only the holder of `closing` closes a round, and only the one
            // it read: a reset in between has already ended it.
            if s.round_start.load(Ordering::Acquire) == start {
                self.close_round(start, now);
            }
            s.closing.store(false, Ordering::Release);
        }
    }

    /// The first throttled outcome since pacing was off: measure for one
    /// round at full speed.
    fn engage(&self) {
        let s = &*self.state;
        let now = self.now_nanos();
        if s.round_start
            .compare_exchange(IDLE, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            s.interval.store(0, Ordering::Release);
            s.sends.store(0, Ordering::Relaxed);
            s.successes.store(0, Ordering::Relaxed);
            s.throttles.store(1, Ordering::Relaxed);
            s.cut_at.store(now, Ordering::Relaxed);
        }
    }

    /// Ends the round that started at `start`, now, and applies the law.
    fn close_round(&self, start: u64, now: u64) {
        let s = &*self.state;
        let round = s.settings.round as f64;
        let length = now.saturating_sub(start) as f64 / round;
        let counted = Round {
            length,
            sent: s.sends.swap(0, Ordering::Relaxed) as f64,
            accepted: s.successes.swap(0, Ordering::Relaxed),
            throttled: s.throttles.swap(0, Ordering::Relaxed),
        };
        let interval = s.interval.load(Ordering::Acquire);
        let per_round = |rate_per_s: f64| rate_per_s * round / 1e9;
        let course = Course {
            rate: if interval == 0 {
                f64::INFINITY
            } else {
                round / interval as f64
            },
            peak: per_round(f64::from_bits(s.peak.load(Ordering::Relaxed))),
            at_least: s.at_least.load(Ordering::Relaxed),
            floor: per_round(f64::from_bits(s.floor.load(Ordering::Relaxed))),
            since_cut: now.saturating_sub(s.cut_at.load(Ordering::Relaxed)) as f64 / round,
            settling: s.settling.load(Ordering::Relaxed),
        };
        s.settling.store(false, Ordering::Relaxed);
        let next_start = match s.settings.law.decide(course, counted) {
            Change::Keep => now,
            Change::Cut {
                rate,
                peak,
                at_least,
            } => {
                let per_second = |per_round: f64| (per_round * 1e9 / round).to_bits();
                s.peak.store(per_second(peak), Ordering::Relaxed);
                s.at_least.store(at_least, Ordering::Relaxed);
                s.floor.store(per_second(rate), Ordering::Relaxed);
                s.cut_at.store(now, Ordering::Relaxed);
                s.interval.store(self.interval_for(rate), Ordering::Release);
                // Slots taken at the old rate are void; the timeline restarts.
                s.last_slot.store(now, Ordering::Release);
                s.epoch.fetch_add(1, Ordering::AcqRel);
                s.raised.fetch_add(1, Ordering::Relaxed);
                s.settling.store(true, Ordering::Relaxed);
                now
            }
            Change::Raise(rate) => {
                s.interval.store(self.interval_for(rate), Ordering::Release);
                s.lowered.fetch_add(1, Ordering::Relaxed);
                now
            }
            Change::Off => {
                if interval != 0 {
                    s.lowered.fetch_add(1, Ordering::Relaxed);
                }
                s.interval.store(0, Ordering::Release);
                s.peak.store(0, Ordering::Relaxed);
                IDLE
            }
        };
        s.round_start.store(next_start, Ordering::Release);
    }

    /// Nanoseconds between sends at `rate` sends per round, rounded up (a
    /// rate is never exceeded by rounding) and at least 1.
    fn interval_for(&self, rate: f64) -> u64 {
        let nanos = (self.state.settings.round as f64 / rate).ceil();
        if nanos.is_finite() && nanos >= 1.0 {
            nanos.min(u64::MAX as f64) as u64
        } else {
            1
        }
    }
}

impl Default for AdaptivePacing {
    fn default() -> Self {
        AdaptivePacingBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

impl fmt::Debug for AdaptivePacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptivePacing")
            .field("metrics", &self.metrics())
            .field("settings", &self.state.settings)
            .finish()
    }
}
