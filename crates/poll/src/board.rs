//! [`Board`]: a snapshot of the poller's leaderboard and of every provider's
//! state.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

/// Where a provider stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The provider's, for ties and to find it again.
    pub(super) id: u64,
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
            id: self.id,
        }
    }

    fn clone_from(&mut self, source: &Self) {
        // Keeps the key's allocation (a `String`'s buffer) when it fits.
        self.key.clone_from(&source.key);
        self.value = Arc::clone(&source.value);
        self.polled_at = source.polled_at;
        self.id = source.id;
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

/// What a [`Board`] shows, and what the poller needs to keep it up to date
/// in place (see [`LiveBoard`](super::live_board::LiveBoard)).
pub(super) struct Snapshot<K, V> {
    /// Sorted by rank, then by provider id.
    pub(super) leaders: Vec<Leader<K, V>>,
    /// In the order the providers were added, which is the order of their ids.
    pub(super) providers: Vec<(K, State)>,
    /// One per provider, beside `providers`.
    pub(super) entries: Vec<Entry<V>>,
}

/// What finds a provider's place on the board.
pub(super) struct Entry<V> {
    pub(super) id: u64,
    /// The value its leader shows (`Some` exactly while it has one), from which
    /// its rank, and so its leader, are found again.
    pub(super) value: Option<Arc<V>>,
    /// Where its leader was put last; right until another leader moves past it.
    pub(super) leader_hint: usize,
}

impl<V> Clone for Entry<V> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            value: self.value.clone(),
            leader_hint: self.leader_hint,
        }
    }
}

impl<K, V> Snapshot<K, V> {
    pub(super) const fn new() -> Self {
        Self {
            leaders: Vec::new(),
            providers: Vec::new(),
            entries: Vec::new(),
        }
    }
}

impl<K: Clone, V> Clone for Snapshot<K, V> {
    fn clone(&self) -> Self {
        Self {
            leaders: self.leaders.clone(),
            providers: self.providers.clone(),
            entries: self.entries.clone(),
        }
    }

    /// Copies `source` into the buffers (and the keys' buffers) this one
    /// already has: once the poller runs, copying a board allocates nothing.
    fn clone_from(&mut self, source: &Self) {
        self.leaders.clone_from(&source.leaders);
        copy_into(&mut self.providers, &source.providers, |to, from| {
            to.0.clone_from(&from.0);
            to.1 = from.1;
        });
        self.entries.clone_from(&source.entries);
    }
}

/// `Vec::clone_from` with `copy` for the elements both have, because a
/// tuple's `clone_from` clones its key afresh.
fn copy_into<T: Clone>(to: &mut Vec<T>, from: &[T], copy: impl Fn(&mut T, &T)) {
    to.truncate(from.len());
    let (common, rest) = from.split_at(to.len());
    to.iter_mut()
        .zip(common)
        .for_each(|(to, from)| copy(to, from));
    to.extend_from_slice(rest);
}

impl<K, V> Board<K, V> {
    pub(super) fn new(inner: Arc<Snapshot<K, V>>) -> Self {
        Self { inner }
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
