//! [`AdaptivePacing`]: a send rate shared by every clone of a service, which
//! falls to what the server accepts while it throttles and climbs back as it
//! recovers.
//!
//! # The algorithm
//!
//! The problem: many workers write to a store that throttles above a rate it
//! does not announce (DynamoDB's provisioned capacity), and that rate changes.
//! Backoff alone slows down only the request that was throttled; the others
//! keep the store saturated. Pacing spaces *every* send, first attempts and
//! retries, of every clone, so the aggregate rate follows what the store
//! accepts. It is built like AWS SDKs' *adaptive* retry mode (a client-side
//! token bucket whose fill rate CUBIC drives from the measured send rate),
//! with four changes the measurements asked for:
//!
//! 1. **Rounds, not responses.** Outcomes are counted over rounds (1 s by
//!    default) and the rate changes at most once per round. AWS changes it on
//!    every throttled response, so 64 workers throttled together cut it 64
//!    times; here they cut it once. Throttled answers to attempts sent before
//!    the last cut are not counted: they answer a rate no longer in force.
//! 2. **Cut to what was accepted, not by a fixed factor.** A store that
//!    throttles admits up to its rate and turns the rest away, so the
//!    successes of a throttled round *are* its rate. The cut sets the rate to
//!    `down_multiplier` (0.9) times that: one round finds the rate, with 10 %
//!    headroom, where a fixed factor either overshoots by orders of magnitude
//!    or takes many rounds. Two guards against a bad measurement: the round
//!    that measures at full speed slows down by at most `up_multiplier`
//!    (×1.5; a server that admitted its whole second in a burst before the
//!    round began shows too few successes in it), and the round right after
//!    a cut does not cut again unless it is far off (a server counting over
//!    a rolling window keeps refusing until the window has moved past the
//!    burst). When nothing got through (fewer than `success_threshold`
//!    successes: an outage), the rate falls one ×1.5 step below the fastest
//!    rate that was going, and no further: an outage says nothing about the
//!    rate the server will accept when it is back, and in the storm
//!    simulation backing off further delayed or prevented recovery.
//! 3. **A count taken in a burst is a lower bound: slow start from it.** Sent
//!    faster than its rate, a store counting over a rolling window admits
//!    its rate in one burst per window and nothing in between, and a round,
//!    which starts at a throttle (right after such a burst), counts whatever
//!    share of the next burst falls inside it. So the round that measures at
//!    full speed, and any round paced more than `up_multiplier`² (×2.25)
//!    above what it got accepted, only show that the store accepts *at
//!    least* that much. Measured in the simulator against a store answering
//!    in 1 ms: 8 closed-loop workers, asleep in their retries' backoff for
//!    most of the measuring round, got 1 success of the store's 200 counted
//!    in it; 64 workers, paced at the 20,000 a second the full-speed guard
//!    above left them, got 63 of 200 counted. The round right after such a
//!    cut keeps the larger of its own count and the bound (the store's
//!    window still holds the same burst). From a lower bound each clean
//!    round raises the rate by `up_multiplier` (×1.5, a slow start as TCP's)
//!    until a paced round is throttled and measures the rate: its last step
//!    crosses the rate by ×1.5 at most, and paced sends spread the
//!    admissions, so that count is the rate. Taken for the rate, those
//!    bounds left CUBIC creeping up at 15 % a round: closed-loop workers
//!    took 11–16 s (8 workers, R = 100–200) and 14–16 s (64 workers,
//!    R = 500–1,000) until every 10 s window from then on got 90 % of the
//!    rate; with the slow start 4–6 s and 0 s.
//! 4. **Climb along CUBIC's curve, per round.** Each clean round (successes
//!    and no throttling) raises the rate along `peak × (1 + 0.01 (t − K)³)`,
//!    `t` rounds after the cut: concave below the peak measured at the cut
//!    (back within two rounds), flat around it (probing costs a few percent
//!    throttled), convex beyond (a capacity that doubled is found in about
//!    six rounds). Never more than 15 % per round above the peak, so a
//!    rising rate never releases a burst. Where CUBIC's own curve in absolute
//!    sends (`peak + 0.4 (t − K)³` per second, AWS's constant) is faster, it
//!    is taken: it gives every client the same gain whatever its share, so
//!    independent clients that started unequal converge on fair shares; the
//!    scaled curve alone would keep their ratio forever.
//!
//! Pacing turns itself off when a clean round would set a rate above the peak
//! and the rate in force let through at least twice what was sent, and a send
//! more (a round it held back can count a send or so short: whole counts,
//! slots taken before a raise): it no longer holds anything back (below the
//! peak, clients queued behind it would all leave at once). It turns back on
//! at the next throttled outcome, with one round of measuring at full speed.
//!
//! **Backpressure, not sleeps.** Sends take slots on one shared timeline,
//! `1 / rate` apart (randomized by ± the randomization factor, mean kept), in
//! `poll_ready`, as `tower::limit::RateLimit` does: the clone that was readied
//! is the one that sends, and a clone waiting for its slot holds nothing of
//! the inner service (no concurrency permit, no buffer slot). Time nobody used
//! is not saved up: an idle client sends at once, and no faster than the rate
//! after that. Slots are taken at most one round ahead and are void after a
//! cut, so a new rate holds within a round.
//!
//! All state is atomics in one `Arc`; a round is closed by whichever outcome
//! arrives after it ends, and only by one. Time is kept in nanoseconds on
//! tokio's clock, so the paused clock of tests and simulations works.
//!
//! Measured in the simulator's `Pacing` (`crates/sim`) and
//! `examples/paced_writers.rs`.

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
/// rate-limited store. See the [module docs](self) for the algorithm.
///
/// Off until the first throttled outcome (the policy decided
/// [`Cause::Throttled`] or [`Cause::Timeout`], or a retry after a
/// server-given delay); then every
/// send waits for its slot at the rate the server was found to accept. While
/// off, a request costs two atomic loads and one uncontended add: no timer,
/// no clock.
///
/// Defaults: rounds of 1 s; a cut to 0.9 × the accepted rate
/// (`down_multiplier`); ×1.5 slower per round at most while measuring, one
/// ×1.5 step in an outage, and ×1.5 faster per round from a rate known only
/// as a lower bound (`up_multiplier`); 1 success to measure a rate
/// (`success_threshold`); 500 ms between sends when nothing was sent to
/// measure (`initial_interval`); at most 15 min between sends
/// (`max_interval`); slots spaced ±10 % at random.
///
/// The handle is cheap to clone; clones share the rate and the metrics.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_core::{AdaptivePacing, BackoffLayer};
///
/// let pacing = AdaptivePacing::builder()
///     .max_interval(Duration::from_secs(30))
///     .build()?;
/// let layer = BackoffLayer::builder().pacing(pacing.clone()).build()?;
/// assert_eq!(pacing.interval(), Duration::ZERO);
/// // ...later, when an operator knows the store recovered:
/// pacing.reset();
/// # drop(layer);
/// # Ok::<_, tower_backoff_core::ConfigError>(())
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
        // A timed-out attempt says the server is too slow for the rate sent,
        // as a throttled one says it is too busy: both slow the pacing down.
        let throttled = matches!(
            *decision,
            Decision::Retry {
                cause: Cause::Throttled | Cause::Timeout,
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
