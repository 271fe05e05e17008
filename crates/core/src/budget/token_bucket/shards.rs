//! The tokens of a [`TokenBucket`](crate::budget::TokenBucket), spread over
//! shards of a cache line each, so that threads retrying at once mostly move
//! tokens on their own line instead of all on one.
//!
//! Every move of tokens is one compare-and-swap on one shard, so the total is
//! conserved: no race creates a token. Each shard holds at most its share of
//! the capacity, so the total never passes it. A thread takes from and puts
//! into its own shard first, then walks the others: a withdrawal its shard
//! cannot pay gathers from them, a deposit its shard cannot hold spills into
//! them. So one thread alone sees exactly what a single counter would give.
//!
//! A bucket whose capacity grows takes more shards into use as it grows,
//! never fewer again. The capacity and the count in use are one word, read
//! together; a deposit that read them before a resize re-splits the tokens
//! checks again after it wrote, and moves what it put over a share it no
//! longer has (`recheck`).

use crate::sync::{AtomicU64, Ordering};

/// Most shards a bucket gets: past that, a withdrawal that gathers, or a
/// sum, walks more lines than threads gain by spreading.
const MAX_SHARDS: usize = 16;

/// The state in the low bits of `Limits::room`: every shard held its share
/// at the last look.
const FULL: u64 = 0;

/// A shard may hold less than its share.
const ROOM: u64 = 1;

/// A deposit found every shard full and is looking again: deposits still
/// walk the shards meanwhile.
const CHECKING: u64 = 2;

/// The bits of `Limits::room` that hold the state.
const STATE: u64 = 0b11;

/// What each write of `Limits::room` adds above the state, so that a
/// deposit that finds its own `CHECKING` still there knows nothing was
/// written since.
const WRITE: u64 = STATE + 1;

/// One shard's tokens, alone on its line. 128 bytes, not 64: x86 fetches
/// lines in adjacent pairs, and Apple's cores have 128-byte lines.
#[repr(align(128))]
struct Shard {
    tokens: AtomicU64,
}

/// Where `Limits::size` keeps the base-2 log of the shards in use, above the
/// capacity, which stays below 2^51 thousandths (2^40 tokens).
const IN_USE_SHIFT: u32 = 56;

/// The bits of `Limits::size` that hold the capacity.
const CAPACITY: u64 = (1 << IN_USE_SHIFT) - 1;

/// What every deposit reads and almost never writes. Not padded to a line
/// of its own: the bucket would more than double in size, and the layer
/// keeps it by value; no shard shares its line, which is what matters.
struct Limits {
    /// The most the shards hold in all, and in its top bits how many shards
    /// it is split over, evenly (see [`Size`]): one word, so that a deposit
    /// reads a capacity with the shards it is split over, never one with
    /// the other's count.
    size: AtomicU64,
    /// [`FULL`], [`ROOM`] or [`CHECKING`], and above them a count of the
    /// writes. A healthy service keeps the bucket full, and then a deposit
    /// is this one read: no walk over the shards to find them all full.
    /// Written only by read-modify-writes, so that what a release write of
    /// it made visible stays visible through the writes after it (its
    /// release sequence).
    room: AtomicU64,
}

/// A bucket's tokens in thousandths, over its shards, and its capacity.
///
/// A bucket whose capacity grows with traffic starts on the shards its
/// floor can pay for and takes more into use as it grows (never fewer
/// again: a shard leaves no tokens behind that way). The ones not in use
/// yet hold nothing, as every move of tokens goes to a shard in use in the
/// size it read, and the shards in use only ever become more.
pub(in crate::budget) struct Shards {
    /// A power of two of them, in an allocation of their own: the most the
    /// bucket may use.
    shards: Box<[Shard]>,
    limits: Limits,
}

/// The capacity and the shards in use, as one read of `Limits::size` gave
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::budget) struct Size {
    capacity: u64,
    /// A power of two.
    in_use: usize,
}

impl Size {
    fn of(word: u64) -> Self {
        Self {
            capacity: word & CAPACITY,
            in_use: 1 << (word >> IN_USE_SHIFT),
        }
    }

