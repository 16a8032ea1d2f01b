//! The process's compute threads, shared by every forward pass of every
//! model in it.
//!
//! A pass runs on the thread that asked for it (a handler thread of the
//! server's pool) and splits its products, attention heads and row-wise
//! work over helpers when CPUs are free: [`Pass::threads`] divides the
//! CPUs this process may use ([`share_cpus`]) by the passes running at that
//! moment, and a pass asks again before each layer. So a lone request
//! computes on every core, and under load each batch keeps one thread, as
//! many batches at once as there are CPUs.
//!
//! Helpers only ever run pieces of a split (never a whole pass): a pass
//! waiting for its pieces cannot pick up another pass and finish late
//! behind it, which a pass running inside a work-stealing pool could.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle helper watches for the next split before it sleeps. A
/// pass posts its splits microseconds apart (one per product, per layer),
/// and waking a sleeping thread costs more than that, most on a virtual
/// machine; past this an idle helper costs nothing. Only a worker whose
/// passes split (a lone pass) spins: under load every pass computes alone.
const HELPER_SPIN: Duration = Duration::from_micros(300);

/// How long a pass watches for its helpers' last pieces before it sleeps
/// (their pieces are as long as its own, so they end about together).
const PASS_SPIN: Duration = Duration::from_micros(100);

/// CPUs the passes of this process share; 0 until [`share_cpus`]: then
/// the CPUs the process may run on.
static CPUS: AtomicUsize = AtomicUsize::new(0);

/// Passes computing now, in this process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// The helpers' board: one fewer helpers than the CPUs shared, the pass's
/// own thread being the last. `None` when none could be started (passes
/// then compute on their own thread).
static TEAM: OnceLock<Option<&'static Team>> = OnceLock::new();

/// Sets the CPUs the passes of this process share (a server's worker: its
/// part of the CPUs). Call it before the first pass: the helpers are
/// started for the CPUs known at the first split.
pub fn share_cpus(cpus: usize) {
    CPUS.store(cpus.max(1), Ordering::Relaxed);
}

/// The CPUs shared ([`share_cpus`], else the process's).
pub(crate) fn shared_cpus() -> usize {
    match CPUS.load(Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// One forward pass's claim on the CPUs, from its start to its end (drop).
pub(crate) struct Pass {
    /// Most threads it uses.
    cap: usize,
    /// Counted among the running passes (not a test's fixed split).
    counted: bool,
}

impl Pass {
    /// A pass starting now, using at most `cap` threads.
    pub(crate) fn begin(cap: usize) -> Pass {
        ACTIVE.fetch_add(1, Ordering::Relaxed);
        Pass {
            cap: cap.max(1),
            counted: true,
        }
    }

    /// Always `threads` threads, whatever else runs.
    #[cfg(test)]
    pub(crate) fn fixed(threads: usize) -> Pass {
        Pass {
            cap: threads.max(1),
            counted: false,
        }
    }

    /// Threads for the pass's next step: its part of the shared CPUs while
    /// others compute, at most its cap, at least 1.
    pub(crate) fn threads(&self) -> usize {
        if !self.counted || self.cap == 1 {
            return self.cap;
        }
        let active = ACTIVE.load(Ordering::Relaxed).max(1);
        (shared_cpus() / active).clamp(1, self.cap)
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if self.counted {
            ACTIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The split work `f`, its borrow's lifetime erased so that helpers can
/// hold the job ([`each`] says why that is sound).
type Piece = &'static (dyn Fn(usize) + Sync);

/// One split posted by a pass: the indices 0..n of `f`, each taken once by
/// whichever thread asks next.
struct Job {
    f: Piece,
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Helpers that may still join (the split's threads less the pass's).
    seats: AtomicUsize,
    /// A helper's piece panicked (its message went to stderr then).
    panicked: AtomicBool,
    /// The pass's thread, woken when the last piece is done.
    waiter: Thread,
}

impl Job {
    /// Runs the next index until none is left; the first panic's payload
    /// (the rest run on, so that every index is done once).
    fn work(&self) -> Option<Box<dyn Any + Send>> {
        let mut first = None;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return first;
            }
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.f)(i))) {
                self.panicked.store(true, Ordering::Relaxed);
                first.get_or_insert(payload);
            }
            // Release: the piece's writes are seen by the pass that sees
            // the count.
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
                self.waiter.unpark();
            }
        }
    }

    /// A helper may join: a seat left and an index not yet taken.
    fn seat(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.n
            && self
                .seats
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1))
                .is_ok()
    }

    /// Until every index is done: spinning a while, then asleep until the
    /// thread that ends the last piece wakes this one.
    fn wait(&self) {
        let since = Instant::now();
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) < self.n {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || since.elapsed() < PASS_SPIN {
                std::hint::spin_loop();
            } else {
                // A wake-up given before this sleep is kept, so none is
                // lost; the timeout only bounds a stray early one.
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
    }
}

