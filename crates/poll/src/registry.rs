//! The state the poller's handle and its provider tasks share: who is polled,
//! and the board showing their states and values.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::board::{Board, State};
use super::config::Config;
use super::event::{Event, Failure};
use super::live_board::LiveBoard;

pub(crate) struct Shared<K, Req, V, E> {
    pub(super) config: Config<K, Req, V, E>,
    pub(super) runtime: Handle,
    pub(super) events: broadcast::Sender<Event<K>>,
    registry: Mutex<Registry<K, V>>,
}

pub(super) struct Registry<K, V> {
    pub(super) slots: HashMap<K, Slot>,
    pub(super) next_id: u64,
    /// Every provider's state and the healthy ones' values.
    pub(super) board: LiveBoard<K, V>,
}

pub(super) struct Slot {
    /// Tells a removed provider's task from a newer one under the same key,
    /// and orders the board.
    pub(super) id: u64,
    pub(super) task: Option<JoinHandle<()>>,
}

impl<K, Req, V, E> Shared<K, Req, V, E> {
    pub(super) fn new(config: Config<K, Req, V, E>, runtime: Handle, capacity: usize) -> Self
    where
        K: Clone,
    {
        Self {
            config,
            runtime,
            events: broadcast::channel(capacity).0,
            registry: Mutex::new(Registry {
                slots: HashMap::new(),
                next_id: 0,
                board: LiveBoard::new(),
            }),
        }
    }

    /// A panic in user code (a rank closure) must not take every later poll
    /// down with it; the registry is consistent between statements anyway.
    pub(super) fn lock(&self) -> MutexGuard<'_, Registry<K, V>> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn emit(&self, event: Event<K>) {
        // No subscriber is not an error: events are optional.
        let _ = self.events.send(event);
    }

    /// Whether anyone would receive an event: when no one would, a poll skips
    /// making its events (and cloning its key into them).
    fn listened(&self) -> bool {
        self.events.receiver_count() > 0
    }
}

impl<K, Req, V, E> Shared<K, Req, V, E>
where
    K: Clone + Eq + Hash,
{
    pub(super) fn board(&self) -> Board<K, V> {
        self.lock().board.snapshot()
    }

    /// Runs `change` on the board for provider `id`, if it is still
    /// registered, and sends its events while the lock is held, so a
    /// subscriber who receives one finds the board already changed. `change`
    /// makes events only when it is told someone listens. `false` tells a task
    /// whose provider was removed to stop.
    fn update(
        &self,
        id: u64,
        key: &K,
        change: impl FnOnce(&mut LiveBoard<K, V>, bool) -> [Option<Event<K>>; 2],
    ) -> bool {
        let mut registry = self.lock();
        if registry.slots.get(key).is_none_or(|slot| slot.id != id) {
            return false;
        }
        let events = change(&mut registry.board, self.listened());
        events
            .into_iter()
            .flatten()
            .for_each(|event| self.emit(event));
        true
    }

    /// Records a successful poll, which ran over `span`: its value is stamped
    /// with the span's end, and its duration is worked out only for an event.
    pub(super) fn succeeded(
        &self,
        id: u64,
        key: &K,
        value: V,
        span: Range<Instant>,
        next_poll: Instant,
        recovered_from: u32,
    ) -> bool {
        let rank = self.config.rank.as_deref();
        self.update(id, key, |board, listened| {
            board.set_healthy(id, next_poll, value, span.end, rank);
            if !listened {
                return [None, None];
            }
            let polled = Event::Polled {
                key: key.clone(),
                outcome: Ok(()),
                took: span.end - span.start,
            };
            let recovered = (recovered_from > 0).then(|| Event::Recovered {
                key: key.clone(),
                failures: recovered_from,
            });
            [Some(polled), recovered]
        })
    }

    /// Records a failed poll; `state` is quarantined or evicted.
    pub(super) fn failed(
        &self,
        id: u64,
        key: &K,
        failure: Failure,
        took: Duration,
        state: State,
    ) -> bool {
        self.update(id, key, |board, listened| {
            let was_evicted = matches!(board.state(id), Some(State::Evicted { .. }));
            board.set_state(id, state);
            board.take_value(id);
            if !listened {
                return [None, None];
            }
            let polled = Event::Polled {
                key: key.clone(),
                outcome: Err(failure),
                took,
            };
            let next = match state {
                State::Quarantined {
                    failures,
                    next_poll,
                } => Some(Event::Quarantined {
                    key: key.clone(),
                    failures,
                    next_poll,
                }),
                State::Evicted {
                    failures,
                    reprobe_at,
                } if !was_evicted => Some(Event::Evicted {
                    key: key.clone(),
                    failures,
                    reprobe_at,
                }),
                _ => None,
            };
            [Some(polled), next]
        })
    }

    /// Records a poll the budget refused; only its time moves.
    pub(super) fn deferred(&self, id: u64, key: &K, next_poll: Instant) -> bool {
        self.update(id, key, |board, listened| {
            let moved = match board.state(id) {
                Some(State::Quarantined { failures, .. }) => Some(State::Quarantined {
                    failures,
                    next_poll,
                }),
                Some(State::Evicted { failures, .. }) => Some(State::Evicted {
                    failures,
                    reprobe_at: Some(next_poll),
                }),
                Some(State::Pending | State::Healthy { .. }) | None => None,
            };
            if let Some(state) = moved {
                board.set_state(id, state);
            }
            let deferred = listened.then(|| Event::Deferred {
                key: key.clone(),
                next_poll,
            });
            [deferred, None]
        })
    }

    /// Records that the provider's service panicked and its task is gone, so
    /// its last value does not stay on the board with no one to refresh it.
    /// Runs while the panic unwinds: no user code here.
    pub(super) fn panicked(&self, id: u64, key: &K) {
        self.update(id, key, |board, listened| {
            let failures = match board.state(id) {
                Some(State::Quarantined { failures, .. } | State::Evicted { failures, .. }) => {
                    failures.saturating_add(1)
                }
                Some(State::Pending | State::Healthy { .. }) | None => 1,
            };
            board.set_state(
                id,
                State::Evicted {
                    failures,
                    reprobe_at: None,
                },
            );
            board.take_value(id);
            if !listened {
                return [None, None];
            }
            let polled = Event::Polled {
                key: key.clone(),
                outcome: Err(Failure::Error("the provider panicked".to_string())),
                took: Duration::ZERO,
            };
            let evicted = Event::Evicted {
                key: key.clone(),
                failures,
                reprobe_at: None,
            };
            [Some(polled), Some(evicted)]
        });
    }
}
