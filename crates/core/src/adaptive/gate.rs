//! The send schedule: how a service clone waits for its turn to send at the
//! shared rate.
//!
//! Every send takes a slot on one shared timeline (a virtual-time token
//! bucket, GCRA): one interval after the last slot taken, or two intervals
//! ago if the timeline fell further behind, so unused time buys at most two
//! extra sends. A clone takes its slot in `poll_ready` and sleeps until it.
//! Slots are taken at most two intervals ahead, so a new rate is obeyed at
//! once and a caller that gives up wastes little; a cut voids the slots taken
//! at the old rate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::timer::Sleep;

use super::AdaptivePacing;
use crate::jitter::Rng;

/// What one service clone holds to wait for its turn: a flag, and nothing
/// else until pacing is on when it asks (so a service, and a response future
/// holding one, stay small). Cloning a service gives the clone a fresh gate.
#[derive(Default)]
pub(crate) struct Gate {
    ready: bool,
    waiting: Option<Box<Waiting>>,
}

/// A gate's state once pacing is on.
struct Waiting {
    pacing: AdaptivePacing,
    /// Its slot on the shared timeline (nanoseconds since the pacing's
    /// origin) and the epoch of the rate it was taken at.
    slot: Option<(u64, u64)>,
    /// When it started waiting, for the metrics.
    since: Option<u64>,
    sleep: Option<Pin<Box<Sleep>>>,
    rng: Rng,
    /// Whether it is counted among the clones queued without a slot.
    queued: bool,
}

