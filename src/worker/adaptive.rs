//! The adaptive pool controller, run by the event loop between passes.
//!
//! Starvation rule (the .NET thread pool's injection path, sped up): when
//! requests are queued, every handler thread is busy, and no request has
//! completed for `STALL`, the threads are blocked rather than computing, so
//! one more thread is added, up to the plan's maximum. Threads added this
//! way are retired one at a time after `IDLE_RETIRE` without queueing.
//! A plugin that holds a process-wide lock keeps its small start (the
//! seeds: more threads only contend), because its completions never stall.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::pool::Pool;
use super::sizing::PoolPlan;

const STALL: Duration = Duration::from_millis(40);
const IDLE_RETIRE: Duration = Duration::from_secs(10);
pub const TICK: Duration = Duration::from_millis(10);

pub struct Controller {
    plan: PoolPlan,
    last_completed: u64,
    last_progress: Instant,
    last_queued: Instant,
    last_change: Instant,
}

impl Controller {
    pub fn new(plan: PoolPlan) -> Controller {
        let now = Instant::now();
        Controller {
            plan,
            last_completed: 0,
            last_progress: now,
            last_queued: now,
            last_change: now,
        }
    }

    pub fn is_adaptive(&self) -> bool {
        self.plan.adaptive
    }

    pub fn tick(&mut self, pool: &mut Pool, now: Instant) {
        if !self.plan.adaptive {
            return;
        }
        let completed = pool.stats().completed.load(Ordering::Relaxed);
        if completed != self.last_completed {
            self.last_completed = completed;
            self.last_progress = now;
        }
        let (queued, busy) = pool.load();
        let (live, target) = pool.size();
        if queued > 0 {
            self.last_queued = now;
        }
        let stalled = queued > 0 && busy >= live && now.duration_since(self.last_progress) >= STALL;
        if stalled && target < self.plan.max {
            pool.resize(target + 1);
            crate::log::info(format_args!(
                "handler pool grows to {} (requests waiting, all threads blocked)",
                target + 1
            ));
            self.last_progress = now;
            self.last_change = now;
        } else if target > self.plan.initial
            && now.duration_since(self.last_queued) >= IDLE_RETIRE
            && now.duration_since(self.last_change) >= IDLE_RETIRE
        {
            pool.resize(target - 1);
            self.last_change = now;
        }
    }
}
