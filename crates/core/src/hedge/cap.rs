//! [`LoadCap`]: at most a share of a layer's requests get a hedge, in every
//! second, not only on average. When latency rises for everyone, every
//! request passes the hedge delay; the cap is what keeps hedging from adding
//! load to a server that is slow already.

use std::time::Duration;

use tokio::time::Instant;

use crate::sync::{AtomicU64, Ordering};

/// The cap counts in slots of a tenth of a second.
const SLOT: Duration = Duration::from_millis(100);
/// Slots in a second.
const SECOND: u64 = 10;
/// The ring holds the slots of the last second, the current one included.
const RING: usize = SECOND as usize;
/// A slot's counts are tagged with the slot's number in their high bits, so
/// that a count and the slot it belongs to change in one atomic step: a
/// slot reused a ring later starts from zero without a reset that could race
/// with a count. 24 bits of count (16 million a tenth of a second; it
/// saturates), 40 of slot number (3,000 years).
const COUNT_BITS: u32 = 24;
const COUNT: u64 = (1 << COUNT_BITS) - 1;

/// Hedges at most `share` of the requests of a second, in every second.
pub(crate) struct LoadCap {
    share: f64,
    origin: Instant,
    slots: [Slot; RING],
}

#[derive(Default)]
struct Slot {
    /// Requests called in the slot, tagged with its number.
    requests: AtomicU64,
    /// Hedges sent in the slot, tagged with its number.
    hedges: AtomicU64,
}

impl LoadCap {
    /// A cap of `share` (in (0, 1]) of the requests of every second.
    pub(crate) fn new(share: f64) -> Self {
        Self {
            share,
            origin: Instant::now(),
            slots: Default::default(),
        }
    }

    /// The same cap, with nothing counted.
    pub(crate) fn fresh(&self) -> Self {
        Self::new(self.share)
    }

    /// A request was called at `now`.
    pub(crate) fn on_request(&self, now: Instant) {
        let epoch = self.epoch(now);
        add(&self.slot(epoch).requests, epoch, u64::MAX);
    }

    /// Takes a hedge at `now` if, with it, the hedges of the second that
    /// ends now stay within the share of that same second's requests, those
    /// so far in its last slot included: a second with fewer requests than
    /// the one before gets fewer hedges, not the busier one's share. Exact
    /// under concurrent callers: the last check and the count are one atomic
    /// step.
    pub(crate) fn try_take(&self, now: Instant) -> bool {
        let current = self.epoch(now);
        add(&self.slot(current).hedges, current, self.room(current))
    }

    /// Whether [`try_take`](Self::try_take) at `now` would take a hedge, as
    /// the counts stand: what a hedge is admitted on before anything is
    /// reserved for it.
    pub(crate) fn would_take(&self, now: Instant) -> bool {
        let current = self.epoch(now);
        let taken = count(self.slot(current).hedges.load(Ordering::Relaxed), current);
        taken < self.room(current)
    }

    /// The hedges slot `current` may hold: the share of the requests of
    /// the second that ends with it, less the hedges of its earlier slots.
    fn room(&self, current: u64) -> u64 {
        let (mut requests, mut earlier_hedges) = (0u64, 0u64);
        for epoch in current.saturating_sub(SECOND - 1)..=current {
            let slot = self.slot(epoch);
            requests += count(slot.requests.load(Ordering::Relaxed), epoch);
            if epoch != current {
                earlier_hedges += count(slot.hedges.load(Ordering::Relaxed), epoch);
            }
        }
        // Floored: a hedge is whole.
        let allowed = (self.share * requests as f64) as u64;
        allowed.saturating_sub(earlier_hedges)
    }

    /// A hedge taken at `now` did not go out after all (the budget refused
    /// it).
    pub(crate) fn give_back(&self, now: Instant) {
        let epoch = self.epoch(now);
        let _ =
            self.slot(epoch)
                .hedges
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                    match count(word, epoch) {
                        0 => None,
                        taken => Some(tag(epoch, taken - 1)),
                    }
                });
    }

    /// The number of `now`'s slot since `origin`.
    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        // In whole slots, without a 128-bit division on every request.
        let slot_millis = SLOT.as_millis() as u64;
        let slots_a_second = 1000 / slot_millis;
        elapsed
            .as_secs()
            .saturating_mul(slots_a_second)
            .saturating_add(u64::from(elapsed.subsec_millis()) / slot_millis)
    }

    fn slot(&self, epoch: u64) -> &Slot {
        &self.slots[(epoch % RING as u64) as usize]
    }
}

