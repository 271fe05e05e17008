//! Where a hedged attempt stands: when its next hedge is due, what its
//! failed copies leave for the others, and when a hedge the load cap turned
//! away asks again. The transitions that move it are in `hedged.rs`.

use std::time::Duration;

use tokio::time::Instant;

use super::copies::CopySent;
use super::Hedger;
use crate::engine::Ending;

/// Where a hedged attempt stands with its next hedge.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextHedge {
    /// The first copy has not been polled yet. Its hedging starts at the
    /// first poll that finds it pending: one that answers at once is never
    /// hedged, and counts towards neither the load cap nor the latencies.
    Unpolled,
    /// The first hedge is due after this delay, from the first poll on: a
    /// timer made at the call would need a runtime where the future is
    /// made, not only where it is polled.
    Arm(Duration),
    /// Sent when the delay is over, if `next` is set.
    Waiting,
    /// Due: sent as soon as the service is ready.
    Due,
    /// No further hedge of this attempt: the limit, the cap or the budget
    /// said no, or the server asked for a delay.
    Stopped,
}

/// What the copies of a hedged attempt that failed leave behind for those
/// still pending: the caller gets the last real outcome, and the retry after
/// the attempt honours every delay a server named.
#[derive(Clone, Copy, Default)]
pub(crate) struct Failed {
    /// The longest delay a server named for a failed copy: the retry after
    /// the attempt waits at least that long, whichever copy fails last.
    pub(crate) held: Option<Duration>,
    /// How the request ends with the kept outcome when that is a failure
    /// kept back because the request could no longer be copied: a copy that
    /// fell behind a replay limit fails for a reason of our own, so the
    /// copies still pending are let bring the real outcome.
    pub(crate) spent: Option<Ending>,
}

/// A copy of a hedged attempt that answered: its outcome, how it went
/// out, and whether it answered at its first poll.
pub(crate) struct Answered<O> {
    pub(crate) outcome: O,
    pub(crate) sent: CopySent,
    pub(crate) first_poll: bool,
}

/// When a hedge the load cap turned away asks again: soon after a short
/// wait, when the cap may have room for it (each request that comes adds
/// some), and less often the longer the attempt has been pending. A hedge
/// that goes out a little late still cuts the tail that one never sent
/// leaves in place, and an attempt pending for long asks only a few times.
pub(crate) fn ask_again(delay: Duration, started: Instant, now: Instant) -> Duration {
    let pending = now.saturating_duration_since(started);
    (delay.max(pending) / 4).max(Duration::from_millis(1))
}

/// The longer of two delays a server may have named.
pub(crate) fn longest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The hedging of an attempt whose first copy, attempt `attempt`, was found
/// pending at `now`: counted towards the load cap if it is a request's
/// first, and its first hedge due after the hedging delay.
pub(crate) fn start_hedging(hedger: &Hedger, attempt: u32, now: Instant) -> NextHedge {
    if attempt == 1 {
        hedger.on_request(now);
    }
    match hedger.delay() {
        // Zero: every copy at once, as gRPC's hedging does.
        Some(delay) if delay.is_zero() => NextHedge::Due,
        Some(delay) => NextHedge::Arm(delay),
        // No percentile yet to go by.
        None => NextHedge::Stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Hedging;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_hedge_turned_away_asks_again_after_a_quarter_of_its_wait_and_at_least_1_ms() {
        let t0 = Instant::now();
        // Pending for less than the delay: a quarter of the delay.
        assert_eq!(ask_again(MS * 40, t0, t0 + MS * 10), MS * 10);
        // Pending longer: a quarter of the time pending, so an attempt
        // pending for long asks less often.
        assert_eq!(ask_again(MS * 40, t0, t0 + MS * 200), MS * 50);
        // Never sooner than 1 ms, nor with a clock that went back.
        assert_eq!(ask_again(Duration::ZERO, t0, t0), MS);
        assert_eq!(ask_again(MS * 2, t0 + MS * 5, t0), MS);
    }

    #[test]
    fn the_longest_named_delay_wins_and_none_names_none() {
        assert_eq!(longest(Some(MS), Some(MS * 3)), Some(MS * 3));
        assert_eq!(longest(Some(MS * 3), Some(MS)), Some(MS * 3));
        assert_eq!(longest(None, Some(MS)), Some(MS));
        assert_eq!(longest(Some(MS), None), Some(MS));
        assert_eq!(longest(None, None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn hedging_starts_armed_due_at_once_or_stopped_by_the_delay_it_has() {
        let now = Instant::now();
        let fixed = Hedger::new(&Hedging::after(MS * 7));
        assert!(matches!(start_hedging(&fixed, 1, now), NextHedge::Arm(d) if d == MS * 7));
        let at_once = Hedger::new(&Hedging::after(Duration::ZERO));
        assert!(matches!(start_hedging(&at_once, 2, now), NextHedge::Due));
        // A percentile with nothing measured yet has no delay to go by.
        let percentile = Hedger::new(&Hedging::at_percentile(95.0));
        assert!(matches!(
            start_hedging(&percentile, 1, now),
            NextHedge::Stopped
        ));
    }
}
