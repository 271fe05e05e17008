//! [`LoadCap`]: at most a share of a layer's requests get a hedge, in every
//! second, not only on average. When latency rises for everyone, every
//! request passes the hedge delay; the cap is what keeps hedging from adding
//! load to a server that is slow already.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The cap counts in slots of a tenth of a second.
const SLOT: Duration = Duration::from_millis(100);
/// Slots in a second.
const SECOND: u64 = 10;
/// The ring holds a second of full slots and the current one.
const RING: usize = SECOND as usize + 1;

/// Hedges at most `share` of the requests of the last second.
pub(crate) struct LoadCap {
    share: f64,
    origin: Instant,
    slots: [Slot; RING],
}

#[derive(Default)]
struct Slot {
    /// The slot's number since `origin`, plus one: 0 is a slot never used.
    epoch: AtomicU64,
    requests: AtomicU32,
    hedges: AtomicU32,
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
        self.slot(now).requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a hedge at `now` if the hedges of the last second, this one
    /// included, stay within the share of the requests of the last full
    /// second. Concurrent callers may overshoot by one hedge each: the check
    /// and the count are two steps.
    pub(crate) fn try_take(&self, now: Instant) -> bool {
        let current = self.epoch(now);
        let slot = self.slot(now);
        let (mut requests, mut hedges) = (0u64, 0u64);
        for slot in &self.slots {
            let epoch = slot.epoch.load(Ordering::Relaxed);
            // Hedges over the second before this slot and this slot; the
            // requests of the full slots only: the current one has just
            // begun. So whatever second a clock on the wall picks, it holds
            // no more hedges than the share of its requests.
            if epoch + SECOND >= current && epoch <= current && epoch != 0 {
                hedges += u64::from(slot.hedges.load(Ordering::Relaxed));
                if epoch < current {
                    requests += u64::from(slot.requests.load(Ordering::Relaxed));
                }
            }
        }
        if (hedges + 1) as f64 > self.share * requests as f64 {
            return false;
        }
        slot.hedges.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A hedge taken at `now` did not go out after all (the budget refused
    /// it).
    pub(crate) fn give_back(&self, now: Instant) {
        let slot = self.slot(now);
        // Saturating: the slot may have been reset since.
        let _ = slot
            .hedges
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        // In whole slots, without a 128-bit division on every request.
        let slot_millis = SLOT.as_millis() as u64;
        let slots_a_second = 1000 / slot_millis;
        elapsed
            .as_secs()
            .saturating_mul(slots_a_second)
            .saturating_add(u64::from(elapsed.subsec_millis()) / slot_millis + 1)
    }

    /// The slot of `now`, emptied first if it last counted an older slot.
    fn slot(&self, now: Instant) -> &Slot {
        let epoch = self.epoch(now);
        let slot = &self.slots[(epoch % RING as u64) as usize];
        if slot.epoch.load(Ordering::Relaxed) != epoch
            && slot.epoch.swap(epoch, Ordering::Relaxed) != epoch
        {
            // A request counted between the swap and these stores is lost:
            // the cap errs towards fewer hedges.
            slot.requests.store(0, Ordering::Relaxed);
            slot.hedges.store(0, Ordering::Relaxed);
        }
        slot
    }
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

    #[tokio::test(start_paused = true)]
    async fn hedges_a_share_of_the_last_seconds_requests() {
        let cap = LoadCap::new(0.1);
        // No requests counted yet: no hedge.
        assert_eq!(hedges(&cap), 0);
        requests(&cap, 500, Duration::from_secs(1)).await;
        assert_eq!(hedges(&cap), 50);
        // Still within the same second: nothing more.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(hedges(&cap), 0);
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
        /// hedges of slots `k - 10 ..= k` within the share of the requests
        /// of the full slots `k - 10 ..= k - 1`: what the docs promise.
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
                            let window = k.saturating_sub(SECOND)..=k;
                            let granted = hedges.iter().filter(|s| window.contains(s)).count();
                            let before = requests
                                .iter()
                                .filter(|&&s| s + SECOND >= k && s < k)
                                .count();
                            assert!(
                                granted as f64 <= share * before as f64,
                                "{granted} hedges at slot {k} for {before} requests at {share}"
                            );
                        }
                    }
                }
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_given_back_frees_its_place() {
        let cap = LoadCap::new(0.1);
        requests(&cap, 10, Duration::from_secs(1)).await;
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
}
