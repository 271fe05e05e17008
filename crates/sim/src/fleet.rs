//! A fleet's day: independent processes through spells of traffic, busy and
//! quiet, healthy and failing, one after another; what each spell's requests
//! turn into. What a budget remembers of a busy hour is what the outage that
//! follows a quiet one gets.

use std::cell::RefCell;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

use super::budgets::{one_layer_each, BudgetKind};
use super::connection::{AttemptError, Request};
use super::partial::FlakyAttempt;
use super::workload::{check_open_load, issue, ClientLog};
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::Rng;

/// One stretch of a [`Fleet`]'s day: each process sends `rate` requests a
/// second for `duration`, and each attempt fails with probability
/// `failure_rate`, answered after `latency`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spell {
    duration: Duration,
    rate: f64,
    failure_rate: f64,
    latency: Duration,
}

impl Spell {
    /// `duration` (whole seconds) at `rate` requests a second per process,
    /// a `failure_rate` share of attempts failing, each answered after 10 ms.
    pub const fn new(duration: Duration, rate: f64, failure_rate: f64) -> Self {
        Self {
            duration,
            rate,
            failure_rate,
            latency: Duration::from_millis(10),
        }
    }

    /// A full outage: every attempt fails after `timeout`, as an attempt
    /// to a server that is down times out.
    pub const fn outage(duration: Duration, rate: f64, timeout: Duration) -> Self {
        Self {
            duration,
            rate,
            failure_rate: 1.0,
            latency: timeout,
        }
    }
}

/// Independent processes, each with its own client, through [`Spell`]s in
/// order; the last one is followed by 60 s for the requests still retrying
/// to finish, counted in it.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{BudgetKind, Fleet, Spell};
///
/// let secs = Duration::from_secs;
/// let report = Fleet::new(10)
///     .spell(Spell::new(secs(5), 1.0, 0.0))
///     .spell(Spell::outage(secs(10), 1.0, secs(1)))
///     .run_independent(BudgetKind::None, 1)?;
/// // No budget: every request of the outage makes all three attempts.
/// let outage = report.spells[1];
/// assert_eq!(outage.attempts, 3 * outage.requests);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    processes: usize,
    spells: Vec<Spell>,
    seed: u64,
}

/// What one spell of a [`Fleet`] run counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpellReport {
    /// Logical requests issued in the spell.
    pub requests: u64,
    /// Of them, those that ended in success.
    pub succeeded: u64,
    /// Attempts that reached the server during the spell.
    pub attempts: u64,
    /// Retries that reached the server from 10 s into the spell to its end
    /// (attempts then, less the requests issued then).
    pub late_retries: u64,
}

impl SpellReport {
    /// Attempts per logical request: 1.0 means no retry went out.
    pub fn attempts_per_request(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.attempts as f64 / self.requests as f64
    }
}

/// What a [`Fleet`] run counted, a report per spell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetReport {
    /// In the order of the spells.
    pub spells: Vec<SpellReport>,
}

/// How long the requests of the last spell get to finish.
const DRAIN: Duration = Duration::from_secs(60);

impl Fleet {
    /// `processes` independent processes and no spell yet.
    pub fn new(processes: usize) -> Self {
        Self {
            processes,
            spells: Vec::new(),
            seed: 1,
        }
    }

    /// Adds `spell` after the ones before.
    pub fn spell(mut self, spell: Spell) -> Self {
        self.spells.push(spell);
        self
    }

