//! The shard of a [`TokenBucket`](crate::budget::TokenBucket) a thread turns
//! to first: its own, dealt round-robin, so threads that retry at once touch
//! different cache lines.

use std::cell::Cell;

/// Set in every index dealt, so that 0 means "none yet" and the check on
/// each call is a comparison with zero.
const DEALT: u8 = 0x80;

// A const initializer and no destructor: reading it is an offset from the
// thread pointer. Under loom, loom's, so each modelled thread gets its own.
#[cfg(not(tower_backoff_loom))]
std::thread_local! {
    static HOME: Cell<u8> = const { Cell::new(0) };
}
#[cfg(tower_backoff_loom)]
loom::thread_local! {
    static HOME: Cell<u8> = Cell::new(0);
}

// The dealer is no part of any model: a std atomic, reset for each loom
// execution so every run deals the same way.
#[cfg(not(tower_backoff_loom))]
static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
#[cfg(tower_backoff_loom)]
loom::lazy_static! {
    static ref NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
}

/// This thread's shard number, for every bucket: a bucket of `n` shards
/// (a power of two, at most 128) uses it modulo `n`, so threads dealt one
/// after another land on different shards.
///
/// Shard 0 for a thread whose thread-locals are being torn down (a budget
/// used from another thread-local's destructor), on the platforms where
/// that can fail: any shard is correct, the own one is only faster.
#[inline]
pub(super) fn index() -> usize {
    HOME.try_with(|home| {
        let mut dealt = home.get();
        if dealt == 0 {
            dealt = deal(home);
        }
        usize::from(dealt & !DEALT)
    })
    .unwrap_or(0)
}

#[cold]
fn deal(home: &Cell<u8>) -> u8 {
    let dealt = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | DEALT;
    home.set(dealt);
    dealt
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_index_and_the_next_thread_gets_another() {
        let mine = index();
        assert_eq!(index(), mine);
        let theirs = std::thread::spawn(index).join().unwrap();
        // Other tests deal indices too, but never the one a live thread holds
        // until 128 more threads have been dealt one.
        assert_ne!(theirs, mine);
        assert!(mine < 128 && theirs < 128);
    }
}
