//! Every connection's deadline, and when the loop next looks for those
//! past due.
//!
//! A sweep looks at every connection, so it cannot run on every pass; but
//! run only every 250 ms it cut everything that fell due in that window at
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
//!
//! The deadlines live here, eight bytes a connection in one array indexed
//! by the connection's key, not in the connections (a few hundred bytes
//! each): a sweep reads 8 KiB for 1,000 connections, 80 KiB for 10,000,
//! and touches only the connections it finds due.
//!
//! What a sweep finds due is not all handled at once either: each is a 408
//! or a close, a few system calls and the client's side of loopback TCP,
//! 8-31 us here (16 on average, timed in the loop), and the half-dozen that
//! fall due between two sweeps under a thousand slow clients held the loop
//! 64-255 us a sweep. The loop takes them from a queue one a pass, between
//! the other connections' events.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The steady cadence of the periodic pass.
pub const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// The least time between two sweeps.
const MIN_GAP: Duration = Duration::from_millis(5);
/// Added to the gap per open connection: 10,000 connections are swept at
/// most every 10 ms.
const GAP_PER_CONN: Duration = Duration::from_micros(1);
/// No deadline: never at or before any time a sweep is made.
const NONE: u64 = u64::MAX;
/// Found due by a sweep and queued, not yet handled; setting a deadline
/// (or clearing it, as a close does) takes a connection out of the queue.
const QUEUED: u64 = u64::MAX - 1;
/// The latest deadline stored as itself.
const LATEST: u64 = u64::MAX - 2;

pub struct SweepClock {
    /// Deadlines as nanoseconds since `base`, by connection key; `NONE`
    /// for a connection without one, or a key not in use; `QUEUED` for
    /// one in `due`.
    at: Vec<u64>,
    /// Keys found past their deadline, oldest first.
    due: VecDeque<usize>,
    base: Instant,
    /// No deadline falls before this (when `Some`).
    earliest: Option<Instant>,
    last_sweep: Instant,
    /// The next periodic pass.
    next_housekeeping: Instant,
}

impl SweepClock {
    pub fn new(now: Instant) -> SweepClock {
        SweepClock {
            at: Vec::new(),
            due: VecDeque::new(),
            base: now,
            earliest: None,
            last_sweep: now,
            next_housekeeping: now + HOUSEKEEPING,
        }
    }

    /// Connection `key` times out at `deadline` (`None`: it does not).
    #[inline]
    pub fn set(&mut self, key: usize, deadline: Option<Instant>) {
        if key >= self.at.len() {
            if deadline.is_none() {
                return;
            }
            self.at.resize(key + 1, NONE);
        }
        self.at[key] = deadline.map_or(NONE, |d| self.ticks(d));
        self.note(deadline);
    }

    /// Connection `key`'s deadline (for one queued as due, the sweep that
    /// found it so).
    pub fn get(&self, key: usize) -> Option<Instant> {
        match self.at.get(key) {
            Some(&QUEUED) => Some(self.last_sweep),
            Some(&t) if t <= LATEST => Some(self.base + Duration::from_nanos(t)),
            _ => None,
        }
    }

    fn ticks(&self, at: Instant) -> u64 {
        // A deadline is never before the clock began; one that were would
        // be due at once, which is what 0 says.
        (at.saturating_duration_since(self.base).as_nanos() as u64).min(LATEST)
    }