    /// Seeds the arrivals and the failures.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.spells.is_empty() {
            return Err(ConfigError::new("spell", "a fleet needs at least one"));
        }
        for spell in &self.spells {
            if spell.duration.subsec_nanos() != 0 {
                return Err(ConfigError::new(
                    "duration",
                    format!("must be whole seconds, got {:?}", spell.duration),
                ));
            }
            if !(0.0..=1.0).contains(&spell.failure_rate) {
                return Err(ConfigError::new(
                    "failure_rate",
                    format!("must be within [0, 1], got {}", spell.failure_rate),
                ));
            }
            check_duration("latency", spell.latency)?;
            let total = spell.rate * self.processes as f64;
            check_open_load(self.processes, total, spell.duration)?;
        }
        Ok(())
    }

    /// Runs the day with the layer's defaults and `kind` of budget, a layer
    /// per process, process `i` seeding its jitter with `seed + i`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_independent(&self, kind: BudgetKind, seed: u64) -> Result<FleetReport, ConfigError> {
        let layers = kind.per_process(self.processes, seed)?;
        self.run(one_layer_each(&layers))
    }

    /// Runs the day with a client made by `make_client` for each process.
    /// Blocks until done, on a fresh runtime with a paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(&self, make_client: F) -> Result<FleetReport, ConfigError>
    where
        F: FnMut(DayServer) -> S,
        S: Service<Request> + Clone + 'static,
    {
        self.validate()?;
        let runtime = super::paused_runtime();
        let report = LocalSet::new().block_on(&runtime, self.day(make_client));
        Ok(report)
    }

    async fn day<S, F>(&self, mut make_client: F) -> FleetReport
    where
        F: FnMut(DayServer) -> S,
        S: Service<Request> + Clone + 'static,
    {
        let second = Duration::from_secs(1);
        let day: Duration = self.spells.iter().map(|s| s.duration).sum();
        let horizon = day + DRAIN;
        let start = Instant::now();
        let server = DayServer {
            state: Rc::new(RefCell::new(Day {
                rng: Rng::stream(self.seed, 0xDA7),
                start,
                spells: self.spells.clone(),
                arrivals: vec![0; horizon.as_secs() as usize],
            })),
        };
        let clients: Rc<[S]> = (0..self.processes)
            .map(|_| make_client(server.clone()))
            .collect();
        let log = Rc::new(RefCell::new(ClientLog::new(start, second, horizon)));
        let mut at = start;
        for (i, spell) in self.spells.iter().enumerate() {
            at += spell.duration;
            let seed = self.seed.wrapping_add(i as u64);
            issue(clients.clone(), spell.rate, at, seed, log.clone()).await;
            tokio::time::sleep_until(at).await;
        }
        tokio::time::sleep_until(start + horizon).await;
        let samples = log.borrow().samples();
        let started: Vec<u64> = samples.iter().map(|c| c.started).collect();
        let succeeded: Vec<u64> = samples.iter().map(|c| c.succeeded).collect();
        let arrivals = server.state.borrow().arrivals.clone();
        let sum =
            |series: &[u64], range: std::ops::Range<usize>| -> u64 { series[range].iter().sum() };
        let mut from = 0;
        let spells = self
            .spells
            .iter()
            .enumerate()
            .map(|(i, spell)| {
                let last = i + 1 == self.spells.len();
                let seconds = spell.duration.as_secs() as usize;
                let until = from + seconds + if last { DRAIN.as_secs() as usize } else { 0 };
                let late = (from + 10).min(until);
                let report = SpellReport {
                    requests: sum(&started, from..until),
                    succeeded: sum(&succeeded, from..until),
                    attempts: sum(&arrivals, from..until),
                    late_retries: sum(&arrivals, late..until)
                        .saturating_sub(sum(&started, late..until)),
                };
                from += seconds;
                report
            })
            .collect();
        FleetReport { spells }
    }
}

/// The server of a [`Fleet`]: answers each attempt as the spell it arrives
/// in says, and counts arrivals by the second.
#[derive(Debug, Clone)]
pub struct DayServer {
    state: Rc<RefCell<Day>>,
}

#[derive(Debug)]
struct Day {
    rng: Rng,
    start: Instant,
    spells: Vec<Spell>,
    arrivals: Vec<u64>,
}

impl Day {
    /// The spell running `since` into the day: the last one after the end.
    fn spell(&self, since: Duration) -> Spell {
        let mut end = Duration::ZERO;
        for spell in &self.spells {
            end += spell.duration;
            if since < end {
                return *spell;
            }
        }
        *self.spells.last().expect("validated: at least one spell")
    }
}

impl Service<Request> for DayServer {
    type Response = ();
    type Error = AttemptError;
    type Future = FlakyAttempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AttemptError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> Self::Future {
        let mut day = self.state.borrow_mut();
        let since = day.start.elapsed();
        let second = (since.as_secs() as usize).min(day.arrivals.len() - 1);
        day.arrivals[second] += 1;
        let spell = day.spell(since);
        let fails = day.rng.next_f64() < spell.failure_rate;
        FlakyAttempt::new(spell.latency, fails)
    }
}
