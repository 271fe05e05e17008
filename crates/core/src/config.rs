//! The settings a [`BackoffRetry`](crate::BackoffRetry) service and its response
//! futures share: plain data copied into each clone, plus one `Arc` for what
//! every clone of one layer shares (budget, pacing, stats, jitter seed).
//!
//! One module, so the layer writes it, the service and the future read it, and
//! none of the three imports another for it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::adaptive::AdaptivePacing;
use crate::breaker::CircuitBreaker;
use crate::budget::{Budget, TokenBucket};
use crate::deadline::{AttemptTimer, NoTimeout};
use crate::decision::Cause;
use crate::engine::Rules;
use crate::events::{Event, Observer, Origin, Outcome, RetryArgs, RetryHook};
use crate::hedge::Hedger;
use crate::jitter::{Jitter, Rng};
use crate::schedule::AnySchedule;
use crate::stats::Stats;

/// Everything a [`BackoffRetry`](crate::BackoffRetry) service and its response futures
/// read, behind one `Arc` per layer. What the layer's services share (budget,
/// pacing, observers, the seeded jitter streams) are handles of their own, so
/// a service that changes its policy keeps sharing them.
#[derive(Clone)]
pub(crate) struct Config<P, T = NoTimeout> {
    pub(crate) policy: P,
    pub(crate) schedule: AnySchedule,
    pub(crate) jitter: Jitter,
    pub(crate) max_attempts: u32,
    pub(crate) max_elapsed: Option<Duration>,
    pub(crate) stop_at_cap: bool,
    pub(crate) exact_server_delays: bool,
    /// How long each attempt may take.
    pub(crate) timeouts: T,
    // Each one an `Option` read straight from here: what is not configured
    // costs a branch, and nothing else.
    pub(crate) budget: Option<Arc<LayerBudget>>,
    pub(crate) pacing: Option<AdaptivePacing>,
    pub(crate) observers: Observers,
    /// The host and name the observers hear each event with.
    pub(crate) origin: Origin,
    pub(crate) streams: Option<Arc<Streams>>,
    /// Set only when `T`'s error can say the breaker rejected a request.
    pub(crate) breaker: Option<CircuitBreaker>,
    pub(crate) hedging: Option<Arc<Hedger>>,
    /// Whether a request is tracked from its call: with a time limit or
    /// pacing its first outcome needs more than the settings (hedging
    /// starts at the first poll that finds the attempt pending). Worked out
    /// once, so the happy path reads one flag, not two.
    pub(crate) track_from_call: bool,
    /// Whether the budget is told of every call: a budget given as a trait
    /// object, or a token bucket that earns on requests. Worked out once,
    /// so the happy path reads one flag, not the budget's kind.
    pub(crate) budget_counts_calls: bool,
}

/// Who hears a layer's events. Stats alone, the common case, is called
/// directly; with observers of the user's, every one is told through one
/// `Arc`. Nobody listening costs one branch an event.
#[derive(Clone, Default)]
pub(crate) enum Observers {
    #[default]
    None,
    Stats(Stats),
    Many(Arc<Many>),
}

pub(crate) struct Many {
    stats: Option<Stats>,
    others: Box<[Box<dyn Observer>]>,
    hooks: Box<[Box<RetryHook>]>,
}

impl Observers {
    pub(crate) fn new(
        stats: Option<Stats>,
        others: Vec<Box<dyn Observer>>,
        hooks: Vec<Box<RetryHook>>,
    ) -> Self {
        match (stats, others.is_empty() && hooks.is_empty()) {
            (None, true) => Observers::None,
            (Some(stats), true) => Observers::Stats(stats),
            (stats, false) => Observers::Many(Arc::new(Many {
                stats,
                others: others.into_boxed_slice(),
                hooks: hooks.into_boxed_slice(),
            })),
        }
    }

    fn stats(&self) -> Option<&Stats> {
        match self {
            Observers::None => None,
            Observers::Stats(stats) => Some(stats),
            Observers::Many(many) => many.stats.as_ref(),
        }
    }
}

impl Many {
    fn hook(&self, args: &RetryArgs, replaced: Outcome<'_>) {
        for hook in &*self.hooks {
            hook(args, replaced);
        }
    }

    // Out of line: dynamic calls to observers of the user's.
    fn tell(&self, event: &Event, origin: &Origin) {
        if let Some(stats) = &self.stats {
            stats.on_event(event);
        }
        for observer in &*self.others {
            observer.on_event_from(event, origin);
        }
    }
}

impl<P, T> Config<P, T> {
    /// The same settings with the policy `change` makes of this one.
    pub(crate) fn map_policy<P2>(self, change: impl FnOnce(P) -> P2) -> Config<P2, T> {
        self.map(change, |timing| timing)
    }

    /// The same settings with the timing `change` makes of this one.
    pub(crate) fn map_timing<T2>(self, change: impl FnOnce(T) -> T2) -> Config<P, T2> {
        self.map(|policy| policy, change)
    }

    fn map<P2, T2>(
        self,
        policy: impl FnOnce(P) -> P2,
        timing: impl FnOnce(T) -> T2,
    ) -> Config<P2, T2> {
        Config {
            policy: policy(self.policy),
            schedule: self.schedule,
            jitter: self.jitter,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            stop_at_cap: self.stop_at_cap,
            exact_server_delays: self.exact_server_delays,
            timeouts: timing(self.timeouts),
            budget: self.budget,
            pacing: self.pacing,
            observers: self.observers,
            origin: self.origin,
            streams: self.streams,
            breaker: self.breaker,
            hedging: self.hedging,
            track_from_call: self.track_from_call,
            budget_counts_calls: self.budget_counts_calls,
        }
    }

