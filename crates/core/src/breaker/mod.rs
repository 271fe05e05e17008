//! [`CircuitBreaker`]: stops calling a host that keeps failing, and probes it
//! now and then to come back.
//!
//! Retries and their [budget](crate::budget) bound the *extra* load a failing
//! host gets; a breaker stops the load itself. While a host fails most of
//! what it is sent, every first attempt is a wasted round trip for the caller
//! and work for a host that is trying to recover; a breaker answers at once,
//! with [`BreakerOpen`], for a while.
//!
//! # What it counts
//! **Attempts**, not requests: the outcome of every attempt, first or retry,
//! as the layer's [`Policy`](crate::Policy) classifies it. A
//! [`Decision::Retry`](crate::Decision::Retry) (any cause: an error, a
//! time-out, a 503, a 429) is a failure; [`Success`](crate::Decision::Success)
//! and [`Final`](crate::Decision::Final) are not (a 400 is the caller's
//! fault, not the host's). An outcome the policy never classifies (a request
//! it would not copy, a future dropped mid-attempt) is not counted.
//!
//! # When it opens, and how it comes back
//! The defaults are those of Polly and resilience4j: it opens when at least
//! half of at least 20 attempts within the last 10 s failed. It then stays
//! open 5 s, less up to a fifth at random, so that a fleet whose breakers
//! opened together does not probe together. Then it is half-open: the next
//! attempt, and only that one, goes out as a probe; its success closes the
//! breaker (with its window forgotten), its failure opens it again. A probe
//! whose outcome never comes (its request was dropped, or not classified)
//! frees the half-open state for another probe after the break time. As in
//! Polly and resilience4j, the first outcome to arrive while half-open
//! decides, the probe's or that of an attempt sent before the breaker
//! opened and still out after the break (attempts carry no ticket: that
//! would grow every response future).
//!
//! # With retries
//! The layer checks the breaker before every attempt goes out: before the
//! first (a rejected request gets [`Error::Open`](crate::Error::Open), and
//! nothing else happens: no call, no budget, no [`Event::Called`](crate::events::Event::Called)),
//! and when a retry is committed, before the budget pays for it. A retry the
//! open breaker stops ends the request with the outcome it would have
//! replaced, the last real one, as a budget refusal does
//! ([`Ending::BreakerOpen`](crate::engine::Ending::BreakerOpen)): the
//! breaker's error is never returned for a host that answered. The breaker's
//! error is never retried. Rejections and state changes are
//! [events](crate::events::Event) every observer sees;
//! [`Stats`](crate::Stats) counts rejections.
//!
//! A layer without a breaker keeps its types and pays nothing: the check is
//! compiled out. With one, a closed breaker costs an attempt one atomic load,
//! and a success one load and one relaxed add; see
//! [`record`](CircuitBreaker::record) for when the clock is read.
//!
//! # Why a breaker, not client-side adaptive throttling
//! Google's SRE book (chapter 21) rejects each request locally with
//! probability `max(0, (requests - K × accepts) / (requests + 1))` over the
//! last two minutes. Both measured on top of the layer's defaults (the
//! `BreakerScenario` of the repository's simulator, `crates/sim`: 50
//! requests a second, a 20 ms round trip; `cargo test --release
//! --all-features --test repo sim_breaker::breaker_table -- --ignored --nocapture`):
//!
//! | outage | guard | opened after | calls per request once open | whole outage | traffic back after recovery |
//! |---|---|---|---|---|---|
//! | 30 s | breaker | 4.3 s | 0.007 | 0.17 | 3.1 s |
//! | 30 s | throttling, K = 2 | – | 0.68 (from 10 s in) | 0.82 | 34.7 s |
//! | 5 min | breaker | 4.3 s | 0.005 | 0.022 | 2.0 s |
//! | 5 min | throttling, K = 2 | – | 0.13 (from 10 s in) | 0.16 | 693 s |
//!
//! The throttle's two-minute memory keeps requests going to a dead host
//! through a short outage, and away from the recovered host for minutes
//! after a long one; the breaker forgets on its first successful probe.
//! Shedding a *fraction* of an overloaded host's load, the throttle's
//! strength, is what the retry budget and [adaptive pacing](crate::adaptive)
//! already do; stopping the first attempts to a host that is down is the
//! breaker's job. Its cost: it opens 4.3 s after a host dies at full traffic,
//! only with 20 attempts to the host in 10 s, and never opened at 10 %
//! random failures.
//!
//! # Per host
//! One breaker is one host's state: share it between the clients of one
//! host (every clone of a layer shares its breaker), and build one per host
//! where a client talks to many, for instance in the closure of the HTTP
//! crate's `PerHostLayer`.
//!
//! ```
//! # extern crate tower_backoff_core as tower_backoff;
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower::{service_fn, ServiceExt};
//! use tower_backoff::breaker::CircuitBreaker;
//! use tower_backoff::BackoffLayer;
//!
//! let breaker = CircuitBreaker::new();
//! let layer = BackoffLayer::builder()
//!     .circuit_breaker(breaker.clone())
//!     .no_budget() // the default budget would stop at one retry in all
//!     .build()?;
//! let down = service_fn(|_: ()| async { Err::<(), _>(std::io::Error::other("down")) });
//! let svc = tower::Layer::layer(&layer, down);
//! for _ in 0..10 {
//!     // Three attempts each: the breaker opens at the 20th.
//!     let _ = svc.clone().oneshot(()).await;
//! }
//! let error = svc.oneshot(()).await.unwrap_err();
//! assert!(error.is_breaker_open());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::error::BreakerOpen;
use crate::error::{check_duration, ConfigError};
use crate::jitter::Rng;
use crate::sync::{AtomicU64, Ordering};

