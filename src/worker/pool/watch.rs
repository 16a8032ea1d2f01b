//! The pool's side of loop calls (see `worker/leader.rs`): the word that
//! says which call the loop's thread is in, and the idle handler thread that
//! watches it.
//!
//! A thread that runs the event loop may call a plugin that can block. It
//! lets go of the loop for the call, and one idle handler thread (the
//! watcher) wakes every `WATCH_TICK`: when it finds the same call still
//! running on two ticks in a row, it takes the loop over, so no call holds
//! up the other connections for more than two ticks. Like Go's runtime
//! retaking a processor from a thread stuck in a system call, the common
//! case costs one atomic store before and one compare-and-swap after each
//! call, and the watcher's timer while calls happen.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use super::{
    CallBuffers, Completion, Job, Queue, Shared, announce, handler_loop, lock, serve,
    thread_start_hook,
};
use crate::worker::exchange::{Outcome, Sink};

/// How often the watcher looks. A call it sees on two ticks in a row has
/// run at least one tick, and is taken over within two. Debug builds make
/// a first call on a thread take a few milliseconds, and a hand-off sends
/// calls to the pool for a while, so not much shorter than this.
pub const WATCH_TICK: Duration = Duration::from_millis(2);
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
    fn take_over(&self, call: u64, bufs: &mut CallBuffers);
}

#[derive(Default)]
pub(super) struct Watch {
    /// Count of calls the loop's thread has begun, shifted left two bits,
    /// with LEADING, CALLING or EXITED in the low bits.
    word: AtomicU64,
    state: AtomicU8,
    take_over: OnceLock<Weak<dyn TakeOver>>,
}

/// A handler thread's view of the watch.
pub(super) struct Watcher {
    claimed: bool,
    seen: u64,
    quiet: u32,
}

impl Watcher {
    pub(super) fn new() -> Watcher {
        Watcher {
            claimed: false,
            seen: u64::MAX,
            quiet: 0,
        }
    }

    /// This thread leaves its wait for a job or for good: another idle
    /// thread takes the watch at its next wait (true when this one held it;
    /// a thread that is leaving notifies one).
    pub(super) fn step_down(&mut self, shared: &Shared) -> bool {
        let held = self.claimed;
        if held {
            self.claimed = false;
            shared.watch.state.store(WANTED, Ordering::SeqCst);
        }
        held
    }

    /// Park until work is queued (the caller holds the queue lock). The
    /// watcher wakes every tick and may run the loop before it returns.
    pub(super) fn idle_wait<'a>(
        &mut self,
        shared: &'a Shared,
        mut q: MutexGuard<'a, Queue>,
        bufs: &mut CallBuffers,
    ) -> MutexGuard<'a, Queue> {
        let watch = &shared.watch;
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
        q.idle += 1;
        if !self.claimed {
            q = shared.work_ready.wait(q).unwrap_or_else(|e| e.into_inner());
            q.idle -= 1;
            return q;
        }
        let (mut q, waited) = shared
            .work_ready
            .wait_timeout(q, WATCH_TICK)
            .unwrap_or_else(|e| e.into_inner());
        q.idle -= 1;
        if !waited.timed_out() || q.stopping {
            return q;
        }
        let word = watch.word.load(Ordering::SeqCst);
        if word & 3 == CALLING && word == self.seen {
            // The same call on two ticks: lead the loop, and let another
            // idle thread watch our calls meanwhile.
            let Some(leader) = watch.take_over.get().and_then(Weak::upgrade) else {
                return q;
            };
            drop(q);
            self.claimed = false;
            self.seen = u64::MAX;
            want_watcher(shared);
            leader.take_over(word, bufs);
            return lock(&shared.queue);
        }
        if word == self.seen {
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
        self.seen = word;
        q
    }
}

/// Ask an idle thread to watch. Stored under the queue lock, so a thread
/// about to wait either sees it or is already waiting for the notify.
fn want_watcher(shared: &Shared) {
    {
        let _q = lock(&shared.queue);
        shared.watch.state.store(WANTED, Ordering::SeqCst);
    }
    shared.work_ready.notify_one();
}

