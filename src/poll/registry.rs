//! The state the poller's handle and its provider tasks share: who is polled,
//! in what state, with what value, and the board built from that.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::board::{Board, Leader, State};
use super::builder::Config;
use super::event::{Event, Failure};

pub(crate) struct Shared<K, Req, V, E> {
    pub(super) config: Config<K, Req, V, E>,
    pub(super) runtime: Handle,
    pub(super) events: broadcast::Sender<Event<K>>,
    registry: Mutex<Registry<K, V>>,
}

pub(super) struct Registry<K, V> {
    pub(super) slots: HashMap<K, Slot<V>>,
    pub(super) next_id: u64,
    /// The last board built, until a change makes it stale.
    cached: Option<Board<K, V>>,
}

pub(super) struct Slot<V> {
    /// Tells a removed provider's task from a newer one under the same key,
    /// and orders the board.
    pub(super) id: u64,
    pub(super) state: State,
    /// `Some` only while the state is healthy.
    pub(super) value: Option<(Arc<V>, Instant)>,
    pub(super) task: Option<JoinHandle<()>>,
}

impl<K, V> Registry<K, V> {
    pub(super) fn touch(&mut self) {
        self.cached = None;
    }
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
                cached: None,
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
}

impl<K, Req, V, E> Shared<K, Req, V, E>
where
    K: Clone + Eq + Hash,
{
    pub(super) fn board(&self) -> Board<K, V> {
        let mut registry = self.lock();
        if let Some(board) = &registry.cached {
            return board.clone();
        }
        let mut slots: Vec<_> = registry.slots.iter().collect();
        slots.sort_unstable_by_key(|(_, slot)| slot.id);
        let providers = slots
            .iter()
            .map(|&(key, slot)| (key.clone(), slot.state))
            .collect();
        let mut leaders: Vec<_> = slots
            .iter()
            .filter(|(_, slot)| slot.state.is_healthy())
            .filter_map(|&(key, slot)| {
                let (value, polled_at) = slot.value.as_ref()?;
                Some(Leader {
                    key: key.clone(),
                    value: Arc::clone(value),
                    polled_at: *polled_at,
                })
            })
            .collect();
        if let Some(rank) = &self.config.rank {
            // Stable, so ties keep the order the providers were added in.
            leaders.sort_by(|a, b| rank(&a.value, &b.value));
        }
        let board = Board::new(leaders, providers);
        registry.cached = Some(board.clone());
        board
    }

    /// Runs `change` on the slot of provider `id`, if it is still registered,
    /// and sends its events while the lock is held, so a subscriber who
    /// receives one finds the board already changed. `false` tells a task
    /// whose provider was removed to stop.
    fn update(
        &self,
        id: u64,
        key: &K,
        change: impl FnOnce(&mut Slot<V>) -> [Option<Event<K>>; 2],
    ) -> bool {
        let mut registry = self.lock();
        let Some(slot) = registry.slots.get_mut(key).filter(|slot| slot.id == id) else {
            return false;
        };
        let events = change(slot);
        registry.touch();
        events
            .into_iter()
            .flatten()
            .for_each(|event| self.emit(event));
        true
    }

    pub(super) fn succeeded(
        &self,
        id: u64,
        key: &K,
        value: V,
        took: Duration,
        next_poll: Instant,
        recovered_from: u32,
    ) -> bool {
        self.update(id, key, |slot| {
            slot.state = State::Healthy { next_poll };
            slot.value = Some((Arc::new(value), Instant::now()));
            let polled = Event::Polled {
                key: key.clone(),
                outcome: Ok(()),
                took,
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
        self.update(id, key, |slot| {
            let was_evicted = matches!(slot.state, State::Evicted { .. });
            slot.state = state;
            slot.value = None;
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
        self.update(id, key, |slot| {
            match &mut slot.state {
                State::Quarantined { next_poll: at, .. } => *at = next_poll,
                State::Evicted { reprobe_at, .. } => *reprobe_at = Some(next_poll),
                State::Pending | State::Healthy { .. } => {}
            }
            let deferred = Event::Deferred {
                key: key.clone(),
                next_poll,
            };
            [Some(deferred), None]
        })
    }

    /// Records that the provider's service panicked and its task is gone, so
    /// its last value does not stay on the board with no one to refresh it.
    pub(super) fn panicked(&self, id: u64, key: &K) {
        self.update(id, key, |slot| {
            let failures = match slot.state {
                State::Quarantined { failures, .. } | State::Evicted { failures, .. } => {
                    failures.saturating_add(1)
                }
                State::Pending | State::Healthy { .. } => 1,
            };
            slot.state = State::Evicted {
                failures,
                reprobe_at: None,
            };
            slot.value = None;
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
