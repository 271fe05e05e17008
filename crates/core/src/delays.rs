//! [`Delays`]: the delays of a schedule, one after another, for loops written
//! by hand. A [`Schedule`] and a [`Jitter`] are stateless so that one value
//! serves every request; `Delays` carries the state of one sequence.

use std::fmt;
use std::time::Duration;

use crate::budget::Budget;
use crate::decision::Cause;
use crate::engine::{Rules, Session};
use crate::error::ConfigError;
use crate::jitter::{Jitter, Rng};
use crate::limits::UNLIMITED_ATTEMPTS;
use crate::schedule::{AnySchedule, Schedule};

/// The jittered delays of a [`Schedule`], one per call: an iterator that
/// remembers the retry number and the previous delay, for loops that own
/// their retries: sleep `next()` after each failure, [`reset`](Delays::reset)
/// once connected. No limit unless [`max_attempts`](Delays::max_attempts)
/// sets one; it never allocates and never panics, however long it runs.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Delays, Exponential, Jitter};
///
/// let schedule = Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_millis(500));
/// let mut delays = Delays::new(schedule).jitter(Jitter::None);
/// let first: Vec<_> = delays.by_ref().take(4).collect();
/// assert_eq!(first, [100, 200, 400, 500].map(Duration::from_millis));
///
/// // Connected again: the next outage starts from the first delay.
/// delays.reset();
/// assert_eq!(delays.next(), Some(Duration::from_millis(100)));
///
/// // With a limit, as the layer's: one delay before each retry.
/// assert_eq!(Delays::new(schedule).max_attempts(4).count(), 3);
/// ```
///
/// A client that keeps a connection open backs off while the server is gone,
/// starts again when told it is back, and stops when done
/// (`examples/reconnect.rs` runs it against a real server):
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use tokio::sync::watch;
/// use tower_backoff::{Delays, Exponential};
///
/// # let mut refusals = 3;
/// # let mut connect = || {
/// #     let refused = refusals > 0;
/// #     refusals -= u32::from(refused);
/// #     async move { if refused { Err("refused") } else { Ok("connection") } }
/// # };
/// let (_server_back, mut back) = watch::channel(());
/// let (_stop, mut done) = watch::channel(false);
/// let mut delays = Delays::new(Exponential::new(Duration::from_millis(100)));
/// let connection = loop {
///     match connect().await {
///         Ok(connection) => break Some(connection),
///         Err(_) => {
///             let delay = delays.next().expect("no limit was set");
///             tokio::select! {
///                 _ = tokio::time::sleep(delay) => {}
///                 Ok(()) = back.changed() => delays.reset(),
///                 _ = done.wait_for(|done| *done) => break None,
///             }
///         }
///     }
/// };
/// assert_eq!(connection, Some("connection"));
/// assert_eq!(delays.retries(), 3);
/// # }
/// ```
#[derive(Clone)]
pub struct Delays {
    schedule: AnySchedule,
    jitter: Jitter,
    /// The retries since the last reset, as the engine counts them: each
    /// delay handed out is a retry decided and sent at once.
    session: Session,
}

impl Delays {
    /// The delays of `schedule`, with [`Jitter::Full`] (the layer's default),
    /// a random stream seeded from entropy, and no limit.
    pub fn new(schedule: impl Schedule + Send + Sync + 'static) -> Self {
        Self {
            schedule: schedule.into_any(),
            jitter: Jitter::default(),
            session: Session::new(UNLIMITED_ATTEMPTS, None).with_rng(Rng::from_entropy()),
        }
    }

    /// Randomizes each delay with `jitter`.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Makes every draw reproducible: the same seed gives the same delays,
    /// and the same as the first request of a layer
    /// [seeded](crate::BackoffBuilder::seed) alike.
    pub fn seed(self, seed: u64) -> Self {
        self.rng(Rng::stream(seed, 0))
    }

    /// Draws from `rng`, for example one [`Rng::stream`] of a seeded family per
    /// connection.
    pub fn rng(mut self, rng: Rng) -> Self {
        self.session = self.session.with_rng(rng);
        self
    }

    /// Ends after `attempts − 1` delays, so that a loop which tries, then asks
    /// for a delay, makes at most `attempts` attempts (the first included).
    /// `0` and `1` both mean a single attempt: no delay at all.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.session = self.session.with_max_attempts(attempts.max(1));
        self
    }

    /// No limit on the number of delays (the default): the loop itself decides
    /// when to stop, for example on a done signal.
    pub fn unlimited(mut self) -> Self {
        self.session = self.session.with_max_attempts(UNLIMITED_ATTEMPTS);
        self
    }

    /// The delay before the next retry, or `None` once the attempts set by
    /// [`max_attempts`](Delays::max_attempts) are spent.
    pub fn next_delay(&mut self) -> Option<Duration> {
        let rules: Rules<'_, AnySchedule, dyn Budget> = Rules {
            schedule: &self.schedule,
            jitter: self.jitter,
            stop_at_cap: false,
            exact_server_delays: false,
            budget: None,
        };
        let no_deadline = || unreachable!("no deadline, so no clock");
        let retry = self
            .session
            .decide(
                &rules,
                None,
                Cause::Transient,
                true,
                no_deadline,
                Rng::from_entropy,
            )
            .ok()?;
        // Handed out is sent: the loop sleeps and tries again itself, so the
        // session keeps no time slept.
        self.session
            .send(&retry, rules.budget, no_deadline, || Some(()))
            .ok()?;
        Some(retry.delay)
    }

    /// Starts again from the first delay, with the whole limit of attempts
    /// available; the random stream continues, so jittered delays after a
    /// reset are fresh draws, not a replay.
    pub fn reset(&mut self) {
        self.session.reset();
    }

    /// How many delays were handed out since the last reset: the number of the
    /// retry the last delay was for.
    pub fn retries(&self) -> u32 {
        self.session.attempts() - 1
    }

    /// The last delay handed out, or `None` if none since the last reset.
    pub fn previous(&self) -> Option<Duration> {
        (self.retries() > 0).then(|| self.session.previous_delay())
    }

    /// The schedule the delays come from.
    pub fn schedule(&self) -> &AnySchedule {
        &self.schedule
    }

    /// Checks the schedule and the jitter, as the layer's builder does; the
    /// delays never panic either way, but a wrong setting gives delays nobody
    /// meant.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.schedule.validate()?;
        self.jitter.validate()
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.next_delay()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self.session.max_attempts() {
            UNLIMITED_ATTEMPTS => (usize::MAX, None),
            max => {
                let left = max.saturating_sub(self.session.attempts()) as usize;
                (left, Some(left))
            }
        }
    }
}

impl fmt::Debug for Delays {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delays")
            .field("schedule", &self.schedule)
            .field("jitter", &self.jitter)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}