    fn word(self) -> u64 {
        debug_assert!(self.capacity <= CAPACITY && self.in_use.is_power_of_two());
        self.capacity | (u64::from(self.in_use.trailing_zeros()) << IN_USE_SHIFT)
    }

    fn mask(self) -> usize {
        self.in_use - 1
    }

    /// Every shard in use once, from `home` on.
    fn ring(self, home: usize) -> impl Iterator<Item = usize> {
        let mask = self.mask();
        (0..self.in_use).map(move |k| (home + k) & mask)
    }

    /// The most shard `i` holds: nothing if it is not in use.
    fn share(self, i: usize) -> u64 {
        if i < self.in_use {
            share_of(self.capacity, self.in_use, i)
        } else {
            0
        }
    }
}

impl Shards {
    /// How many shards a bucket of `capacity` whose dearest retry costs
    /// `dearest` gets: one per CPU (rounded up to a power of two, at most
    /// [`MAX_SHARDS`]), but never so many that a full shard cannot pay the
    /// dearest retry alone; a retry that gathers touches several lines, the
    /// contention sharding is for, and two that gather at once can both be
    /// refused.
    pub(in crate::budget) fn count_for(capacity: u64, dearest: u64) -> usize {
        let fit = capacity.checked_div(dearest).unwrap_or(u64::MAX);
        let fit = usize::try_from(fit).unwrap_or(usize::MAX).max(1);
        // The largest power of two that fits.
        let fit = 1 << fit.ilog2();
        machine_shards().min(fit)
    }

    /// `count` shards (a power of two) holding `tokens` of `capacity` in all,
    /// split as evenly as the capacity.
    #[cfg(any(test, tower_backoff_loom))]
    pub(in crate::budget) fn new(count: usize, tokens: u64, capacity: u64) -> Self {
        Self::growing(count, count, tokens, capacity)
    }

    /// Room for `most` shards, `count` of them in use, holding `tokens` of
    /// `capacity` in all, split as evenly as the capacity; both counts
    /// powers of two.
    pub(in crate::budget) fn growing(
        most: usize,
        count: usize,
        tokens: u64,
        capacity: u64,
    ) -> Self {
        debug_assert!(most.is_power_of_two() && most <= 128);
        debug_assert!(count.is_power_of_two() && count <= most);
        debug_assert!(tokens <= capacity);
        let shards = (0..most)
            .map(|i| Shard {
                tokens: AtomicU64::new(if i < count {
                    share_of(tokens, count, i)
                } else {
                    0
                }),
            })
            .collect();
        let size = Size {
            capacity,
            in_use: count,
        };
        Self {
            shards,
            limits: Limits {
                size: AtomicU64::new(size.word()),
                // The first deposit that finds every shard full checks.
                room: AtomicU64::new(ROOM),
            },
        }
    }

    /// The most shards the bucket may use.
    pub(in crate::budget) fn most(&self) -> usize {
        self.shards.len()
    }

    /// The shards in use now.
    #[cfg(any(test, tower_backoff_loom))]
    pub(in crate::budget) fn in_use(&self) -> usize {
        self.size().in_use
    }

    pub(in crate::budget) fn capacity(&self) -> u64 {
        self.size().capacity
    }

    pub(in crate::budget) fn size(&self) -> Size {
        Size::of(self.limits.size.load(Ordering::Relaxed))
    }

    /// The sum of the shards. A snapshot of one shard after another: a
    /// withdrawal gathering at the same time may be missed halfway.
    pub(in crate::budget) fn total(&self) -> u64 {
        self.total_of(self.size())
    }

