//! A retry-storm simulator: what a retry configuration does to a struggling
//! server when many clients use it.
//!
//! Retrying is a system property. One client retrying at a fixed interval is
//! harmless; a thousand of them can keep a recovering server down for good,
//! because the requests the server still works on for clients that gave up
//! push its latency past their timeouts, and their retries add more. This
//! module models that, deterministically and fast, so you can run **your own**
//! layer configuration against it:
//!
//! - [`ServerModel`] / [`Server`]: a server whose latency grows with the work it
//!   holds, that finishes requests whose client gave up, and that can go down
//!   for a while, keeping what arrives in its accept backlog.
//! - [`Connection`]: the `Service` a client wraps: one attempt, with a timeout.
//! - [`Storm`]: many clients with random (Poisson) arrivals, an outage, and a
//!   [`StormReport`] of load, goodput and recovery, per interval.
//! - [`Strategy`]: the ready-made configurations the demo compares.
//! - [`Contention`]: clients racing to write one record; which jitter costs
//!   the fewest calls.
//! - [`Amplification`]: a full outage; how many attempts each request turns
//!   into, with and without a retry budget.
//! - [`PartialFailure`]: a server that fails each attempt at random; what
//!   share of requests succeed and at what load.
//! - [`Fleet`]: independent processes through [`Spell`]s of busy, quiet and
//!   failing traffic; what a budget carries from one spell to the next.
//! - [`BudgetKind`]: the retry budgets the tables compare.
//! - [`Tail`]: a backend with a latency tail ([`LatencyModel`],
//!   [`TailBackend`]) under an open load; what a client stack, hedging or
//!   not, makes of the tail and how many extra attempts it sends.
//!
//! - [`ShedFront`]: the server half, `tower_backoff_shed`'s limiter (or a
//!   fixed limit, as tower's `load_shed` over `concurrency_limit`) in front
//!   of the server's work: [`shed_storm`] on the [`metastable_storm`], and
//!   [`OverloadScenario`], twice the capacity for a minute.
//!
//! Everything runs on one thread, on tokio's paused clock: a run is a pure
//! function of its settings and seeds (seed your layer too), and two minutes
//! of a thousand clients take a fraction of a second in a release build.
//!
//! ```
//! use std::time::Duration;
//! use tower_backoff_sim::{Storm, Strategy};
//!
//! let storm = Storm::new()
//!     .clients(200)
//!     .outage(Duration::from_secs(10), Duration::from_secs(5))
//!     .horizon(Duration::from_secs(40));
//! let report = Strategy::ExponentialJitter.run(&storm, 1)?;
//! let summary = report.summary();
//! println!("{summary:?}");
//! assert!(summary.attempts >= summary.requests);
//! # Ok::<(), tower_backoff::ConfigError>(())
//! ```

mod amplification;
mod breaker;
mod budgets;
mod connection;
mod contention;
mod fleet;
mod pacing;
mod partial;
mod report;
mod server;
mod shed;
mod storm;
mod strategy;
mod tail;
mod workload;

pub use amplification::{Amplification, AmplificationReport, BudgetSharing};
pub use breaker::{
    storm_with_breaker, BreakerReport, BreakerSample, BreakerScenario, Guard, BREAKER_INTERVAL,
};
pub use budgets::BudgetKind;
pub use connection::{Attempt, AttemptError, Connection, Request};
pub use contention::{
    Conflict, Contention, ContentionReport, Record, Write, WriteAttempt, CONTENTION_FIRST_DELAY,
    CONTENTION_MAX_DELAY,
};
pub use fleet::{DayServer, Fleet, FleetReport, Spell, SpellReport};
pub use pacing::{
    Admission, Answer, Demand, Pacing, PacingReport, PacingSample, Store, ThrottledWrites,
};
pub use partial::{FlakyAttempt, FlakyServer, PartialFailure, PartialFailureReport};
pub use report::{storm_table, StormReport, Summary, Table, RECOVERED_SHARE, RECOVERY_WINDOW};
pub use server::{Server, ServerGone, ServerModel, ServerSample, Submission};
pub use shed::{
    metastable_storm, shed_storm, shed_storm_with, Gate, OverloadReport, OverloadScenario,
    ShedError, ShedFront, ShedSignals,
};
pub use storm::Storm;
pub use strategy::{
    storm_budget, RetryErrors, Strategy, BUDGET_RATIO, FIRST_DELAY, FIXED_INTERVAL, MAX_ATTEMPTS,
    MAX_DELAY, UNTIL_SUCCESS_FACTOR, UNTIL_SUCCESS_MAX_DELAY,
};
pub use tail::{
    tail_table, BackendModel, LatencyModel, Tail, TailAttempt, TailBackend, TailReport, TailSample,
};
pub use workload::ClientSample;

/// A single-threaded runtime on tokio's paused clock: time jumps to the next
/// timer whenever every task waits, so a simulation runs as fast as its
/// events, and the same seed gives the same run.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime needs no resources that can run out")
}
