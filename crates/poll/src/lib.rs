//! [`Poller`]: keeps polling many providers of the same data, backs off the
//! failing ones, quarantines and evicts them, and keeps a live leaderboard of
//! the healthy ones' answers.
//!
//! Each provider is a tower `Service` under a key of yours. A healthy one is
//! polled every [`interval`](PollerBuilder::interval); a poll that fails (by
//! the same [`Policy`](tower_backoff_core::Policy) the [`BackoffRetry`](tower_backoff_core::BackoffRetry) layer
//! uses, or by timing out) **quarantines** it: its value leaves the [`Board`]
//! and its next poll waits for the backoff [`Schedule`](tower_backoff_core::Schedule)'s
//! jittered delay, longer after each failure. After
//! [`max_failures`](PollerBuilder::max_failures) failures in a row it is
//! **evicted** and no longer polled (unless [re-probes](PollerBuilder::reprobe_after)
//! are on). A success clears quarantine and resets the backoff.
//!
//! Every provider runs in its own task: different providers are polled
//! concurrently, and a provider has at most one poll in flight.

mod board;
mod builder;
mod config;
mod event;
mod live_board;
mod registry;
mod task;

use std::fmt;
use std::fmt::Display;
use std::hash::Hash;
use std::sync::Arc;

use tokio::sync::broadcast;
use tower_service::Service;

use tower_backoff_core::Rng;

pub use board::{Board, Leader, State};
pub use builder::PollerBuilder;
// The defaults `PollerBuilder`'s methods state; out of the public docs.
#[doc(hidden)]
pub use builder::{DEFAULT_INTERVAL, DEFAULT_MAX_FAILURES, DEFAULT_TIMEOUT};
pub use event::{Event, Failure};

use registry::{Shared, Slot};

/// Polls a set of keyed providers and keeps a leaderboard of their latest
/// values; see the [module docs](self).
///
/// `K` is the provider key, `Req` the request each poll sends (made by the
/// closure given to [`builder`](Poller::builder)), `V` and `E` the providers'
/// response and error types. Providers may be of different service types.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod poll { pub use tower_backoff_poll::*; } }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower::service_fn;
/// use tower_backoff::poll::{Poller, State};
///
/// let poller = Poller::builder(|_store: &&str| ())
///     .interval(Duration::from_secs(5))
///     .rank_by(|price: &u32| *price) // cheapest first
///     .build()?;
/// poller.add("north", service_fn(|()| async { Ok::<u32, String>(1999) }));
/// poller.add("south", service_fn(|()| async { Ok::<u32, String>(1899) }));
/// poller.add("gone", service_fn(|()| async { Err::<u32, _>("connection refused".to_string()) }));
///
/// tokio::time::sleep(Duration::from_secs(60)).await;
/// let board = poller.board();
/// let prices: Vec<_> = board.leaders().iter().map(|l| (*l.key(), *l.value())).collect();
/// assert_eq!(prices, [("south", 1899), ("north", 1999)]);
/// assert!(matches!(board.state(&"gone"), Some(State::Evicted { failures: 3, .. })));
///
/// poller.shutdown().await;
/// # Ok(())
/// # }
/// ```
///
/// # Shutting down
/// [`shutdown`](Poller::shutdown) stops every poll and waits until every task
/// has ended. Dropping the poller stops them too, without waiting.
pub struct Poller<K, Req, V, E> {
    shared: Arc<Shared<K, Req, V, E>>,
}

impl<K, Req, V, E> Poller<K, Req, V, E> {
    /// A builder; `make_request` makes the request of each poll for the
    /// provider it is given.
    pub fn builder(
        make_request: impl Fn(&K) -> Req + Send + Sync + 'static,
    ) -> PollerBuilder<K, Req, V, E> {
        PollerBuilder::new(make_request)
    }

    fn from_shared(shared: Arc<Shared<K, Req, V, E>>) -> Self {
        Self { shared }
    }
}

impl<K, Req, V, E> Poller<K, Req, V, E>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    Req: Send + 'static,
    V: Send + Sync + 'static,
    E: Display + 'static,
{
    /// Starts polling `service` under `key`, at once. Returns `false`, dropping
    /// `service`, when `key` is already there (remove it first to replace it,
    /// evicted or not).
    pub fn add<S>(&self, key: K, service: S) -> bool
    where
        S: Service<Req, Response = V, Error = E> + Send + 'static,
        S::Future: Send,
    {
        let shared = &self.shared;
        let mut registry = shared.lock();
        if registry.slots.contains_key(&key) {
            return false;
        }
        let id = registry.next_id;
        registry.next_id += 1;
        let rng = match shared.config.seed {
            Some(seed) => Rng::stream(seed, id),
            None => Rng::from_entropy(),
        };
        // Spawned under the lock, so the task finds its slot when it reports.
        let task =
            shared
                .runtime
                .spawn(task::run(Arc::clone(shared), id, key.clone(), service, rng));
        let slot = Slot {
            id,
            task: Some(task),
        };
        registry.slots.insert(key.clone(), slot);
        registry.board.add(id, key.clone());
        shared.emit(Event::Added { key });
        true
    }

    /// Stops polling `key` and forgets it; `false` if it was not there. When
    /// this returns, its task has ended: no further poll is made, and a poll in
    /// flight has been dropped.
    ///
    /// # Cancel safety
    /// Dropping the returned future early still removes the provider and stops
    /// its task; it only skips waiting for the task's end.
    pub async fn remove(&self, key: &K) -> bool {
        let task = {
            let mut registry = self.shared.lock();
            let Some(slot) = registry.slots.remove(key) else {
                return false;
            };
            registry.board.remove(slot.id);
            self.shared.emit(Event::Removed { key: key.clone() });
            slot.task
        };
        if let Some(task) = task {
            task.abort();
            // A cancelled task (or a panicked service) has ended all the same.
            let _ = task.await;
        }
        true
    }

    /// The current leaderboard and every provider's state. Cheap: a pointer to
    /// the board the polls keep up to date. A board held past the next poll
    /// costs that poll a copy of the board (into the buffers of an older one
    /// no one holds, when there is one).
    pub fn board(&self) -> Board<K, V> {
        self.shared.board()
    }

    /// A receiver of every [`Event`] from now on. A receiver that falls more
    /// than [`events_capacity`](PollerBuilder::events_capacity) events behind
    /// gets `RecvError::Lagged` and misses them; the stream closes when the
    /// poller is gone.
    pub fn subscribe(&self) -> broadcast::Receiver<Event<K>> {
        self.shared.events.subscribe()
    }

    /// Stops every poll and waits until every provider task has ended (polls in
    /// flight are dropped, not awaited). Event streams close afterwards.
    pub async fn shutdown(self) {
        let tasks: Vec<_> = {
            let mut registry = self.shared.lock();
            registry
                .slots
                .values_mut()
                .filter_map(|slot| slot.task.take())
                .collect()
        };
        tasks.iter().for_each(|task| task.abort());
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl<K, Req, V, E> Drop for Poller<K, Req, V, E> {
    fn drop(&mut self) {
        // The tasks hold the shared state, so they would otherwise poll on.
        let registry = self.shared.lock();
        for slot in registry.slots.values() {
            if let Some(task) = &slot.task {
                task.abort();
            }
        }
    }
}

impl<K, Req, V, E> fmt::Debug for Poller<K, Req, V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}
