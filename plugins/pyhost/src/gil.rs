//! Thread states and the GIL.
//!
//! Each handler thread creates one Python thread state in `thread_start` and
//! keeps it until `thread_stop` (attaching a fresh one per call costs about
//! 13 µs on 3.11, a kept one about 0.3 µs). Between calls the GIL is
//! released. The time spent re-acquiring it is reported to the host as lock
//! wait, which feeds the adaptive thread pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use pyo3::ffi;
use pyo3::prelude::*;

use m0serve_plugin::Host;

/// Calls take the GIL in the order they start.
///
/// CPython's GIL is not fair: a thread that releases it at the end of one
/// call and asks again for its next call usually wins against a thread that
/// has been waiting, so with a GIL-holding view one request could watch
/// dozens of later ones go first. Each call takes a ticket and enters
/// `PyEval_RestoreThread` only when its ticket is served; the ticket is
/// served as soon as the GIL is taken, so calls that release the GIL inside
/// (I/O, hashlib, numpy) still overlap.
struct Turnstile {
    next: AtomicU64,
    serving: AtomicU64,
    lock: Mutex<()>,
    turn: Condvar,
}

static TURNSTILE: Turnstile = Turnstile {
    next: AtomicU64::new(0),
    serving: AtomicU64::new(0),
    lock: Mutex::new(()),
    turn: Condvar::new(),
};

impl Turnstile {
    fn wait_for_turn(&self) -> u64 {
        let ticket = self.next.fetch_add(1, Ordering::SeqCst);
        if self.serving.load(Ordering::SeqCst) != ticket {
            let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.serving.load(Ordering::SeqCst) != ticket {
                guard = self.turn.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        }
        ticket
    }

    fn next_turn(&self) {
        self.serving.fetch_add(1, Ordering::SeqCst);
        // Waiters check under the lock, so take it before notifying.
        if self.next.load(Ordering::SeqCst) > self.serving.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.turn.notify_all();
        }
    }
}

/// Acquires shorter than this are not contention (an uncontended
/// `PyEval_RestoreThread` takes well under a microsecond), so they are not
/// reported: the counters stay off the fast path.
const LOCK_WAIT_MIN_NS: u64 = 1_000;

/// One handler thread's Python thread state, GIL released.
pub struct ThreadState {
    tstate: *mut ffi::PyThreadState,
    gstate: ffi::PyGILState_STATE,
}

impl ThreadState {
    /// Creates this thread's Python thread state, runs `f` with the GIL,
    /// then releases the GIL, keeping the thread state.
    ///
    /// # Safety
    /// Python must be initialised, and this thread must not hold the GIL.
    pub unsafe fn create<R>(f: impl FnOnce(Python<'_>) -> R) -> (ThreadState, R) {
        // SAFETY: Python is initialised (caller); PyGILState_Ensure creates a
        // thread state for a new thread, or reuses this thread's one.
        let gstate = unsafe { ffi::PyGILState_Ensure() };
        let r = Python::attach(f);
        // SAFETY: we hold the GIL (taken just above); SaveThread releases it
        // and returns this thread's state, which stays alive (not deleted).
        let tstate = unsafe { ffi::PyEval_SaveThread() };
        (ThreadState { tstate, gstate }, r)
    }

    /// Takes the GIL for this thread, timing the wait; released when the
    /// guard drops.
    pub fn acquire(&self, host: &Host) -> Held {
        let t0 = host.now_ns();
        TURNSTILE.wait_for_turn();
        // SAFETY: `tstate` is this thread's state (created by `create` on this
        // thread, released by the last `Held`), so restoring it is valid.
        unsafe { ffi::PyEval_RestoreThread(self.tstate) };
        TURNSTILE.next_turn();
        let waited = host.now_ns().saturating_sub(t0);
        if waited >= LOCK_WAIT_MIN_NS {
            host.lock_waited(waited);
        }
        Held {
            tstate: self.tstate,
        }
    }

    /// Deletes this thread's state (for `thread_stop`); `f` runs with the GIL
    /// first, to drop Python objects this thread owns.
    ///
    /// # Safety
    /// Must run on the thread that created it, with the GIL not held.
    pub unsafe fn destroy(self, f: impl FnOnce(Python<'_>)) {
        // SAFETY: our own thread state, GIL not held (caller).
        unsafe { ffi::PyEval_RestoreThread(self.tstate) };
        Python::attach(f);
        // SAFETY: balances the PyGILState_Ensure of `create`; for a thread
        // that PyGILState created, this deletes the state and releases the
        // GIL; for the interpreter's main thread it only releases the GIL.
        unsafe { ffi::PyGILState_Release(self.gstate) };
    }
}

/// The GIL held by a handler thread for one call.
pub struct Held {
    tstate: *mut ffi::PyThreadState,
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: we hold the GIL with this thread's state (taken in
        // `acquire`); SaveThread releases it and returns the same state.
        let ts = unsafe { ffi::PyEval_SaveThread() };
        debug_assert_eq!(ts, self.tstate);
    }
}

/// Runs `f` (which must not touch Python) with the GIL released, for a host
/// call that may block; the re-acquire is reported as lock wait.
pub fn without_gil<R>(_py: Python<'_>, f: impl FnOnce() -> R) -> R {
    struct Restore(*mut ffi::PyThreadState);
    impl Drop for Restore {
        fn drop(&mut self) {
            let host = crate::host();
            let t0 = host.now_ns();
            // SAFETY: the state saved by the matching PyEval_SaveThread on
            // this thread.
            unsafe { ffi::PyEval_RestoreThread(self.0) };
            let waited = host.now_ns().saturating_sub(t0);
            if waited >= LOCK_WAIT_MIN_NS {
                host.lock_waited(waited);
            }
        }
    }
    // SAFETY: `_py` proves this thread holds the GIL; `f` does not use
    // Python (it only calls the host), and `Restore` takes the GIL back even
    // if `f` panics.
    let _restore = Restore(unsafe { ffi::PyEval_SaveThread() });
    f()
}
