//! Hedging: a second copy of an attempt that is still pending after a delay,
//! for the tail of latency rather than for failures (Dean and Barroso, "The
//! Tail at Scale").
//!
//! Opt-in, with [`BackoffBuilder::hedge`](crate::BackoffBuilder::hedge):
//!
//! ```
//! # extern crate tower_backoff_core as tower_backoff;
//! use std::time::Duration;
//! use tower_backoff::{BackoffLayer, Hedging};
//!
//! let layer = BackoffLayer::builder()
//!     // A copy of any attempt slower than 95 % of the recent ones.
//!     .hedge(Hedging::at_percentile(95.0))
//!     .build()?;
//! // Or after a fixed delay, at most 3 copies in flight.
//! let fixed = BackoffLayer::builder()
//!     .hedge(Hedging::after(Duration::from_millis(20)).max_copies(3))
//!     .build()?;
//! # Ok::<(), tower_backoff::ConfigError>(())
//! ```
//!
//! How a hedged attempt goes:
//! - **The first acceptable outcome wins**: one the policy calls a success
//!   or final. The other copies are dropped at once, which cancels them (a
//!   hyper or tonic client resets the stream, so the server sees it).
//! - **A copy that fails** and may be retried sends the next hedge at once,
//!   as gRPC's hedging does with its non-fatal codes, unless the server
//!   asked for a delay (`Retry-After`, gRPC pushback): then no further hedge
//!   goes out. When every copy failed, the last failure is the attempt's
//!   outcome, and the layer retries it as any other, after at least the
//!   longest delay a server named for any of the copies.
//! - **The caller gets a real outcome**: once a streaming body is past its
//!   replay limit, a copy that fails for good does not win while another is
//!   pending: it may have failed for want of bytes the recording dropped.
//! - **Only requests the policy copies** are hedged: the HTTP policy copies
//!   idempotent methods and requests with an `Idempotency-Key` only.
//! - **Paid like retries**: every hedge counts against the attempt limit,
//!   respects the deadline, the open breaker and readiness, and is paid from
//!   the retry budget ([its cause is `Hedge`](crate::Cause::Hedge)); a hedge that wins is a retry that
//!   succeeded. Whether a hedge may go out is asked before the service is
//!   readied for it, so a hedge refused holds no permit of the service's.
//! - **At most a share of the load, every second** (10 % by default): when
//!   latency rises for everyone, hedging backs off instead of piling on
//!   (see [`Hedging::max_extra_load`]). A hedge the cap turns away asks again
//!   a little later while its attempt is pending: each request that comes
//!   makes room, and a late hedge still cuts a tail.
//! - A percentile delay waits for a first window of attempts (a second, and
//!   at least 100 of them); each window then moves it, with half the weight
//!   of the one before. It is a percentile of first copies, what an attempt
//!   takes unhedged, and never lower than one that 90 % of the cap's share
//!   of attempts pass (the 91st at a 10 % cap), so that the delay, not the
//!   cap turning hedges away at random, picks the attempts hedged.
//! - **Only once pending**: hedging starts at the first poll that finds the
//!   first attempt pending. An attempt answered at its first poll (a cache,
//!   an in-process service) arms no timer and is counted neither by the cap
//!   nor by a percentile delay. Hedging changes neither the layer's type nor
//!   its future's size.
//!
//! Each copy sent, won and cancelled is an [`Event::Hedge`](crate::events::Event::Hedge).

mod attempt;
mod cap;
mod copies;
mod latency;

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{check_duration, ConfigError};

pub(crate) use attempt::{ask_again, longest, start_hedging, Answered, Failed, NextHedge};
pub(crate) use cap::LoadCap;
pub(crate) use copies::{Copies, CopySent};
use latency::Latencies;

#[cfg(doc)]
use crate::decision::Cause;

/// When to hedge, and how much: given to
/// [`BackoffBuilder::hedge`](crate::BackoffBuilder::hedge).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hedging {
    delay: Delay,
    max_copies: u32,
    max_extra_load: f64,
    min_samples: u32,
    period: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Delay {
    Fixed(Duration),
    Percentile(f64),
}

impl Hedging {
    /// A hedge of every attempt still pending after `delay`. A zero delay
    /// sends every copy at once.
    pub fn after(delay: Duration) -> Self {
        Self::with(Delay::Fixed(delay))
    }

    /// A hedge of every attempt slower than `percentile` % (in (0, 100)) of
    /// the layer's recent attempts: at 95, about one attempt in twenty is
    /// hedged.
    pub fn at_percentile(percentile: f64) -> Self {
        Self::with(Delay::Percentile(percentile))
    }

    fn with(delay: Delay) -> Self {
        Self {
            delay,
            max_copies: 2,
            max_extra_load: 0.1,
            min_samples: 100,
            period: Duration::from_secs(1),
        }
    }

    /// Copies of one attempt in flight at once, the first included: 2 by
    /// default, at most 5 (gRPC's limit). A hedge goes out every delay
    /// until this many are pending.
    pub fn max_copies(mut self, copies: u32) -> Self {
        self.max_copies = copies;
        self
    }

