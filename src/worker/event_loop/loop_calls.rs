//! The event loop's side of loop calls: the requests that the thread leading
//! the loop calls the plugin for itself, after the pass that read them (see
//! `worker/leader.rs` for the threads).
//!
//! A request becomes a loop call only while no call is in flight on a
//! handler thread, so loop calls never compete with the pool for the
//! plugin's lock, and a plugin whose calls stay short is served by one
//! thread. When a call runs long enough for a handler thread to take the
//! loop over, requests go to the pool for a while (doubling up to
//! `BACKOFF_MAX` while calls keep running long), so a view that blocks
//! costs the other connections one hand-off per back-off, not one per call.

use std::time::{Duration, Instant};

use super::EventLoop;
use crate::worker::pool::{Completion, Job, LoopCaller};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

pub(super) struct LoopCalls {
    batch: Vec<Job>,
    /// Completions of the last batch not yet taken in: still counted in
    /// flight, but no handler thread is busy with them.
    finishing: usize,
    /// After a hand-off, no loop calls until then.
    resume_at: Option<Instant>,
    backoff: Duration,
}

impl EventLoop {
    /// Let the thread leading the loop call the plugin (see `leader.rs`).
    pub fn enable_loop_calls(&mut self) {
        self.loop_calls = Some(LoopCalls {
            batch: Vec::with_capacity(64),
            finishing: 0,
            resume_at: None,
            backoff: BACKOFF_MIN,
        });
    }

    pub fn loop_calls_enabled(&self) -> bool {
        self.loop_calls.is_some()
    }

    pub fn loop_caller(&self) -> LoopCaller {
        self.pool.loop_caller()
    }

    /// See `Pool::adopt_thread`.
    pub fn adopt_thread(&mut self, thread: std::thread::JoinHandle<()>) {
        self.pool.adopt_thread(thread);
    }

    /// Whether the request being dispatched may be a loop call: only while
    /// every call in flight is one of this pass's loop calls.
    pub(super) fn may_call_on_loop(&mut self) -> bool {
        let Some(calls) = &mut self.loop_calls else {
            return false;
        };
        if self.in_flight != calls.batch.len() + calls.finishing {
            return false;
        }
        if let Some(at) = calls.resume_at {
            if self.now < at {
                return false;
            }
            calls.resume_at = None;
        }
        true
    }

    /// Calls in flight on handler threads.
    pub(super) fn pool_in_flight(&self) -> usize {
        match &self.loop_calls {
            Some(calls) => self.in_flight - calls.batch.len() - calls.finishing,
            None => self.in_flight,
        }
    }

    pub(super) fn queue_loop_call(&mut self, job: Job) {
        if let Some(calls) = &mut self.loop_calls {
            calls.batch.push(job);
        }
    }

    /// The loop calls this pass queued, for the leading thread to make.
    pub fn take_loop_calls(&mut self, into: &mut Vec<Job>) {
        if let Some(calls) = &mut self.loop_calls {
            std::mem::swap(&mut calls.batch, into);
        }
    }

    /// The leading thread made every call it took, with no hand-off.
    pub fn finish_loop_calls(&mut self, done: &mut Vec<Completion>) {
        if done.is_empty() {
            return;
        }
        if let Some(calls) = &mut self.loop_calls {
            if calls.resume_at.is_none() {
                calls.backoff = BACKOFF_MIN;
            }
            // A connection's next request, read while the rest are taken
            // in, may be a loop call too.
            calls.finishing = done.len();
        }
        for completion in done.drain(..) {
            if let Some(calls) = &mut self.loop_calls {
                calls.finishing -= 1;
            }
            self.on_completion(completion);
        }
    }

    /// A handler thread took the loop over from a long call: send calls to
    /// the pool for a while.
    pub fn handed_over(&mut self, why: &str) {
        if let Some(calls) = &mut self.loop_calls {
            crate::log::info(format_args!(
                "a call {why}: a handler thread leads the loop now, and calls go to the pool for {} ms",
                calls.backoff.as_millis()
            ));
            calls.resume_at = Some(Instant::now() + calls.backoff);
            calls.backoff = (calls.backoff * 2).min(BACKOFF_MAX);
        }
        self.pool.keep_one_handler();
    }
}
