//! The word that says which call the loop's thread is in, and the idle
//! handler thread that watches it (see `event_loop/loop_calls/leader.rs`
//! for the threads).
//!
//! A thread that runs the event loop may call a plugin that can block. It
//! lets go of the loop for the call, and one idle handler thread (the
//! watcher) wakes every `WATCH_TICK`: when it finds the same call still
//! running on two ticks in a row and the leader asleep in it, it takes the
//! loop over, so no call that blocks holds up the other connections for
//! more than two ticks (one that computes, for more than five). Like Go's
//! runtime retaking a processor from a thread stuck in a system call, the
//! common case costs one atomic store before and one compare-and-swap
//! after each call, and the watcher's timer while calls happen.

use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU64, Ordering};
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant};

use super::schedstat::{Clock, ThreadClock};
use crate::plugin::call::CallBuffers;

/// How often the watcher looks. A call it sees on two ticks in a row has
/// run at least one tick, and is taken over within two. Debug builds make
/// a first call on a thread take a few milliseconds, and a hand-off sends
/// calls to the pool for a while, so not much shorter than this.
pub const WATCH_TICK: Duration = Duration::from_millis(2);
/// Ticks a call must be seen computing before it is taken over. The guest
/// cannot tell a call that computes from one whose virtual CPU the host has
/// stopped (both "run"), and host stops of a few milliseconds are common
/// in a VM; a call that blocks is taken over after one tick.
const COMPUTING_TICKS: u32 = 4;
// The log, `--doctor` and the docs say "2 ms" and "8 ms".
const _: () = assert!(WATCH_TICK.as_millis() == 2 && COMPUTING_TICKS == 4);
/// Ticks without a new call after which the watcher stops waking.
const QUIET_TICKS: u32 = 100;

/// The low two bits of the call word.
const LEADING: u64 = 0;
const CALLING: u64 = 1;
const EXITED: u64 = 3;

/// Whether an idle thread should watch the loop's calls.
const NOT_NEEDED: u8 = 0;
const WANTED: u8 = 1;
const CLAIMED: u8 = 2;

/// Runs the event loop on a handler thread whose watch found a call stuck.
pub trait TakeOver: Send + Sync {
    /// Lead the loop if `call` is still the one running; return when this
    /// thread lets the loop go in turn (or the loop has ended).
    /// `why` says what the call was doing, for the log.
    fn take_over(&self, call: u64, bufs: &mut CallBuffers, why: &'static str);
}

#[derive(Default)]
pub struct Watch {
    /// Count of calls the loop's thread has begun, shifted left two bits,
    /// with LEADING, CALLING or EXITED in the low bits.
    word: AtomicU64,
    /// The kernel's id of the thread in the call (for `LeaderClock`).
    leader_tid: AtomicI32,
    state: AtomicU8,
    take_over: OnceLock<Weak<dyn TakeOver>>,
}

/// What a watcher does to the pool it belongs to, while its thread waits
/// there for work with the pool's lock held: nothing else of the pool is
/// the watcher's business.
pub trait IdleThread {
    /// Wait for work.
    fn wait(&mut self);
    /// Wait for work at most `tick`: true when the tick passed with none
    /// and the pool is not stopping.
    fn wait_tick(&mut self, tick: Duration) -> bool;
    /// Let go of the pool's lock, have another idle thread watch, run `f`
    /// (this thread leads the loop meanwhile), then take the lock again.
    fn lead(&mut self, f: &mut dyn FnMut());
}

impl Watch {
    /// The leader (kernel thread id `tid`) starts a call; returns the word
    /// that names it.
    pub fn begin_call(&self, tid: i32) -> u64 {
        self.leader_tid.store(tid, Ordering::Relaxed);
        let begun = (self.word.load(Ordering::SeqCst) & !3) + 4 + CALLING;
        self.word.store(begun, Ordering::SeqCst);
        begun
    }

