//! The adaptive pool controller, run by the event loop between passes.
//!
//! Three rules, cheapest first:
//!
//! 1. Starvation (the .NET thread pool's injection path, sped up): requests
//!    queued, every thread busy, nothing completed for `STALL`, and the
//!    kernel's clocks of the handler threads (schedstat) say they were
//!    neither on a CPU nor waiting for one for `STALL_CONFIRM` more: the
//!    threads are blocked, not computing, so add one at once. Threads that
//!    wait for a CPU look the same from the pool's counters alone (two
//!    workers on two CPUs grew to sixteen threads each that way), and more
//!    of them only make every call slower.
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
//!    all its CPUs (`CPU_SATURATED`), or its threads that do not block
//!    spend `LOCK_NO_GROW` of their time waiting for the plugin's lock
//!    (the lock is then what is saturated), a step up is tried at most once per
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
//! Every window also splits the handler threads' time by the kernel's
//! clocks: runnable (on a CPU, or waiting for one), waiting for the
//! plugin's lock (reported by the plugin), and blocked (the rest of the
//! time they were busy: a system call, a lock held across I/O). Blocked
//! threads are what more threads help with; runnable ones need CPUs. The
//! worker's share of the CPUs is all of its usable CPUs, or, when sibling
//! workers on the same CPUs published their load on the shared page, the
//! larger of an equal split and its part of what they all want. So:
//!
//! - Over its share: more runnable threads than its share of CPUs (by
//!   `OVER_SHARE`), which wait for a CPU (`CPU_WAIT`), is shed at once,
//!   down to its share plus the threads that were blocked. Across workers
//!   this gives a CPU-bound view about one thread per CPU in all, where
//!   each worker's own probes would have kept its threads: under the
//!   kernel's per-thread fairness a worker with fewer threads gets less
//!   of the CPUs, so a step down always looks like a loss from inside.
//! - A step up is tried only with room for another runnable thread in the
//!   share, or with threads blocked: a sleeping view still grows to what
//!   its clients need, with any number of workers.
//! - A worker that finds no sibling's numbers on the page waits one window
//!   before a step up: workers started together close their first windows
//!   together, and the first to close one would count every CPU as its
//!   own.
//! - A probe that lost is not tried again from the same size while the
//!   load (calls in flight, completions per second) has not changed by a
//!   quarter, for up to `LOST_MEMORY`: it would lose again, and each trial
//!   costs the p99 of its window.
//! - A step down that lost is judged again on the window after going back
//!   (before, trial, after): when the larger pool does no better there than
//!   the trial did, the machine slowed down under the trial (other tenants
//!   on a shared host), and the pool returns to the smaller size. Not for
//!   pools whose threads block.
//!
//! A pool whose busy threads block keeps spare threads: one in eight
//! beyond the most that were busy at once, at least one. A request that
//! finds every thread busy waits for one to come back, and on shared CPUs
//! that is a scheduler's slice: the p99 of a sleeping view at eight
//! clients was a tenth lower with sixteen threads than with eight.
//!
//! Threads added are retired one at a time once, for `IDLE_RETIRE`,
//! nothing has queued and some thread (past the spare ones) was always
//! free.
//!
//! On a worker with CPUs to spare that makes loop calls, whether to make
//! them is measured too, window against window (`mode.rs`).

mod mode;

use std::time::{Duration, Instant};

use super::schedstat::Clock;
use super::sizing::PoolPlan;
use crate::worker::accept_share::SiblingPools;

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
    /// The handler threads' summed scheduler clocks (`Tunable::thread_clock`).
    pub clock: Option<Clock>,
}

/// What the controller reads and moves: the worker's pool and loop calls
/// in the server (`event_loop/tunable.rs`), a queueing model in the unit
/// tests (so its decisions are tested without clocks).
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
    /// The handler threads' summed time on a CPU and waiting for one
    /// (schedstat), as running totals; `None` where the kernel keeps none.
    fn thread_clock(&self) -> Option<Clock> {
        None
    }
    /// What the pools of sibling workers on the same CPUs published
    /// lately; `None` for a worker without siblings.
    fn siblings(&self) -> Option<SiblingPools> {
        None
    }
    /// Publish this worker's last window for its siblings: CPUs used, CPUs
    /// its handler threads wanted, and the pool's size.
    fn publish(&self, _cpu: f64, _demand: f64, _threads: usize) {}
}