    /// The layer's circuit breaker: always `None`, at compile time, for a
    /// layer whose error could not say it rejected a request.
    pub(crate) fn breaker<E>(&self) -> Option<&CircuitBreaker>
    where
        T: AttemptTimer<E>,
    {
        if T::REJECTS {
            self.breaker.as_ref()
        } else {
            None
        }
    }

    pub(crate) fn budget(&self) -> Option<&LayerBudget> {
        self.budget.as_deref()
    }

    /// What the engine reads to decide a retry of any request of this layer.
    pub(crate) fn rules(&self) -> Rules<'_, AnySchedule, LayerBudget> {
        Rules {
            schedule: &self.schedule,
            jitter: self.jitter,
            stop_at_cap: self.stop_at_cap,
            exact_server_delays: self.exact_server_delays,
            budget: self.budget(),
        }
    }

    /// The layer's hedging, if it hedges.
    pub(crate) fn hedger(&self) -> Option<&Hedger> {
        self.hedging.as_deref()
    }

    pub(crate) fn pacing(&self) -> Option<&AdaptivePacing> {
        self.pacing.as_ref()
    }

    /// Tells the layer's observers of the event `event` makes, made only if
    /// anyone listens.
    // Inline, with the event known where it is made: the stats' counting
    // folds to the atomic adds of that event.
    #[inline(always)]
    pub(crate) fn emit(&self, event: impl FnOnce() -> Event) {
        match &self.observers {
            Observers::None => {}
            Observers::Stats(stats) => stats.on_event(&event()),
            Observers::Many(many) => many.tell(&event(), &self.origin),
        }
    }

    /// Tells the observers of a retry going out, and the
    /// [`on_retry`](crate::BackoffBuilder::on_retry) hooks with the outcome
    /// it replaces.
    pub(crate) fn tell_retry<R: 'static, E: 'static>(
        &self,
        args: RetryArgs,
        replaced: &Result<R, E>,
    ) {
        self.emit(|| Event::Retry(args));
        if let Observers::Many(many) = &self.observers {
            many.hook(&args, Outcome::of(replaced));
        }
    }

    /// The counters of this layer, if it was given any.
    pub(crate) fn stats(&self) -> Option<&Stats> {
        self.observers.stats()
    }

    /// A request was called: its first attempt is about to go out.
    #[inline]
    pub(crate) fn on_call(&self) {
        if self.budget_counts_calls {
            if let Some(budget) = self.budget() {
                budget.on_first_attempt();
            }
        }
        self.emit(|| Event::Called);
    }

    /// A new jitter stream for one request: from the seeded family when a seed
    /// was given, so runs are reproducible, else from entropy.
    pub(crate) fn new_rng(&self) -> Rng {
        match self.streams.as_deref() {
            Some(streams) => streams.next(),
            None => Rng::from_entropy(),
        }
    }
}

impl<P, T: fmt::Debug> fmt::Debug for Config<P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("schedule", &self.schedule)
            .field("jitter", &self.jitter)
            .field("max_attempts", &self.max_attempts)
            .field("max_elapsed", &self.max_elapsed)
            .field("stop_at_cap", &self.stop_at_cap)
            .field("exact_server_delays", &self.exact_server_delays)
            .field("timeouts", &self.timeouts)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The jitter streams of a seeded layer: each retrying request takes the next
/// stream of the seed's family, so runs are reproducible.
pub(crate) struct Streams {
    seed: u64,
    next: AtomicU64,
}

impl Streams {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            seed,
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> Rng {
        Rng::stream(self.seed, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// The budget every clone of one layer shares: a token bucket (the default,
/// or one given) by value, so the hot paths call it directly and the compiler
/// inlines it (a full bucket's refund is one relaxed load), or any other
/// budget behind a box.
pub(crate) enum LayerBudget {
    Bucket(TokenBucket),
    Given(Box<dyn Budget>),
}

impl Budget for LayerBudget {
    fn balance(&self) -> Option<u64> {
        match self {
            LayerBudget::Bucket(bucket) => bucket.balance(),
            LayerBudget::Given(budget) => budget.balance(),
        }
    }

    #[inline]
    fn on_first_attempt(&self) {
        match self {
            LayerBudget::Bucket(bucket) => bucket.on_first_attempt(),
            LayerBudget::Given(budget) => budget.on_first_attempt(),
        }
    }

    fn would_allow(&self, cause: Cause) -> bool {
        match self {
            LayerBudget::Bucket(bucket) => bucket.would_allow(cause),
            LayerBudget::Given(budget) => budget.would_allow(cause),
        }
    }

    fn try_retry(&self, cause: Cause) -> bool {
        match self {
            LayerBudget::Bucket(bucket) => bucket.try_retry(cause),
            LayerBudget::Given(budget) => budget.try_retry(cause),
        }
    }

    #[inline]
    fn on_success(&self, last_retry: Option<Cause>) {
        match self {
            LayerBudget::Bucket(bucket) => bucket.on_success(last_retry),
            LayerBudget::Given(budget) => budget.on_success(last_retry),
        }
    }
}
