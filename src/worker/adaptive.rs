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
//!    queue, try an eighth more threads (at least one) for a window and keep
//!    them only if completions per second rose by half of what perfect
//!    scaling would give (at most `GAIN`); otherwise go back and wait before
//!    trying again, longer after each failure. When the worker is using
//!    all its CPUs (`CPU_SATURATED`), a step up is tried at most once per
//!    `COOLDOWN_MAX` and a step down is tried instead: fewer threads are
//!    kept when completions per second hold (within `DOWN_KEEP`) and the
//!    time a request spends in the pool does not grow (`DOWN_LATENCY`).
//!    Under a closed loop a tie in throughput is a tie in latency, and
//!    fewer threads then mean less switching and lock hand-off: on one CPU a lock-holding view is best served by one
//!    thread, which the lock rule alone never reaches. A pool whose threads
//!    mostly wait (I/O) is never stepped down under load: each trial at one
//!    thread fewer makes requests wait a whole call, and a single 200 ms
//!    trial put that in the p99 of a 10 s run.
//!
//! Threads added are retired one at a time once, for `IDLE_RETIRE`,
//! nothing has queued and some thread was always free.
//!
//! On a worker with CPUs to spare that makes loop calls, whether to make
//! them is measured too, window against window (`mode.rs`).

mod mode;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::loop_calls::LoopCalls;
use super::pool::Pool;
use super::sizing::PoolPlan;
use crate::plugin::host::LOCK_WAIT_NS;

/// Running totals the controller reads each window.
#[derive(Clone, Copy, Default, Debug)]
pub struct Counters {
    pub completed: u64,
    pub service_ns: u64,
    pub queue_wait_ns: u64,
    pub lock_wait_ns: u64,
    /// CPU time the whole worker process has used (all its threads).
    pub cpu_ns: u64,
    /// Loop calls made (not in `completed`, which counts the pool's).
    pub loop_calls: u64,
}

/// What the controller reads and moves: the pool in the server, a queueing
/// model in the unit tests (so its decisions are tested without clocks).
pub trait Tunable {
    /// Requests the pool completed so far: read every tick, so it must be
    /// cheap.
    fn completed(&self) -> u64;
    /// Those and the loop calls made: read every tick too.
    fn served(&self) -> u64 {
        self.completed()
    }
    /// Every running total, read once per window.
    fn counters(&self) -> Counters;
    /// Jobs queued and threads busy right now.
    fn load(&self) -> (usize, usize);
    /// Calls in flight right now, loop calls included.
    fn in_flight(&self) -> usize {
        let (queued, busy) = self.load();
        queued + busy
    }
    /// Threads alive and the target.
    fn size(&self) -> (usize, usize);
    fn resize(&mut self, threads: usize);
    /// Send every call to the pool (true), or let loop calls resume (also
    /// when they are on but the pool has had every call since a hand-off).
    fn suspend_loop_calls(&mut self, suspended: bool, now: Instant);
}

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

const STALL: Duration = Duration::from_millis(40);
const IDLE_RETIRE: Duration = Duration::from_secs(10);
/// A measurement window lasts `WINDOW`, or only `WINDOW_MIN` once it holds
/// `WINDOW_COMPLETIONS`: a probe runs the pool at a size that may be worse,
/// and on a fast view (a WSGI hello: 170k requests/s) 200 ms of that showed
/// in the p99 while 50 ms already counts thousands of completions.
const WINDOW: Duration = Duration::from_millis(200);
const WINDOW_MIN: Duration = Duration::from_millis(50);
const WINDOW_COMPLETIONS: u64 = 2000;
const LOCK_SHRINK: f64 = 0.6;
const LOCK_NO_GROW: f64 = 0.35;
const GAIN: f64 = 1.04;
/// A thread worth less than 3% of the throughput is not worth its share of
/// the lock hand-offs: on the one-CPU GIL-releasing view, two threads
/// served 2-3% more than one, with a p99 a third higher.
const DOWN_KEEP: f64 = 0.97;
/// Mean time in the pool over a 200 ms window moves by several percent
/// with nothing changed, and going from 2 threads to 1 moves part of each
/// cycle from the loop into the queue (measured: +8-10% at equal
/// throughput); 15% is "no worse" within that. Steps down happen only on
/// saturated CPUs, where throughput is the measure that matters.
const DOWN_LATENCY: f64 = 1.15;
/// Share of its usable CPUs the worker must be using for a step down.
const CPU_SATURATED: f64 = 0.85;
/// Completions a window needs before a step down is judged on it.
const DOWN_MIN_SAMPLE: u64 = 40;
pub(crate) const COOLDOWN_MIN: Duration = Duration::from_millis(600);
/// Failed probes back off to one per `COOLDOWN_MAX`, so a settled pool
/// spends well under 1% of its time at a trial size.
pub(crate) const COOLDOWN_MAX: Duration = Duration::from_secs(30);
pub const TICK: Duration = Duration::from_millis(10);

/// Counters at the start of a window.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    counters: Counters,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Direction {
    Up,
    Down,
}

