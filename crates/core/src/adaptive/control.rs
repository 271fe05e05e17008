//! The rate law: what one round of outcomes does to the send rate. Pure
//! arithmetic on plain numbers, so every rule can be read and tested alone.

/// The cubic's scale, per round³: a cut to 0.9 of the peak is back at it in
/// about 2 rounds, 1 round later 0.6 % above, 2 rounds later 6 % above.
const CUBIC_SCALE: f64 = 0.01;

/// The most a clean round raises the rate above the peak: a probe crosses
/// the server's rate by at most 15 % for one round.
const MAX_PROBE: f64 = 1.15;

/// A clean round turns pacing off when the rate in force let through at least
/// this many times what was sent: pacing no longer holds anything back.
const HEADROOM: f64 = 2.0;

/// The settings the law reads, as rates (per second) and plain factors.
#[derive(Debug, Clone, Copy)]
pub(super) struct Law {
    /// Share of the accepted rate a throttled round sets.
    pub(super) down: f64,
    /// Most the rate changes, either way, in one round.
    pub(super) up: f64,
    /// Successes a round needs to measure the accepted rate.
    pub(super) threshold: u64,
    /// The rate when nothing could be measured: 1 / initial interval.
    pub(super) initial_rate: f64,
    /// The lowest rate: 1 / max interval.
    pub(super) min_rate: f64,
    /// CUBIC's constant in sends per round per round³ (AWS's 0.4 per s⁴,
    /// in rounds).
    pub(super) cubic: f64,
}

/// What one round saw, counted from attempts sent at the rate in force.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Round {
    /// Its length, in rounds (1.0 for a round of exactly the configured length).
    pub(super) length: f64,
    /// Attempts sent, per round.
    pub(super) sent: f64,
    /// Successes.
    pub(super) accepted: u64,
    /// Throttled outcomes.
    pub(super) throttled: u64,
}

/// Where the rate stands between rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Course {
    /// Sends per round; infinite when not pacing.
    pub(super) rate: f64,
    /// The accepted rate measured at the last cut (per round); zero when
    /// unknown.
    pub(super) peak: f64,
    /// Whether the peak is only a lower bound on what the server accepts:
    /// it was counted while sends went out in bursts.
    pub(super) at_least: bool,
    /// The rate the last cut set, per round.
    pub(super) floor: f64,
    /// Rounds since the last cut.
    pub(super) since_cut: f64,
    /// Whether the last round cut the rate.
    pub(super) settling: bool,
}

/// What a round decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Change {
    /// Nothing to learn: no throttling and no success.
    Keep,
    /// Throttled: the new rate, the peak to climb back to, and whether that
    /// peak is only a lower bound.
    Cut {
        rate: f64,
        peak: f64,
        at_least: bool,
    },
    /// Clean: the new, higher rate.
    Raise(f64),
    /// Clean, and the rate is far above what is sent: stop pacing.
    Off,
}

impl Law {
    /// The change one finished round makes to `course`.
    pub(super) fn decide(&self, course: Course, round: Round) -> Change {
        let length = round.length.max(f64::MIN_POSITIVE);
        if round.throttled > 0 {
            // The round after a cut still sees the server digest what was
            // sent before it: judging the cut needs a round of its own.
            let far_off = (round.accepted as f64 * self.down)
                < course.rate.min(round.sent / length) / self.up;
            if course.settling && round.accepted > 0 && !far_off {
                return Change::Keep;
            }
            return self.cut(course, round, length);
        }
        if !course.rate.is_finite() {
            // Measuring since a throttle, and nothing throttled since.
            return Change::Off;
        }
        if round.accepted == 0 {
            return Change::Keep;
        }
        let next = self.climb(course);
        // Judged against the rate in force, not the one about to be set, and
        // with `up - 1` sends to spare (one at least): a round the rate held back can count fewer
        // than its rate (its first slots may have been taken at the slower
        // rate before a raise, and a count is whole). Taken for a lack of
        // demand, that shortfall would turn pacing off with clients queued.
        let spare = (self.up - 1.0).max(1.0);
        let idle = course.rate * length >= HEADROOM * (round.sent + spare);
        // Off only past the peak: below it, clients queued behind the pacing
        // would all leave at once into a server that just recovered.
        if idle && next > course.peak {
            Change::Off
        } else {
            Change::Raise(next)
        }
    }