/// What a thread leading the event loop uses to call the plugin itself,
/// without holding the loop.
#[derive(Clone)]
pub struct LoopCaller {
    shared: Arc<Shared>,
}

impl LoopCaller {
    pub(super) fn new(shared: Arc<Shared>) -> LoopCaller {
        LoopCaller { shared }
    }

    /// Prepare the calling thread to call the plugin: a thread index of its
    /// own and the plugin's thread-start hook (whose code is the error).
    pub fn start_thread(&self) -> Result<CallBuffers, i32> {
        let index = lock(&self.shared.queue).claim_index();
        thread_start_hook(&self.shared.calls, index)?;
        Ok(CallBuffers::new(index))
    }

    /// The thread that led the loop first, once it has lost it: an
    /// ordinary handler thread from now on (until the pool stops or has
    /// one thread too many), then its thread-stop hook.
    pub fn serve_as_handler(&self, bufs: CallBuffers) {
        lock(&self.shared.queue).live += 1;
        handler_loop(&self.shared, bufs);
    }

    /// Where the watcher finds the loop when a call is stuck.
    pub fn set_take_over(&self, leader: Weak<dyn TakeOver>) {
        let _ = self.shared.watch.take_over.set(leader);
    }

    /// Call the plugin for `job` on this thread and push its completion.
    /// False when another thread took the loop over during the call: the
    /// caller no longer leads and hands the rest back with `give_back`.
    pub fn call(&self, job: Job, bufs: &mut CallBuffers, done: &mut Vec<Completion>) -> bool {
        let shared = &self.shared;
        let watch = &shared.watch;
        let begun = (watch.word.load(Ordering::SeqCst) & !3) + 4 + CALLING;
        watch.word.store(begun, Ordering::SeqCst);
        if watch.state.load(Ordering::SeqCst) == NOT_NEEDED {
            want_watcher(shared);
        }
        let started = std::time::Instant::now();
        let outcome: Outcome = serve(
            shared,
            &job,
            bufs.index,
            &mut bufs.headers,
            &mut bufs.scratch,
            Sink::Wait(shared.write_timeout),
        );
        let stats = &shared.stats;
        stats
            .service_ns
            .fetch_add(super::duration_ns(started.elapsed()), Ordering::Relaxed);
        stats.completed.fetch_add(1, Ordering::Relaxed);
        stats.loop_calls.fetch_add(1, Ordering::Relaxed);
        done.push(Completion { job, outcome });
        watch
            .word
            .compare_exchange(
                begun,
                begun - CALLING + LEADING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Claim the loop from the call `word` names; false when that call has
    /// already ended (its thread still leads).
    pub fn claim(&self, word: u64) -> bool {
        let claimed = self
            .shared
            .watch
            .word
            .compare_exchange(
                word,
                word - CALLING + LEADING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok();
        if claimed {
            self.shared.stats.handoffs.fetch_add(1, Ordering::Relaxed);
        }
        claimed
    }

    /// The loop has ended: no call is taken over any more.
    pub fn mark_exited(&self) {
        self.shared.watch.word.fetch_or(EXITED, Ordering::SeqCst);
    }

    /// After losing the loop mid-batch: queue the calls not yet made (they
    /// were admitted already, so past the queue's bound) and post the
    /// completions for the new leader.
    pub fn give_back(&self, rest: impl Iterator<Item = Job>, done: &mut Vec<Completion>) {
        let mut woken = 0;
        {
            let mut q = lock(&self.shared.queue);
            for job in rest {
                q.jobs.push_back(job);
                woken += 1;
            }
        }
        for _ in 0..woken.min(4) {
            self.shared.work_ready.notify_one();
        }
        lock(&self.shared.done).append(done);
        announce(&self.shared);
    }

    /// A handler thread leads the loop: not counted as a handler meanwhile,
    /// so the pool starts a replacement at the loop's next resize check.
    pub fn enter_leading(&self) {
        lock(&self.shared.queue).live -= 1;
    }

    pub fn leave_leading(&self) {
        lock(&self.shared.queue).live += 1;
    }
}