/// A trial of one thread more or fewer: the size to go back to, and the
/// rate and time-in-pool of the window before it.
struct Probe {
    direction: Direction,
    previous: usize,
    baseline: f64,
    baseline_latency: f64,
}

pub struct Controller {
    plan: PoolPlan,
    last_completed: u64,
    last_progress: Instant,
    last_needed: Instant,
    last_change: Instant,
    window: Mark,
    queued_in_window: bool,
    probe: Option<Probe>,
    cooldown: Duration,
    next_probe: Instant,
    /// A step up while the CPUs are saturated rarely pays (eight threads
    /// lost 31% of the throughput of one on a GIL-holding view), so it is tried at most once
    /// per `COOLDOWN_MAX`: each trial costs the p99 of its window.
    next_saturated_up: Instant,
    /// Which way the next probe goes when both are possible.
    next_direction: Direction,
    /// Loop calls against the pool (`mode.rs`).
    mode: mode::Mode,
    /// The most calls in flight at a tick of the current window.
    peak_in_flight: usize,
}

impl Controller {
    /// `measure_loop_calls`: the worker makes loop calls with CPUs to
    /// spare, and the controller decides when to suspend them.
    pub fn new(plan: PoolPlan, measure_loop_calls: bool) -> Controller {
        let now = Instant::now();
        Controller {
            last_completed: 0,
            last_progress: now,
            last_needed: now,
            last_change: now,
            window: Mark {
                at: now,
                counters: Counters::default(),
            },
            queued_in_window: false,
            probe: None,
            cooldown: COOLDOWN_MIN,
            next_probe: now,
            next_saturated_up: now + COOLDOWN_MAX,
            next_direction: Direction::Up,
            mode: mode::Mode::new(measure_loop_calls && plan.adaptive, now),
            peak_in_flight: 0,
            plan,
        }
    }

    pub fn is_adaptive(&self) -> bool {
        self.plan.adaptive
    }

    /// Whether this controller decides when loop calls are made, and so
    /// must tick while only loop calls are in flight.
    pub fn measures_loop_calls(&self) -> bool {
        self.mode.measured()
    }

    /// Loop calls suspended by the controller right now.
    pub fn loop_calls_suspended(&self) -> bool {
        self.mode.suspended()
    }

    /// The call path the worker ended on, for its closing line.
    pub fn call_path(&self) -> String {
        self.mode.summary()
    }

    fn set(&mut self, pool: &mut impl Tunable, size: usize, now: Instant, why: &str) {
        let size = size.clamp(self.plan.min.max(1), self.plan.max);
        if size != pool.size().1 {
            pool.resize(size);
            crate::log::debug(format_args!("handler pool: {size} thread(s) ({why})"));
        }
        self.last_change = now;
    }

    /// Move a step `direction` from `target`, to be judged against the
    /// window just measured: (completions per second, ns in the pool).
    fn start_probe(
        &mut self,
        pool: &mut impl Tunable,
        direction: Direction,
        (rate, latency): (f64, f64),
        target: usize,
        now: Instant,
        why: &str,
    ) {
        // Steps of an eighth, so a pool for many blocked calls gets there in
        // seconds, not minutes.
        let step = (target / 8).max(1);
        let size = match direction {
            Direction::Up => (target + step).min(self.plan.max),
            Direction::Down => target.saturating_sub(step).max(self.plan.min.max(1)),
        };
        self.probe = Some(Probe {
            direction,
            previous: target,
            baseline: rate,
            baseline_latency: latency,
        });
        self.set(pool, size, now, why);
    }

