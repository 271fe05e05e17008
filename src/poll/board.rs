//! [`Board`]: a snapshot of the poller's leaderboard and of every provider's
//! state.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

/// Where a provider stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Added; its first poll has not answered yet.
    Pending,
    /// Its last poll succeeded; its value is on the board.
    Healthy {
        /// When it is polled next.
        next_poll: Instant,
    },
    /// Its last `failures` polls failed; it has no value on the board and is
    /// polled again, later each time, after the backoff schedule's delay.
    Quarantined {
        /// Consecutive failed polls.
        failures: u32,
        /// When it is polled next.
        next_poll: Instant,
    },
    /// It failed as many polls in a row as the poller allows: it is no longer
    /// polled, except for an occasional re-probe if those are configured.
    Evicted {
        /// Consecutive failed polls, re-probes included.
        failures: u32,
        /// When it is probed again, if ever.
        reprobe_at: Option<Instant>,
    },
}

impl State {
    /// Whether its value is on the board.
    pub const fn is_healthy(&self) -> bool {
        matches!(self, State::Healthy { .. })
    }
}

/// One healthy provider's latest value on a [`Board`].
pub struct Leader<K, V> {
    pub(super) key: K,
    pub(super) value: Arc<V>,
    pub(super) polled_at: Instant,
}

impl<K, V> Leader<K, V> {
    /// The provider's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The value its last poll returned.
    pub fn value(&self) -> &V {
        &self.value
    }

    /// When that poll answered.
    pub fn polled_at(&self) -> Instant {
        self.polled_at
    }
}

impl<K: Clone, V> Clone for Leader<K, V> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            value: Arc::clone(&self.value),
            polled_at: self.polled_at,
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Leader<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("key", &self.key)
            .field("value", &self.value)
            .field("polled_at", &self.polled_at)
            .finish()
    }
}

/// A consistent snapshot of a [`Poller`](super::Poller): the values of the
/// healthy providers, best first, and every provider's [`State`].
///
/// Cloning it copies a pointer; it never changes after it is taken. A value
/// appears on it only while its provider is [`State::Healthy`]: a provider's
/// value leaves the board with the poll that quarantines it, and a snapshot never
/// mixes a leader with a state taken at another moment.
pub struct Board<K, V> {
    inner: Arc<Snapshot<K, V>>,
}

struct Snapshot<K, V> {
    leaders: Vec<Leader<K, V>>,
    providers: Vec<(K, State)>,
}

impl<K, V> Board<K, V> {
    pub(super) fn new(leaders: Vec<Leader<K, V>>, providers: Vec<(K, State)>) -> Self {
        Self {
            inner: Arc::new(Snapshot { leaders, providers }),
        }
    }

    /// The healthy providers' values, sorted by the poller's
    /// [`rank_by`](super::PollerBuilder::rank_by) key (ties, and every value
    /// without a rank, in the order the providers were added).
    pub fn leaders(&self) -> &[Leader<K, V>] {
        &self.inner.leaders
    }

    /// Every provider and its state, in the order they were added.
    pub fn providers(&self) -> &[(K, State)] {
        &self.inner.providers
    }
}

impl<K: Eq, V> Board<K, V> {
    /// The state of the provider `key`, if the poller has it. A linear scan.
    pub fn state(&self, key: &K) -> Option<State> {
        self.providers()
            .iter()
            .find(|(k, _)| k == key)
            .map(|&(_, state)| state)
    }

    /// The value of `key` on the board: `None` unless it is healthy. A linear
    /// scan.
    pub fn value(&self, key: &K) -> Option<&V> {
        self.leaders()
            .iter()
            .find(|leader| leader.key == *key)
            .map(Leader::value)
    }
}

impl<K, V> Clone for Board<K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Board<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Board")
            .field("leaders", &self.inner.leaders)
            .field("providers", &self.inner.providers)
            .finish()
    }
}
