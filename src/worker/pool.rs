//! The handler pool: the threads that call the plugin.
//!
//! The event loop parses a request, pushes a `Job` and goes back to its
//! wait; a handler thread takes the job, calls the plugin, writes the
//! response itself (see `exchange.rs`) and pushes a `Completion` back. (Two
//! exceptions call the plugin on the loop's thread: inline calls, for a
//! plugin that declares it never blocks, and loop calls, on a worker with
//! one CPU, watched from here: see `pool/watch.rs`.)
//!
//! Hand-off costs no syscall while both sides are busy: a push wakes a
//! thread only when one is parked, and a completion pokes the loop's waker
//! only when the loop has announced it is about to block. Jobs are served
//! strictly in arrival order (one FIFO), so no request waits behind later
//! ones. The queue is bounded: `try_submit` refuses when it is full and the
//! loop answers 503.
//!
//! With several models (ABI 1.6) the queue takes them in turn, and two
//! rules keep a flood on one from starving another (`job_queue.rs`): a
//! lane, one thread started above the pool's size (up to `max_threads`,
//! which keeps `M0Request.thread_index` below `max_handler_threads + 1`)
//! for a model with nothing running while every thread is inside another
//! model's call; and the cap, which holds each model to its share of the
//! calls the CPUs compute at once while others are active. A lane's
//! thread is not part of the target: `size()` may show one thread more
//! while it runs, the adaptive controller never sees it as a step of its
//! own, and the thread leaves (as any surplus) once no model waits for a
//! lane. With one class (a plugin that names no models) neither applies.
//!
//! Beside the threads, under `pool/`: the size the pool starts at
//! (`sizing.rs`), the adaptive controller that moves it (`adaptive.rs`),
//! the batch former (`batching.rs`), the threads' scheduler clocks
//! (`schedstat.rs`) and the watcher of loop calls (`watch.rs`). None of
//! them names the event loop: the loop uses the pool, not the other way.

pub mod adaptive;
pub mod batching;
pub mod job_queue;
pub mod schedstat;
pub mod sizing;
pub mod watch;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::plugin::call::{
    self, CallBuffers, Callee, Completion, Job, thread_start_hook, thread_stop_hook,
};
use crate::plugin::exchange::{Outcome, Sink};
use crate::plugin::loader::Calls;
use crate::plugin::models::{CLASSES, class};

use batching::Sizes;
use job_queue::JobQueue;
use schedstat::{Clock, ThreadSet};
use watch::{IdleThread, Watch, Watcher};

/// What the pool shares with the loop and every handler thread.
pub struct Shared {
    queue: Mutex<Queue>,
    work_ready: Condvar,
    /// The thread gathering a batch waits here, until the queue holds what
    /// it waits for (see `batching::gather`).
    gathered: Condvar,
    done: Mutex<Vec<Completion>>,
    waker: mio::Waker,
    /// Set by the loop just before it blocks; a completion that finds it set
    /// pokes the waker.
    loop_parked: AtomicBool,
    callee: Callee,
    write_timeout: Option<Duration>,
    /// Set when the plugin takes batches (see `batching.rs`).
    batch: Option<batching::Limits>,
    /// The most handler threads at once, lanes included (`PoolSettings`).
    max_threads: usize,
    /// The calls the worker's CPUs compute at once, for the cap between
    /// models (`job_queue.rs`).
    slots: usize,
    stats: Stats,
    watch: Watch,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// The threads in `handler_loop`, for their schedstat.
    members: Mutex<Members>,
}

/// Kernel ids of the threads in `handler_loop`, and the last clocks of
/// those that left since the controller's last reading. A leaving thread
/// moves from one to the other under one lock, so a reading never sees it
/// in both or in neither.
#[derive(Default)]
struct Members {
    tids: Vec<i32>,
    departed: Vec<(i32, Clock)>,
}

struct Queue {
    jobs: JobQueue<Job>,
    capacity: usize,
    idle: usize,
    /// Threads that should exist; a thread above it exits after its job.
    target: usize,
    live: usize,
    busy: usize,
    /// Threads that left as surplus and are still in their stop hook:
    /// they hold their index, so no thread is started in their place yet.
    retiring: usize,
    next_index: u32,
    /// Indices of threads that have finished, lowest first.
    free_indices: BinaryHeap<Reverse<u32>>,
    stopping: bool,
    /// While the pool's one thread waits for its batch to fill (only a pool
    /// of one waits, see `handler_loop`): how many it waits for. Set only
    /// for the wait itself, so it is never left behind.
    gathering: Option<usize>,
    /// The last batch call, which sets the next one's expectation.
    last_call: Option<batching::LastCall>,
    /// Calls running on lanes: started above the target for a model that
    /// had none running (`job_queue.rs`). Threads up to `target +
    /// lane_calls` are not surplus.
    lane_calls: usize,
    /// A thread parked with jobs queued that the cap between models kept
    /// it from (never with one class): the next call to end wakes the
    /// parked threads.
    held_back: bool,
}

