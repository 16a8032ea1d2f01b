//! The shared page: one cache line of atomics per worker, in a sealed memfd
//! mapped by the supervisor before the workers start (inherited across fork,
//! adopted by descriptor after exec).
//!
//! Each worker publishes its own line; every worker reads its siblings' to
//! choose where a new connection goes (see `worker/accept_share.rs`), and
//! the adaptive pool controllers of workers on the same CPUs read each
//! other's load to size their pools together (`worker/pool/adaptive.rs`).

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::memfd_map::{self, MemfdMap};

/// A worker's line. 128 bytes, two cache lines: no false sharing between
/// workers.
#[repr(C, align(64))]
pub struct WorkerLine {
    /// 0 while parked; the monotonic ns a loop pass started while in one;
    /// `LEAVING` once the worker drains.
    pub state: AtomicU64,
    /// Open connections (less those whose client hung up), published as
    /// they change and before each wait.
    pub active: AtomicU64,
    /// Connections passed to this worker and not yet received.
    pub pending: AtomicU64,
    pub accepted: AtomicU64,
    pub passed: AtomicU64,
    pub received: AtomicU64,
    pub pid: AtomicU64,
    /// The pool controller's last window, in thousandths: CPUs the whole
    /// worker used, and CPUs its handler threads wanted (used plus time
    /// runnable but waiting for a CPU).
    pub cpu_milli: AtomicU64,
    pub demand_milli: AtomicU64,
    /// Handler threads the controller has set.
    pub pool_threads: AtomicU64,
    /// Monotonic ns of that window's end (0: never): a sibling whose pool
    /// has not measured for a while is not counted.
    pub pool_at_ns: AtomicU64,
    /// The moment `active` holds: monotonic ns of the return of the wait
    /// whose events are in it (see `worker/accept_share.rs`).
    pub active_at_ns: AtomicU64,
    /// Of `active`, those that came after that moment: none of them is
    /// among what the worker may not have seen leave.
    pub active_fresh: AtomicU64,
    /// Monotonic ns of that publish itself.
    pub published_ns: AtomicU64,
    _pad: [AtomicU64; 2],
}

const _: () = assert!(size_of::<WorkerLine>() == 128);

pub const LEAVING: u64 = u64::MAX;
const MAGIC: u64 = 0x6d30_7061_6765_0003; // "m0page" v3

#[repr(C, align(64))]
struct Header {
    /// `memfd_map`'s stamp: written when the page is made, checked when
    /// a process adopts it.
    magic: AtomicU64,
    workers: AtomicU64,
    /// Rotates tie-breaks so no worker is favoured.
    rotation: AtomicU64,
}

pub struct SharedPage {
    map: MemfdMap,
    workers: usize,
}

fn page_len(workers: usize) -> usize {
    memfd_map::page_len(size_of::<Header>(), workers, size_of::<WorkerLine>())
}

impl SharedPage {
    /// Create, size, seal and map a page for `workers` (the supervisor).
    pub fn create(workers: usize) -> std::io::Result<SharedPage> {
        Ok(SharedPage {
            map: MemfdMap::create_stamped(c"m0serve-page", page_len(workers), MAGIC, workers)?,
            workers,
        })
    }

    /// Map a page adopted by descriptor number (a spawned worker, or a
    /// forked one's duplicate).
    ///
    /// # Safety
    /// `fd` must be the page's memfd, owned by the caller from now on.
    pub unsafe fn adopt(fd: RawFd, workers: usize) -> std::io::Result<SharedPage> {
        // SAFETY: per the contract, fd is the page's memfd, ours now.
        let map = unsafe {
            MemfdMap::adopt_stamped(fd, page_len(workers), MAGIC, workers, "shared page")
        }?;
        Ok(SharedPage { map, workers })
    }

    pub fn fd_owned(&self) -> &OwnedFd {
        self.map.fd_owned()
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    fn header(&self) -> &Header {
        // SAFETY: the page starts with its Header, made of atomics.
        unsafe { self.map.at::<Header>(0) }
    }

    pub fn line(&self, index: usize) -> &WorkerLine {
        assert!(index < self.workers, "worker index {index} out of range");
        let offset = std::mem::size_of::<Header>() + index * std::mem::size_of::<WorkerLine>();
        // SAFETY: every process lays the page out the same way: the Header,
        // then one WorkerLine of atomics per worker.
        unsafe { self.map.at::<WorkerLine>(offset) }
    }

    pub fn next_rotation(&self) -> u64 {
        self.header().rotation.fetch_add(1, Ordering::Relaxed)
    }
}
