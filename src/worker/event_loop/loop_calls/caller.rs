//! What a thread leading the event loop uses to call the plugin itself,
//! without holding the loop: the call word around each call, and the
//! pool's narrow loop-calls API for everything else.

use std::sync::Weak;

use crate::plugin::call::{CallBuffers, Completion, Job};
use crate::worker::accept_share::ProgressMark;
use crate::worker::pool::LoopSide;
use crate::worker::pool::watch::TakeOver;

#[derive(Clone)]
pub struct LoopCaller {
    pool: LoopSide,
    /// Tells the siblings the loop moves on after each call (accept sharing).
    progress: Option<ProgressMark>,
}

impl LoopCaller {
    pub fn new(pool: LoopSide, progress: Option<ProgressMark>) -> LoopCaller {
        LoopCaller { pool, progress }
    }

    /// Prepare the calling thread to call the plugin: a thread index of its
    /// own and the plugin's thread-start hook (whose code is the error).
    pub fn start_thread(&self) -> Result<CallBuffers, i32> {
        self.pool.start_calling_thread()
    }

    /// The thread that led the loop first, once it has lost it: an
    /// ordinary handler thread from now on (until the pool stops or has
    /// one thread too many), then its thread-stop hook.
    pub fn serve_as_handler(&self, bufs: CallBuffers) {
        self.pool.serve_as_handler(bufs);
    }

    /// Where the watcher finds the loop when a call is stuck.
    pub fn set_take_over(&self, leader: Weak<dyn TakeOver>) {
        self.pool.watch().set_take_over(leader);
    }

    /// Call the plugin for `job` on this thread and push its completion.
    /// False when another thread took the loop over during the call: the
    /// caller no longer leads and hands the rest back with `give_back`.
    pub fn call(&self, job: Job, bufs: &mut CallBuffers, done: &mut Vec<Completion>) -> bool {
        let watch = self.pool.watch();
        let begun = watch.begin_call(bufs.tid);
        if watch.unwatched() {
            self.pool.want_watcher();
        }
        let outcome = self.pool.call(&job, bufs);
        done.push(Completion { job, outcome });
        if let Some(progress) = &self.progress {
            progress.note();
        }
        watch.end_call(begun)
    }

    /// Claim the loop from the call `word` names; false when that call has
    /// already ended (its thread still leads).
    pub fn claim(&self, word: u64) -> bool {
        let claimed = self.pool.watch().claim(word);
        if claimed {
            self.pool.count_handoff();
        }
        claimed
    }

    /// The loop has ended: no call is taken over any more.
    pub fn mark_exited(&self) {
        self.pool.watch().exit();
    }

    /// After losing the loop mid-batch: queue the calls not yet made and
    /// post the completions for the new leader.
    pub fn give_back(&self, rest: impl Iterator<Item = Job>, done: &mut Vec<Completion>) {
        self.pool.give_back(rest, done);
    }

    /// A handler thread leads the loop: not counted as a handler meanwhile.
    /// The old leader takes its place when its call returns; no thread is
    /// started for it (see `Pool::keep_one_handler`).
    pub fn enter_leading(&self) {
        self.pool.enter_leading();
    }

    pub fn leave_leading(&self) {
        self.pool.leave_leading();
    }
}