/// Measurements the adaptive controller and the logs read.
#[derive(Default)]
pub struct Stats {
    pub completed: AtomicU64,
    pub queue_wait_ns: AtomicU64,
    /// `queue_wait_ns` by class of job (`models::class`), for the metrics.
    pub queue_wait_by_class: [AtomicU64; CLASSES],
    pub service_ns: AtomicU64,
    pub refused: AtomicU64,
    pub thread_start_failures: AtomicU32,
    /// Requests answered by inline calls on the event loop.
    pub inline_served: AtomicU64,
    /// Inline calls that answered `M0_DEFER` and went to the pool.
    pub deferred: AtomicU64,
    /// Inline responses the socket did not take at once (flushed later).
    pub spilled: AtomicU64,
    /// Calls made by the thread leading the event loop (loop calls).
    pub loop_calls: AtomicU64,
    /// Loop calls that ran long enough for a handler thread to take the
    /// loop over.
    pub handoffs: AtomicU64,
    /// `handle_batch` calls and their sizes.
    pub batches: Sizes,
}

pub struct Pool {
    shared: Arc<Shared>,
    /// The handler threads' scheduler clocks (read by the event loop only).
    clocks: Mutex<ThreadSet>,
}

pub struct PoolSettings {
    pub threads: usize,
    pub capacity: usize,
    pub calls: Calls,
    pub server_ip: String,
    pub server_port: u16,
    pub worker_index: u32,
    pub write_timeout: Option<Duration>,
    pub batch: Option<batching::Limits>,
    /// The most handler threads at once, lanes included: thread indices
    /// stay below it plus the event loop's one when the loop calls the
    /// plugin (`worker/mod.rs` decides). At most `threads` for none.
    pub max_threads: usize,
    /// The calls the worker's CPUs compute at once (`sizing::call_slots`).
    pub slots: usize,
}

