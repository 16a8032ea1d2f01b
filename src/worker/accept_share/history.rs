//! This worker's connection count over time: what it held at the moment a
//! sibling last published, and how many of those have left since.
//!
//! A sibling's published count is as old as its last publish: it learns that
//! a client closed only when its own loop next runs. The acceptor estimates
//! what the sibling has not yet seen from its own clients: the share of its
//! own that has left since that moment. Its own are those it held then and
//! those that came after but before the last one left: a burst's
//! connections often reach their workers a little apart, and a sibling's
//! moment can fall before this worker received any of the same burst,
//! while the connections of a new burst, all come after the last
//! departure, must not dilute the share (see `AcceptShare::sibling_load`).

/// Changes remembered. A sibling silent for longer than this many changes
/// of this worker is judged from the oldest one kept.
const KEPT: usize = 1024;

#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Change {
    at_ns: u64,
    /// The count right after the change.
    count: u64,
    /// Departures (closes, hang-ups) up to and including this change.
    departed: u64,
    /// Arrivals likewise.
    arrived: u64,
}

pub struct History {
    ring: Box<[Change]>,
    /// Where the next change goes; changes are in time order from here on.
    next: usize,
    len: usize,
    departed: u64,
    arrived: u64,
    /// Arrivals up to the last departure.
    arrived_before_departure: u64,
}

impl History {
    pub fn new() -> History {
        History {
            ring: vec![Change::default(); KEPT].into_boxed_slice(),
            next: 0,
            len: 0,
            departed: 0,
            arrived: 0,
            arrived_before_departure: 0,
        }
    }

    /// The count changed to `count` at `at_ns`: a connection left
    /// (`departed`: a close, or its client hung up) or came.
    pub fn record(&mut self, at_ns: u64, count: u64, departed: bool) {
        if departed {
            self.departed += 1;
            self.arrived_before_departure = self.arrived;
        } else {
            self.arrived += 1;
        }
        self.ring[self.next] = Change {
            at_ns,
            count,
            departed: self.departed,
            arrived: self.arrived,
        };
        self.next = (self.next + 1) % KEPT;
        self.len = (self.len + 1).min(KEPT);
    }

    /// The `i`-th change kept, oldest first.
    fn nth(&self, i: usize) -> Change {
        self.ring[(self.next + KEPT - self.len + i) % KEPT]
    }

    /// Since `at_ns`: the connections this worker held then or received
    /// before the last departure, and how many left.
    pub fn since(&self, at_ns: u64) -> (u64, u64) {
        // The last change at or before `at_ns`: changes are in time order.
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.nth(mid).at_ns <= at_ns {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let then = if lo > 0 {
            self.nth(lo - 1)
        } else if self.len == KEPT {
            // Older than all kept: the oldest is the nearest known.
            self.nth(0)
        } else {
            // Before the first change: nothing held, nothing departed.
            Change::default()
        };
        let came = self.arrived_before_departure.saturating_sub(then.arrived);
        (then.count + came, self.departed - then.departed)
    }
}

/// Of `count` connections a sibling published, those estimated gone since:
/// the share of this worker's own that left since the same moment (`held`,
/// `left`: `History::since`). With none held, nothing is known: none.
pub fn unseen(count: u64, (held, left): (u64, u64)) -> u64 {
    if held == 0 {
        return 0;
    }
    count * left.min(held) / held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_at_a_moment_and_the_departures_since() {
        let mut h = History::new();
        assert_eq!(h.since(5), (0, 0), "nothing yet");
        for (t, c) in (10..=13).zip(1..) {
            h.record(t, c, false); // four arrivals: 1..=4 at 10..=13
        }
        h.record(20, 3, true);
        h.record(21, 2, true);
        h.record(22, 3, false);
        // Held none at 9, and the four that came before the last departure.
        assert_eq!(h.since(9), (4, 2));
        assert_eq!(h.since(11), (4, 2));
        assert_eq!(h.since(13), (4, 2));
        assert_eq!(h.since(20), (3, 1));
        // The arrival at 22 came after the last departure: not counted.
        assert_eq!(h.since(21), (2, 0));
        assert_eq!(h.since(30), (3, 0));
    }

    #[test]
    fn a_new_bursts_arrivals_do_not_dilute_the_share_that_left() {
        let mut h = History::new();
        for t in 1..=8 {
            h.record(10 + t, t, false); // a burst's 8 arrive after the moment 5
        }
        for t in 1..=8 {
            h.record(30 + t, 8 - t, true); // and all leave
        }
        for t in 1..=5 {
            h.record(50 + t, t, false); // the next burst
        }
        assert_eq!(h.since(5), (8, 8));
        assert_eq!(unseen(8, h.since(5)), 8);
    }

    #[test]
    fn a_moment_older_than_all_kept_is_judged_from_the_oldest() {
        let mut h = History::new();
        for i in 0..(KEPT as u64 + 10) {
            h.record(100 + i, 1 + i % 2, i % 2 == 1);
        }
        let (held, left) = h.since(50);
        let came = h.arrived_before_departure - h.nth(0).arrived;
        assert_eq!(held, h.nth(0).count + came);
        assert_eq!(left, h.departed - h.nth(0).departed);
    }

    #[test]
    fn a_sibling_is_estimated_to_have_lost_the_share_this_worker_lost() {
        // All 16 of ours left: all 16 of theirs are taken as gone.
        assert_eq!(unseen(16, (16, 16)), 16);
        // Half of ours: half of theirs.
        assert_eq!(unseen(24, (8, 4)), 12);
        // More left than were held (some came and went): at most all.
        assert_eq!(unseen(10, (4, 9)), 10);
        // We held nothing then: no estimate.
        assert_eq!(unseen(10, (0, 3)), 0);
    }
}
