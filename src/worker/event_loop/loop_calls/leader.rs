//! The threads of loop calls: the loop lives in a mutex, the thread that
//! holds it leads (it runs passes, then lets go of the loop for the calls
//! the pass queued), and a watcher that finds a call stuck leads next.
//! The loop starts on a thread of its own (`m0-loop`), which becomes an
//! ordinary handler thread once it has lost the loop; the worker's main
//! thread only waits for the end.

use std::io;
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::LoopCaller;
use crate::plugin::call::{CallBuffers, Completion, Job};
use crate::worker::event_loop::{EventLoop, Exit};
use crate::worker::pool::lock;
use crate::worker::pool::watch::TakeOver;

pub struct Leader {
    event_loop: Mutex<Option<EventLoop>>,
    caller: LoopCaller,
    ended: Mutex<Option<io::Result<Exit>>>,
    ended_signal: Condvar,
}

/// Run `event_loop` with loop calls until it ends, and give it back. This
/// thread only waits: the loop starts on a thread of its own, so the worker
/// can finish at the drain deadline even while a call holds that thread.
pub fn run(event_loop: EventLoop) -> (io::Result<Exit>, EventLoop) {
    let caller = event_loop.loop_caller();
    let leader = Arc::new(Leader {
        event_loop: Mutex::new(Some(event_loop)),
        caller: caller.clone(),
        ended: Mutex::new(None),
        ended_signal: Condvar::new(),
    });
    let weak: Weak<Leader> = Arc::downgrade(&leader);
    caller.set_take_over(weak);
    let first = Arc::clone(&leader);
    let thread = std::thread::Builder::new()
        .name("m0-loop".into())
        .spawn(move || first.lead_first());
    let result = match &thread {
        Ok(_) => leader.wait_until_ended(),
        Err(e) => Err(io::Error::other(format!(
            "cannot start the event-loop thread: {e}"
        ))),
    };
    let mut event_loop = lock(&leader.event_loop)
        .take()
        .expect("only this function takes the loop out, once");
    if let Ok(thread) = thread {
        event_loop.adopt_thread(thread);
    }
    (result, event_loop)
}

impl Leader {
    /// The loop's own thread: it leads until the loop ends or is taken
    /// over, then works as a handler thread.
    fn lead_first(&self) {
        let mut bufs = match self.caller.start_thread() {
            Ok(bufs) => bufs,
            Err(code) => {
                self.caller.mark_exited();
                return self.end(Err(io::Error::other(format!(
                    "the plugin's thread_start failed on the event-loop thread (code {code})"
                ))));
            }
        };
        if let Some(result) = self.lead(&mut bufs, None) {
            self.end(result);
        }
        self.caller.serve_as_handler(bufs);
    }

    fn end(&self, result: io::Result<Exit>) {
        *lock(&self.ended) = Some(result);
        self.ended_signal.notify_all();
    }

    /// Lead the loop on this thread. `Some` when it ended here; `None` when
    /// another thread took it over. `took_over` says why, when this thread
    /// takes the loop from a call.
    fn lead(
        &self,
        bufs: &mut CallBuffers,
        took_over: Option<&'static str>,
    ) -> Option<io::Result<Exit>> {
        let mut batch: Vec<Job> = Vec::with_capacity(64);
        let mut done: Vec<Completion> = Vec::with_capacity(64);
        let mut guard = lock(&self.event_loop);
        if let Some(why) = took_over {
            guard.as_mut()?.handed_over(why);
        }
        loop {
            let event_loop = guard.as_mut()?;
            event_loop.finish_loop_calls(&mut done);
            let ended = loop {
                match event_loop.pass() {
                    Ok(None) => {}
                    ended => break ended,
                }
                event_loop.take_loop_calls(&mut batch);
                if !batch.is_empty() {
                    break Ok(None);
                }
            };
            match ended {
                Ok(None) => {}
                ended => {
                    self.caller.mark_exited();
                    return ended.transpose();
                }
            }
            // Let go of the loop for the calls, so it can be taken over.
            drop(guard);
            let mut jobs = batch.drain(..);
            while let Some(job) = jobs.next() {
                if !self.caller.call(job, bufs, &mut done) {
                    self.caller.give_back(jobs, &mut done);
                    return None;
                }
            }
            drop(jobs);
            guard = lock(&self.event_loop);
        }
    }

    fn wait_until_ended(&self) -> io::Result<Exit> {
        let mut ended = lock(&self.ended);
        loop {
            if let Some(result) = ended.take() {
                return result;
            }
            ended = self
                .ended_signal
                .wait(ended)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl TakeOver for Leader {
    fn take_over(&self, call: u64, bufs: &mut CallBuffers, why: &'static str) {
        if !self.caller.claim(call) {
            return;
        }
        self.caller.enter_leading();
        let ended = self.lead(bufs, Some(why));
        self.caller.leave_leading();
        if let Some(result) = ended {
            self.end(result);
        }
    }
}
