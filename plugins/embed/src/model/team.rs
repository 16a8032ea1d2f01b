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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// CPUs the passes of this process share; 0 until [`share_cpus`]: then
/// the CPUs the process may run on.
static CPUS: AtomicUsize = AtomicUsize::new(0);

/// Passes computing now, in this process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// The helpers: one fewer than the CPUs shared, the pass's own thread
/// being the last. `None` when they could not be started (passes then
/// compute on their own thread).
static HELPERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

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

fn helpers() -> Option<&'static rayon::ThreadPool> {
    HELPERS
        .get_or_init(|| {
            let n = shared_cpus().saturating_sub(1);
            if n == 0 {
                return None;
            }
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("m0-embed-{i}"))
                .build()
                .ok()
        })
        .as_ref()
}

/// `f(i)` for every i in 0..n, on this thread and up to `threads - 1`
/// helpers. Each thread takes the next index until none is left, so a
/// helper that wakes late takes less and the pass never waits on a piece
/// nobody started.
pub(crate) fn each(threads: usize, n: usize, f: impl Fn(usize) + Sync) {
    let helpers = match helpers() {
        Some(h) if threads > 1 && n > 1 => h,
        _ => {
            (0..n).for_each(f);
            return;
        }
    };
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            f(i);
        }
    };
    // This thread is not one of the helpers: it runs its share here and
    // then blocks until the helpers' pieces are done.
    helpers.in_place_scope(|s| {
        for _ in 1..threads.min(n) {
            s.spawn(|_| work());
        }
        work();
    });
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