    /// A throttled round: the rate is set just under what it got accepted
    /// (see the [module docs](super), point 2).
    fn cut(&self, course: Course, round: Round, length: f64) -> Change {
        let sent = round.sent / length;
        // What was really going out: the rate in force, or less if demand was.
        let going = if course.rate.is_finite() {
            course.rate.min(sent.max(f64::MIN_POSITIVE))
        } else {
            sent
        };
        if round.accepted >= self.threshold {
            return self.measured(course, round.accepted as f64 / length, going);
        }
        let (rate, peak) = if going > 0.0 {
            // An outage: one step below the fastest rate that was going, and
            // no further; every step down is one to climb back once it ends.
            let peak = course.peak.max(going);
            (peak / self.up, peak)
        } else {
            (self.initial_rate, course.peak)
        };
        let rate = rate.max(self.min_rate);
        Change::Cut {
            rate,
            peak: peak.max(rate),
            at_least: false,
        }
    }

    /// A throttled round that counted `accepted` successes per round while
    /// `going` went out: the rate itself if paced within `up`² of it, else
    /// only a lower bound (see the [module docs](super), point 3).
    fn measured(&self, course: Course, accepted: f64, going: f64) -> Change {
        let unpaced = !course.rate.is_finite();
        // Right after a cut from a lower bound, the server's window still
        // holds that round's burst: both rounds counted a share of the same
        // rate, and the larger share is the closer.
        let accepted = if course.settling && course.at_least {
            accepted.max(course.peak)
        } else {
            accepted
        };
        let at_least = unpaced || going > self.up * self.up * accepted;
        // Measuring at full speed, never more than `up` slower than what
        // was going: a server that admitted its whole second in a burst
        // before the round began shows too few successes in it.
        let floor = if unpaced { going / self.up } else { 0.0 };
        let rate = (accepted * self.down).max(floor).max(self.min_rate);
        // A lower bound is kept as counted, not raised to that floor: the
        // next throttled round compares its own count with it.
        let peak = if at_least {
            accepted
        } else {
            accepted.max(rate)
        };
        Change::Cut {
            rate,
            peak,
            at_least,
        }
    }