mod window;

#[cfg(all(test, tower_backoff_loom))]
mod loom;

use window::{Window, BUCKETS};

/// Default longest time a breaker stays open before it probes.
#[doc(hidden)]
pub const DEFAULT_BREAK_DURATION: Duration = Duration::from_secs(5);

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Attempts go out; their outcomes are counted.
    Closed,
    /// Attempts are rejected until the break time is over.
    Open,
    /// One probe attempt may go out; its outcome closes or reopens it.
    HalfOpen,
}

/// Stops calling a host that keeps failing: see the [module](self).
///
/// A handle: clones share one state, as every clone of a layer does. Give
/// one breaker to the clients of one host.
#[derive(Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

struct Shared {
    // [time in ms since `origin`: 62 bits][phase: 2 bits]. Closed is 0, so
    // the check before every attempt is one load and one comparison. The
    // time is when an open breaker may probe, or when a half-open one's
    // probe is given up for lost.
    state: AtomicU64,
    window: Window,
    origin: Instant,
    failure_ratio: f64,
    min_throughput: u64,
    break_ms: u64,
    jitter: f64,
    seed: u64,
    // Not a model's concern: which random break time a breaker draws.
    openings: StdAtomicU64,
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const PHASE: u64 = 0b11;

fn word(phase: u64, at_ms: u64) -> u64 {
    at_ms << 2 | phase
}

fn phase_of(word: u64) -> BreakerState {
    match word & PHASE {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

/// What the breaker said to an attempt about to go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Closed: go.
    Closed,
    /// Go, as the one probe of a half-open breaker.
    Probe(Probe),
    /// Open, or half-open with its probe out: do not send.
    Rejected,
}

/// An attempt let out as the probe of a half-open breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    opened_half: bool,
    // The state word it set: what `cancel` gives back.
    word: u64,
}

impl Probe {
    /// Whether this admission moved the breaker from open to half-open: a
    /// state change for the observers.
    pub fn opened_half(&self) -> bool {
        self.opened_half
    }
}

impl Admission {
    /// Whether the attempt may go out.
    pub fn admitted(&self) -> bool {
        !matches!(self, Admission::Rejected)
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

impl CircuitBreaker {
    /// A breaker with the defaults: opens at 50 % failures of at least 20
    /// attempts within 10 s, stays open 4 to 5 s.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default settings are valid")
    }

    /// A builder starting from the defaults.
    pub fn builder() -> CircuitBreakerBuilder {
        CircuitBreakerBuilder::default()
    }

    /// Another breaker with the same settings, closed and with no history:
    /// what each host of a per-host stack gets. Its random break times are
    /// drawn from a stream of their own.
    pub fn fresh(&self) -> Self {
        let shared = &*self.shared;
        CircuitBreaker {
            shared: Arc::new(Shared {
                state: AtomicU64::new(CLOSED),
                window: Window::new(shared.window.bucket_ms()),
                origin: Instant::now(),
                seed: Rng::from_entropy().next_u64(),
                openings: StdAtomicU64::new(0),
                ..*shared
            }),
        }
    }

    /// Where the breaker stands now: an open breaker whose break time is
    /// over reads as open until an attempt probes.
    pub fn state(&self) -> BreakerState {
        phase_of(self.shared.state.load(Ordering::Acquire))
    }

    /// A layer that does nothing but this breaker: every attempt is a first
    /// attempt (no retries, no budget), counted as `policy` classifies it and
    /// rejected with [`Error::Open`](crate::Error::Open) while open. Put it
    /// under a retry layer of your own, or use it alone.
    pub fn layer<P>(&self, policy: P) -> crate::BackoffLayer<P, crate::deadline::Guarded> {
        crate::BackoffLayer::builder()
            .policy(policy)
            .max_attempts(1)
            .no_budget()
            .circuit_breaker(self.clone())
            .build()
            .expect("one attempt without a budget is valid")
    }

    /// Asks to send an attempt now. Reads no clock while closed.
    pub fn admit(&self) -> Admission {
        let word = self.shared.state.load(Ordering::Acquire);
        if word == CLOSED {
            return Admission::Closed;
        }
        self.admit_at(self.shared.now_ms())
    }

    /// Whether an attempt sent `after` from now could be let out, as far as
    /// the breaker knows now (without taking the probe of a half-open
    /// breaker): what a retry is decided on, so that a retry an open breaker
    /// would stop ends at once, and one due after the break may be the probe.
    pub fn would_admit(&self, after: Duration) -> bool {
        let word = self.shared.state.load(Ordering::Acquire);
        let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        word == CLOSED || self.shared.now_ms().saturating_add(after_ms) >= word >> 2
    }

    /// [`admit`](Self::admit) at `now_ms` since the breaker was made.
    fn admit_at(&self, now_ms: u64) -> Admission {
        let shared = &*self.shared;
        let mut current = shared.state.load(Ordering::Acquire);
        loop {
            if current == CLOSED {
                return Admission::Closed;
            }
            if now_ms < current >> 2 {
                return Admission::Rejected;
            }
            // Open and its break is over, or half-open and its probe lost:
            // this attempt is the probe; another may go if its outcome has
            // not come back within a break time.
            let next = word(HALF_OPEN, now_ms.saturating_add(shared.break_ms));
            match shared
                .state
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Admission::Probe(Probe {
                        opened_half: current & PHASE == OPEN,
                        word: next,
                    })
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// An admitted attempt did not go out after all (the budget refused the
    /// retry): a probe it was frees the half-open state at once.
    pub fn cancel(&self, admission: Admission) {
        if let Admission::Probe(Probe { word, .. }) = admission {
            let freed = word & PHASE;
            let _ = self.shared.state.compare_exchange(
                word,
                freed,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// An attempt's outcome: a failure (the policy asked for a retry) or
    /// not. Returns the state the breaker moved to, if this moved it. A
    /// success to a closed breaker reads no clock, but for the one that
    /// completes a batch: about twenty in each tenth of the window at a
    /// steady rate (see `window.rs`).
    pub fn record(&self, failed: bool) -> Option<BreakerState> {
        if !failed && self.shared.state.load(Ordering::Acquire) == CLOSED {
            if self.shared.window.success() {
                self.shared.window.place(self.shared.now_ms());
            }
            return None;
        }
        self.record_at(self.shared.now_ms(), failed)
    }

    fn record_at(&self, now_ms: u64, failed: bool) -> Option<BreakerState> {
        let shared = &*self.shared;
        let current = shared.state.load(Ordering::Acquire);
        match current & PHASE {
            CLOSED if failed => {
                shared.window.failure(now_ms);
                if shared.trips(now_ms) {
                    return self.open_from(current, now_ms);
                }
                None
            }
            CLOSED => {
                if shared.window.success() {
                    shared.window.place(now_ms);
                }
                None
            }
            HALF_OPEN if failed => self.open_from(current, now_ms),
            HALF_OPEN => {
                // Cleared before it closes: an attempt counted in between
                // is counted in the new window, never in the old one.
                shared.window.clear(now_ms);
                shared
                    .state
                    .compare_exchange(current, CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                    .ok()
                    .map(|_| BreakerState::Closed)
            }
            // Outcomes of attempts sent before it opened change nothing.
            _ => None,
        }
    }

    fn open_from(&self, current: u64, now_ms: u64) -> Option<BreakerState> {
        let shared = &*self.shared;
        let until = now_ms.saturating_add(shared.break_ms());
        shared
            .state
            .compare_exchange(
                current,
                word(OPEN, until),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()
            .map(|_| BreakerState::Open)
    }

    /// Attempts and failures in the window now: what the breaker would open
    /// on.
    pub fn window(&self) -> (u64, u64) {
        let now_ms = self.shared.now_ms();
        self.shared.window.place(now_ms);
        let counts = self.shared.window.counts(now_ms);
        (counts.attempts, counts.failures)
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX >> 2)
    }

    fn trips(&self, now_ms: u64) -> bool {
        let counts = self.window.counts(now_ms);
        counts.attempts >= self.min_throughput
            && counts.failures as f64 >= self.failure_ratio * counts.attempts as f64
    }

    /// This opening's break: the break time less a random share of up to
    /// `jitter` of it.
    fn break_ms(&self) -> u64 {
        let n = self
            .openings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cut = Rng::stream(self.seed, n).next_f64() * self.jitter;
        ((self.break_ms as f64) * (1.0 - cut)).round() as u64
    }
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        f.debug_struct("CircuitBreaker")
            .field("state", &self.state())
            .field("failure_ratio", &shared.failure_ratio)
            .field("min_throughput", &shared.min_throughput)
            .field("break_ms", &shared.break_ms)
            .finish_non_exhaustive()
    }
}

/// Builds a [`CircuitBreaker`]; [`build`](Self::build) checks every setting.
#[derive(Debug, Clone)]
#[must_use]
pub struct CircuitBreakerBuilder {
    failure_ratio: f64,
    min_throughput: u32,
    window: Duration,
    break_duration: Duration,
    jitter: f64,
    seed: Option<u64>,
}

impl Default for CircuitBreakerBuilder {
    fn default() -> Self {
        Self {
            failure_ratio: 0.5,
            min_throughput: 20,
            window: Duration::from_secs(10),
            break_duration: DEFAULT_BREAK_DURATION,
            jitter: 0.2,
            seed: None,
        }
    }
}

impl CircuitBreakerBuilder {
    /// Opens when at least this share of the window's attempts failed
    /// (default 0.5): in `(0, 1]`.
    pub fn failure_ratio(mut self, ratio: f64) -> Self {
        self.failure_ratio = ratio;
        self
    }

    /// Opens only once the window holds at least this many attempts (default
    /// 20), so that three failures of a quiet client do not cut it off.
    pub fn min_throughput(mut self, attempts: u32) -> Self {
        self.min_throughput = attempts;
        self
    }

    /// How far back attempts are counted (default 10 s), in ten buckets:
    /// the window slides a tenth at a time. At least 10 ms.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long it stays open at most before it probes (default 5 s).
    pub fn break_duration(mut self, duration: Duration) -> Self {
        self.break_duration = duration;
        self
    }

    /// Takes up to this share of the break time off at random (default 0.2),
    /// so that the breakers of a fleet that opened together probe apart: in
    /// `[0, 1)`.
    pub fn break_jitter(mut self, share: f64) -> Self {
        self.jitter = share;
        self
    }

    /// Makes the random break times reproducible.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks every setting and builds the breaker.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work.
    pub fn build(self) -> Result<CircuitBreaker, ConfigError> {
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return Err(ConfigError::new("failure_ratio", "must be in (0, 1]"));
        }
        if self.min_throughput == 0 {
            return Err(ConfigError::new("min_throughput", "must be at least 1"));
        }
        check_duration("window", self.window)?;
        if self.window < Duration::from_millis(10) {
            return Err(ConfigError::new("window", "must be at least 10 ms"));
        }
        check_duration("break_duration", self.break_duration)?;
        if self.break_duration < Duration::from_millis(1) {
            return Err(ConfigError::new("break_duration", "must be at least 1 ms"));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(ConfigError::new("break_jitter", "must be in [0, 1)"));
        }
        let window_ms = self.window.as_millis() as u64;
        Ok(CircuitBreaker {
            shared: Arc::new(Shared {
                state: AtomicU64::new(CLOSED),
                window: Window::new(window_ms / BUCKETS),
                origin: Instant::now(),
                failure_ratio: self.failure_ratio,
                min_throughput: u64::from(self.min_throughput),
                break_ms: self.break_duration.as_millis() as u64,
                jitter: self.jitter,
                seed: self.seed.unwrap_or_else(|| Rng::from_entropy().next_u64()),
                openings: StdAtomicU64::new(0),
            }),
        })
    }
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use super::*;

    fn breaker(min: u32) -> CircuitBreaker {
        CircuitBreaker::builder()
            .min_throughput(min)
            .break_jitter(0.0)
            .build()
            .unwrap()
    }

    #[test]
    fn opens_at_the_ratio_once_the_minimum_is_reached() {
        let b = breaker(4);
        assert_eq!(b.record_at(0, true), None);
        assert_eq!(b.record_at(0, false), None);
        assert_eq!(b.record_at(0, false), None);
        assert_eq!(b.record_at(0, true), Some(BreakerState::Open));
        assert_eq!(b.admit_at(4_999), Admission::Rejected);
    }

    #[test]
    fn one_probe_after_the_break_its_success_closes() {
        let b = breaker(1);
        assert_eq!(b.record_at(0, true), Some(BreakerState::Open));
        let probe = b.admit_at(5_000);
        assert!(matches!(
            probe,
            Admission::Probe(Probe {
                opened_half: true,
                ..
            })
        ));
        assert_eq!(b.admit_at(5_000), Admission::Rejected);
        assert_eq!(b.record_at(5_010, false), Some(BreakerState::Closed));
        assert_eq!(b.admit_at(5_010), Admission::Closed);
        assert_eq!(b.window(), (0, 0), "the window starts over");
    }

    #[test]
    fn a_failed_probe_opens_it_again_for_a_whole_break() {
        let b = breaker(1);
        b.record_at(0, true);
        assert!(b.admit_at(5_000).admitted());
        assert_eq!(b.record_at(5_100, true), Some(BreakerState::Open));
        assert_eq!(b.admit_at(10_099), Admission::Rejected);
        assert!(b.admit_at(10_100).admitted());
    }

    #[test]
    fn a_lost_probe_is_replaced_after_a_break_and_a_cancelled_one_at_once() {
        let b = breaker(1);
        b.record_at(0, true);
        let probe = b.admit_at(5_000);
        assert_eq!(b.admit_at(9_999), Admission::Rejected);
        assert!(matches!(
            b.admit_at(10_000),
            Admission::Probe(Probe {
                opened_half: false,
                ..
            })
        ));
        let again = b.admit_at(20_000);
        b.cancel(probe); // stale: changes nothing
        assert_eq!(b.admit_at(20_001), Admission::Rejected);
        b.cancel(again);
        assert!(b.admit_at(20_001).admitted());
    }

    #[test]
    fn jitter_only_shortens_the_break() {
        let b = CircuitBreaker::builder()
            .min_throughput(1)
            .seed(7)
            .build()
            .unwrap();
        for _ in 0..100 {
            let ms = b.shared.break_ms();
            assert!((4_000..=5_000).contains(&ms), "{ms}");
        }
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        let field = |b: CircuitBreakerBuilder| b.build().unwrap_err().field();
        assert_eq!(
            field(CircuitBreaker::builder().failure_ratio(0.0)),
            "failure_ratio"
        );
        assert_eq!(
            field(CircuitBreaker::builder().min_throughput(0)),
            "min_throughput"
        );
        assert_eq!(
            field(CircuitBreaker::builder().window(Duration::from_millis(5))),
            "window"
        );
        assert_eq!(
            field(CircuitBreaker::builder().break_duration(Duration::ZERO)),
            "break_duration"
        );
        assert_eq!(
            field(CircuitBreaker::builder().break_jitter(1.0)),
            "break_jitter"
        );
    }

    #[test]
    fn a_rejected_attempt_is_not_admitted_and_a_probe_is() {
        let b = breaker(1);
        assert!(b.admit_at(0).admitted(), "closed");
        b.record_at(0, true);
        assert!(!b.admit_at(4_999).admitted(), "open");
        assert!(b.admit_at(5_000).admitted(), "the probe");
        assert!(!b.admit_at(5_000).admitted(), "half-open, its probe out");
    }

    #[test]
    fn only_the_probe_that_ends_the_break_tells_it_went_half_open() {
        let b = breaker(1);
        b.record_at(0, true);
        let Admission::Probe(first) = b.admit_at(5_000) else {
            panic!("the break is over: a probe");
        };
        assert!(first.opened_half());
        // Lost: replaced a break later, in a breaker half-open already.
        let Admission::Probe(replacement) = b.admit_at(10_000) else {
            panic!("a lost probe is replaced");
        };
        assert!(!replacement.opened_half());
    }

    #[test]
    fn successes_on_the_slow_path_count_as_successes() {
        // What `record` leaves to `record_at` when the breaker closed
        // between its two loads.
        let b = breaker(4);
        for _ in 0..3 {
            assert_eq!(b.record_at(0, false), None);
        }
        assert_eq!(b.record_at(0, true), None, "one failure in four");
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.window(), (4, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_would_be_admitted_only_once_the_break_is_over_when_it_goes() {
        let b = breaker(1);
        assert!(b.would_admit(Duration::ZERO), "closed");
        b.record(true);
        assert!(!b.would_admit(Duration::from_millis(4_999)));
        assert!(b.would_admit(Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!b.would_admit(Duration::from_millis(3_999)));
        assert!(b.would_admit(Duration::from_secs(4)));
        assert_eq!(b.state(), BreakerState::Open, "asking took no probe");
    }

    #[test]
    fn a_fresh_breaker_has_the_settings_and_none_of_the_history() {
        let b = CircuitBreaker::builder()
            .min_throughput(2)
            .window(Duration::from_millis(100))
            .break_duration(Duration::from_millis(300))
            .break_jitter(0.0)
            .build()
            .unwrap();
        b.record_at(0, true);
        b.record_at(0, true);
        assert_eq!(b.state(), BreakerState::Open);
        let fresh = b.fresh();
        assert_eq!(fresh.state(), BreakerState::Closed);
        assert_eq!(fresh.record_at(0, true), None, "one of its two");
        assert_eq!(
            fresh.record_at(100, true),
            None,
            "the first left its 100 ms window"
        );
        assert_eq!(fresh.record_at(150, true), Some(BreakerState::Open));
        assert_eq!(fresh.admit_at(449), Admission::Rejected);
        assert!(fresh.admit_at(450).admitted(), "a break of 300 ms");
    }

    #[test]
    fn debug_shows_the_state_and_settings() {
        let b = breaker(4);
        b.record_at(0, true);
        b.record_at(0, true);
        b.record_at(0, true);
        b.record_at(0, true);
        let shown = format!("{b:?}");
        assert!(shown.starts_with("CircuitBreaker {"), "{shown}");
        for field in [
            "state: Open",
            "failure_ratio: 0.5",
            "min_throughput: 4",
            "break_ms: 5000",
        ] {
            assert!(shown.contains(field), "{field} in {shown}");
        }
    }

    #[test]
    fn a_seed_makes_the_break_times_reproducible_and_keeps_the_other_settings() {
        let seeded = || {
            CircuitBreaker::builder()
                .break_jitter(0.5)
                .seed(7)
                .build()
                .unwrap()
        };
        let times = |b: CircuitBreaker| (0..20).map(|_| b.shared.break_ms()).collect::<Vec<_>>();
        let drawn = times(seeded());
        assert_eq!(drawn, times(seeded()));
        assert!(
            drawn.iter().all(|ms| (2_500..=5_000).contains(ms)),
            "{drawn:?}"
        );
        assert!(
            drawn.iter().any(|&ms| ms < 4_000),
            "a jitter of a half, not the default fifth: {drawn:?}"
        );
    }

    #[test]
    fn the_shortest_window_and_break_allowed_are_valid() {
        let shortest = CircuitBreaker::builder()
            .window(Duration::from_millis(10))
            .break_duration(Duration::from_millis(1))
            .build();
        assert!(shortest.is_ok(), "{shortest:?}");
    }
}