    pub fn tick(&mut self, pool: &mut impl Tunable, now: Instant) {
        if !self.plan.adaptive {
            return;
        }
        let completed = pool.completed();
        if completed != self.last_completed {
            self.last_completed = completed;
            self.last_progress = now;
        }
        let (queued, busy) = pool.load();
        let (live, target) = pool.size();
        if self.mode.measured() {
            self.peak_in_flight = self.peak_in_flight.max(pool.in_flight());
        }
        // A backlog only counts when no thread is free to take it: a job
        // caught between submit and pickup (one client, a descheduled thread
        // on a busy machine) is not a reason to add threads, and counting it
        // let noise in the completion rate ratchet the pool upwards.
        if queued > live.saturating_sub(busy) {
            self.last_needed = now;
            self.queued_in_window = true;
        }
        // Every thread busy is not idle either: eight clients on eight
        // threads queue nothing, and retiring one makes them wait.
        if busy >= live && live > 0 {
            self.last_needed = now;
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

        let open_for = now.duration_since(self.window.at);
        // A window measuring loop calls fills with them as well.
        let counted = if self.mode.measured() {
            let start = &self.window.counters;
            pool.served()
                .saturating_sub(start.completed + start.loop_calls)
        } else {
            completed.saturating_sub(self.window.counters.completed)
        };
        if open_for < WINDOW && (open_for < WINDOW_MIN || counted < WINDOW_COMPLETIONS) {
            return;
        }
        let end = Mark {
            at: now,
            counters: pool.counters(),
        };
        let start = std::mem::replace(&mut self.window, end);
        let seconds = end.at.duration_since(start.at).as_secs_f64();
        let (end, start) = (end.counters, start.counters);
        let queued_in_window = std::mem::replace(&mut self.queued_in_window, false);
        let completions = end.completed - start.completed;
        let rate = completions as f64 / seconds.max(1e-3);
        let service = end.service_ns.saturating_sub(start.service_ns) as f64;
        let lock_share = if service > 0.0 {
            end.lock_wait_ns.saturating_sub(start.lock_wait_ns) as f64 / service
        } else {
            0.0
        };
        let cpu_share = end.cpu_ns.saturating_sub(start.cpu_ns) as f64
            / (seconds.max(1e-3) * 1e9 * self.plan.cpus.max(1) as f64);
        let saturated = cpu_share >= CPU_SATURATED;
        // Mean time a request spent in the pool (queued + served).
        let latency = (service + end.queue_wait_ns.saturating_sub(start.queue_wait_ns) as f64)
            / completions.max(1) as f64;

        // Loop calls or the pool alone: a window of the mode's is not one
        // of the pool's.
        let served = (end.completed + end.loop_calls) - (start.completed + start.loop_calls);
        let window = mode::Window {
            rate: served as f64 / seconds.max(1e-3),
            completions: served,
            peak_in_flight: std::mem::take(&mut self.peak_in_flight),
            loop_share: (end.loop_calls - start.loop_calls) as f64 / served.max(1) as f64,
        };
        let min_threads = self.plan.initial.max(self.plan.min.max(1));
        if self
            .mode
            .window(&window, pool, self.probe.is_some(), min_threads, now)
        {
            return;
        }

        // 3b. A probe's verdict.
        if let Some(probe) = self.probe.take() {
            // Perfect scaling would change the rate by step/size; ask for half
            // of that from a step up (so a pool of 30 still grows for I/O
            // views) and forgive a quarter of it in a step down.
            let step = probe.previous.abs_diff(target) as f64;
            let share = step / probe.previous.max(target) as f64;
            let kept = match probe.direction {
                Direction::Up => {
                    rate > probe.baseline * (1.0 + (GAIN - 1.0).min(share / 2.0))
                        && lock_share < LOCK_NO_GROW
                }
                Direction::Down => {
                    completions >= DOWN_MIN_SAMPLE
                        && rate >= probe.baseline * DOWN_KEEP.max(1.0 - share / 4.0)
                        && latency <= probe.baseline_latency * DOWN_LATENCY
                }
            };
            if kept {
                self.cooldown = COOLDOWN_MIN;
                // Keep going the same way while it pays.
                let (more, why) = match probe.direction {
                    Direction::Up => (
                        queued_in_window && target < self.plan.max,
                        "more threads raised throughput",
                    ),
                    Direction::Down => (
                        target > self.plan.min.max(1) && saturated,
                        "fewer threads served as much",
                    ),
                };
                if more {
                    self.start_probe(pool, probe.direction, (rate, latency), target, now, why);
                } else {
                    self.next_probe = now + self.cooldown;
                }
            } else {
                let what = match probe.direction {
                    Direction::Up => "more threads did not help",
                    // Say which test failed: the rate can hold while the
                    // time in the pool grows.
                    Direction::Down if latency > probe.baseline_latency * DOWN_LATENCY => {
                        "fewer threads kept requests longer in the pool"
                    }
                    Direction::Down => "fewer threads served less",
                };
                let why = format!(
                    "{what}: {rate:.0}/s vs {:.0}/s, {:.2} vs {:.2} ms in the pool",
                    probe.baseline,
                    latency / 1e6,
                    probe.baseline_latency / 1e6
                );
                self.set(pool, probe.previous, now, &why);
                self.next_probe = now + self.cooldown;
                self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
                self.next_direction = match probe.direction {
                    Direction::Up => Direction::Down,
                    Direction::Down => Direction::Up,
                };
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

        // 3a. Try more threads while requests queue, or fewer while the CPUs
        // are saturated (alternating after a failed trial when both apply).
        if now >= self.next_probe {
            let up = queued_in_window
                && lock_share < LOCK_NO_GROW
                && target < self.plan.max
                && (!saturated || now >= self.next_saturated_up);
            let down = queued_in_window
                && saturated
                && completions >= DOWN_MIN_SAMPLE
                && target > self.plan.min.max(1);
            let direction = match (up, down) {
                (true, true) => Some(self.next_direction),
                (true, false) => Some(Direction::Up),
                (false, true) => Some(Direction::Down),
                (false, false) => None,
            };
            if let Some(direction) = direction {
                if direction == Direction::Up && saturated {
                    self.next_saturated_up = now + COOLDOWN_MAX;
                }
                let why = match direction {
                    Direction::Up => "requests queue: trying more",
                    Direction::Down => "trying fewer",
                };
                self.start_probe(pool, direction, (rate, latency), target, now, why);
                return;
            }
        }

        // Retire surplus threads once idle.
        if target > self.plan.initial
            && now.duration_since(self.last_needed) >= IDLE_RETIRE
            && now.duration_since(self.last_change) >= IDLE_RETIRE
        {
            self.set(pool, target - 1, now, "idle");
        }
    }
}

#[cfg(test)]
mod tests;