    /// The leader's call `begun` returned: true when it still leads, false
    /// when a watcher claimed the loop meanwhile.
    pub fn end_call(&self, begun: u64) -> bool {
        self.word
            .compare_exchange(
                begun,
                begun - CALLING + LEADING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// A watcher takes the loop from the call `word` names, if that call is
    /// still running (the same compare-and-swap as `end_call`: one wins).
    pub fn claim(&self, word: u64) -> bool {
        word & 3 == CALLING && self.end_call(word)
    }

    /// The loop has ended: no call is taken over any more.
    pub fn exit(&self) {
        self.word.fetch_or(EXITED, Ordering::SeqCst);
    }

    /// Whether no idle thread watches, nor has been asked to.
    pub fn unwatched(&self) -> bool {
        self.state.load(Ordering::SeqCst) == NOT_NEEDED
    }

    /// Ask an idle thread to watch. The pool stores it under its lock, so
    /// a thread about to wait either sees it or is already waiting for the
    /// notify that follows.
    pub fn want_watcher(&self) {
        self.state.store(WANTED, Ordering::SeqCst);
    }

    /// Where the watcher finds the loop when a call is stuck.
    pub fn set_take_over(&self, leader: Weak<dyn TakeOver>) {
        let _ = self.take_over.set(leader);
    }
}

/// A handler thread's view of the watch.
pub struct Watcher {
    claimed: bool,
    late_before: bool,
    seen: u64,
    /// The leader's CPU accounting when `seen` was first seen.
    seen_clock: Option<Clock>,
    /// Ticks the `seen` call has been found computing.
    computing: u32,
    clock: ThreadClock,
    quiet: u32,
}

impl Default for Watcher {
    fn default() -> Watcher {
        Watcher {
            claimed: false,
            late_before: false,
            seen: u64::MAX,
            seen_clock: None,
            computing: 0,
            clock: ThreadClock::default(),
            quiet: 0,
        }
    }
}

impl Watcher {
    /// This thread leaves its wait for a job or for good: another idle
    /// thread takes the watch at its next wait (true when this one held it;
    /// a thread that is leaving notifies one).
    pub fn step_down(&mut self, watch: &Watch) -> bool {
        let held = self.claimed;
        if held {
            self.claimed = false;
            watch.want_watcher();
        }
        held
    }

    /// Park until work is queued (`idle` holds the pool's lock). The
    /// watcher wakes every tick and may run the loop before it returns.
    pub fn idle_wait(&mut self, watch: &Watch, idle: &mut impl IdleThread, bufs: &mut CallBuffers) {
        if !self.claimed
            && watch
                .state
                .compare_exchange(WANTED, CLAIMED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.claimed = true;
            self.seen = u64::MAX;
            self.quiet = 0;
        }
        if !self.claimed {
            idle.wait();
            return;
        }
        let slept_at = Instant::now();
        if !idle.wait_tick(WATCH_TICK) {
            return;
        }
        let word = watch.word.load(Ordering::SeqCst);
        // A late wake may mean this CPU was not ours (in a VM the host
        // stops it for milliseconds now and then): the call was stopped
        // too, so the tick only starts a new observation. Only one in a
        // row: a call computing on this CPU may keep every wake late.
        let late = slept_at.elapsed() >= WATCH_TICK * 3 / 2;
        let trusted = !late || self.late_before;
        self.late_before = late;
        let clock = if word & 3 == CALLING {
            self.clock.read(watch.leader_tid.load(Ordering::Relaxed))
        } else {
            None
        };
        if word != self.seen {
            self.computing = 0;
        }
        let why = if word & 3 == CALLING && word == self.seen && trusted {
            match what_the_leader_did(self.seen_clock, clock) {
                Leader::Blocked => Some("blocked for over 2 ms"),
                Leader::Computing => {
                    self.computing += 1;
                    (self.computing >= COMPUTING_TICKS).then_some("computed for over 8 ms")
                }
                // Another process has its CPU: a new leader would wait
                // for one as well.
                Leader::WaitingForACpu => None,
            }
        } else {
            None
        };
        if let Some(why) = why {
            // Lead the loop, and let another idle thread watch our calls.
            let Some(leader) = watch.take_over.get().and_then(Weak::upgrade) else {
                return;
            };
            self.claimed = false;
            self.seen = u64::MAX;
            idle.lead(&mut || leader.take_over(word, bufs, why));
            return;
        }
        if word == self.seen && word & 3 != CALLING {
            self.quiet += 1;
            if self.quiet >= QUIET_TICKS {
                // Nothing called on the loop for a while: stop the timer.
                // The next call asks for a watcher again.
                self.claimed = false;
                watch.state.store(NOT_NEEDED, Ordering::SeqCst);
            }
        } else {
            self.quiet = 0;
        }
        // The next tick judges the time since this one.
        self.seen_clock = clock;
        self.seen = word;
    }
}

/// What the leader did between two readings of its clock.
#[derive(Debug, PartialEq, Eq)]
enum Leader {
    /// Neither ran nor waited for a CPU most of the time: asleep in the
    /// call (I/O, a lock, `time.sleep`). Also the verdict without schedstat
    /// (an older kernel), so every long call is still taken over.
    Blocked,
    Computing,
    /// Runnable but off the CPU most of the time: another process has it
    /// (with two workers, one shares a CPU with whatever else runs there).
    WaitingForACpu,
}

fn what_the_leader_did(before: Option<Clock>, now: Option<Clock>) -> Leader {
    let (Some(b), Some(n)) = (before, now) else {
        return Leader::Blocked;
    };
    let ran = n.ran.saturating_sub(b.ran);
    let waited = n.waited.saturating_sub(b.waited);
    if ran + waited < WATCH_TICK.as_nanos() as u64 / 4 {
        Leader::Blocked
    } else if waited > ran {
        Leader::WaitingForACpu
    } else {
        Leader::Computing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_takes_only_the_call_still_running_and_its_caller_learns_it_lost() {
        let watch = Watch::default();
        let first = watch.begin_call(1);
        assert!(watch.end_call(first), "no watcher: the caller still leads");
        assert!(!watch.claim(first), "that call has ended");
        let second = watch.begin_call(1);
        assert!(
            !watch.claim(first),
            "an earlier call's word names nothing now"
        );
        assert!(watch.claim(second));
        assert!(!watch.claim(second), "only one watcher takes it");
        assert!(!watch.end_call(second), "the caller lost the loop");
    }

    #[test]
    fn the_leaders_clock_tells_blocked_from_computing_from_kept_off_its_cpu() {
        let tick = WATCH_TICK.as_nanos() as u64;
        let at = |ran, waited| Some(Clock { ran, waited });
        let before = at(1_000, 1_000);
        assert_eq!(
            what_the_leader_did(before, at(1_000, 1_000)),
            Leader::Blocked
        );
        assert_eq!(
            what_the_leader_did(before, at(1_000 + tick, 1_000 + tick / 10)),
            Leader::Computing
        );
        assert_eq!(
            what_the_leader_did(before, at(1_000 + tick / 10, 1_000 + tick)),
            Leader::WaitingForACpu
        );
        assert_eq!(what_the_leader_did(None, at(0, tick)), Leader::Blocked);
    }

    #[test]
    fn nothing_is_taken_over_once_the_loop_has_ended() {
        let watch = Watch::default();
        let call = watch.begin_call(1);
        watch.exit();
        assert!(!watch.claim(call));
        assert!(!watch.claim(watch.word.load(Ordering::SeqCst)));
    }
}