/// `count` of slot `epoch`, as stored.
fn tag(epoch: u64, count: u64) -> u64 {
    (epoch << COUNT_BITS) | count.min(COUNT)
}

/// The count `word` holds for slot `epoch`: none if it was written for
/// another slot (a ring earlier).
fn count(word: u64, epoch: u64) -> u64 {
    if word >> COUNT_BITS == epoch & (u64::MAX >> COUNT_BITS) {
        word & COUNT
    } else {
        0
    }
}

/// Adds one to slot `epoch`'s count in `counter` if it is below `limit`:
/// whether it did.
fn add(counter: &AtomicU64, epoch: u64, limit: u64) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
            let now = count(word, epoch);
            (now < limit).then(|| tag(epoch, now.saturating_add(1)))
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn requests(cap: &LoadCap, count: u32, over: Duration) {
        for _ in 0..count {
            cap.on_request(Instant::now());
            tokio::time::advance(over / count).await;
        }
    }

    fn hedges(cap: &LoadCap) -> u32 {
        let now = Instant::now();
        (0..1000).take_while(|_| cap.try_take(now)).count() as u32
    }

    /// Within a second's slots: the last request at 998 ms, the clock at
    /// 999 ms.
    const WITHIN_A_SECOND: Duration = Duration::from_millis(999);

    #[tokio::test(start_paused = true)]
    async fn hedges_a_share_of_the_last_seconds_requests() {
        let cap = LoadCap::new(0.1);
        // No requests counted yet: no hedge.
        assert_eq!(hedges(&cap), 0);
        requests(&cap, 500, WITHIN_A_SECOND).await;
        assert_eq!(hedges(&cap), 50);
        // Half a second on, the last second holds those 50 hedges and
        // half the requests: nothing more.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(hedges(&cap), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quieter_second_gets_the_share_of_its_own_requests() {
        let cap = LoadCap::new(0.1);
        requests(&cap, 500, Duration::from_secs(1)).await;
        // A second of 100 requests after one of 500: 10 hedges, not the
        // share of the busier second before it.
        requests(&cap, 100, WITHIN_A_SECOND).await;
        assert_eq!(hedges(&cap), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn no_second_holds_more_than_the_share() {
        let cap = LoadCap::new(0.1);
        let mut per_slot = Vec::new();
        // 50 requests a slot for 5 s; take every hedge allowed at each slot.
        for _ in 0..50 {
            for _ in 0..50 {
                cap.on_request(Instant::now());
            }
            per_slot.push(hedges(&cap));
            tokio::time::advance(SLOT).await;
        }
        for window in per_slot.windows(SECOND as usize) {
            let sum: u32 = window.iter().sum();
            assert!(
                sum <= 50,
                "{sum} hedges in a second of 500 requests: {per_slot:?}"
            );
        }
        assert!(per_slot.iter().sum::<u32>() >= 200, "{per_slot:?}");
    }

    proptest::proptest! {
        /// Whatever the traffic, each hedge granted at slot `k` leaves the
        /// hedges of the second that ends with it, slots `k - 9 ..= k`,
        /// within the share of that second's requests so far: what the
        /// docs promise.
        #[test]
        fn no_hedge_is_granted_past_the_share_of_the_last_second(
            steps in proptest::collection::vec((0u64..350, 0u32..40, 0u32..12), 1..120),
            share in 0.01f64..=1.0,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                let cap = LoadCap::new(share);
                let start = Instant::now();
                let slot = |at: Instant| (at - start).as_millis() as u64 / 100;
                let (mut requests, mut hedges) = (Vec::new(), Vec::new());
                for (advance, new_requests, tries) in steps {
                    tokio::time::advance(Duration::from_millis(advance)).await;
                    let now = Instant::now();
                    for _ in 0..new_requests {
                        cap.on_request(now);
                        requests.push(slot(now));
                    }
                    for _ in 0..tries {
                        if cap.try_take(now) {
                            hedges.push(slot(now));
                            let k = slot(now);
                            let window = k.saturating_sub(SECOND - 1)..=k;
                            let granted = hedges.iter().filter(|s| window.contains(s)).count();
                            let arrived = requests.iter().filter(|s| window.contains(s)).count();
                            assert!(
                                granted as f64 <= share * arrived as f64,
                                "{granted} hedges at slot {k} for {arrived} requests at {share}"
                            );
                        }
                    }
                }
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn would_take_says_what_try_take_does_and_takes_nothing() {
        let cap = LoadCap::new(0.2);
        requests(&cap, 10, WITHIN_A_SECOND).await;
        let now = Instant::now();
        for _ in 0..2 {
            assert!(cap.would_take(now));
            assert!(cap.would_take(now), "asking took nothing");
            assert!(cap.try_take(now));
        }
        assert!(!cap.would_take(now));
        assert!(!cap.try_take(now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_given_back_frees_its_place() {
        let cap = LoadCap::new(0.1);
        requests(&cap, 10, WITHIN_A_SECOND).await;
        let now = Instant::now();
        assert!(cap.try_take(now));
        assert!(!cap.try_take(now));
        cap.give_back(now);
        assert!(cap.try_take(now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_used_again_a_ring_later_starts_empty() {
        let cap = LoadCap::new(0.1);
        // 100 requests in the first slot, then one in the slot that reuses
        // its place in the ring, RING slots later.
        requests(&cap, 100, SLOT / 2).await;
        tokio::time::advance(SLOT * RING as u32).await;
        cap.on_request(Instant::now());
        // A slot on: the last second holds that one request only, too few
        // for a hedge. The first slot's 100 would grant 10.
        tokio::time::advance(SLOT).await;
        assert_eq!(hedges(&cap), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_second_forgets_the_requests_before() {
        let cap = LoadCap::new(0.1);
        requests(&cap, 500, Duration::from_secs(1)).await;
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(hedges(&cap), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_slot_a_second_back_is_out_of_the_second_before_its_place_is_reused() {
        let cap = LoadCap::new(0.1);
        // 50 requests in each slot of the first second, none in the slot now.
        requests(&cap, 500, Duration::from_secs(1)).await;
        // The second that ends now, at 1 s, holds the first second's last
        // nine slots: 450 requests. The first slot's place in the ring is
        // the current slot's, still holding its 50.
        assert_eq!(hedges(&cap), 45);
    }
}

/// Model checks of the cap's counters with loom's atomics: every
/// interleaving of two threads. Run by `.ci/loom.sh`.
#[cfg(all(test, tower_backoff_loom))]
mod loom {
    use ::loom::sync::Arc;
    use ::loom::thread;

    use super::*;

    const EARLIER: Duration = Duration::from_millis(150);
    const NOW: Duration = Duration::from_millis(250);

    #[test]
    fn load_cap_concurrent_takers_get_exactly_the_share() {
        ::loom::model(|| {
            let cap = Arc::new(LoadCap::new(0.5));
            // Two requests in the last full slot: at 50 %, one hedge.
            cap.on_request(cap.origin + EARLIER);
            cap.on_request(cap.origin + EARLIER);
            let other = {
                let cap = cap.clone();
                thread::spawn(move || cap.try_take(cap.origin + NOW))
            };
            let mine = cap.try_take(cap.origin + NOW);
            let granted = usize::from(mine) + usize::from(other.join().unwrap());
            assert_eq!(granted, 1);
        });
    }

    #[test]
    fn load_cap_counts_every_concurrent_request() {
        ::loom::model(|| {
            let cap = Arc::new(LoadCap::new(1.0));
            let other = {
                let cap = cap.clone();
                thread::spawn(move || cap.on_request(cap.origin + EARLIER))
            };
            cap.on_request(cap.origin + EARLIER);
            other.join().unwrap();
            // Both requests counted: at 100 %, two hedges and no third.
            let now = cap.origin + NOW;
            assert!(cap.try_take(now));
            assert!(cap.try_take(now));
            assert!(!cap.try_take(now));
        });
    }
}