/// The splits open now, and how helpers learn of a new one.
struct Team {
    board: Mutex<Board>,
    wake: Condvar,
    /// Bumped at each post: spinning helpers watch it.
    posted: AtomicU64,
}

#[derive(Default)]
struct Board {
    open: Vec<Arc<Job>>,
    sleeping: usize,
}

impl Team {
    fn board(&self) -> MutexGuard<'_, Board> {
        // A panic never happens under this lock (only pushes, removes and
        // counts), so a poisoned board is still whole.
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post(&self, job: &Arc<Job>) {
        let mut b = self.board();
        b.open.push(Arc::clone(job));
        self.posted.fetch_add(1, Ordering::Release);
        if b.sleeping > 0 {
            self.wake.notify_all();
        }
    }

    fn withdraw(&self, job: &Arc<Job>) {
        self.board().open.retain(|j| !Arc::ptr_eq(j, job));
    }

    /// A split this helper may join, if any.
    fn take(&self) -> Option<Arc<Job>> {
        self.board().open.iter().find(|j| j.seat()).cloned()
    }

    /// A helper's life: join splits while there are, watch for the next a
    /// while, then sleep until one is posted.
    fn help(&self) {
        let mut seen = self.posted.load(Ordering::Acquire);
        loop {
            if let Some(job) = self.take() {
                // Its panic was printed by the hook; the pass re-raises.
                drop(job.work());
                continue;
            }
            let since = Instant::now();
            let mut spins = 0u32;
            loop {
                let now = self.posted.load(Ordering::Acquire);
                if now != seen {
                    seen = now;
                    break;
                }
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(64) || since.elapsed() < HELPER_SPIN {
                    std::hint::spin_loop();
                    continue;
                }
                // Posts bump the count under this lock: checked again
                // here, none is missed.
                let mut b = self.board();
                while self.posted.load(Ordering::Acquire) == seen {
                    b.sleeping += 1;
                    b = self.wake.wait(b).unwrap_or_else(|e| e.into_inner());
                    b.sleeping -= 1;
                }
                seen = self.posted.load(Ordering::Acquire);
                break;
            }
        }
    }
}

/// The team, its helpers started at the first split: `None` when the
/// process shares one CPU or not one helper could be started.
fn team() -> Option<&'static Team> {
    *TEAM.get_or_init(|| {
        let helpers = shared_cpus().saturating_sub(1);
        if helpers == 0 {
            return None;
        }
        // One a process, for its life: its helpers hold it.
        let team: &'static Team = Box::leak(Box::new(Team {
            board: Mutex::new(Board::default()),
            wake: Condvar::new(),
            posted: AtomicU64::new(0),
        }));
        let started = (0..helpers)
            .filter(|i| {
                std::thread::Builder::new()
                    .name(format!("m0-embed-{i}"))
                    .spawn(move || team.help())
                    .is_ok()
            })
            .count();
        (started > 0).then_some(team)
    })
}

/// `f(i)` for every i in 0..n, on this thread and up to `threads - 1`
/// helpers. Each thread takes the next index until none is left, so a
/// helper that joins late takes less, and one that never joins leaves its
/// pieces to this thread: a split never waits on a piece nobody started.
pub(crate) fn each(threads: usize, n: usize, f: impl Fn(usize) + Sync) {
    let team = match team() {
        Some(t) if threads > 1 && n > 1 => t,
        _ => {
            (0..n).for_each(f);
            return;
        }
    };
    let f: &(dyn Fn(usize) + Sync) = &f;
    // SAFETY: only the lifetime changes. `f` is called only for an index
    // taken below n, and this function returns (or unwinds) only after all
    // n are done and the job is off the board: no call outlives the borrow.
    // A helper that holds the job after that only reads its counters.
    let f: Piece = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Piece>(f) };
    let job = Arc::new(Job {
        f,
        n,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        seats: AtomicUsize::new(threads.min(n) - 1),
        panicked: AtomicBool::new(false),
        waiter: std::thread::current(),
    });
    team.post(&job);
    let own = job.work();
    team.withdraw(&job);
    job.wait();
    if let Some(payload) = own {
        resume_unwind(payload);
    }
    assert!(
        !job.panicked.load(Ordering::Relaxed),
        "a helper's piece of this split panicked (its message is above)"
    );
}