    /// The share of a second's requests that may get a hedge in that second
    /// (10 % by default), in (0, 1]. The requests counted are those whose
    /// first attempt was pending at its first poll: only they can be hedged.
    pub fn max_extra_load(mut self, share: f64) -> Self {
        self.max_extra_load = share;
        self
    }

    /// For a percentile delay: a window of latencies lasts at least `period`
    /// (1 s by default) and holds at least `samples` attempts (100 by
    /// default) before its percentile becomes the delay.
    pub fn window(mut self, period: Duration, samples: u32) -> Self {
        self.period = period;
        self.min_samples = samples;
        self
    }

    /// The error naming the first setting that cannot work.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, reason: String| Err(ConfigError::new(field, reason));
        match self.delay {
            Delay::Fixed(delay) => check_duration("hedge.delay", delay)?,
            Delay::Percentile(p) if !(p > 0.0 && p < 100.0) => {
                return fail("hedge.percentile", format!("must be in (0, 100), got {p}"));
            }
            Delay::Percentile(_) => {}
        }
        let (copies, share) = (self.max_copies, self.max_extra_load);
        if !(2..=5).contains(&copies) {
            return fail("hedge.max_copies", format!("must be 2 to 5, got {copies}"));
        }
        if !(share > 0.0 && share <= 1.0) {
            return fail(
                "hedge.max_extra_load",
                format!("must be in (0, 1], got {share}"),
            );
        }
        if self.period.is_zero() {
            return fail("hedge.window", "period must be longer than zero".into());
        }
        check_duration("hedge.window", self.period)?;
        if self.min_samples == 0 {
            return fail("hedge.window", "samples must be at least 1".into());
        }
        Ok(())
    }
}

/// What a layer's hedging shares across its services: the settings, the
/// latencies a percentile delay follows, and the load cap.
pub(crate) struct Hedger {
    max_copies: u32,
    fixed: Option<Duration>,
    latencies: Option<Latencies>,
    cap: LoadCap,
}

impl Hedger {
    /// The shared state of `hedging`, already validated.
    pub(crate) fn new(hedging: &Hedging) -> Self {
        let (fixed, latencies) = match hedging.delay {
            Delay::Fixed(delay) => (Some(delay), None),
            Delay::Percentile(p) => (
                None,
                Some(Latencies::new(
                    p.max(percentile_within(hedging.max_extra_load)),
                    hedging.period,
                    hedging.min_samples,
                )),
            ),
        };
        Self {
            max_copies: hedging.max_copies,
            fixed,
            latencies,
            cap: LoadCap::new(hedging.max_extra_load),
        }
    }

    /// The same settings with nothing measured: what a host of a per-host
    /// stack gets.
    pub(crate) fn fresh(&self) -> Self {
        Self {
            max_copies: self.max_copies,
            fixed: self.fixed,
            latencies: self.latencies.as_ref().map(Latencies::fresh),
            cap: self.cap.fresh(),
        }
    }

    /// Copies of one attempt in flight at once, the first included.
    pub(crate) fn max_copies(&self) -> usize {
        self.max_copies as usize
    }

    /// How long an attempt may be pending before its next copy: `None`
    /// while a percentile delay has no window yet.
    pub(crate) fn delay(&self) -> Option<Duration> {
        match &self.latencies {
            None => self.fixed,
            Some(latencies) => latencies.delay(),
        }
    }

    /// A request was called at `now`.
    pub(crate) fn on_request(&self, now: Instant) {
        self.cap.on_request(now);
    }

    /// A copy `sent` ended at `now`, answered or cancelled; the clock is
    /// read only when a percentile delay needs the latency. Only first
    /// copies count: a cancelled hedge would count the few milliseconds it
    /// lived and pull the percentile down. A first copy cancelled because a
    /// hedge won counts as a lower bound, but one past the delay already.
    pub(crate) fn on_copy_end(&self, sent: &CopySent, now: impl FnOnce() -> Instant) {
        if sent.is_hedge() {
            return;
        }
        if let Some(latencies) = &self.latencies {
            let now = now();
            latencies.record(now.saturating_duration_since(sent.at), now);
        }
    }

    pub(crate) fn cap(&self) -> &LoadCap {
        &self.cap
    }
}

/// The lowest percentile a delay may have under a cap of `share`: the one
/// `FILL` of `share` of attempts pass. Lower, it asks for more hedges than
/// the cap gives, and the cap turns them away at random, long tail or not
/// (on a log-normal backend, a p99 10 % worse for the same extra load). The
/// rest of the share is for seconds busier than the average.
fn percentile_within(share: f64) -> f64 {
    100.0 * (1.0 - share * FILL)
}

/// The share of the cap a percentile delay asks for on average.
const FILL: f64 = 0.9;