    /// The rate after a clean round: CUBIC's curve through the peak, at most
    /// [`MAX_PROBE`] a round above it (see the [module docs](super), point 4).
    fn climb(&self, course: Course) -> f64 {
        let rate = course.rate;
        if course.at_least {
            // The peak or more, how much more unknown: slow start, where
            // CUBIC's curve would creep around the peak.
            return rate * self.up;
        }
        let target = if course.peak > 0.0 {
            let t = course.since_cut;
            let drop = (course.peak - course.floor).max(0.0);
            // Scaled to the peak: the same shape at any rate.
            let reach = (drop / course.peak / CUBIC_SCALE).cbrt();
            let scaled = course.peak * (1.0 + CUBIC_SCALE * (t - reach).powi(3));
            // In absolute sends, as CUBIC and AWS do: the same gain for
            // every client, so unequal shares converge.
            let reach = (drop / self.cubic).cbrt();
            let absolute = course.peak + self.cubic * (t - reach).powi(3);
            scaled.max(absolute)
        } else {
            // No peak measured (only outages so far): slow start.
            rate * self.up
        };
        // Below the peak the curve itself is the bound: back to a rate that
        // worked, fast, however far an outage pushed it down.
        let step = if target > course.peak.max(rate) {
            MAX_PROBE.min(self.up)
        } else {
            f64::INFINITY
        };
        target.clamp(rate, rate * step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn law() -> Law {
        Law {
            down: 0.9,
            up: 1.5,
            threshold: 1,
            initial_rate: 2.0,
            min_rate: 1.0 / 900.0,
            cubic: 0.4,
        }
    }

    fn round(sent: f64, accepted: u64, throttled: u64) -> Round {
        Round {
            length: 1.0,
            sent,
            accepted,
            throttled,
        }
    }

    #[test]
    fn a_throttled_round_sets_the_rate_under_what_was_accepted() {
        let unpaced = Course {
            rate: f64::INFINITY,
            ..Course::default()
        };
        let settling = Course {
            rate: 90.0,
            peak: 100.0,
            at_least: false,
            floor: 90.0,
            since_cut: 1.0,
            settling: true,
        };
        assert_eq!(law().decide(settling, round(90.0, 80, 10)), Change::Keep);
        // Unpaced, what was accepted is only a lower bound.
        let change = law().decide(unpaced, round(120.0, 100, 20));
        assert_eq!(
            change,
            Change::Cut {
                rate: 90.0,
                peak: 100.0,
                at_least: true
            }
        );
        // Flooded at 9 times the rate: one step of the up-multiplier.
        let change = law().decide(unpaced, round(900.0, 100, 800));
        assert_eq!(
            change,
            Change::Cut {
                rate: 600.0,
                peak: 100.0,
                at_least: true
            }
        );
    }

    #[test]
    fn a_round_paced_near_the_rate_measures_it_and_one_far_above_a_lower_bound() {
        let paced = |rate: f64| Course {
            rate,
            peak: 100.0,
            floor: 90.0,
            since_cut: 5.0,
            ..Course::default()
        };
        assert_eq!(
            law().decide(paced(150.0), round(150.0, 100, 50)),
            Change::Cut {
                rate: 90.0,
                peak: 100.0,
                at_least: false
            }
        );
        assert_eq!(
            law().decide(paced(1000.0), round(1000.0, 100, 900)),
            Change::Cut {
                rate: 90.0,
                peak: 100.0,
                at_least: true
            }
        );
        // Sent far less than the rate allowed: what was going counts.
        assert!(matches!(
            law().decide(paced(1000.0), round(150.0, 100, 50)),
            Change::Cut {
                at_least: false,
                ..
            }
        ));
    }

    #[test]
    fn right_after_a_cut_from_a_lower_bound_the_larger_count_of_both_rounds_is_kept() {
        let settling = |rate: f64, peak: f64| Course {
            rate,
            peak,
            at_least: true,
            floor: rate,
            since_cut: 1.0,
            settling: true,
        };
        // Paced far above what either round got accepted: still a bound.
        assert_eq!(
            law().decide(settling(600.0, 100.0), round(550.0, 40, 500)),
            Change::Cut {
                rate: 90.0,
                peak: 100.0,
                at_least: true
            }
        );
        // Paced near it: a measurement.
        let Change::Cut {
            rate,
            peak,
            at_least: false,
        } = law().decide(settling(95.0, 63.0), round(97.0, 64, 35))
        else {
            panic!("a far-off settling round cuts to a measured rate");
        };
        assert!((rate - 57.6).abs() < 1e-9 && (peak - 64.0).abs() < 1e-9);
    }

    #[test]
    fn clean_rounds_above_a_lower_bound_climb_by_the_up_multiplier_until_throttled() {
        let law = law();
        let mut course = Course {
            rate: 20.0,
            peak: 20.0,
            at_least: true,
            floor: 20.0,
            since_cut: 0.0,
            settling: false,
        };
        let mut rates = Vec::new();
        for _ in 0..4 {
            course.since_cut += 1.0;
            let Change::Raise(rate) = law.decide(course, round(course.rate, 20, 0)) else {
                panic!("a clean round that sent at the rate raises it");
            };
            course.rate = rate;
            rates.push(rate);
        }
        assert_eq!(rates, [30.0, 45.0, 67.5, 101.25]);
        // The round that crosses the server's rate of 100 measures it.
        let change = law.decide(course, round(101.0, 100, 1));
        assert_eq!(
            change,
            Change::Cut {
                rate: 90.0,
                peak: 100.0,
                at_least: false
            }
        );
    }

    #[test]
    fn a_paced_round_that_halved_its_successes_halves_the_rate() {
        let paced = Course {
            rate: 100.0,
            peak: 100.0,
            at_least: false,
            floor: 90.0,
            since_cut: 3.0,
            settling: false,
        };
        let Change::Cut { rate, .. } = law().decide(paced, round(100.0, 50, 50)) else {
            panic!("a throttled round cuts");
        };
        assert!((rate - 45.0).abs() < 1e-9, "{rate}");
        // Right after a cut, the same round is still cut: it is far off.
        let settling = Course {
            settling: true,
            ..paced
        };
        assert!(matches!(
            law().decide(settling, round(100.0, 50, 50)),
            Change::Cut { .. }
        ));
    }

    #[test]
    fn an_outage_round_backs_off_from_what_was_sent() {
        let paced = Course {
            rate: 300.0,
            peak: 0.0,
            at_least: false,
            floor: 200.0,
            since_cut: 1.0,
            settling: false,
        };
        let change = law().decide(paced, round(150.0, 0, 150));
        assert_eq!(
            change,
            Change::Cut {
                rate: 100.0,
                peak: 150.0,
                at_least: false
            }
        );
    }

    #[test]
    fn clean_rounds_climb_back_to_the_peak_slowly_near_it_then_fast_beyond() {
        let law = law();
        let mut course = Course {
            rate: 90.0,
            peak: 100.0,
            at_least: false,
            floor: 90.0,
            since_cut: 0.0,
            settling: false,
        };
        let mut rates = Vec::new();
        for _ in 0..8 {
            course.since_cut += 1.0;
            let Change::Raise(rate) = law.decide(course, round(course.rate, 50, 0)) else {
                panic!("a clean round that sent at the rate raises it");
            };
            course.rate = rate;
            rates.push(rate);
        }
        // Back near the peak in two rounds, barely above it for one, then
        // faster and faster, never more than 15 % a round above the peak.
        assert!(rates[1] > 99.0 && rates[1] <= 100.0, "{rates:?}");
        assert!(rates[2] < 101.0, "{rates:?}");
        assert!(rates[7] > 170.0, "{rates:?}");
        for pair in rates.windows(2) {
            assert!(pair[1] >= pair[0] && pair[1] <= pair[0] * 1.15 + 1e-9);
        }
    }

    #[test]
    fn a_clean_round_far_below_the_rate_turns_pacing_off() {
        let course = Course {
            rate: 100.0,
            peak: 50.0,
            at_least: false,
            floor: 45.0,
            since_cut: 20.0,
            settling: false,
        };
        assert_eq!(law().decide(course, round(40.0, 40, 0)), Change::Off);
    }

    #[test]
    fn a_round_the_rate_held_back_does_not_turn_pacing_off() {
        // The round that turned pacing off in a flaky run of
        // `a_paced_interval_keeps_its_fraction_of_a_millisecond` (rounds of
        // 10 ms, a store taking 3 a round, 8 workers queued for slots): slow
        // start had just raised 2.7 to 4.05 a round, and two of the round's
        // slots had been taken ahead at 2.7, so it sent 3. Turned off, pacing
        // re-engaged at full speed at the next 429, and the same rounds came
        // round again and again.
        let course = Course {
            rate: 4.049999676000026,
            peak: 3.0,
            at_least: true,
            floor: 2.7,
            since_cut: 2.2,
            settling: false,
        };
        let Change::Raise(rate) = law().decide(course, round(3.0, 3, 0)) else {
            panic!("a round that sent what its rate let through keeps pacing");
        };
        assert!((rate - 4.05 * 1.5).abs() < 1e-5, "{rate}");
        // A round that sent less than half its rate, by a send, says demand
        // fell.
        assert_eq!(law().decide(course, round(1.0, 1, 0)), Change::Off);
        // Less than half, but by less than a whole send: still held back.
        let short = Course {
            rate: 3.5,
            ..course
        };
        assert!(matches!(
            law().decide(short, round(1.0, 1, 0)),
            Change::Raise(_)
        ));
    }

    #[test]
    fn a_round_with_no_success_and_no_throttling_changes_nothing() {
        let course = Course {
            rate: 100.0,
            peak: 50.0,
            at_least: false,
            floor: 45.0,
            since_cut: 2.0,
            settling: false,
        };
        assert_eq!(law().decide(course, round(10.0, 0, 0)), Change::Keep);
    }
}