/// `f(item)` for every item, as [`each`] splits indices.
pub(crate) fn each_item<T: Send>(threads: usize, items: Vec<T>, f: impl Fn(T) + Sync) {
    if threads <= 1 || items.len() <= 1 {
        items.into_iter().for_each(f);
        return;
    }
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    each(threads, slots.len(), |i| {
        // Each index is taken once, so its slot is full and uncontended.
        let item = slots[i].lock().map(|mut s| s.take()).ok().flatten();
        if let Some(item) = item {
            f(item);
        }
    });
}

/// `[f(0), .., f(n - 1)]`, computed as [`each`] splits indices.
pub(crate) fn map<R: Send>(threads: usize, n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    if threads <= 1 || n <= 1 {
        return (0..n).map(f).collect();
    }
    let slots: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    each(threads, n, |i| {
        let r = f(i);
        if let Ok(mut s) = slots[i].lock() {
            *s = Some(r);
        }
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .ok()
                .flatten()
                .expect("every index of a split is computed once")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn each_runs_every_index_once_at_any_split() {
        for threads in [1, 2, 3, 8] {
            for n in [0, 1, 2, 7, 64] {
                let seen: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                each(threads, n, |i| {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    seen.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                    "threads {threads}, n {n}"
                );
                let got = map(threads, n, |i| i * 3);
                assert_eq!(got, (0..n).map(|i| i * 3).collect::<Vec<_>>());
                let items: Vec<usize> = (0..n).collect();
                let sum = AtomicU64::new(0);
                each_item(threads, items, |i| {
                    sum.fetch_add(i as u64 + 1, Ordering::Relaxed);
                });
                assert_eq!(sum.load(Ordering::Relaxed), (n * (n + 1) / 2) as u64);
            }
        }
    }

    #[test]
    fn a_panicking_piece_reaches_the_pass_and_the_team_serves_on() {
        for bad in [0, 5] {
            let ran = AtomicU64::new(0);
            let got = std::panic::catch_unwind(AssertUnwindSafe(|| {
                each(2, 8, |i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert_ne!(i, bad, "piece {i} fails");
                });
            }));
            assert!(got.is_err(), "piece {bad}'s panic reached the caller");
            // Every other piece still ran once: none was left half-taken.
            assert_eq!(ran.load(Ordering::Relaxed), 8);
        }
        assert_eq!(map(2, 4, |i| i + 1), vec![1, 2, 3, 4]);
    }

    #[test]
    fn passes_splitting_at_once_each_get_every_index_once() {
        let passes: Vec<u64> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..4u64)
                .map(|p| {
                    s.spawn(move || {
                        let mut sum = 0;
                        for round in 0..200u64 {
                            let n = (round % 9) as usize;
                            let got = map(3, n, |i| i as u64 * p + round);
                            sum += got.iter().sum::<u64>();
                        }
                        sum
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (p, sum) in passes.into_iter().enumerate() {
            let p = p as u64;
            let want: u64 = (0..200u64)
                .map(|round| {
                    let n = round % 9;
                    (0..n).map(|i| i * p + round).sum::<u64>()
                })
                .sum();
            assert_eq!(sum, want, "pass {p}");
        }
    }

    #[test]
    fn a_pass_gets_its_part_of_the_cpus_while_others_run() {
        // Fixed passes ignore the others and count for none.
        assert_eq!(Pass::fixed(3).threads(), 3);
        let cpus = shared_cpus();
        let one = Pass::begin(usize::MAX);
        // Other tests of this process may run passes meanwhile: what holds
        // at any moment is a part of the CPUs, never more, at least one.
        let alone = one.threads();
        assert!((1..=cpus).contains(&alone), "{alone} of {cpus}");
        let others: Vec<Pass> = (0..2 * cpus).map(|_| Pass::begin(usize::MAX)).collect();
        assert_eq!(one.threads(), 1, "{} passes on {cpus} CPUs", 2 * cpus + 1);
        drop(others);
        assert_eq!(Pass::begin(1).threads(), 1, "a cap of one");
    }
}