    /// The sum of the shards in use in `size`: the others hold nothing.
    fn total_of(&self, size: Size) -> u64 {
        size.ring(0)
            .map(|i| self.shards[i].tokens.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether the bucket holds `amount`, reading the shard of `home` first.
    pub(in crate::budget) fn holds(&self, amount: u64, home: usize) -> bool {
        let size = self.size();
        self.shards[home & size.mask()]
            .tokens
            .load(Ordering::Relaxed)
            >= amount
            || self.total_of(size) >= amount
    }

    /// Takes `amount` if the shards hold it, from the shard of `home` first.
    ///
    /// Exact alone; under a race it can refuse what was there: a gathering
    /// withdrawal reads each shard once, so tokens that move behind it to a
    /// shard it already read are missed, and two gathering at once can each
    /// hold part of what one of them needed, and both give it back. It never
    /// grants what was not there.
    pub(in crate::budget) fn take(&self, amount: u64, home: usize) -> bool {
        let size = self.size();
        let home = home & size.mask();
        // One location, read-modify-write: the CAS alone makes it exact.
        // Acquire only for the room flag (see `lower_room_flag`).
        let taken =
            self.shards[home]
                .tokens
                .fetch_update(Ordering::Acquire, Ordering::Relaxed, |tokens| {
                    tokens.checked_sub(amount)
                });
        if taken.is_ok() {
            self.made_room();
            return true;
        }
        self.gather(amount, home, size)
    }

    /// Takes `amount` from as many shards as it takes, giving everything back
    /// when they do not hold that much in all.
    #[cold]
    fn gather(&self, amount: u64, home: usize, size: Size) -> bool {
        // A bucket that does not hold it refuses on reads alone, as one
        // counter does: an outage's refusals write nothing.
        if self.total_of(size) < amount {
            return false;
        }
        let mut gathered = 0;
        for i in size.ring(home) {
            let wanted = amount - gathered;
            let had = self.shards[i].tokens.fetch_update(
                Ordering::Acquire,
                Ordering::Relaxed,
                |tokens| (tokens > 0).then(|| tokens.saturating_sub(wanted)),
            );
            if let Ok(had) = had {
                gathered += had.min(wanted);
                if gathered == amount {
                    break;
                }
            }
        }
        if gathered > 0 {
            self.made_room();
        }
        if gathered == amount {
            return true;
        }
        // Another thread took what the sum counted: refuse, and put back
        // what was gathered for the retries that can be paid.
        let size = self.size();
        self.spill(gathered, size, size.ring(home));
        false
    }

    /// Puts `amount` back into the shard of `home()`, spilling what it cannot
    /// hold into the others; what none can hold is dropped. `home` is asked
    /// only when there is room: a deposit into a full bucket is one read,
    /// small enough to inline into every caller.
    #[inline]
    pub(in crate::budget) fn put(&self, amount: u64, home: impl FnOnce() -> usize) {
        if self.limits.room.load(Ordering::Relaxed) & STATE == FULL {
            return;
        }
        self.put_with_room(amount, home);
    }

    /// [`put`](Self::put) when a shard may have room: the own shard alone
    /// here, what it cannot hold spills.
    #[inline(never)]
    fn put_with_room(&self, amount: u64, home: impl FnOnce() -> usize) {
        if amount == 0 {
            return;
        }
        self.put_into(amount, home(), self.size());
    }

    /// [`put_with_room`](Self::put_with_room) with `size` as it was read.
    // Inline: a call of its own costs a refund about 30 instructions.
    #[inline(always)]
    pub(in crate::budget) fn put_into(&self, amount: u64, home: usize, size: Size) {
        let home = home & size.mask();
        let share = size.share(home);
        // Acquire: see `recheck`.
        let had =
            self.shards[home]
                .tokens
                .fetch_update(Ordering::Acquire, Ordering::Relaxed, |tokens| {
                    (tokens < share).then(|| tokens.saturating_add(amount).min(share))
                });
        let left = match had {
            Ok(had) => amount.saturating_sub(share - had),
            Err(_) => amount,
        };
        if left > 0 {
            self.spill(left, size, size.ring(home).skip(1));
        } else {
            self.recheck(size);
        }
    }

    /// Puts `amount` into the shards of `ring`, in turn, each up to its share
    /// in `size`; when all are full, drops the rest and flags the bucket
    /// full.
    #[cold]
    fn spill(&self, amount: u64, size: Size, ring: impl Iterator<Item = usize>) {
        if !self.spill_into(amount, size, ring) {
            self.lower_room_flag();
        }
        self.recheck(size);
    }

    /// The walk of [`spill`](Self::spill): whether `amount` found room.
    fn spill_into(&self, mut amount: u64, size: Size, ring: impl Iterator<Item = usize>) -> bool {
        for i in ring {
            let share = size.share(i);
            // Saturating: a refill owed for a long idle spell can be any size.
            // Acquire: see `recheck`.
            let had = self.shards[i].tokens.fetch_update(
                Ordering::Acquire,
                Ordering::Relaxed,
                |tokens| (tokens < share).then(|| tokens.saturating_add(amount).min(share)),
            );
            if let Ok(had) = had {
                amount -= amount.min(share - had);
                if amount == 0 {
                    return true;
                }
            }
        }
        false
    }

    /// A deposit made with `read` as the size: if a resize changed it
    /// meanwhile, the deposit may have filled a shard to a share it no
    /// longer has, behind the resize's walk; it then moves what is over
    /// itself. Its write to the shard acquired the resize's (a release, on
    /// every shard), or came before it and was seen by it; so a deposit
    /// behind the walk reads the new size here. Without this, a deposit
    /// racing a resize that takes more shards into use could leave the
    /// bucket holding more than its capacity.
    #[inline]
    fn recheck(&self, read: Size) {
        if self.size() != read {
            self.rebalance();
        }
    }

    /// Moves what shards hold beyond their shares in the size now to those
    /// with room; drops what none can hold.
    #[cold]
    fn rebalance(&self) {
        let size = self.size();
        let over = self.clamp(size);
        if over > 0 {
            self.spill(over, size, size.ring(0));
        }
    }

    /// Cuts every shard down to its share in `size`, writing each even when
    /// it holds no more (see `recheck`); returns what was cut.
    fn clamp(&self, size: Size) -> u64 {
        let mut over = 0u64;
        for (i, shard) in self.shards.iter().enumerate() {
            let share = size.share(i);
            let had = shard
                .tokens
                .fetch_update(Ordering::Release, Ordering::Relaxed, |tokens| {
                    Some(tokens.min(share))
                });
            // Always `Ok`: the update never declines.
            let had = had.unwrap_or_else(|had| had);
            over = over.saturating_add(had.saturating_sub(share));
        }
        over
    }

    /// Every shard was full as a deposit walked past it: flags the bucket
    /// full, so deposits stop at one read, unless a second look finds room.
    ///
    /// It races withdrawals that empty a shard behind the walk, which then
    /// raise the flag (`made_room`). The second look is a read-modify-write
    /// of each shard, with release: it reads the shard's latest value, so it
    /// sees any withdrawal before it; and a withdrawal after it reads
    /// (acquire) what it wrote, or a later write of the same chain of
    /// read-modify-writes, so it sees the `CHECKING` written before the
    /// look, and raises the flag. The flag turns `FULL` only if nothing
    /// wrote it since this `CHECKING`: no withdrawal raised it, and no other
    /// deposit took the check over. Until then deposits go on walking the
    /// shards, so none is dropped while there may be room. No room is lost,
    /// with no fence on the withdrawals' path.
    #[cold]
    fn lower_room_flag(&self) {
        let checking = self.start_check();
        let room = self.look_again();
        self.end_check(checking, room);
    }

    /// Flags a check under way; returns the flag as written, the check's
    /// own mark. Acquire: a `resize` that raised the flag before this, to
    /// say it grew the capacity, shows that capacity to `look_again`.
    fn start_check(&self) -> u64 {
        let flag = self.limits.room.load(Ordering::Relaxed);
        self.write_room_flag(flag, CHECKING, Ordering::AcqRel)
    }

    /// Whether some shard holds less than its share, read by a
    /// read-modify-write of each (see `lower_room_flag`).
    fn look_again(&self) -> bool {
        let size = self.size();
        let mut room = false;
        // Every shard, those not in use too (their share is nothing): the
        // protocol's argument does not depend on which size was read.
        for (i, shard) in self.shards.iter().enumerate() {
            // Adding nothing changes no token.
            let tokens = shard.tokens.fetch_add(0, Ordering::Release);
            room |= tokens < size.share(i);
        }
        room
    }

    /// Ends the check marked `checking`: raises the flag if it found room,
    /// or flags the bucket full if nothing wrote the flag since its mark.
    fn end_check(&self, checking: u64, room: bool) {
        if room {
            self.write_room_flag(checking, ROOM, Ordering::Relaxed);
        } else {
            // Failing means another write came after the mark: it stands.
            let full = (checking & !STATE) | FULL;
            let _ = self.limits.room.compare_exchange(
                checking,
                full,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// Tokens were taken: makes sure the room flag says so (see
    /// `lower_room_flag`). A write only when a deposit lowered the flag
    /// since, so threads retrying at once only read it.
    fn made_room(&self) {
        let flag = self.limits.room.load(Ordering::Relaxed);
        if flag & STATE != ROOM {
            self.write_room_flag(flag, ROOM, Ordering::Relaxed);
        }
    }

    /// Sets the room flag to `state`, counting the write, from `flag` as the
    /// value it likely holds; returns what it wrote.
    fn write_room_flag(&self, mut flag: u64, state: u64, order: Ordering) -> u64 {
        loop {
            let next = (flag & !STATE).wrapping_add(WRITE) | state;
            match self
                .limits
                .room
                .compare_exchange_weak(flag, next, order, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(actual) => flag = actual,
            }
        }
    }

    /// Sets the capacity, giving up what the shards hold beyond it in all,
    /// and takes up to `wanted` shards into use (a power of two; never fewer
    /// than are in use, never more than the most): what one shard held
    /// beyond its new share moves to those with room, new ones included.
    ///
    /// A deposit that read the old size and fills a shard to its old share
    /// behind this walk moves what is over itself (see `recheck`).
    #[cold]
    pub(in crate::budget) fn resize(&self, capacity: u64, wanted: usize) {
        debug_assert!(wanted.is_power_of_two());
        let wanted = wanted.min(self.shards.len());
        let resized = |word| Size {
            capacity,
            in_use: Size::of(word).in_use.max(wanted),
        };
        // A read-modify-write, so that two resizes at once never put fewer
        // shards in use than either asked for.
        let previous =
            self.limits
                .size
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                    Some(resized(word).word())
                });
        let size = resized(previous.unwrap_or_else(|word| word));
        let over = self.clamp(size);
        // A larger capacity leaves room in every shard. Release: a deposit
        // that lowers the flag after this reads the new capacity (see
        // `lower_room_flag`); one that lowered it before is overwritten.
        let flag = self.limits.room.load(Ordering::Relaxed);
        self.write_room_flag(flag, ROOM, Ordering::Release);
        if over > 0 {
            self.spill(over, size, size.ring(0));
        }
    }

    /// Empties every shard without reading the clock.
    #[cfg(all(test, tower_backoff_loom))]
    pub(in crate::budget) fn empty(&self) {
        for shard in self.shards.iter() {
            shard.tokens.store(0, Ordering::Relaxed);
        }
        let flag = self.limits.room.load(Ordering::Relaxed);
        self.write_room_flag(flag, ROOM, Ordering::Relaxed);
    }

    /// Whether the room flag says every shard is full, for tests that look
    /// inside.
    #[cfg(test)]
    pub(in crate::budget) fn says_full(&self) -> bool {
        self.limits.room.load(Ordering::Relaxed) & STATE == FULL
    }

    /// The tokens of each shard, for tests that look inside.
    #[cfg(test)]
    pub(in crate::budget) fn each(&self) -> Vec<u64> {
        self.shards
            .iter()
            .map(|shard| shard.tokens.load(Ordering::Relaxed))
            .collect()
    }
}

/// Shard `i`'s part of `total` split over `count` shards (a power of two):
/// the quotient each, and one more for the first `remainder` shards. So a
/// smaller total never gives a shard a larger part.
fn share_of(total: u64, count: usize, i: usize) -> u64 {
    let shift = count.trailing_zeros();
    let remainder = total & (count as u64 - 1);
    (total >> shift) + u64::from((i as u64) < remainder)
}

/// Shards for one per CPU, once per process: reading the CPU count can
/// mean reading cgroup files. Two under loom, to keep the models small.
fn machine_shards() -> usize {
    if cfg!(tower_backoff_loom) {
        return 2;
    }
    static SHARDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SHARDS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .next_power_of_two()
            .min(MAX_SHARDS)
    })
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn shares_split_the_capacity_evenly_and_add_up_to_it() {
        for count in [1, 2, 4, 8, 16] {
            for capacity in [1, 7, 10, 1_000, 1 << 50] {
                let shares: Vec<u64> = (0..count).map(|i| share_of(capacity, count, i)).collect();
                assert_eq!(shares.iter().sum::<u64>(), capacity, "{shares:?}");
                assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn a_bucket_gets_no_more_shards_than_can_each_pay_its_dearest_retry() {
        // The fleet-safe default: a capacity of one timeout retry.
        assert_eq!(Shards::count_for(10, 10), 1);
        assert_eq!(Shards::count_for(9, 10), 1);
        assert!(Shards::count_for(500, 10) <= 32);
        assert!(Shards::count_for(500, 10).is_power_of_two());
        assert_eq!(Shards::count_for(500, 0), machine_shards());
        assert_eq!(Shards::count_for(u64::MAX, 1), machine_shards());
    }

    #[test]
    fn a_withdrawal_its_shard_cannot_pay_gathers_from_the_others() {
        let shards = Shards::new(4, 40, 40); // 10 each
        assert!(shards.take(25, 1));
        assert_eq!(shards.each(), [10, 0, 0, 5], "its own, then the next ones");
        assert!(!shards.take(16, 0), "15 left in all");
        assert_eq!(shards.each(), [10, 0, 0, 5], "a refusal moves nothing");
    }

    #[test]
    fn a_deposit_its_shard_cannot_hold_spills_into_the_others() {
        let shards = Shards::new(4, 0, 40);
        shards.put(25, || 2);
        assert_eq!(shards.each(), [5, 0, 10, 10], "its own, then the next ones");
        shards.put(100, || 1);
        assert_eq!(shards.total(), 40, "none holds more than its share");
    }

    #[test]
    fn one_thread_alone_fills_every_shard_and_the_flag_then_says_full() {
        let shards = Shards::new(8, 0, 80);
        for _ in 0..80 {
            shards.put(1, || 5);
        }
        assert_eq!(shards.total(), 80);
        assert!(
            !shards.says_full(),
            "no deposit has found them all full yet"
        );
        shards.put(1, || 5);
        assert!(shards.says_full());
        assert!(shards.take(1, 3));
        assert!(!shards.says_full(), "a withdrawal made room");
        shards.put(1, || 0);
        assert_eq!(shards.total(), 80);
    }

    /// The race of two deposits that find the bucket full and a retry, one
    /// step at a time: the first check's `FULL` must not land over the
    /// second check, which began after the retry made room.
    #[test]
    fn a_check_taken_over_by_another_deposit_does_not_flag_full_over_room_made_since() {
        let shards = Shards::new(1, 5, 5); // full
        let first = shards.start_check();
        let first_saw_room = shards.look_again();
        assert!(!first_saw_room);
        // A retry takes tokens behind the first look, and raises the flag...
        assert!(shards.take(5, 0));
        // ...which a second deposit, whose walk found the bucket full before
        // the retry, overwrites with its own check.
        let second = shards.start_check();
        shards.end_check(first, first_saw_room);
        assert!(
            !shards.says_full(),
            "the first check ended the second one's"
        );
        shards.put(5, || 0); // the retry's refund
        assert_eq!(shards.total(), 5);
        let second_saw_room = shards.look_again();
        shards.end_check(second, second_saw_room);
        assert!(
            shards.says_full(),
            "full again, and the second check says so"
        );
    }

    /// The layer's default at its floor: one shard in use of several. Full,
    /// it is flagged full, so a refund is one read; the shards not in use
    /// are no room.
    #[test]
    fn a_bucket_full_on_the_shards_in_use_is_flagged_full() {
        let shards = Shards::growing(4, 1, 0, 10);
        shards.put(10, || 3);
        assert!(!shards.says_full(), "no deposit found it full yet");
        shards.put(1, || 2);
        assert!(shards.says_full());
        assert_eq!(shards.each(), [10, 0, 0, 0]);
    }

    #[test]
    fn a_deposit_that_read_the_size_before_a_resize_moves_what_is_over_its_new_share() {
        let shards = Shards::growing(2, 1, 19, 19); // full, on one shard
        let before = shards.size();
        shards.resize(20, 2); // two shares of 10
        assert_eq!(shards.each(), [10, 9]);
        // Lands now, filling its shard to the share it read: 19.
        shards.put_into(5, 0, before);
        assert_eq!(shards.each(), [10, 10], "no more than the capacity");
    }

    #[test]
    fn a_smaller_capacity_keeps_what_fits_in_all_not_in_each_shard() {
        let shards = Shards::new(2, 0, 10);
        shards.put(5, || 0);
        assert_eq!(shards.each(), [5, 0]);
        shards.resize(6, 1); // shares of 3: shard 0 is over, shard 1 has room
        assert_eq!(shards.each(), [3, 2]);
        shards.resize(4, 1);
        assert_eq!(shards.each(), [2, 2]);
        shards.resize(100, 1);
        shards.put(100, || 1);
        assert_eq!(shards.total(), 100, "a larger capacity has room");
    }

    /// One step of a history, on the shard of `home`.
    #[derive(Debug, Clone)]
    enum Step {
        Take {
            amount: u64,
            home: usize,
        },
        Put {
            amount: u64,
            home: usize,
        },
        /// To a capacity, asking for 2^k shards.
        Resize(u64, u32),
    }

    fn step(capacity: u64) -> impl Strategy<Value = Step> {
        let amount = prop_oneof![
            Just(0),
            Just(1),
            Just(capacity),
            Just(u64::MAX / 2),
            0..=capacity / 4 + 1,
            0..=capacity.saturating_mul(2),
        ];
        prop_oneof![
            4 => (amount.clone(), any::<usize>()).prop_map(|(amount, home)| Step::Take { amount, home }),
            4 => (amount, any::<usize>()).prop_map(|(amount, home)| Step::Put { amount, home }),
            1 => (1..=capacity.saturating_mul(2), 0..=4u32)
                .prop_map(|(to, k)| Step::Resize(to, k)),
        ]
    }

    /// The most shards, how many are in use at first, the capacity, the
    /// tokens at first, and the steps.
    fn history() -> impl Strategy<Value = (usize, usize, u64, u64, Vec<Step>)> {
        (0..=4u32, 0..=4u32, prop_oneof![1u64..=100, 1u64..=1 << 50]).prop_flat_map(
            |(most, in_use, capacity)| {
                (
                    Just(1 << most),
                    Just(1 << in_use.min(most)),
                    Just(capacity),
                    0..=capacity,
                    proptest::collection::vec(step(capacity), 0..100),
                )
            },
        )
    }

    proptest! {
        /// From one thread, the shards are one counter: every withdrawal
        /// and deposit does what it does to a single total capped at the
        /// capacity, whichever shard it starts from.
        #[test]
        fn from_one_thread_the_shards_behave_as_one_counter(
            (most, mut in_use, capacity, tokens, steps) in history(),
        ) {
            let shards = Shards::growing(most, in_use, tokens, capacity);
            let (mut model, mut capacity) = (tokens, capacity);
            let (mut taken, mut given) = (0u128, 0u128);
            for step in steps {
                match step {
                    Step::Take { amount, home } => {
                        let granted = shards.take(amount, home);
                        prop_assert_eq!(granted, model >= amount, "{:?}", step);
                        if granted {
                            model -= amount;
                            taken += u128::from(amount);
                        }
                    }
                    Step::Put { amount, home } => {
                        shards.put(amount, || home);
                        model = model.saturating_add(amount).min(capacity);
                        given += u128::from(amount);
                    }
                    Step::Resize(to, k) => {
                        shards.resize(to, 1 << k);
                        capacity = to;
                        in_use = in_use.max((1 << k).min(most));
                        model = model.min(capacity);
                    }
                }
                prop_assert_eq!(shards.total(), model, "after {:?}: {:?}", step, shards.each());
                prop_assert_eq!(shards.capacity(), capacity);
                prop_assert_eq!(shards.in_use(), in_use);
                for (i, held) in shards.each().into_iter().enumerate() {
                    let share = if i < in_use { share_of(capacity, in_use, i) } else { 0 };
                    prop_assert!(held <= share, "{:?}", shards.each());
                }
                if shards.says_full() {
                    prop_assert_eq!(model, capacity, "the flag says full, but there is room");
                }
                // The bound a bucket documents: nothing taken that was not
                // given (at the start or later).
                prop_assert!(taken <= u128::from(tokens) + given);
            }
        }
    }
}