impl fmt::Debug for Hedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedger")
            .field("max_copies", &self.max_copies)
            .field("delay", &self.delay())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Cause;

    #[test]
    fn invalid_settings_name_their_field() {
        let field = |h: Hedging| h.validate().unwrap_err().field();
        assert_eq!(field(Hedging::at_percentile(100.0)), "hedge.percentile");
        assert_eq!(field(Hedging::at_percentile(f64::NAN)), "hedge.percentile");
        assert_eq!(field(Hedging::at_percentile(0.0)), "hedge.percentile");
        assert_eq!(field(Hedging::after(Duration::MAX)), "hedge.delay");
        assert_eq!(
            field(Hedging::after(Duration::ZERO).max_copies(1)),
            "hedge.max_copies"
        );
        assert_eq!(
            field(Hedging::after(Duration::ZERO).max_copies(6)),
            "hedge.max_copies"
        );
        assert_eq!(
            field(Hedging::after(Duration::ZERO).max_extra_load(0.0)),
            "hedge.max_extra_load"
        );
        assert_eq!(
            field(Hedging::after(Duration::ZERO).max_extra_load(1.5)),
            "hedge.max_extra_load"
        );
        assert_eq!(
            field(Hedging::at_percentile(95.0).window(Duration::ZERO, 10)),
            "hedge.window"
        );
        assert_eq!(
            field(Hedging::at_percentile(95.0).window(Duration::from_secs(1), 0)),
            "hedge.window"
        );
        assert!(Hedging::at_percentile(95.0)
            .max_copies(5)
            .max_extra_load(1.0)
            .validate()
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_percentile_delay_waits_for_a_window() {
        let hedger = Hedger::new(&Hedging::at_percentile(50.0).window(Duration::from_secs(1), 16));
        assert_eq!(hedger.delay(), None);
        let first = sent_at(Instant::now(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..16 {
            hedger.on_copy_end(&first, Instant::now);
        }
        assert!(hedger.delay().unwrap() >= Duration::from_secs(1));
        assert_eq!(hedger.fresh().delay(), None);
        let fixed = Hedger::new(&Hedging::after(Duration::from_millis(7)));
        assert_eq!(fixed.delay(), Some(Duration::from_millis(7)));
        assert_eq!(fixed.fresh().delay(), Some(Duration::from_millis(7)));
    }

    fn sent_at(at: Instant, paid: Option<Cause>) -> CopySent {
        CopySent {
            at,
            attempt: 1,
            paid,
            stamp: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_percentile_delay_follows_first_copies_only() {
        let hedger = Hedger::new(&Hedging::at_percentile(50.0).window(Duration::from_secs(1), 16));
        let first = sent_at(Instant::now(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        // Hedges cancelled a millisecond after they went out, more of them
        // than first copies, then sixteen first copies of a second: the
        // median is the first copies' second.
        let hedge = sent_at(
            Instant::now() - Duration::from_millis(1),
            Some(Cause::Hedge),
        );
        for _ in 0..64 {
            hedger.on_copy_end(&hedge, Instant::now);
        }
        assert_eq!(hedger.delay(), None, "no first copy yet");
        for _ in 0..16 {
            hedger.on_copy_end(&first, Instant::now);
        }
        assert!(hedger.delay().unwrap() >= Duration::from_secs(1));
    }

    #[test]
    fn a_hedger_shows_its_copies_and_delay_in_debug() {
        let hedger = Hedger::new(&Hedging::after(Duration::from_millis(7)).max_copies(3));
        let shown = format!("{hedger:?}");
        assert!(shown.starts_with("Hedger {"), "{shown}");
        assert!(shown.contains("max_copies: 3"), "{shown}");
        assert!(shown.contains("delay: Some(7ms)"), "{shown}");
    }

    /// The delay a hedger settles on after one window of first copies of
    /// 1 to 112 ms, one each.
    fn delay_after_a_window(hedging: Hedging) -> Duration {
        let hedger = Hedger::new(&hedging.window(Duration::from_secs(1), 112));
        let end = Instant::now() + Duration::from_secs(1);
        for ms in 1..=112 {
            let first = sent_at(end - Duration::from_millis(ms), None);
            hedger.on_copy_end(&first, || end);
        }
        hedger.delay().expect("a window of 112 closed")
    }

    #[tokio::test(start_paused = true)]
    async fn a_percentile_delay_asks_for_no_more_hedges_than_the_cap_gives() {
        // At a 10 % cap, the median is raised to the 91st percentile: the
        // 102nd of 112 (within 1/32).
        let capped = delay_after_a_window(Hedging::at_percentile(50.0));
        assert!(
            capped >= Duration::from_millis(102) && capped < Duration::from_micros(102_400),
            "{capped:?}"
        );
        // A cap of every request asks for no raise: the 56th of 112.
        let uncapped = delay_after_a_window(Hedging::at_percentile(50.0).max_extra_load(1.0));
        assert!(
            uncapped >= Duration::from_millis(56) && uncapped < Duration::from_micros(56_400),
            "{uncapped:?}"
        );
        // A percentile above the raise is kept: the 107th.
        let high = delay_after_a_window(Hedging::at_percentile(95.0));
        assert!(
            high >= Duration::from_millis(107) && high < Duration::from_micros(108_600),
            "{high:?}"
        );
    }
}
