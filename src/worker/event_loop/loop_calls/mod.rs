//! Loop calls: the thread that leads the event loop calls the plugin
//! itself (on a worker with CPUs to spare, while that serves more than the
//! pool alone), and the loop moves to another thread when a call runs long.
//!
//! A WSGI app behind a loop that hands every request to a handler thread
//! pays a thread switch per request or batch (0.64 context switches per
//! request at 8 connections on one CPU; bjoern, which calls the app on its
//! only thread, 0.11). Calling the app on the loop's thread removes the
//! switch, but an app may block (a database, `time.sleep`) and would hold
//! up every other connection. So:
//!
//! - `leader.rs`: the loop lives in a mutex, and the thread that holds it
//!   leads: it runs passes, and between passes it lets go of the loop and
//!   makes the calls the pass queued. The loop starts on a thread of its
//!   own (`m0-loop`), which becomes an ordinary handler thread once it has
//!   lost the loop; the worker's main thread only waits for the end.
//! - `pool/watch.rs`: an idle handler thread watches those calls; when
//!   one blocks for a tick (or computes for four), it claims the call word
//!   and leads the loop from then on, and the old leader hands what it has
//!   left to the pool when its call returns. The watcher is the pool's
//!   (its idle threads do the watching), so this folder uses it, and the
//!   pool never names the loop.
//! - `caller.rs`: what the leading thread uses to make the calls, built on
//!   the pool's narrow loop-calls API (`pool::LoopSide`).
//! - here: when a worker makes loop calls at all (`decide`), and the event
//!   loop's bookkeeping of them (`LoopCalls`). On a worker with CPUs to
//!   spare the adaptive controller also suspends them while the pool alone
//!   serves more (`pool/adaptive/mode.rs`). A request becomes a loop
//!   call only while no call is in flight on a handler thread, so loop
//!   calls never compete with the pool for the plugin's lock, and a plugin
//!   whose calls stay short is served by one thread. When a call runs long
//!   enough for a handler thread to take the loop over, requests go to the
//!   pool for a while (doubling up to `BACKOFF_MAX` while calls keep running
//!   long), so a view that blocks costs the other connections one hand-off
//!   per back-off, not one per call.

mod caller;
pub mod leader;

use std::time::{Duration, Instant};

pub use caller::LoopCaller;

use crate::plugin::Descriptor;
use crate::plugin::call::Job;

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long requests are held for loop calls to resume while the pool
/// finishes its calls. A held request waits no longer than it would have
/// queued behind those calls in the pool, as long as the pool makes
/// progress; the bound is for a pool whose calls block, and is long enough
/// for two threads to clear 64 queued WSGI hellos.
const RESUME_HOLD: Duration = Duration::from_millis(10);

/// Whether a worker makes loop calls, and whether the adaptive controller
/// measures them against the pool (see `pool/adaptive/mode.rs`).
pub struct Decision {
    pub on: bool,
    /// A worker with CPUs to spare: loop calls start on, and the controller
    /// suspends them while the pool alone serves more.
    pub measured: bool,
    pub why: String,
}

/// Whether a worker makes loop calls, and why (or why not): only for a
/// reentrant plugin with no cap that is not called inline and does not
/// take batches. On a worker with at most one usable CPU of its own they
/// are always best (the pool has no CPU to run beside them; what blocks is
/// handed off); with more, they start on and the controller measures them
/// against the pool, which it can only do for a pool it sizes.
pub fn decide(
    desc: &Descriptor,
    no_inline: bool,
    usable_cpus: usize,
    workers: u32,
    batching: bool,
    adaptive_pool: bool,
) -> Decision {
    let (declared, _) = desc.inline_calls();
    let off = |why: String| Decision {
        on: false,
        measured: false,
        why,
    };
    if declared && !no_inline {
        return off("its calls are inline".into());
    }
    if no_inline {
        return off("turned off with --no-inline".into());
    }
    if batching {
        // Batches form in the pool's queue, and a batch computes for long
        // enough that the hand-off to a handler thread costs nothing.
        return off("the plugin takes batches: its calls go through the handler pool".into());
    }
    if desc.concurrency_cap() != u32::MAX {
        return off(format!(
            "the plugin is {} with a cap: its calls stay on handler threads",
            desc.call_model_name()
        ));
    }
    const HANDOFF: &str = "a handler thread takes the loop over from a call that blocks for 2 ms or computes for 8 ms";
    if usable_cpus <= workers as usize {
        return Decision {
            on: true,
            measured: false,
            why: format!(
                "{usable_cpus} usable CPU(s) for {workers} worker(s): the thread leading the loop calls the plugin while no handler thread is busy, and {HANDOFF}"
            ),
        };
    }
    if !adaptive_pool {
        return off(format!(
            "{usable_cpus} usable CPUs for {workers} worker(s) and a pool fixed with --blocking-threads: \
             the loop and the handler threads run side by side (only an adaptive pool measures loop calls against itself)"
        ));
    }
    Decision {
        on: true,
        measured: true,
        why: format!(
            "{usable_cpus} usable CPUs for {workers} worker(s): loop calls start on, and under concurrent load the controller \
             measures them against the pool alone and keeps whichever serves more; {HANDOFF}"
        ),
    }
}

