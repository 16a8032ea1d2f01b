//! When the loop next looks for connections past their deadline.
//!
//! A sweep walks every connection, so it cannot run on every pass; but run
//! only every 250 ms it cut everything that fell due in that window at
//! once. A thousand slow bodies, each a byte a second at its own phase, are
//! cut about 200 a second: on 250 ms sweeps that was 50 refusals in one
//! burst, then 50 reconnections sending their heads at once, and the
//! ordinary clients beside them saw a p99 about twice that of sweeps a few
//! milliseconds apart (the same attack, alternated by hand).
//!
//! So the clock keeps a lower bound of the earliest deadline, lowered
//! whenever a deadline is set (a compare, no clock read) and recomputed by
//! each sweep, and sweeps when it passes: deadlines fire close to when they
//! fall due, and a loop whose deadlines are all far off does not sweep at
//! all. Two sweeps are at least `min_gap` apart, which grows with the
//! connections a sweep walks, so sweeping stays a small share of the loop.
//! The periodic pass (every `HOUSEKEEPING`) stays, for the work that wants
//! a steady cadence, and sweeps too.

use std::time::{Duration, Instant};

/// The steady cadence of the periodic pass.
pub const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// The least time between two sweeps.
const MIN_GAP: Duration = Duration::from_millis(5);
/// Added to the gap per open connection: 10,000 connections are swept at
/// most every 10 ms.
const GAP_PER_CONN: Duration = Duration::from_micros(1);

pub struct SweepClock {
    /// No deadline falls before this (when `Some`).
    earliest: Option<Instant>,
    last_sweep: Instant,
    /// The next periodic pass.
    next_housekeeping: Instant,
}

impl SweepClock {
    pub fn new(now: Instant) -> SweepClock {
        SweepClock {
            earliest: None,
            last_sweep: now,
            next_housekeeping: now + HOUSEKEEPING,
        }
    }

    /// A connection's deadline was set.
    #[inline]
    pub fn note(&mut self, deadline: Option<Instant>) {
        if let Some(d) = deadline
            && self.earliest.is_none_or(|e| d < e)
        {
            self.earliest = Some(d);
        }
    }

    /// When the loop should sweep next, with `conns` connections open.
    pub fn next(&self, conns: usize) -> Instant {
        let Some(earliest) = self.earliest else {
            return self.next_housekeeping;
        };
        let gap = MIN_GAP.max(GAP_PER_CONN * conns as u32);
        earliest
            .max(self.last_sweep + gap)
            .min(self.next_housekeeping)
    }

    /// Whether this sweep is also the periodic pass.
    pub fn housekeeping_due(&self, now: Instant) -> bool {
        now >= self.next_housekeeping
    }

    /// A sweep at `now` began; deadlines noted from here on (including
    /// those the sweep itself sets) are kept. `left`, the earliest deadline
    /// the sweep saw and did not expire, is added with `swept`.
    pub fn begin(&mut self, now: Instant) {
        self.last_sweep = now;
        self.earliest = None;
        if now >= self.next_housekeeping {
            self.next_housekeeping = now + HOUSEKEEPING;
        }
    }

    /// The sweep found `left` as the earliest deadline it did not expire.
    pub fn swept(&mut self, left: Option<Instant>) {
        self.note(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_swept_when_due_not_at_the_next_periodic_pass() {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(t0);
        // Nothing due: only the periodic pass.
        assert_eq!(clock.next(10), t0 + HOUSEKEEPING);
        // A deadline 20 ms on is swept then, not at 250 ms.
        clock.note(Some(t0 + Duration::from_millis(20)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(20));
        // A later one does not move it; an earlier one does.
        clock.note(Some(t0 + Duration::from_millis(90)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(20));
        clock.note(Some(t0 + Duration::from_millis(12)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(12));
        // Past the periodic pass, the periodic pass comes first.
        let mut far = SweepClock::new(t0);
        far.note(Some(t0 + Duration::from_secs(5)));
        assert_eq!(far.next(10), t0 + HOUSEKEEPING);
    }

    #[test]
    fn sweeps_keep_a_gap_that_grows_with_the_connections() {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(t0);
        let now = t0 + Duration::from_millis(100);
        clock.begin(now);
        // Something already due waits out the gap: 5 ms for a few
        // connections, 10 ms for 10,000.
        clock.swept(Some(now));
        assert_eq!(clock.next(8), now + MIN_GAP);
        assert_eq!(clock.next(10_000), now + Duration::from_millis(10));
        // A sweep that left nothing: back to the periodic pass alone.
        let later = now + Duration::from_millis(10);
        clock.begin(later);
        clock.swept(None);
        assert_eq!(clock.next(8), t0 + HOUSEKEEPING);
        // Deadlines set during the sweep are kept.
        clock.begin(later);
        clock.note(Some(later + Duration::from_millis(30)));
        clock.swept(Some(later + Duration::from_millis(40)));
        assert_eq!(clock.next(8), later + Duration::from_millis(30));
        // The periodic pass moves on once passed.
        assert!(clock.housekeeping_due(t0 + HOUSEKEEPING));
        clock.begin(t0 + HOUSEKEEPING);
        assert!(!clock.housekeeping_due(t0 + HOUSEKEEPING));
        assert_eq!(clock.next(8), t0 + HOUSEKEEPING + HOUSEKEEPING);
    }
}