impl Waiting {
    fn dequeue(&mut self) {
        if std::mem::take(&mut self.queued) {
            self.pacing.state.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Waiting {
    /// A clone dropped while waiting (its caller gave up) leaves the queue,
    /// and gives its slot back if it was the last one taken, so a caller's
    /// deadline does not cost the others a send.
    fn drop(&mut self) {
        self.dequeue();
        if let Some((slot, epoch)) = self.slot {
            let s = &*self.pacing.state;
            if s.epoch.load(Ordering::Acquire) == epoch {
                let before = slot.saturating_sub(s.interval.load(Ordering::Relaxed));
                let _ =
                    s.last_slot
                        .compare_exchange(slot, before, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
}

impl AdaptivePacing {
    /// Ready when the service clone owning `gate` may send its next attempt;
    /// it stays ready until [`sent`](Self::sent) consumes the readiness.
    /// Called from `BackoffRetry::poll_ready`, so pacing is backpressure: the
    /// service that was readied is the one that sends, and a clone that waits
    /// holds nothing of the inner service.
    pub(crate) fn poll_send(
        &self,
        gate: &mut Gate,
        cx: &mut Context<'_>,
        new_rng: impl FnOnce() -> Rng,
    ) -> Poll<()> {
        if gate.ready {
            return Poll::Ready(());
        }
        let s = &*self.state;
        if self.pacing_interval() == 0 {
            return self.open(gate, None);
        }
        let w = gate.waiting.get_or_insert_with(|| {
            Box::new(Waiting {
                pacing: self.clone(),
                slot: None,
                since: None,
                sleep: None,
                rng: new_rng(),
                queued: false,
            })
        });
        loop {
            let interval = self.pacing_interval();
            if interval == 0 {
                return self.open(gate, None);
            }
            let now = self.now_nanos();
            let epoch = s.epoch.load(Ordering::Acquire);
            let wake = match w.slot {
                Some((slot, taken)) if taken == epoch => {
                    if slot <= now {
                        return self.open(gate, Some(now));
                    }
                    slot
                }
                _ => {
                    let gap = self.gap(interval, &mut w.rng);
                    let ahead = lookahead(interval, s.settings.round);
                    let horizon = now.saturating_add(ahead);
                    // A slot missed by at most two intervals is still taken:
                    // waiters wake at random and may come a little late.
                    let earliest = now.saturating_sub(ahead);
                    let taken =
                        s.last_slot
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                                let slot = last.saturating_add(gap).max(earliest);
                                (slot <= horizon).then_some(slot)
                            });
                    match taken {
                        Ok(last) => {
                            w.dequeue();
                            let slot = last.saturating_add(gap).max(earliest);
                            w.slot = Some((slot, epoch));
                            if slot <= now {
                                return self.open(gate, Some(now));
                            }
                            slot
                        }
                        // The timeline is full as far ahead as slots are
                        // taken: look again when its end comes within reach,
                        // at a random place among the clones queued, so that
                        // a few look per slot, not all of them.
                        Err(last) => {
                            w.slot = None;
                            if !w.queued {
                                s.queued.fetch_add(1, Ordering::Relaxed);
                                w.queued = true;
                            }
                            let due = last.saturating_add(gap).saturating_sub(ahead);
                            let queue = s.queued.load(Ordering::Relaxed).max(1);
                            // About eight look per slot: one might be late.
                            let span = interval.saturating_mul(queue) / 8;
                            let spread = w.rng.next_u64() % span.max(1);
                            due.max(now)
                                .saturating_add(spread)
                                .min(now.saturating_add(s.settings.round))
                        }
                    }
                }
            };
            w.since.get_or_insert(now);
            let deadline = s.origin + Duration::from_nanos(wake);
            let sleep = match w.sleep.as_mut() {
                Some(sleep) => {
                    sleep.as_mut().reset(deadline);
                    sleep
                }
                None => w
                    .sleep
                    .insert(Box::pin(crate::timer::sleep_until(deadline))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    /// The clone owning `gate` may send: counts the wait it ends, if any.
    fn open(&self, gate: &mut Gate, now: Option<u64>) -> Poll<()> {
        gate.ready = true;
        if let Some(w) = gate.waiting.as_mut() {
            w.dequeue();
            w.slot = None;
            if let Some(since) = w.since.take() {
                let now = now.unwrap_or_else(|| self.now_nanos());
                let s = &*self.state;
                s.sleeps.fetch_add(1, Ordering::Relaxed);
                s.slept_nanos
                    .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
            }
        }
        Poll::Ready(())
    }

    /// The spacing before the next slot: the interval, randomized by ± the
    /// randomization factor (at most the max spread); the mean stays the
    /// interval, so the rate does too.
    fn gap(&self, interval: u64, rng: &mut Rng) -> u64 {
        let s = &self.state.settings;
        let spread = ((interval as f64 * s.randomization) as u64).min(s.max_spread);
        if spread == 0 {
            return interval;
        }
        interval - spread + rng.next_u64() % (2 * spread + 1)
    }

    /// Nanoseconds since the pacing was built, on tokio's clock (paused in
    /// tests and simulations).
    pub(super) fn now_nanos(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.state.origin);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    /// An attempt goes out through the clone owning `gate`: uses up its
    /// readiness, counts the send, and returns the stamp to hand back to
    /// [`observe`](Self::observe) with its outcome: the epoch of the rate it
    /// went out at, in the two bytes a response future has spare.
    pub(crate) fn sent(&self, gate: &mut Gate) -> u16 {
        gate.ready = false;
        let s = &*self.state;
        s.invocations.fetch_add(1, Ordering::Relaxed);
        if s.round_start.load(Ordering::Relaxed) != super::IDLE {
            s.sends.fetch_add(1, Ordering::Relaxed);
        }
        s.epoch.load(Ordering::Acquire) as u16
    }
}

/// How far ahead a slot may be taken: two intervals, within a round. A slot
/// taken far ahead is lost if its holder gives up waiting (a caller's
/// deadline), and is sent at a rate that may no longer hold.
fn lookahead(interval: u64, round: u64) -> u64 {
    interval.saturating_mul(2).min(round)
}

impl Clone for Gate {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("ready", &self.ready)
            .field("slot", &self.waiting.as_ref().and_then(|w| w.slot))
            .finish()
    }
}