const STALL: Duration = Duration::from_millis(40);
/// After a stall, how long the busy threads' clocks are watched before a
/// thread is added: long beside a scheduler's time slice.
const STALL_CONFIRM: Duration = Duration::from_millis(20);
/// Busy threads runnable on average, over `STALL_CONFIRM`, below which
/// they are all blocked: one thread computing (with the plugin's lock, or
/// kept off its CPU) is not a reason to add another.
const STALL_RUNNABLE: f64 = 0.5;
/// Share of the busy threads' time spent blocked from which the pool
/// counts as one whose threads wait (I/O, sleep): a step up may then go as
/// far as the requests waiting, and spare threads are kept. A share, not
/// "all but half a thread": a WSGI view sleeping 5 ms still waits for the
/// GIL and a CPU around it, so eight busy threads were 7.1 blocked (and
/// the old rule grew the pool for 32 clients one thread per probe), and
/// 32 busy threads 19-21 blocked.
const BLOCKED_SHARE: f64 = 0.5;
/// Runnable threads past the worker's share of the CPUs, waiting for
/// one, that are shed without a probe.
const OVER_SHARE: f64 = 0.5;
/// Share of the runnable threads' time spent waiting for a CPU from which
/// the CPUs count as taken (by siblings, the clients, anything else).
const CPU_WAIT: f64 = 0.2;
/// How long a probe that lost is not tried again from the same size and
/// load.
const LOST_MEMORY: Duration = Duration::from_secs(120);
/// Change in calls in flight or completions per second that makes a
/// lost probe worth trying again.
const LOAD_CHANGED: f64 = 0.25;
/// Longest gap between ticks counted in the busy-thread averages (the
/// loop ticks at least every `TICK` while calls are in flight).
const TICK_GAP_MAX: Duration = Duration::from_millis(50);
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
/// saturated CPUs (or a saturated plugin lock), where throughput is the
/// measure that matters.
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
    baseline_in_flight: f64,
}

/// A step down that lost, judged again on the window after going back:
/// the size it tried and what it served there.
#[derive(Clone, Copy)]
struct Recheck {
    size: usize,
    rate: f64,
    latency: f64,
    /// The step as a share of the larger size (see `fewer_served_as_much`).
    step_share: f64,
}

/// A probe that lost: from which size, under which load, and when.
#[derive(Clone, Copy)]
struct Lost {
    from: usize,
    in_flight: f64,
    rate: f64,
    at: Instant,
}

/// The handler threads over one window, from the kernel's clocks, as
/// average numbers of threads.
#[derive(Clone, Copy, Debug)]
struct Threads {
    /// On a CPU or waiting for one.
    runnable: f64,
    /// Waiting for a CPU.
    waiting: f64,
    /// Busy, but neither runnable nor waiting for the plugin's lock.
    blocked: f64,
}

/// What one tick read of the pool.
#[derive(Clone, Copy)]
struct Sample {
    /// Requests the pool completed so far.
    completed: u64,
    /// Jobs queued and threads busy.
    queued: usize,
    busy: usize,
    /// Threads alive and the target.
    live: usize,
    target: usize,
}

/// A window just closed: what the rules after it judge on. Rates and
/// averages are over the window; `target` is the pool's size at the tick
/// that closed it.
struct Closed {
    target: usize,
    /// Requests waited with no thread free at some tick.
    queued_in_window: bool,
    completions: u64,
    /// Completions per second.
    rate: f64,
    /// Mean time a request spent in the pool (queued + served), ns.
    latency: f64,
    /// Calls in flight and handler threads busy, on average.
    in_flight: f64,
    busy_threads: f64,
    /// The most handler threads busy at a tick.
    peak_busy: usize,
    /// Share of the service time spent waiting for the plugin's lock.
    lock_share: f64,
    /// The worker's usable CPUs, what its threads wanted of them, and its
    /// share of them beside its siblings.
    cpus: f64,
    demand: f64,
    share: f64,
    siblings: Option<SiblingPools>,
    /// The handler threads' time by the kernel's clocks, where it keeps them.
    threads: Option<Threads>,
    /// The runnable threads waited for a CPU (`CPU_WAIT`).
    waits_for_cpu: bool,
    /// The busy threads mostly blocked (`BLOCKED_SHARE`).
    blocking: bool,
    /// The CPUs, or the plugin's lock, are what limits the pool: a step
    /// down is tried rather than up.
    saturated: bool,
    /// A step up has something to help with: room in the share, or threads
    /// that block.
    up_room: bool,
    /// A step up with room in the share is held back this window for the
    /// siblings' numbers.
    held_for_siblings: bool,
    /// Every call served, loop calls too, for loop calls against the pool.
    calls: mode::Window,
}