impl Pool {
    pub fn start(settings: PoolSettings, waker: mio::Waker) -> Pool {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: JobQueue::with_capacity(settings.capacity.min(4096)),
                capacity: settings.capacity,
                idle: 0,
                target: settings.threads,
                live: 0,
                busy: 0,
                retiring: 0,
                next_index: 0,
                free_indices: BinaryHeap::new(),
                stopping: false,
                gathering: None,
                last_call: None,
                lane_calls: 0,
                held_back: false,
            }),
            work_ready: Condvar::new(),
            gathered: Condvar::new(),
            done: Mutex::new(Vec::with_capacity(64)),
            waker,
            loop_parked: AtomicBool::new(false),
            callee: Callee {
                calls: settings.calls,
                server_ip: settings.server_ip,
                server_port: settings.server_port,
                worker_index: settings.worker_index,
            },
            write_timeout: settings.write_timeout,
            batch: settings.batch,
            max_threads: settings.max_threads,
            slots: settings.slots.max(1),
            stats: Stats::default(),
            watch: Watch::default(),
            handles: Mutex::new(Vec::new()),
            members: Mutex::new(Members::default()),
        });
        spawn_missing(&shared);
        Pool {
            shared,
            clocks: Mutex::new(ThreadSet::default()),
        }
    }

    /// The handler threads' summed scheduler clocks: time on a CPU and
    /// time runnable but waiting for one, running totals over every thread
    /// the pool has had. `None` without schedstat.
    pub fn thread_clock(&self) -> Option<Clock> {
        let (tids, departed) = {
            let mut m = lock(&self.shared.members);
            (m.tids.clone(), std::mem::take(&mut m.departed))
        };
        lock(&self.clocks).read(&tids, &departed)
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Threads alive and the target.
    pub fn size(&self) -> (usize, usize) {
        let q = lock(&self.shared.queue);
        (q.live, q.target)
    }

    /// Queue depth and busy threads right now.
    pub fn load(&self) -> (usize, usize) {
        let q = lock(&self.shared.queue);
        (q.jobs.len(), q.busy)
    }

    /// Change the number of handler threads (the adaptive controller).
    pub fn resize(&mut self, threads: usize) {
        {
            let mut q = lock(&self.shared.queue);
            q.target = threads.max(1);
        }
        // Threads above the target leave after their current job.
        self.shared.work_ready.notify_all();
        spawn_missing(&self.shared);
    }

    /// Queue a job; gives it back when the queue is full.
    ///
    /// A job of a model with nothing running or queued, while every thread
    /// is inside another model's call and none is parked, gets a lane: one
    /// more thread, up to `max_threads`, whose call starts now rather than
    /// when a running call ends (`job_queue.rs`). Never with one class.
    pub fn try_submit(&self, job: Job) -> Result<(), Box<Job>> {
        let c = class(job.model);
        let (wake, lane) = {
            let mut q = lock(&self.shared.queue);
            if q.jobs.len() >= q.capacity {
                self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Box::new(job));
            }
            q.jobs.push_back(job);
            if q.gathering.is_some_and(|want| q.jobs.len() >= want) {
                self.shared.gathered.notify_one();
            }
            let lane = q.idle == 0
                && q.busy >= q.live
                && !q.stopping
                && q.live + q.retiring < self.shared.max_threads
                && q.jobs.wants_lane(c);
            let index = lane.then(|| {
                q.live += 1;
                q.claim_index()
            });
            (q.idle > 0, index)
        };
        if wake {
            self.shared.work_ready.notify_one();
        }
        if let Some(index) = lane {
            spawn_thread(&self.shared, index);
        }
        Ok(())
    }

    /// Prepare the calling thread (the event loop) for inline calls: give it
    /// a thread index of its own and run the plugin's thread-start hook.
    pub fn adopt_loop_thread(&self) -> Result<u32, i32> {
        start_calling_thread(&self.shared)
    }

    /// Undo `adopt_loop_thread` on the same thread, after its last call.
    pub fn release_loop_thread(&self, index: u32) {
        thread_stop_hook(&self.shared.callee.calls, index);
        lock(&self.shared.queue).release_index(index);
    }

    /// Call the plugin for `job` on the event loop. Whatever the socket does
    /// not take lands in `spilled`; a deferred job is handed back untouched.
    pub fn call_inline(&self, job: &Job, bufs: &mut CallBuffers, spilled: &mut Vec<u8>) -> Outcome {
        let outcome = call::serve(&self.shared.callee, job, bufs, Sink::Spill(&mut *spilled));
        let stats = &self.shared.stats;
        let counter = if outcome.deferred {
            &stats.deferred
        } else {
            &stats.inline_served
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !spilled.is_empty() {
            stats.spilled.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Whether the plugin admits requests itself (`M0_CAP_ADMIT` and an
    /// `admit` in its calls table).
    pub fn has_admit(&self) -> bool {
        self.shared.callee.calls.admit.is_some()
    }

    /// Ask the plugin's `admit` about `job` on the event loop (see
    /// `call::admit`).
    pub fn admit(
        &self,
        job: &Job,
        bufs: &mut CallBuffers,
        spilled: &mut Vec<u8>,
        in_flight: u64,
    ) -> call::Admission {
        call::admit(&self.shared.callee, job, bufs, spilled, in_flight)
    }

    /// For the threads that lead the loop and call the plugin themselves.
    pub fn loop_side(&self) -> LoopSide {
        LoopSide {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Take finished exchanges (the loop, once per pass).
    pub fn drain_completions(&self, into: &mut Vec<Completion>) {
        let mut done = lock(&self.shared.done);
        std::mem::swap(&mut *done, into);
    }

    /// The loop is about to block: returns false when a completion is already
    /// waiting (then it must not block).
    pub fn park_loop(&self) -> bool {
        self.shared.loop_parked.store(true, Ordering::SeqCst);
        if !lock(&self.shared.done).is_empty() {
            self.shared.loop_parked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub fn unpark_loop(&self) {
        self.shared.loop_parked.store(false, Ordering::SeqCst);
    }

    /// After a hand-off: start a handler thread only if none is left. A
    /// thread's start hook may take a process-wide lock (the WSGI plugin's
    /// takes the GIL), which the new leader's next call then waits for:
    /// starting one per hand-off made hand-offs beget hand-offs.
    pub fn keep_one_handler(&mut self) {
        let none_left = lock(&self.shared.queue).live == 0;
        if none_left {
            spawn_missing(&self.shared);
        }
    }

    /// Join `thread` with the handler threads when the pool stops (the
    /// thread that led the loop first, which ends as a handler thread).
    pub fn adopt_thread(&mut self, thread: JoinHandle<()>) {
        lock(&self.shared.handles).push(thread);
    }

    /// Stop every thread once the queue is empty, waiting up to `timeout`
    /// for those inside the plugin. Returns how many were left behind.
    pub fn stop(&mut self, timeout: Duration) -> usize {
        {
            let mut q = lock(&self.shared.queue);
            q.stopping = true;
        }
        self.shared.work_ready.notify_all();
        self.shared.gathered.notify_all();
        let deadline = Instant::now() + timeout;
        let mut left = 0;
        let handles = std::mem::take(&mut *lock(&self.shared.handles));
        for handle in handles {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                left += 1;
            }
        }
        left
    }

    pub fn shutdown_plugin(&self) {
        if let Some(shutdown) = self.shared.callee.calls.shutdown {
            // SAFETY: the plugin's own state pointer, after its last call.
            unsafe { shutdown(self.shared.callee.calls.state) };
        }
    }
}

static FATAL_STOP: AtomicBool = AtomicBool::new(false);

/// A handler thread hit an error that ends the worker.
fn request_fatal_stop() {
    FATAL_STOP.store(true, Ordering::SeqCst);
}

/// Whether a handler thread asked for the worker to end (the loop stops).
pub fn fatal_stop_requested() -> bool {
    FATAL_STOP.load(Ordering::SeqCst)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic on another thread while holding the lock leaves plain data
    // that is still consistent (every critical section is a few field
    // updates), so keep going rather than poisoning the worker.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Queue {
    /// The next thread index: handler threads and the event loop (for
    /// inline calls) each get their own.
    ///
    /// Indices are reused, lowest first, once the thread holding one has
    /// finished its stop hook, and a thread that leaves as surplus is
    /// replaced only after that: so the indices in use are distinct and
    /// fewer than the threads calling the plugin at once, which are at most
    /// the pool's largest size plus the event loop's thread (the contract
    /// `M0Request.thread_index` documents).
    fn claim_index(&mut self) -> u32 {
        if let Some(Reverse(index)) = self.free_indices.pop() {
            return index;
        }
        self.next_index += 1;
        self.next_index - 1
    }

    /// Fewer threads than the target, counting those still retiring (they
    /// hold their index), and not stopping: a thread should be started.
    fn lacks_threads(&self) -> bool {
        self.live + self.retiring < self.target && !self.stopping
    }

    fn release_index(&mut self, index: u32) {
        self.free_indices.push(Reverse(index));
    }
}

/// Give the calling thread an index of its own and run the plugin's
/// thread-start hook on it (the error is the hook's code).
fn start_calling_thread(shared: &Shared) -> Result<u32, i32> {
    let index = lock(&shared.queue).claim_index();
    thread_start_hook(&shared.callee.calls, index)?;
    Ok(index)
}

/// Start the threads the target asks for and the pool lacks (a thread
/// that leads the loop is not counted meanwhile, and one retiring still
/// is).
/// Joins the handler threads that have left (retired as surplus). An
/// exited thread that is never joined keeps its stack mapped and its
/// descriptor allocated: with the adaptive pool stepping up and down under
/// load that was about 20 KiB of RSS and one more mapping per retired
/// thread, for the life of the worker (measured: WSGI workers grew 3 MiB a
/// minute, over a thousand stale mappings in four minutes).
fn reap_finished(handles: &mut Vec<JoinHandle<()>>) {
    let mut i = 0;
    while i < handles.len() {
        if handles[i].is_finished() {
            // A finished thread: the join returns at once. A thread that
            // panicked was already counted where it failed.
            let _ = handles.swap_remove(i).join();
        } else {
            i += 1;
        }
    }
}

fn spawn_missing(shared: &Arc<Shared>) {
    loop {
        let index = {
            let mut q = lock(&shared.queue);
            if !q.lacks_threads() {
                return;
            }
            q.live += 1;
            q.claim_index()
        };
        if !spawn_thread(shared, index) {
            return;
        }
    }
}

/// Start a handler thread with `index`, already counted in `live` by the
/// caller; false (and uncounted again) when the system refuses one.
fn spawn_thread(shared: &Arc<Shared>, index: u32) -> bool {
    let for_thread = Arc::clone(shared);
    let handle = std::thread::Builder::new()
        .name(format!("m0-handler-{index}"))
        .spawn(move || handler_thread(for_thread, index));
    match handle {
        Ok(h) => {
            let mut handles = lock(&shared.handles);
            reap_finished(&mut handles);
            handles.push(h);
            true
        }
        Err(e) => {
            crate::log::error(format_args!("cannot start handler thread {index}: {e}"));
            let mut q = lock(&shared.queue);
            q.live -= 1;
            q.release_index(index);
            false
        }
    }
}

fn handler_thread(shared: Arc<Shared>, index: u32) {
    let calls = shared.callee.calls;
    if let Err(code) = thread_start_hook(&calls, index) {
        crate::log::error(format_args!(
            "the plugin's thread_start failed on handler thread {index} (code {code}); stopping the worker"
        ));
        shared
            .stats
            .thread_start_failures
            .fetch_add(1, Ordering::Relaxed);
        request_fatal_stop();
        let _ = shared.waker.wake();
        let mut q = lock(&shared.queue);
        q.live -= 1;
        q.release_index(index);
        return;
    }
    handler_loop(&shared, CallBuffers::new(index));
}

/// Take jobs until the pool stops or has a thread too many (counted in
/// `live` by the caller), then run the thread-stop hook.
fn handler_loop(shared: &Arc<Shared>, mut bufs: CallBuffers) {
    let calls = shared.callee.calls;
    let index = bufs.index;
    let tid = bufs.tid;
    lock(&shared.members).tids.push(tid);
    let mut watcher = Watcher::default();
    // Completions pushed but not yet announced to the loop, and when the
    // first of them was pushed (see `announce`).
    let mut unannounced = 0usize;
    let mut first_unannounced = Instant::now();
    let mut counted_live = true;
    // The jobs of the call in progress: one, or a batch.
    let mut jobs: Vec<Job> = Vec::with_capacity(1);
    let mut outcomes: Vec<Outcome> = Vec::new();
    loop {
        // Set while this thread waits for its batch to fill: until when,
        // for how many.
        let mut gather: Option<(Instant, usize)> = None;
        // The class of the call taken, and whether it is a lane's.
        let mut call_class = 0;
        let mut call_lane = false;
        let took = {
            let mut q = lock(&shared.queue);
            loop {
                // Threads started for lanes are surplus too, but first
                // serve any model still waiting for its lane.
                let surplus = q.live > q.target + q.lane_calls;
                let lane = if surplus && !q.stopping {
                    q.jobs.lane_class()
                } else {
                    None
                };
                if surplus && lane.is_none() {
                    // Leave, and say so now: counted until the thread had
                    // finished its stop hook, every thread finishing a job
                    // meanwhile saw the same surplus and left too, emptying
                    // the pool until the controller noticed (a 40 ms stall).
                    q.live -= 1;
                    q.retiring += 1;
                    counted_live = false;
                    break false;
                }
                if let Some(c) = lane.or_else(|| q.jobs.next_class(shared.slots)) {
                    if let Some(limits) = shared.batch {
                        if gather.is_none() && lane.is_none() && q.target == 1 {
                            // Only a pool of one thread waits: with more,
                            // the requests that arrive later go to the
                            // next thread, beside this call. A two-thread
                            // pool that waited merged both threads' clients
                            // into one call and computed on one CPU of two
                            // (0.65x the sentences/s at 8 connections).
                            gather = batching::gather(limits, q.jobs.len(), q.last_call)
                                .map(|g| (Instant::now() + g.wait, g.want));
                        }
                        if let Some((until, want)) = gather.filter(|_| lane.is_none()) {
                            let now = Instant::now();
                            if q.jobs.len() < want && now < until && !q.stopping {
                                if unannounced > 0 {
                                    // The clients the last call answered
                                    // are what it waits for: the loop must
                                    // know them done to read their next
                                    // requests.
                                    announce(shared);
                                    unannounced = 0;
                                }
                                q.gathering = Some(want);
                                q = shared
                                    .gathered
                                    .wait_timeout(q, until - now)
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                                q.gathering = None;
                                continue;
                            }
                        }
                        if let Some((_, want)) = gather {
                            shared.stats.batches.record_wait(q.jobs.len() >= want);
                        }
                        q.jobs.take_batch(c, limits, &mut jobs);
                    } else {
                        jobs.extend(q.jobs.pop_next(c));
                    }
                    q.jobs.started(c);
                    q.busy += 1;
                    q.lane_calls += usize::from(lane.is_some());
                    (call_class, call_lane) = (c, lane.is_some());
                    watcher.step_down(&shared.watch);
                    break true;
                }
                if q.stopping {
                    break false;
                }
                if unannounced > 0 {
                    // Never park on completions the loop has not heard of.
                    drop(q);
                    announce(shared);
                    unannounced = 0;
                    q = lock(&shared.queue);
                    continue;
                }
                if !q.jobs.is_empty() {
                    // Jobs the cap between models keeps from this thread.
                    q.held_back = true;
                }
                let mut idle = PoolIdle { shared, q: Some(q) };
                watcher.idle_wait(&shared.watch, &mut idle, &mut bufs);
                q = idle.into_guard();
            }
        };
        if !took {
            break;
        }
        let started = Instant::now();
        if unannounced > 0 && started - first_unannounced >= ANNOUNCE_AFTER {
            // This call may be slow: do not let earlier completions wait on it.
            announce(shared);
            unannounced = 0;
        }
        let waited: u64 = jobs
            .iter()
            .map(|job| duration_ns(started - job.queued_at))
            .sum();
        shared
            .stats
            .queue_wait_ns
            .fetch_add(waited, Ordering::Relaxed);
        // Every job of a call is of one model (`job_queue.rs`).
        shared.stats.queue_wait_by_class[call_class].fetch_add(waited, Ordering::Relaxed);
        serve_counted(shared, &jobs, &mut bufs, &mut outcomes);
        let (size, took) = (jobs.len(), started.elapsed());
        if unannounced == 0 {
            first_unannounced = started;
        }
        unannounced += jobs.len();
        lock(&shared.done).extend(
            jobs.drain(..)
                .zip(outcomes.drain(..))
                .map(|(job, outcome)| Completion { job, outcome }),
        );
        let (more_queued, wake_held) = {
            let mut q = lock(&shared.queue);
            q.busy -= 1;
            q.jobs.finished(call_class);
            q.lane_calls -= usize::from(call_lane);
            q.last_call = Some(batching::LastCall {
                size,
                took,
                behind: q.jobs.len(),
            });
            let more = !q.jobs.is_empty();
            // A model's call ended: what the cap held back may start now.
            let wake = std::mem::take(&mut q.held_back) && more && q.idle > 0;
            (more, wake)
        };
        if wake_held {
            shared.work_ready.notify_all();
        }
        if !more_queued || unannounced >= ANNOUNCE_BATCH {
            announce(shared);
            unannounced = 0;
        }
    }
    if unannounced > 0 {
        announce(shared);
    }
    if watcher.step_down(&shared.watch) {
        shared.work_ready.notify_one();
    }
    {
        let last_clock = schedstat::own_clock();
        let mut m = lock(&shared.members);
        m.tids.retain(|&t| t != tid);
        // Only the adaptive controller reads (and so empties) the list, and
        // only it retires threads; the bound is for a pool that is never read.
        if let Some(clock) = last_clock.filter(|_| m.departed.len() < 1024) {
            m.departed.push((tid, clock));
        }
    }
    thread_stop_hook(&calls, index);
    let owed = {
        let mut q = lock(&shared.queue);
        if counted_live {
            q.live -= 1;
        } else {
            q.retiring -= 1;
        }
        q.release_index(index);
        q.lacks_threads()
    };
    if owed {
        // The pool grew again while this thread retired: start the thread
        // that waited for its index.
        spawn_missing(shared);
    }
}

/// The pool as loop calls use it (see `worker/event_loop/loop_calls/`): the whole of
/// what they may do to it.
#[derive(Clone)]
pub struct LoopSide {
    shared: Arc<Shared>,
}

impl LoopSide {
    /// Give the calling thread an index of its own and run the plugin's
    /// thread-start hook on it (the error is the hook's code).
    pub fn start_calling_thread(&self) -> Result<CallBuffers, i32> {
        start_calling_thread(&self.shared).map(CallBuffers::new)
    }

    /// Work as an ordinary handler thread from now on.
    pub fn serve_as_handler(&self, bufs: CallBuffers) {
        lock(&self.shared.queue).live += 1;
        handler_loop(&self.shared, bufs);
    }

    pub fn watch(&self) -> &Watch {
        &self.shared.watch
    }

    /// Ask an idle thread to watch the loop's calls.
    pub fn want_watcher(&self) {
        want_watcher(&self.shared);
    }

    /// A loop call. Not timed, nor counted in `completed`: the adaptive
    /// controller sizes the pool from the pool's own calls.
    pub fn call(&self, job: &Job, bufs: &mut CallBuffers) -> Outcome {
        let shared = &self.shared;
        let outcome = call::serve(&shared.callee, job, bufs, Sink::Wait(shared.write_timeout));
        shared.stats.loop_calls.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    pub fn count_handoff(&self) {
        self.shared.stats.handoffs.fetch_add(1, Ordering::Relaxed);
    }

    /// Queue calls a leader did not make (they were admitted already, so
    /// past the queue's bound) and post completions for the loop.
    pub fn give_back(&self, rest: impl Iterator<Item = Job>, done: &mut Vec<Completion>) {
        // They were dispatched before anything the new leader has queued
        // since it took the loop over (a batch of loop calls is made only
        // while the pool has nothing in flight): at the front, in order, or
        // they would wait behind every later request (the fairness test saw
        // two requests overtaken by 58).
        let rest: Vec<Job> = rest.collect();
        let woken = rest.len();
        {
            let mut q = lock(&self.shared.queue);
            for job in rest.into_iter().rev() {
                q.jobs.push_front(job);
            }
        }
        for _ in 0..woken.min(4) {
            self.shared.work_ready.notify_one();
        }
        lock(&self.shared.done).append(done);
        announce(&self.shared);
    }

    /// A handler thread leads the loop: not counted as a handler meanwhile.
    pub fn enter_leading(&self) {
        lock(&self.shared.queue).live -= 1;
    }

    pub fn leave_leading(&self) {
        lock(&self.shared.queue).live += 1;
    }
}

/// Stored under the queue lock, so a thread about to wait either sees it
/// or is already waiting for the notify.
fn want_watcher(shared: &Shared) {
    {
        let _q = lock(&shared.queue);
        shared.watch.want_watcher();
    }
    shared.work_ready.notify_one();
}

/// An idle handler thread's wait, as the loop calls' watcher drives it.
struct PoolIdle<'a> {
    shared: &'a Shared,
    /// Held except while the thread leads the loop.
    q: Option<MutexGuard<'a, Queue>>,
}

impl<'a> PoolIdle<'a> {
    fn into_guard(mut self) -> MutexGuard<'a, Queue> {
        self.guard()
    }

    fn guard(&mut self) -> MutexGuard<'a, Queue> {
        self.q.take().unwrap_or_else(|| lock(&self.shared.queue))
    }
}

impl IdleThread for PoolIdle<'_> {
    fn wait(&mut self) {
        let mut q = self.guard();
        q.idle += 1;
        q = self
            .shared
            .work_ready
            .wait(q)
            .unwrap_or_else(|e| e.into_inner());
        q.idle -= 1;
        self.q = Some(q);
    }

    fn wait_tick(&mut self, tick: Duration) -> bool {
        let mut q = self.guard();
        q.idle += 1;
        let (mut q, waited) = self
            .shared
            .work_ready
            .wait_timeout(q, tick)
            .unwrap_or_else(|e| e.into_inner());
        q.idle -= 1;
        let passed = waited.timed_out() && !q.stopping;
        self.q = Some(q);
        passed
    }

    fn lead(&mut self, f: &mut dyn FnMut()) {
        drop(self.q.take());
        want_watcher(self.shared);
        f();
        self.q = Some(lock(&self.shared.queue));
    }
}

/// Completions are announced to the loop in batches: while more jobs are
/// queued, a handler thread keeps working and tells the loop once the queue
/// is empty, after `ANNOUNCE_BATCH` completions, or before a job that starts
/// `ANNOUNCE_AFTER` after an unannounced completion. The responses are
/// already on the wire; the loop only needs the completions to read the
/// next requests. On a busy core this turns one loop wake-up per request
/// into one per batch.
const ANNOUNCE_BATCH: usize = 16;
const ANNOUNCE_AFTER: Duration = Duration::from_micros(200);

/// Poke the loop if it is parked (it drains completions every pass).
fn announce(shared: &Shared) {
    if shared.loop_parked.swap(false, Ordering::SeqCst) {
        let _ = shared.waker.wake();
    }
}

fn duration_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// Call the plugin for `jobs` on a handler thread (one `handle_batch` call
/// when the plugin batches, else `handle` for the one job), and count it:
/// a batch is one call to the adaptive pool, and each of its requests one
/// completion.
fn serve_counted(shared: &Shared, jobs: &[Job], bufs: &mut CallBuffers, out: &mut Vec<Outcome>) {
    let started = Instant::now();
    let sink = Sink::Wait(shared.write_timeout);
    match (shared.batch, jobs) {
        (None, [job]) => out.push(call::serve(&shared.callee, job, bufs, sink)),
        _ => {
            call::serve_batch(&shared.callee, jobs, bufs, shared.write_timeout, out);
            // A batch holds one model's jobs (`job_queue.rs`).
            shared.stats.batches.record(jobs[0].model, jobs.len());
        }
    }
    let stats = &shared.stats;
    stats
        .service_ns
        .fetch_add(duration_ns(started.elapsed()), Ordering::Relaxed);
    stats
        .completed
        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use m0serve_abi as abi;
    use std::ffi::c_void;
    use std::sync::atomic::AtomicUsize;

    static STOPPED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn never_called(
        _: *mut c_void,
        _: *const abi::M0Request,
        _: *mut abi::M0Response,
    ) -> i32 {
        abi::M0_ERR_INTERNAL
    }

    /// A stop hook that takes a while, as the WSGI plugin's does when it
    /// waits for the GIL: the window in which surplus used to be miscounted.
    unsafe extern "C" fn slow_stop(_: *mut c_void, _: u32) {
        std::thread::sleep(Duration::from_millis(100));
        STOPPED.fetch_add(1, Ordering::SeqCst);
    }

    fn test_pool(threads: usize, calls: Calls) -> Pool {
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
        Pool::start(
            PoolSettings {
                threads,
                capacity: 16,
                calls,
                server_ip: "127.0.0.1".into(),
                server_port: 0,
                worker_index: 0,
                write_timeout: None,
                batch: None,
                max_threads: threads,
                slots: threads,
            },
            waker,
        )
    }

    #[test]
    fn shrinking_retires_only_the_surplus() {
        let calls = Calls {
            handle: never_called,
            thread_start: None,
            thread_stop: Some(slow_stop),
            handle_batch: None,
            shutdown: None,
            admit: None,
            state: std::ptr::null_mut(),
        };
        let mut pool = test_pool(4, calls);
        // Let all four threads park, then ask for one.
        while lock(&pool.shared.queue).idle < 4 {
            std::thread::sleep(Duration::from_millis(5));
        }
        pool.resize(1);
        while STOPPED.load(Ordering::SeqCst) < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Every woken thread saw the surplus; exactly three may act on it.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(STOPPED.load(Ordering::SeqCst), 3);
        assert_eq!(pool.size(), (1, 1));
        assert_eq!(lock(&pool.shared.queue).idle, 1);
        pool.stop(Duration::from_secs(5));
        assert_eq!(STOPPED.load(Ordering::SeqCst), 4);
    }

    /// Indices in use by the `reuse` test's threads, and the highest seen.
    static IN_USE: [AtomicBool; 256] = [const { AtomicBool::new(false) }; 256];
    static HIGHEST: AtomicU32 = AtomicU32::new(0);
    static CLASHES: AtomicU32 = AtomicU32::new(0);

    unsafe extern "C" fn track_start(_: *mut c_void, index: u32) -> i32 {
        let i = (index as usize).min(255);
        if IN_USE[i].swap(true, Ordering::SeqCst) {
            CLASHES.fetch_add(1, Ordering::SeqCst);
        }
        HIGHEST.fetch_max(index, Ordering::SeqCst);
        abi::M0_OK
    }

    /// Slow, as the WSGI plugin's is when it waits for the GIL: threads
    /// that leave as surplus hold their index meanwhile.
    unsafe extern "C" fn track_stop(_: *mut c_void, index: u32) {
        std::thread::sleep(Duration::from_millis(20));
        IN_USE[(index as usize).min(255)].store(false, Ordering::SeqCst);
    }

    #[test]
    fn thread_indices_are_reused_and_stay_below_the_largest_size() {
        let calls = Calls {
            handle: never_called,
            thread_start: Some(track_start),
            thread_stop: Some(track_stop),
            handle_batch: None,
            shutdown: None,
            admit: None,
            state: std::ptr::null_mut(),
        };
        let mut pool = test_pool(2, calls);
        let settled = |pool: &Pool, n: usize| {
            while pool.size() != (n, n) || lock(&pool.shared.queue).retiring > 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        for _ in 0..15 {
            pool.resize(8);
            settled(&pool, 8);
            // Shrink, and grow again as soon as the surplus has left: it
            // is still in its stop hook when the pool asks for threads.
            pool.resize(1);
            while pool.size().0 > 1 {
                std::thread::yield_now();
            }
            pool.resize(8);
            settled(&pool, 8);
        }
        // The threads that left were joined as new ones started: at most
        // the live eight and the last round's seven leavers are held (all
        // 113 started without the reaping).
        let held = lock(&pool.shared.handles).len();
        assert!(held <= 15, "{held} thread handles held for a pool of 8");
        pool.stop(Duration::from_secs(5));
        // 15 rounds started over 100 threads; without reuse the indices
        // would have grown past 100.
        assert!(
            HIGHEST.load(Ordering::SeqCst) < 8,
            "highest thread index {} for a pool of at most 8",
            HIGHEST.load(Ordering::SeqCst)
        );
        assert_eq!(CLASHES.load(Ordering::SeqCst), 0, "an index held twice");
    }
}
