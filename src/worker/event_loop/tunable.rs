//! The worker as the adaptive controller reads and moves it: the handler
//! pool, the loop's loop calls where it makes them, and the shared page
//! where sibling workers publish their pools.
//!
//! The controller (`pool/adaptive.rs`) sees only its `Tunable` seam, so its
//! decisions are tested against a queueing model. What fills the seam in
//! the server lives here, beside the loop that owns all three parts: the
//! pool's folder then never names the loop or its loop calls.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::loop_calls::LoopCalls;
use crate::plugin::host::LOCK_WAIT_NS;
use crate::worker::accept_share::{AcceptShare, SiblingPools};
use crate::worker::pool::Pool;
use crate::worker::pool::adaptive::{Counters, Tunable};
use crate::worker::pool::schedstat::Clock;

/// User plus system time of this process, read once per window.
fn process_cpu_ns() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0, |u| {
        let ns = |t: nix::sys::time::TimeVal| {
            t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1000
        };
        ns(u.user_time()) + ns(u.system_time())
    })
}

/// The worker as the controller reads and moves it: the pool, and the
/// event loop's loop calls where it makes them.
pub struct Worker<'a> {
    pub pool: &'a mut Pool,
    pub loop_calls: Option<&'a mut LoopCalls>,
    /// Calls in flight, loop calls included (the event loop's count).
    pub in_flight: usize,
    /// The shared page's side of accept sharing: where siblings publish.
    pub share: Option<&'a AcceptShare>,
}

impl Tunable for Worker<'_> {
    fn completed(&self) -> u64 {
        self.pool.stats().completed.load(Ordering::Relaxed)
    }
    fn served(&self) -> u64 {
        let stats = self.pool.stats();
        stats.completed.load(Ordering::Relaxed) + stats.loop_calls.load(Ordering::Relaxed)
    }
    fn counters(&self) -> Counters {
        let stats = self.pool.stats();
        Counters {
            completed: stats.completed.load(Ordering::Relaxed),
            service_ns: stats.service_ns.load(Ordering::Relaxed),
            queue_wait_ns: stats.queue_wait_ns.load(Ordering::Relaxed),
            lock_wait_ns: LOCK_WAIT_NS.load(Ordering::Relaxed),
            cpu_ns: process_cpu_ns(),
            loop_calls: stats.loop_calls.load(Ordering::Relaxed),
            clock: self.pool.thread_clock(),
        }
    }
    fn thread_clock(&self) -> Option<Clock> {
        self.pool.thread_clock()
    }
    fn siblings(&self) -> Option<SiblingPools> {
        let share = self.share?;
        Some(share.sibling_pools(crate::plugin::host::monotonic_ns()))
    }
    fn publish(&self, cpu: f64, demand: f64, threads: usize) {
        if let Some(share) = self.share {
            share.publish_pool(cpu, demand, threads, crate::plugin::host::monotonic_ns());
        }
    }
    fn load(&self) -> (usize, usize) {
        self.pool.load()
    }
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn size(&self) -> (usize, usize) {
        self.pool.size()
    }
    fn resize(&mut self, threads: usize) {
        self.pool.resize(threads)
    }
    fn suspend_loop_calls(&mut self, suspended: bool, now: Instant) {
        if let Some(calls) = self.loop_calls.as_deref_mut() {
            calls.set_suspended(suspended, now);
        }
    }
}
