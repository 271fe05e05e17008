//! [`LiveBoard`]: the board the providers' tasks write to, changed in place
//! one provider at a time, so that a poll costs no rebuild and, in steady
//! state, no allocation.

use std::cmp::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::board::{Board, Entry, Leader, Snapshot, State};
use super::config::Rank;

/// The current board, and the one published before it.
///
/// Changes go straight into the current snapshot while no reader holds it.
/// Once one does, the next change is written into the previous snapshot
/// instead (copied over from the current one into its own buffers), if its
/// readers have let go of it by then, and into a new copy otherwise: a reader
/// that always holds the latest board costs one copy per read, with no
/// allocation but the values that changed.
pub(super) struct LiveBoard<K, V> {
    current: Arc<Snapshot<K, V>>,
    spare: Option<Arc<Snapshot<K, V>>>,
}

impl<K: Clone, V> LiveBoard<K, V> {
    pub(super) fn new() -> Self {
        Self {
            current: Arc::new(Snapshot::new()),
            spare: None,
        }
    }

    /// The board as it is now; it never changes afterwards.
    pub(super) fn snapshot(&self) -> Board<K, V> {
        Board::new(Arc::clone(&self.current))
    }

    /// The current snapshot, to change in place, which no reader holds.
    fn edit(&mut self) -> &mut Snapshot<K, V> {
        if Arc::get_mut(&mut self.current).is_none() {
            let next = match self.spare.take() {
                Some(mut spare) => match Arc::get_mut(&mut spare) {
                    Some(writable) => {
                        writable.clone_from(&self.current);
                        spare
                    }
                    None => Arc::new((*self.current).clone()),
                },
                None => Arc::new((*self.current).clone()),
            };
            self.spare = Some(std::mem::replace(&mut self.current, next));
        }
        // Unique by now, so this copies nothing.
        Arc::make_mut(&mut self.current)
    }

    /// The provider's index in `providers` and `entries`.
    fn position(&self, id: u64) -> Option<usize> {
        self.current
            .entries
            .binary_search_by_key(&id, |entry| entry.id)
            .ok()
    }

    /// A provider just added: ids only grow, so it goes last.
    pub(super) fn add(&mut self, id: u64, key: K) {
        let board = self.edit();
        board.providers.push((key, State::Pending));
        board.entries.push(Entry {
            id,
            value: None,
            leader_hint: 0,
        });
    }

    pub(super) fn remove(&mut self, id: u64) {
        let Some(at) = self.position(id) else { return };
        self.take_value(id);
        let board = self.edit();
        board.providers.remove(at);
        board.entries.remove(at);
    }

    pub(super) fn state(&self, id: u64) -> Option<State> {
        self.position(id).map(|at| self.current.providers[at].1)
    }

    /// Sets the provider's state, leaving its value as it is.
    pub(super) fn set_state(&mut self, id: u64, state: State) {
        let Some(at) = self.position(id) else { return };
        self.edit().providers[at].1 = state;
    }

    /// Makes the provider healthy until `next_poll`, with `value` shown in
    /// its rank among the others. The allocation of the value it replaces is
    /// reused when no reader holds it.
    ///
    /// `rank` is user code and may panic: it runs only while the board is
    /// whole (at worst a leader is left out of order), never halfway through
    /// a change.
    pub(super) fn set_healthy(
        &mut self,
        id: u64,
        next_poll: Instant,
        value: V,
        polled_at: Instant,
        rank: Option<&Rank<V>>,
    ) {
        let Some(at) = self.position(id) else { return };
        let board = self.edit();
        let entry = &board.entries[at];
        let found = entry
            .value
            .as_deref()
            .and_then(|old| find_leader(&board.leaders, entry.leader_hint, id, old, rank));
        // Let go of the entry's share, so the leader's may be the only one.
        board.entries[at].value = None;
        let index = match found {
            Some(index) => {
                let leader = &mut board.leaders[index];
                match Arc::get_mut(&mut leader.value) {
                    Some(in_place) => *in_place = value,
                    None => leader.value = Arc::new(value),
                }
                leader.polled_at = polled_at;
                index
            }
            None => {
                let (key, _) = &board.providers[at];
                board.leaders.push(Leader {
                    key: key.clone(),
                    value: Arc::new(value),
                    polled_at,
                    id,
                });
                board.leaders.len() - 1
            }
        };
        board.entries[at].value = Some(Arc::clone(&board.leaders[index].value));
        board.providers[at].1 = State::Healthy { next_poll };
        board.entries[at].leader_hint = reposition(&mut board.leaders, index, rank);
    }

    /// Takes the provider's value off the board. Runs no user code, so it is
    /// safe while a rank closure's panic unwinds.
    pub(super) fn take_value(&mut self, id: u64) {
        let Some(at) = self.position(id) else { return };
        if self.current.entries[at].value.is_none() {
            return;
        }
        let board = self.edit();
        let entry = &mut board.entries[at];
        entry.value = None;
        let leaders = &mut board.leaders;
        let index = match leaders.get(entry.leader_hint) {
            Some(leader) if leader.id == id => Some(entry.leader_hint),
            _ => leaders.iter().position(|leader| leader.id == id),
        };
        if let Some(index) = index {
            leaders.remove(index);
        }
    }
}

/// Whether `leader` comes before the value `value` of provider `id`: by rank,
/// then in the order the providers were added.
fn is_before<K, V>(leader: &Leader<K, V>, value: &V, id: u64, rank: Option<&Rank<V>>) -> bool {
    let by_rank = rank.map_or(Ordering::Equal, |rank| rank(&leader.value, value));
    by_rank.then(leader.id.cmp(&id)) == Ordering::Less
}

/// The index of provider `id`'s leader, showing `value`: `hint` while no
/// other leader moved past it, else a binary search, or a scan when a rank
/// that is not a total order put it out of place.
fn find_leader<K, V>(
    leaders: &[Leader<K, V>],
    hint: usize,
    id: u64,
    value: &V,
    rank: Option<&Rank<V>>,
) -> Option<usize> {
    let is_at = |index: usize| leaders.get(index).is_some_and(|leader| leader.id == id);
    if is_at(hint) {
        return Some(hint);
    }
    let index = leaders.partition_point(|leader| is_before(leader, value, id, rank));
    if is_at(index) {
        return Some(index);
    }
    leaders.iter().position(|leader| leader.id == id)
}

/// Moves the leader at `index`, whose value changed, to its place among the
/// others (which are in order), shifting only the leaders in between, and
/// returns its new index. Without a rank, the order never changes.
fn reposition<K, V>(leaders: &mut [Leader<K, V>], index: usize, rank: Option<&Rank<V>>) -> usize {
    if rank.is_none() {
        return index;
    }
    let (left, rest) = leaders.split_at(index);
    let Some((moved, right)) = rest.split_first() else {
        return index;
    };
    let comes_before = |leader: &Leader<K, V>| is_before(leader, &moved.value, moved.id, rank);
    // Most changes keep their place: two comparisons say so.
    if left.last().is_some_and(|leader| !comes_before(leader)) {
        let to = left.partition_point(comes_before);
        leaders[to..=index].rotate_right(1);
        return to;
    }
    if right.first().is_some_and(comes_before) {
        let past = right.partition_point(comes_before);
        leaders[index..=index + past].rotate_left(1);
        return index + past;
    }
    index
}
