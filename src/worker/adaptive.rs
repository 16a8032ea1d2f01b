//! The adaptive pool controller, run by the event loop between passes.
//!
//! Three rules, cheapest first:
//!
//! 1. Starvation (the .NET thread pool's injection path, sped up): requests
//!    queued, every thread busy, nothing completed for `STALL`: the threads
//!    are blocked, not computing, so add one at once.
//! 2. Lock contention: when handler threads spend more than `LOCK_SHRINK` of
//!    their time waiting for the plugin's process-wide lock (the WSGI
//!    plugin reports GIL waits), threads are only queueing for the lock:
//!    shed one (never below 2: one in the call, one ready to take the lock).
//!    Above `LOCK_NO_GROW` the controller never adds threads.
//! 3. Hill climbing (after .NET's controller, simplified): while requests
//!    queue, try one more thread for a window and keep it only if
//!    completions per second rose by `GAIN`; otherwise go back and wait
//!    before trying again, longer after each failure.
//!
//! Threads added are retired one at a time once nothing has queued for
//! `IDLE_RETIRE`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::pool::Pool;
use super::sizing::PoolPlan;
use crate::plugin::host::LOCK_WAIT_NS;

const STALL: Duration = Duration::from_millis(40);
const IDLE_RETIRE: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_millis(200);
const LOCK_SHRINK: f64 = 0.6;
const LOCK_NO_GROW: f64 = 0.35;
const GAIN: f64 = 1.04;
const COOLDOWN_MIN: Duration = Duration::from_millis(600);
const COOLDOWN_MAX: Duration = Duration::from_secs(8);
pub const TICK: Duration = Duration::from_millis(10);

/// Counters at the start of a window.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    completed: u64,
    service_ns: u64,
    lock_wait_ns: u64,
}

/// A trial of one more thread: the size to go back to and the rate to beat.
struct Probe {
    previous: usize,
    baseline: f64,
}

pub struct Controller {
    plan: PoolPlan,
    last_completed: u64,
    last_progress: Instant,
    last_queued: Instant,
    last_change: Instant,
    window: Mark,
    queued_in_window: bool,
    probe: Option<Probe>,
    cooldown: Duration,
    next_probe: Instant,
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
            window: Mark {
                at: now,
                completed: 0,
                service_ns: 0,
                lock_wait_ns: 0,
            },
            queued_in_window: false,
            probe: None,
            cooldown: COOLDOWN_MIN,
            next_probe: now,
        }
    }

    pub fn is_adaptive(&self) -> bool {
        self.plan.adaptive
    }

    fn mark(pool: &Pool, at: Instant) -> Mark {
        let stats = pool.stats();
        Mark {
            at,
            completed: stats.completed.load(Ordering::Relaxed),
            service_ns: stats.service_ns.load(Ordering::Relaxed),
            lock_wait_ns: LOCK_WAIT_NS.load(Ordering::Relaxed),
        }
    }

    fn set(&mut self, pool: &mut Pool, size: usize, now: Instant, why: &str) {
        let size = size.clamp(self.plan.min.max(1), self.plan.max);
        if size != pool.size().1 {
            pool.resize(size);
            crate::log::info(format_args!("handler pool: {size} thread(s) ({why})"));
        }
        self.last_change = now;
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
        // A backlog only counts when no thread is free to take it: a job
        // caught between submit and pickup (one client, a descheduled thread
        // on a busy machine) is not a reason to add threads, and counting it
        // let noise in the completion rate ratchet the pool upwards.
        if queued > live.saturating_sub(busy) {
            self.last_queued = now;
            self.queued_in_window = true;
        }

        // 1. Starvation.
        if queued > 0
            && busy >= live
            && now.duration_since(self.last_progress) >= STALL
            && target < self.plan.max
        {
            self.probe = None;
            self.set(
                pool,
                target + 1,
                now,
                "requests waiting, every thread blocked",
            );
            self.last_progress = now;
            return;
        }

        if now.duration_since(self.window.at) < WINDOW {
            return;
        }
        let end = Controller::mark(pool, now);
        let start = std::mem::replace(&mut self.window, end);
        let queued_in_window = std::mem::replace(&mut self.queued_in_window, false);
        let seconds = end.at.duration_since(start.at).as_secs_f64();
        let rate = (end.completed - start.completed) as f64 / seconds.max(1e-3);
        let service = end.service_ns.saturating_sub(start.service_ns) as f64;
        let lock_share = if service > 0.0 {
            end.lock_wait_ns.saturating_sub(start.lock_wait_ns) as f64 / service
        } else {
            0.0
        };

        // 3b. A probe's verdict.
        if let Some(probe) = self.probe.take() {
            if rate > probe.baseline * GAIN && lock_share < LOCK_NO_GROW {
                self.cooldown = COOLDOWN_MIN;
                // Keep climbing from here while requests still queue.
                if queued_in_window && target < self.plan.max {
                    self.probe = Some(Probe {
                        previous: target,
                        baseline: rate,
                    });
                    self.set(pool, target + 1, now, "more threads raised throughput");
                }
            } else {
                self.set(pool, probe.previous, now, "one more thread did not help");
                self.next_probe = now + self.cooldown;
                self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
            }
            return;
        }

        // 2. Lock contention.
        if lock_share > LOCK_SHRINK && target > 2 {
            self.set(
                pool,
                target - 1,
                now,
                "threads wait on the plugin's process-wide lock",
            );
            self.next_probe = now + self.cooldown;
            return;
        }

        // 3a. Try one more thread while requests queue.
        if queued_in_window
            && lock_share < LOCK_NO_GROW
            && target < self.plan.max
            && now >= self.next_probe
        {
            self.probe = Some(Probe {
                previous: target,
                baseline: rate,
            });
            self.set(pool, target + 1, now, "requests queue: trying one more");
            return;
        }

        // Retire surplus threads once idle.
        if target > self.plan.initial
            && now.duration_since(self.last_queued) >= IDLE_RETIRE
            && now.duration_since(self.last_change) >= IDLE_RETIRE
        {
            self.set(pool, target - 1, now, "idle");
        }
    }
}
