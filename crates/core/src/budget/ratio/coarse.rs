//! The kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`): the time of
//! the last timer tick, read without the cycle counter, so several times
//! cheaper than `Instant::now()` (7 against 24 ns: the controls of
//! `benches/budget.rs`). Linux and Android only; elsewhere [`lag`] is `None` and
//! nothing is decided on it.

#[cfg(any(target_os = "linux", target_os = "android"))]
use rustix::time::ClockId;

/// Nanoseconds on the coarse clock. It runs on `CLOCK_MONOTONIC`, which std's
/// and tokio's `Instant` read on Linux and Android, at most [`lag`] behind:
/// `now() <= Instant::now()` read after it, and `Instant::now()` read before
/// it `<= now() + lag`, in the same nanoseconds.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
pub(super) fn now() -> u64 {
    nanos(rustix::time::clock_gettime(ClockId::MonotonicCoarse))
}

/// How far the coarse clock may be behind `CLOCK_MONOTONIC`: its resolution,
/// one timer tick (1 to 10 ms, by the kernel's `HZ`). A tick delayed longer
/// (a virtual CPU descheduled) is the same as a thread preempted between
/// reading a clock and using what it read.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) fn lag() -> Option<u64> {
    Some(nanos(rustix::time::clock_getres(ClockId::MonotonicCoarse)))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
#[inline]
pub(super) fn now() -> u64 {
    0
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) fn lag() -> Option<u64> {
    None
}

/// A timespec in nanoseconds. The kernel's monotonic times and resolutions
/// are never negative (a negative field would read as zero); u64
/// nanoseconds last 584 years.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
fn nanos(time: rustix::time::Timespec) -> u64 {
    u64::try_from(time.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(time.tv_nsec).unwrap_or(0))
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    /// The lag is the coarse clock's step: the time of one tick. Steps come
    /// a nanosecond short of it (the kernel's clock is slewed) or a tick or
    /// more long (ticks skipped while idle), never half as short.
    #[test]
    fn the_lag_is_the_coarse_clocks_step() {
        let lag = lag().expect("Linux has a coarse clock");
        let mut last = now();
        let mut shortest = u64::MAX;
        let mut steps = 0;
        let started = std::time::Instant::now();
        while steps < 5 && started.elapsed() < std::time::Duration::from_secs(2) {
            let read = now();
            if read != last {
                shortest = shortest.min(read - last);
                last = read;
                steps += 1;
            }
        }
        assert_eq!(steps, 5, "the coarse clock moves");
        assert!(
            lag >= shortest / 2 && lag <= shortest * 2,
            "lag {lag} ns, shortest step {shortest} ns"
        );
    }

    #[test]
    fn the_coarse_clock_runs_on_the_instant_clock_a_tick_behind() {
        let lag = lag().expect("Linux has a coarse clock");
        assert!(lag <= 100_000_000, "a tick of {lag} ns");
        // Both clocks' elapsed time from (about) the same origin. The slack
        // is for ticks handled late on a loaded machine: what is checked is
        // that both run on one clock, a tick apart, not the kernel's latency.
        let coarse_origin = now();
        let origin = std::time::Instant::now();
        let slack = 10_000_000;
        for _ in 0..1000 {
            let before = origin.elapsed().as_nanos() as u64;
            let coarse = now() - coarse_origin;
            let after = origin.elapsed().as_nanos() as u64;
            assert!(
                coarse <= after + lag + slack,
                "{coarse} ns, the clock says {after}"
            );
            assert!(
                coarse + lag + slack >= before,
                "{coarse} ns, the clock said {before}"
            );
        }
    }
}