    #[inline]
    fn note(&mut self, deadline: Option<Instant>) {
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

    /// Sweep at `now`: the keys whose deadline has passed are queued for
    /// `next_due`; the earliest of the others is kept, with those set from
    /// here on.
    pub fn sweep(&mut self, now: Instant) {
        self.last_sweep = now;
        self.earliest = None;
        if now >= self.next_housekeeping {
            self.next_housekeeping = now + HOUSEKEEPING;
        }
        let due = self.ticks(now);
        let mut left = NONE;
        for (key, t) in self.at.iter_mut().enumerate() {
            if *t <= due {
                self.due.push_back(key);
                *t = QUEUED;
            } else {
                left = left.min(*t);
            }
        }
        if left <= LATEST {
            self.note(Some(self.base + Duration::from_nanos(left)));
        }
    }

    /// Whether connections found due wait to be handled.
    pub fn has_due(&self) -> bool {
        !self.due.is_empty()
    }

    /// The next connection found due whose deadline has not been set since
    /// (by progress, or a close and a new connection under its key). What
    /// is done with it sets its next deadline.
    pub fn next_due(&mut self) -> Option<usize> {
        while let Some(key) = self.due.pop_front() {
            if self.at.get(key) == Some(&QUEUED) {
                self.at[key] = NONE;
                return Some(key);
            }
        }
        None
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
        clock.set(0, Some(t0 + Duration::from_millis(20)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(20));
        // A later one does not move it; an earlier one does.
        clock.set(1, Some(t0 + Duration::from_millis(90)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(20));
        clock.set(2, Some(t0 + Duration::from_millis(12)));
        assert_eq!(clock.next(10), t0 + Duration::from_millis(12));
        // Past the periodic pass, the periodic pass comes first.
        let mut far = SweepClock::new(t0);
        far.set(0, Some(t0 + Duration::from_secs(5)));
        assert_eq!(far.next(10), t0 + HOUSEKEEPING);
    }

    #[test]
    fn a_sweep_takes_what_is_due_and_keeps_the_earliest_of_the_rest() {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(t0);
        let ms = |n| t0 + Duration::from_millis(n);
        clock.set(0, Some(ms(10)));
        clock.set(3, Some(ms(40)));
        clock.set(5, Some(ms(20)));
        clock.set(7, Some(ms(30)));
        // A deadline taken back is not swept.
        clock.set(7, None);
        assert_eq!(clock.get(7), None);
        assert_eq!(clock.get(3), Some(ms(40)));
        clock.sweep(ms(20));
        assert_eq!(drain(&mut clock), [0, 5]);
        // Those are cleared; the earliest left is 40 ms, a gap on.
        assert_eq!((clock.get(0), clock.get(5)), (None, None));
        assert_eq!(clock.next(4), ms(40));
        clock.sweep(ms(39));
        assert!(!clock.has_due());
        clock.sweep(ms(45));
        assert_eq!(drain(&mut clock), [3]);
        // Nothing left: the periodic pass alone.
        assert_eq!(clock.next(4), t0 + HOUSEKEEPING);
    }

    #[test]
    fn a_queued_connection_that_moves_on_before_its_turn_is_left_alone() {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(t0);
        let ms = |n| t0 + Duration::from_millis(n);
        for key in 0..4 {
            clock.set(key, Some(ms(10)));
        }
        clock.sweep(ms(10));
        assert!(clock.has_due());
        // Key 1 made progress (a new deadline), key 2 was closed and its
        // key reused by a connection without a deadline: neither is due.
        assert_eq!(clock.get(1), Some(ms(10)));
        clock.set(1, Some(ms(5_000)));
        clock.set(2, None);
        // Nor is one swept again while it waits its turn.
        clock.sweep(ms(20));
        assert_eq!(drain(&mut clock), [0, 3]);
        assert_eq!(clock.get(1), Some(ms(5_000)));
    }

    fn drain(clock: &mut SweepClock) -> Vec<usize> {
        std::iter::from_fn(|| clock.next_due()).collect()
    }

    #[test]
    fn sweeps_keep_a_gap_that_grows_with_the_connections() {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(t0);
        let now = t0 + Duration::from_millis(100);
        clock.sweep(now);
        // Something already due waits out the gap: 5 ms for a few
        // connections, 10 ms for 10,000.
        clock.set(0, Some(now));
        assert_eq!(clock.next(8), now + MIN_GAP);
        assert_eq!(clock.next(10_000), now + Duration::from_millis(10));
        // A sweep that left nothing: back to the periodic pass alone.
        let later = now + Duration::from_millis(10);
        clock.sweep(later);
        assert_eq!(drain(&mut clock), [0]);
        assert_eq!(clock.next(8), t0 + HOUSEKEEPING);
        // Deadlines set after the sweep are kept with those it left.
        clock.set(1, Some(later + Duration::from_millis(40)));
        clock.sweep(later);
        clock.set(2, Some(later + Duration::from_millis(30)));
        assert_eq!(clock.next(8), later + Duration::from_millis(30));
        // The periodic pass moves on once passed.
        assert!(clock.housekeeping_due(t0 + HOUSEKEEPING));
        clock.sweep(t0 + HOUSEKEEPING);
        assert_eq!(drain(&mut clock), [1, 2]);
        assert!(!clock.housekeeping_due(t0 + HOUSEKEEPING));
        assert_eq!(clock.next(8), t0 + HOUSEKEEPING + HOUSEKEEPING);
    }
}