pub struct Controller {
    plan: PoolPlan,
    last_completed: u64,
    last_progress: Instant,
    last_needed: Instant,
    last_change: Instant,
    window: Mark,
    /// False until the first tick opens a window (see `restart_window`).
    window_open: bool,
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
    /// Busy threads and calls in flight integrated over the window (ns).
    busy_ns: f64,
    in_flight_ns: f64,
    last_tick: Instant,
    /// A stall's start and the busy threads' clocks then.
    stall_mark: Option<(Instant, Clock)>,
    /// Stalls not grown for: the busy threads were runnable.
    stalls_runnable: u64,
    /// The last probe that lost, by direction (up, down).
    lost: [Option<Lost>; 2],
    /// A step down that lost, to be judged again on the next window.
    recheck: Option<Recheck>,
    /// Probes not started since they lost at the same size and load.
    not_repeated: u64,
    /// Why the pool has its size, for the closing line.
    conclusion: String,
    /// Requests that waited on average in the last window while every
    /// busy thread was blocked: how far a step up may go at once.
    blocked_step: usize,
    /// The most handler threads busy at a tick of the current window.
    peak_busy: usize,
    /// Threads kept free beyond the most that were busy, for a pool whose
    /// busy threads block (`spare_threads`); 0 for one whose threads compute.
    spare: usize,
    /// The last window found no sibling's numbers on the shared page.
    siblings_unseen: bool,
    /// Steps up held back a window for the siblings' numbers.
    waited_for_siblings: u64,
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
            window_open: false,
            queued_in_window: false,
            probe: None,
            cooldown: COOLDOWN_MIN,
            next_probe: now,
            next_saturated_up: now + COOLDOWN_MAX,
            next_direction: Direction::Up,
            mode: mode::Mode::new(measure_loop_calls && plan.adaptive, now),
            peak_in_flight: 0,
            busy_ns: 0.0,
            in_flight_ns: 0.0,
            last_tick: now,
            stall_mark: None,
            stalls_runnable: 0,
            lost: [None; 2],
            recheck: None,
            not_repeated: 0,
            blocked_step: 0,
            peak_busy: 0,
            spare: 0,
            siblings_unseen: false,
            waited_for_siblings: 0,
            conclusion: format!("as started ({})", plan.reason),
            plan,
        }
    }

    /// What the pool concluded and why, for the closing line.
    pub fn pool_summary(&self) -> String {
        if !self.plan.adaptive {
            return format!("pool: {}", self.plan.reason);
        }
        let siblings = if self.plan.workers > 1 {
            format!(
                "; {} step(s) up held back a window for the siblings' numbers",
                self.waited_for_siblings
            )
        } else {
            String::new()
        };
        format!(
            "pool: {}; {} stall(s) not grown for (the busy threads were computing or waiting for a CPU); \
             {} probe(s) not repeated (they had lost at that size and load){siblings}",
            self.conclusion, self.stalls_runnable, self.not_repeated
        )
    }

    /// A probe in `direction` from `target` lost lately under this load.
    fn lost_lately(
        &self,
        direction: Direction,
        target: usize,
        in_flight: f64,
        rate: f64,
        now: Instant,
    ) -> bool {
        let near = |a: f64, b: f64| (a - b).abs() <= LOAD_CHANGED * b.max(1.0);
        self.lost[direction as usize].is_some_and(|l| {
            l.from == target
                && now.duration_since(l.at) < LOST_MEMORY
                && near(in_flight, l.in_flight)
                && near(rate, l.rate)
        })
    }

    pub fn is_adaptive(&self) -> bool {
        self.plan.adaptive
    }

    /// Whether this controller decides when loop calls are made, and so
    /// must tick while only loop calls are in flight.
    pub fn measures_loop_calls(&self) -> bool {
        self.mode.measured()
    }

    /// Whether sibling workers share this worker's CPUs: then it ticks
    /// while only loop calls are in flight too, so that what they use of
    /// the CPUs reaches the siblings' controllers (a worker that went
    /// unmeasured let its sibling count every CPU as its own).
    pub fn shares_cpus(&self) -> bool {
        self.plan.adaptive && self.plan.workers > 1
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
            self.conclusion = format!("{size} thread(s) since {why}");
        }
        self.last_change = now;
    }

    /// Move a step `direction` from `target`, to be judged against the
    /// window just measured: (completions per second, ns in the pool).
    fn start_probe(
        &mut self,
        pool: &mut impl Tunable,
        direction: Direction,
        (rate, latency, in_flight): (f64, f64, f64),
        target: usize,
        now: Instant,
        why: &str,
    ) {
        // Steps of an eighth, so a pool for many blocked calls gets there in
        // seconds, not minutes; up to doubling while every busy thread is
        // blocked and requests wait for one (a sleeping view under 32
        // clients took seconds to climb from one thread by eighths).
        let step = (target / 8).max(1);
        let size = match direction {
            Direction::Up => (target + step.max(self.blocked_step.min(target))).min(self.plan.max),
            Direction::Down => target.saturating_sub(step).max(self.plan.min.max(1)),
        };
        self.probe = Some(Probe {
            direction,
            previous: target,
            baseline: rate,
            baseline_latency: latency,
            baseline_in_flight: in_flight,
        });
        self.set(pool, size, now, why);
    }

    /// One tick, between the loop's passes while calls are in flight: the
    /// rules of the module docs in the order they run. Starvation is
    /// judged on every tick; the rest only when a window closes, and the
    /// first of them that moves the pool ends the tick. On a closed
    /// window, loop calls against the pool come first (a window of the
    /// mode's is not one of the pool's), then hill climbing's verdict on a
    /// trial in progress, the worker's share of the CPUs, spare threads
    /// for threads that block, lock contention, a new trial, and last the
    /// retirement of an idle thread.
    pub fn tick(&mut self, pool: &mut impl Tunable, now: Instant) {
        if !self.plan.adaptive {
            return;
        }
        let sample = self.sample(pool, now);
        if self.starvation(pool, &sample, now) {
            return;
        }
        let Some(window) = self.close_window(pool, &sample, now) else {
            return;
        };
        let min_threads = self.plan.initial.max(self.plan.min.max(1));
        if self
            .mode
            .window(&window.calls, pool, self.probe.is_some(), min_threads, now)
        {
            return;
        }
        if self.recheck_step_down(pool, &window, now) || self.judge_probe(pool, &window, now) {
            return;
        }
        if self.shed_over_share(pool, &window, now) || self.keep_spare_threads(pool, &window, now) {
            return;
        }
        if self.lock_contention(pool, &window, now) || self.try_probe(pool, &window, now) {
            return;
        }
        self.retire_if_idle(pool, now);
    }

    /// What this tick reads of the pool, with the window's running counts
    /// and averages brought up to now; a fresh window first, where there
    /// is none yet or the last tick was a window ago.
    fn sample(&mut self, pool: &mut impl Tunable, now: Instant) -> Sample {
        // The event loop ticks the controller only while calls are in
        // flight, so a gap between ticks is idle time, and before the first
        // tick there is only the worker's start. A window closed across
        // either measured the idle seconds' rate, and the pool's clocks
        // from before its threads ran: a step up judged against that rate
        // looked like a gain, and a window without the threads' clocks gave
        // room for a thread past the worker's share (a second worker whose
        // first connections came seconds after the first worker's tried a
        // second thread for a GIL-holding view at once, and kept it a
        // window). Windows span only busy time.
        if !self.window_open || now.saturating_duration_since(self.last_tick) >= WINDOW {
            self.restart_window(pool, now);
            if self.probe.is_none() {
                self.retire_if_idle(pool, now);
            }
        }
        let completed = pool.completed();
        if completed != self.last_completed {
            self.last_completed = completed;
            self.last_progress = now;
        }
        let (queued, busy) = pool.load();
        let (live, target) = pool.size();
        let in_flight = pool.in_flight();
        if self.mode.measured() {
            self.peak_in_flight = self.peak_in_flight.max(in_flight);
        }
        self.peak_busy = self.peak_busy.max(busy);
        let dt = now
            .saturating_duration_since(self.last_tick)
            .min(TICK_GAP_MAX)
            .as_nanos() as f64;
        self.last_tick = now;
        self.busy_ns += busy as f64 * dt;
        self.in_flight_ns += in_flight as f64 * dt;
        // A backlog only counts when no thread is free to take it: a job
        // caught between submit and pickup (one client, a descheduled thread
        // on a busy machine) is not a reason to add threads, and counting it
        // let noise in the completion rate ratchet the pool upwards.
        if queued > live.saturating_sub(busy) {
            self.last_needed = now;
            self.queued_in_window = true;
        }
        // Every thread busy is not idle either: eight clients on eight
        // threads queue nothing, and retiring one makes them wait. Nor is
        // a pool whose spare threads (for views that block) were taken.
        if busy + self.spare >= live && live > 0 {
            self.last_needed = now;
        }
        Sample {
            completed,
            queued,
            busy,
            live,
            target,
        }
    }

    /// Starvation (rule 1), once the clocks say the busy threads sleep:
    /// requests queued, every thread busy and nothing completed for
    /// `STALL`, then the busy threads not runnable for `STALL_CONFIRM`
    /// more, add a thread. True when it did, which ends the tick.
    fn starvation(&mut self, pool: &mut impl Tunable, sample: &Sample, now: Instant) -> bool {
        let &Sample {
            queued,
            busy,
            live,
            target,
            ..
        } = sample;
        let stalled = queued > 0
            && busy >= live
            && now.duration_since(self.last_progress) >= STALL
            && target < self.plan.max;
        if !stalled {
            self.stall_mark = None;
            return false;
        }
        let grow = match (self.stall_mark, pool.thread_clock()) {
            (_, None) => Some(true),
            (None, Some(clock)) => {
                self.stall_mark = Some((now, clock));
                None
            }
            (Some((at, before)), Some(clock)) if now.duration_since(at) >= STALL_CONFIRM => {
                self.stall_mark = None;
                let runnable = (clock.ran + clock.waited).saturating_sub(before.ran + before.waited)
                    as f64
                    / now.duration_since(at).as_nanos().max(1) as f64;
                Some(runnable < STALL_RUNNABLE)
            }
            _ => None,
        };
        match grow {
            Some(true) => {
                self.probe = None;
                self.set(
                    pool,
                    target + 1,
                    now,
                    "requests waiting, every thread blocked",
                );
                self.last_progress = now;
                true
            }
            Some(false) => {
                self.stalls_runnable += 1;
                self.last_progress = now;
                false
            }
            None => false,
        }
    }

    /// The window close: once the window is `WINDOW` long, or `WINDOW_MIN`
    /// with `WINDOW_COMPLETIONS` in it, what it measured, for the rules
    /// that judge on it; the worker's load goes to its siblings, and the
    /// next window starts. None while the window stays open.
    fn close_window(
        &mut self,
        pool: &impl Tunable,
        sample: &Sample,
        now: Instant,
    ) -> Option<Closed> {
        let target = sample.target;
        let open_for = now.duration_since(self.window.at);
        // A window measuring loop calls fills with them as well.
        let counted = if self.mode.measured() {
            let start = &self.window.counters;
            pool.served()
                .saturating_sub(start.completed + start.loop_calls)
        } else {
            sample
                .completed
                .saturating_sub(self.window.counters.completed)
        };
        if open_for < WINDOW && (open_for < WINDOW_MIN || counted < WINDOW_COMPLETIONS) {
            return None;
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
        let window_ns = seconds.max(1e-3) * 1e9;
        let cpus = self.plan.cpus.max(1) as f64;
        let cpu_used = end.cpu_ns.saturating_sub(start.cpu_ns) as f64 / window_ns;
        let cpu_share = cpu_used / cpus;
        let busy_threads = std::mem::take(&mut self.busy_ns) / window_ns;
        let in_flight = std::mem::take(&mut self.in_flight_ns) / window_ns;
        let threads = match (start.clock, end.clock) {
            (Some(a), Some(b)) => {
                let ran = b.ran.saturating_sub(a.ran) as f64 / window_ns;
                let waiting = b.waited.saturating_sub(a.waited) as f64 / window_ns;
                let lock = end.lock_wait_ns.saturating_sub(start.lock_wait_ns) as f64 / window_ns;
                Some(Threads {
                    runnable: ran + waiting,
                    waiting,
                    blocked: (busy_threads - ran - waiting - lock).max(0.0),
                })
            }
            _ => None,
        };
        // What this worker's threads want of the CPUs, for the siblings,
        // and its share of them: every usable CPU without siblings that
        // measured lately, else at least an equal split.
        let demand = cpu_used + threads.map_or(0.0, |t| t.waiting);
        pool.publish(cpu_used, demand, target);
        let siblings = pool.siblings().filter(|s| s.workers > 0);
        let share = match siblings {
            Some(s) => {
                let equal = cpus / (s.workers + 1) as f64;
                let total = demand + s.demand;
                if total > 0.0 {
                    (cpus * demand / total).max(equal)
                } else {
                    equal
                }
            }
            None => cpus,
        };
        let waits_for_cpu =
            threads.is_some_and(|t| t.runnable >= 0.5 && t.waiting >= CPU_WAIT * t.runnable);
        let peak_busy = std::mem::take(&mut self.peak_busy);
        let blocking =
            threads.is_some_and(|t| t.blocked >= 0.5 && t.blocked >= BLOCKED_SHARE * busy_threads);
        // The plugin's process-wide lock is the resource a lock-holding view
        // saturates, whatever the CPUs do: on a worker with two CPUs a
        // GIL-holding view uses one, so without this the pool started at
        // two threads was never stepped down, and two threads served
        // 0.80-0.95x of one (measured, 1 ms of Python per request, c8 and
        // c32) with a second thread only queueing for the lock. Not for a
        // pool whose threads block: there lock waits are the wake-ups of
        // threads back from their I/O, and a trial at fewer threads makes
        // requests wait a whole call.
        let lock_bound = !blocking && lock_share >= LOCK_NO_GROW;
        let saturated = cpu_share >= CPU_SATURATED
            || siblings.is_some_and(|s| (cpu_used + s.cpu) / cpus >= CPU_SATURATED)
            || waits_for_cpu
            || lock_bound;
        self.blocked_step = if blocking {
            (in_flight - busy_threads).max(0.0).round() as usize
        } else {
            0
        };
        self.spare = if blocking { spare_threads(target) } else { 0 };
        // Workers started together close their first windows together, and
        // the first to close one finds no sibling on the page: its share is
        // then every CPU. A step up taken on that (each fresh two-worker
        // process tried a second thread for a GIL-holding view, and lost,
        // inside the measured seconds) waits one window for the siblings'
        // numbers; a sibling that still has none is idle, and the CPUs are
        // this worker's.
        let unseen = self.plan.workers > 1 && siblings.is_none();
        let wait_for_siblings = unseen && !self.siblings_unseen;
        self.siblings_unseen = unseen;
        // Room for another runnable thread in the share, or threads that
        // block: what a step up can help with. The worker's own demand
        // counts the thread leading the loop too, which computes loop
        // calls beside the pool.
        let cpu_room = threads.is_none_or(|t| t.runnable.max(demand) + 1.0 <= share + OVER_SHARE);
        let blocked = threads.is_some_and(|t| t.blocked >= 0.5);
        let held_for_siblings = wait_for_siblings && cpu_room && !blocked;
        let up_room = blocked || (cpu_room && !wait_for_siblings);
        // Mean time a request spent in the pool (queued + served).
        let latency = (service + end.queue_wait_ns.saturating_sub(start.queue_wait_ns) as f64)
            / completions.max(1) as f64;
        // Every call served, loop calls too, for the mode's judgement.
        let served = (end.completed + end.loop_calls) - (start.completed + start.loop_calls);
        let calls = mode::Window {
            rate: served as f64 / seconds.max(1e-3),
            completions: served,
            peak_in_flight: std::mem::take(&mut self.peak_in_flight),
            loop_share: (end.loop_calls - start.loop_calls) as f64 / served.max(1) as f64,
        };
        Some(Closed {
            target,
            queued_in_window,
            completions,
            rate,
            latency,
            in_flight,
            busy_threads,
            peak_busy,
            lock_share,
            cpus,
            demand,
            share,
            siblings,
            threads,
            waits_for_cpu,
            blocking,
            saturated,
            up_room,
            held_for_siblings,
            calls,
        })
    }

    /// Hill climbing (rule 3): a step down that lost, judged again on the
    /// window after going back. True when the pool returned to the smaller
    /// size, which ends the tick.
    fn recheck_step_down(
        &mut self,
        pool: &mut impl Tunable,
        window: &Closed,
        now: Instant,
    ) -> bool {
        let &Closed {
            target,
            rate,
            latency,
            blocking,
            ..
        } = window;
        if let Some(r) = self.recheck.take()
            && target > r.size
            && !blocking
            && fewer_served_as_much((r.rate, r.latency), (rate, latency), r.step_share)
        {
            // The larger pool did no better than the trial: the machine
            // slowed down under the trial (other tenants), not the pool.
            // Judged on its window alone, such a trial left a GIL-holding
            // view on two threads for up to `LOST_MEMORY` (x1 unpinned: three
            // runs of eighteen ended on two threads, 4-7 s of lock waits).
            self.lost[Direction::Down as usize] = None;
            self.cooldown = COOLDOWN_MIN;
            self.next_probe = now + self.cooldown;
            let why = format!(
                "fewer threads served as much: {:.0}/s vs {rate:.0}/s after going back, {:.2} vs {:.2} ms in the pool",
                r.rate,
                r.latency / 1e6,
                latency / 1e6
            );
            self.set(pool, r.size, now, &why);
            return true;
        }
        false
    }

    /// Hill climbing (rule 3): a probe's verdict on the window it ran.
    /// Kept, the next step the same way while it pays; lost, back to the
    /// size before it, remembered, and a longer wait. True when a probe
    /// was judged, which ends the tick.
    fn judge_probe(&mut self, pool: &mut impl Tunable, window: &Closed, now: Instant) -> bool {
        let Some(probe) = self.probe.take() else {
            return false;
        };
        let &Closed {
            target,
            queued_in_window,
            completions,
            rate,
            latency,
            in_flight,
            lock_share,
            saturated,
            up_room,
            ..
        } = window;
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
                    && fewer_served_as_much(
                        (rate, latency),
                        (probe.baseline, probe.baseline_latency),
                        share,
                    )
            }
        };
        if kept {
            self.cooldown = COOLDOWN_MIN;
            // Keep going the same way while it pays.
            let (more, why) = match probe.direction {
                Direction::Up => (
                    queued_in_window && target < self.plan.max && up_room,
                    "more threads raised throughput",
                ),
                Direction::Down => (
                    target > self.plan.min.max(1) && saturated,
                    "fewer threads served as much",
                ),
            };
            if more {
                self.start_probe(
                    pool,
                    probe.direction,
                    (rate, latency, in_flight),
                    target,
                    now,
                    why,
                );
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
            if probe.direction == Direction::Down {
                self.recheck = Some(Recheck {
                    size: target,
                    rate,
                    latency,
                    step_share: share,
                });
            }
            self.lost[probe.direction as usize] = Some(Lost {
                from: probe.previous,
                in_flight: probe.baseline_in_flight,
                rate: probe.baseline,
                at: now,
            });
            self.next_probe = now + self.cooldown;
            self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
            self.next_direction = match probe.direction {
                Direction::Up => Direction::Down,
                Direction::Down => Direction::Up,
            };
        }
        true
    }

    /// Over its share: runnable threads past the worker's share of the
    /// CPUs, waiting for a CPU, are shed without a probe, keeping the share
    /// and the threads that block. True when it shed, which ends the tick.
    fn shed_over_share(&mut self, pool: &mut impl Tunable, window: &Closed, now: Instant) -> bool {
        let &Closed {
            target,
            cpus,
            share,
            siblings,
            threads,
            waits_for_cpu,
            blocking,
            ..
        } = window;
        // Not in a pool whose threads mostly block: there a few are
        // runnable at a time, just woken, and shedding fought the spare
        // threads (36 and 37 threads for 32 sleeping clients, in turn).
        if let Some(t) = threads
            && !blocking
            && t.runnable > share + OVER_SHARE
            && waits_for_cpu
            && target > self.plan.min.max(1)
        {
            let excess = ((t.runnable - share).floor() as usize).max(1);
            let why = match siblings {
                Some(s) => format!(
                    "{} workers share {cpus:.0} CPU(s): {:.1} runnable thread(s) here, {:.0}% of their time \
                     waiting for a CPU, for a share of {share:.1} CPU(s) ({:.1} wanted by the siblings); \
                     {:.1} blocked",
                    s.workers + 1,
                    t.runnable,
                    100.0 * t.waiting / t.runnable.max(1e-9),
                    s.demand,
                    t.blocked
                ),
                None => format!(
                    "{:.1} runnable thread(s) on {cpus:.0} usable CPU(s), {:.0}% of their time waiting \
                     for one; {:.1} blocked",
                    t.runnable,
                    100.0 * t.waiting / t.runnable.max(1e-9),
                    t.blocked
                ),
            };
            self.set(pool, target.saturating_sub(excess), now, &why);
            self.next_probe = now + self.cooldown;
            return true;
        }
        false
    }

    /// Spare threads for a pool whose threads block: one in eight past the
    /// most that were busy at a tick, added without a probe. True when it
    /// added them, which ends the tick.
    fn keep_spare_threads(
        &mut self,
        pool: &mut impl Tunable,
        window: &Closed,
        now: Instant,
    ) -> bool {
        let &Closed {
            target,
            in_flight,
            busy_threads,
            peak_busy,
            lock_share,
            ..
        } = window;
        // When every thread was busy at some tick, the next request waits
        // for one to come back, which on a busy CPU is a scheduler's slice,
        // not the microseconds of its bookkeeping. Measured, a 5 ms sleeping
        // view at 8 clients, one worker on 2 CPUs: 8 threads p99 7.0-7.4 ms,
        // 16 threads 6.3-6.9 ms, at the same throughput. The clients bound
        // how many can be busy, so this stops one step past them. While
        // more requests wait than that, growing is the probes' part: they
        // keep threads only where they raise throughput (threads that
        // block on a lock the plugin holds across I/O would not). A probe
        // cannot see the last few threads, though: 32 clients on 31
        // threads are served at the rate of 32, one request waiting a
        // sixth of a millisecond on average, and a trial at 34 "did not
        // help".
        if self.spare > 0
            && in_flight - busy_threads <= self.spare as f64
            && peak_busy + self.spare > target
            && target < self.plan.max
            && lock_share < LOCK_NO_GROW
        {
            let size = peak_busy + self.spare;
            let why = format!(
                "{peak_busy} thread(s) busy at once, blocked: {} kept free for the next request",
                self.spare
            );
            self.set(pool, size, now, &why);
            return true;
        }
        false
    }

    /// Lock contention (rule 2): threads that spend more than
    /// `LOCK_SHRINK` of their time waiting for the plugin's process-wide
    /// lock only queue for it; one is shed (never below 2). True when it
    /// shed, which ends the tick.
    fn lock_contention(&mut self, pool: &mut impl Tunable, window: &Closed, now: Instant) -> bool {
        let &Closed {
            target, lock_share, ..
        } = window;
        if lock_share > LOCK_SHRINK && target > 2 {
            self.set(
                pool,
                target - 1,
                now,
                "threads wait on the plugin's process-wide lock",
            );
            self.next_probe = now + self.cooldown;
            return true;
        }
        false
    }

    /// Hill climbing (rule 3): once the wait since the last trial is over,
    /// try more threads while requests queue, or fewer while the CPUs are
    /// saturated (alternating after a failed trial when both apply), but
    /// not a trial that lost lately at this size and load. True when a
    /// probe started, which ends the tick.
    fn try_probe(&mut self, pool: &mut impl Tunable, window: &Closed, now: Instant) -> bool {
        let &Closed {
            target,
            queued_in_window,
            completions,
            rate,
            latency,
            in_flight,
            lock_share,
            cpus,
            demand,
            share,
            siblings,
            threads,
            saturated,
            up_room,
            held_for_siblings,
            ..
        } = window;
        if now < self.next_probe {
            return false;
        }
        let up_wanted = queued_in_window
            && lock_share < LOCK_NO_GROW
            && target < self.plan.max
            && (!saturated || now >= self.next_saturated_up);
        if up_wanted && held_for_siblings {
            self.waited_for_siblings += 1;
        }
        let mut up = up_wanted && up_room;
        let mut down = queued_in_window
            && saturated
            && completions >= DOWN_MIN_SAMPLE
            && target > self.plan.min.max(1);
        let mut skipped = false;
        for (wanted, direction) in [(&mut up, Direction::Up), (&mut down, Direction::Down)] {
            if *wanted && self.lost_lately(direction, target, in_flight, rate, now) {
                *wanted = false;
                skipped = true;
            }
        }
        if skipped && !up && !down {
            // The turn is spent: counted once per cooldown, not per window.
            self.not_repeated += 1;
            self.next_probe = now + self.cooldown;
        }
        let direction = match (up, down) {
            (true, true) => self.next_direction,
            (true, false) => Direction::Up,
            (false, true) => Direction::Down,
            (false, false) => return false,
        };
        if direction == Direction::Up && saturated {
            self.next_saturated_up = now + COOLDOWN_MAX;
        }
        // A step up says what gave it room, so that a log shows
        // why a worker tried a thread past its share.
        let why = match direction {
            Direction::Up => format!(
                "requests queue: trying more ({}; {demand:.1} CPU(s) wanted here, a share \
                 of {share:.1} of {cpus:.0}{})",
                threads.map_or("no thread clocks".into(), |t| format!(
                    "{:.1} runnable thread(s), {:.1} blocked",
                    t.runnable, t.blocked
                )),
                siblings.map_or(String::new(), |s| format!(
                    ", {:.1} wanted by {} sibling(s)",
                    s.demand, s.workers
                )),
            ),
            Direction::Down => "trying fewer".into(),
        };
        self.start_probe(
            pool,
            direction,
            (rate, latency, in_flight),
            target,
            now,
            &why,
        );
        true
    }

    /// Start a measurement window now, with nothing of the time before it.
    fn restart_window(&mut self, pool: &impl Tunable, now: Instant) {
        self.window = Mark {
            at: now,
            counters: pool.counters(),
        };
        self.window_open = true;
        self.queued_in_window = false;
        self.busy_ns = 0.0;
        self.in_flight_ns = 0.0;
        self.peak_in_flight = 0;
        self.peak_busy = 0;
        self.last_tick = now;
        self.last_completed = pool.completed();
        self.last_progress = now;
        self.stall_mark = None;
    }

    /// Retire a surplus thread once the pool has not needed it for a while.
    fn retire_if_idle(&mut self, pool: &mut impl Tunable, now: Instant) {
        let (_, target) = pool.size();
        if target > self.plan.initial
            && now.duration_since(self.last_needed) >= IDLE_RETIRE
            && now.duration_since(self.last_change) >= IDLE_RETIRE
        {
            self.set(pool, target - 1, now, "idle");
        }
    }
}

/// The step-down test: the smaller pool's (completions per second, ns in
/// the pool) against the larger one's, for a step of `step_share` of the
/// larger size. The rate may fall by a quarter of perfect scaling (at
/// least to `DOWN_KEEP`), the time in the pool grow by `DOWN_LATENCY`.
fn fewer_served_as_much(fewer: (f64, f64), more: (f64, f64), step_share: f64) -> bool {
    fewer.0 >= more.0 * DOWN_KEEP.max(1.0 - step_share / 4.0) && fewer.1 <= more.1 * DOWN_LATENCY
}

/// Threads kept free beyond the most that were busy at once, for a pool of
/// `threads` whose threads block: one in eight, at least one.
fn spare_threads(threads: usize) -> usize {
    (threads / 8).max(1)
}

#[cfg(test)]
mod tests;