/// The event loop's account of its loop calls.
pub struct LoopCalls {
    batch: Vec<Job>,
    /// Completions of the last batch not yet taken in: still counted in
    /// flight, but no handler thread is busy with them.
    finishing: usize,
    /// After a hand-off, no loop calls until then.
    resume_at: Option<Instant>,
    backoff: Duration,
    /// The adaptive controller found the pool alone serves more: no loop
    /// calls until it says otherwise (see `pool/adaptive/mode.rs`).
    suspended: bool,
    /// Loop calls were just resumed (by the controller, or at the end of a
    /// back-off): until then, requests are held for the leading thread
    /// while the pool finishes what it has, instead of going to the pool,
    /// or a pool under steady load would never run dry and loop calls would
    /// never resume. Not called at once: a loop call beside pool calls
    /// waits for the plugin's lock (the GIL), and its watcher would take
    /// that for a call that blocks. Past the time, what is held goes to the
    /// pool after all.
    resuming: Option<Instant>,
}

impl Default for LoopCalls {
    fn default() -> LoopCalls {
        LoopCalls {
            batch: Vec::with_capacity(64),
            finishing: 0,
            resume_at: None,
            backoff: BACKOFF_MIN,
            suspended: false,
            resuming: None,
        }
    }
}

impl LoopCalls {
    /// Whether the request being dispatched may be a loop call: only while
    /// every call in flight (`in_flight`) is one of this pass's loop calls,
    /// or while loop calls resume (`resuming`). The controller's suspension
    /// and the back-off after a hand-off each send calls to the pool, and
    /// the controller never cuts a back-off short (`set_suspended`), so a
    /// view that blocks keeps its calls in the pool whatever it measured.
    pub fn may_call(&mut self, in_flight: usize, now: Instant) -> bool {
        if self.suspended {
            return false;
        }
        if let Some(at) = self.resume_at {
            if now < at {
                return false;
            }
            self.resume_at = None;
            self.resuming = Some(now + RESUME_HOLD);
        }
        let pool_idle = in_flight == self.batch.len() + self.finishing;
        match self.resuming {
            Some(_) if pool_idle => {
                self.resuming = None;
                true
            }
            Some(until) if now < until => true,
            Some(_) => {
                self.resuming = None;
                false
            }
            None => pool_idle,
        }
    }

    /// The controller suspends loop calls (the pool alone serves more) or
    /// resumes them; resuming when they are on but the pool has had every
    /// call (it never ran dry since a hand-off's back-off) starts them
    /// again too.
    pub fn set_suspended(&mut self, suspended: bool, now: Instant) {
        if !suspended && self.resume_at.is_none() {
            self.resuming = Some(now + RESUME_HOLD);
        }
        self.suspended = suspended;
    }

    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// Of `in_flight` calls, those on handler threads.
    pub fn in_the_pool(&self, in_flight: usize) -> usize {
        in_flight - self.batch.len() - self.finishing
    }

    pub fn queue(&mut self, job: Job) {
        self.batch.push(job);
    }

    /// The loop calls this pass queued, for the leading thread to make;
    /// none while they are held for the pool to finish (see `resuming`).
    /// True when the time to hold them is past and they go to the pool.
    pub fn take(&mut self, in_flight: usize, now: Instant, into: &mut Vec<Job>) -> bool {
        if let Some(until) = self.resuming {
            if self.in_the_pool(in_flight) > 0 {
                if now < until {
                    return false;
                }
                self.resuming = None;
                std::mem::swap(&mut self.batch, into);
                return true;
            }
            self.resuming = None;
        }
        std::mem::swap(&mut self.batch, into);
        false
    }

    /// The leading thread made every call it took, with no hand-off: the
    /// back-off starts over, and `count` completions are taken in.
    pub fn finishing(&mut self, count: usize) {
        if self.resume_at.is_none() {
            self.backoff = BACKOFF_MIN;
        }
        // A connection's next request, read while the rest are taken in,
        // may be a loop call too.
        self.finishing = count;
    }

    /// One of the finishing completions was taken in.
    pub fn finished_one(&mut self) {
        self.finishing -= 1;
    }

    /// A handler thread took the loop over from a long call: calls go to
    /// the pool for the back-off, which doubles.
    pub fn handed_over(&mut self, why: &str, now: Instant) {
        crate::log::debug(format_args!(
            "a call {why}: a handler thread leads the loop now, and calls go to the pool for {} ms",
            self.backoff.as_millis()
        ));
        self.resume_at = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}
