//! The shared page: one cache line of atomics per worker, in a sealed memfd
//! mapped by the supervisor before the workers start (inherited across fork,
//! adopted by descriptor after exec).
//!
//! Each worker publishes its own line; every worker reads its siblings' to
//! choose where a new connection goes (see `worker/accept_share.rs`).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A worker's line. 64 bytes: no false sharing between workers.
#[repr(C, align(64))]
pub struct WorkerLine {
    /// 0 while parked; the monotonic ns a loop pass started while in one;
    /// `LEAVING` once the worker drains.
    pub state: AtomicU64,
    /// Open connections, published at the end of each loop pass.
    pub active: AtomicU64,
    /// Connections passed to this worker and not yet received.
    pub pending: AtomicU64,
    pub accepted: AtomicU64,
    pub passed: AtomicU64,
    pub received: AtomicU64,
    pub pid: AtomicU64,
    _pad: AtomicU64,
}

pub const LEAVING: u64 = u64::MAX;
const MAGIC: u64 = 0x6d30_7061_6765_0001; // "m0page" v1

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    workers: AtomicU64,
    /// Rotates tie-breaks so no worker is favoured.
    rotation: AtomicU64,
}

pub struct SharedPage {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    workers: usize,
}

// SAFETY: the mapping holds only atomics, safe to use from any thread.
unsafe impl Send for SharedPage {}
// SAFETY: as above.
unsafe impl Sync for SharedPage {}

fn page_len(workers: usize) -> usize {
    let bytes = std::mem::size_of::<Header>() + workers * std::mem::size_of::<WorkerLine>();
    bytes.div_ceil(4096) * 4096
}

impl SharedPage {
    /// Create, size, seal and map a page for `workers` (the supervisor).
    pub fn create(workers: usize) -> std::io::Result<SharedPage> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd = memfd_create(
            c"m0serve-page",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        let len = page_len(workers);
        nix::unistd::ftruncate(&fd, len as i64)?;
        // Sealed so no worker can shrink it under the others.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let page = SharedPage::map(fd, workers)?;
        page.header().magic.store(MAGIC, Ordering::SeqCst);
        page.header()
            .workers
            .store(workers as u64, Ordering::SeqCst);
        Ok(page)
    }

    /// Map a page adopted by descriptor number (a spawned worker).
    ///
    /// # Safety
    /// `fd` must be the page's memfd, owned by the caller from now on.
    pub unsafe fn adopt(fd: RawFd, workers: usize) -> std::io::Result<SharedPage> {
        // SAFETY: per the contract, we own fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let page = SharedPage::map(fd, workers)?;
        if page.header().magic.load(Ordering::SeqCst) != MAGIC
            || page.header().workers.load(Ordering::SeqCst) != workers as u64
        {
            return Err(std::io::Error::other(
                "the shared page is not an m0serve page for this many workers",
            ));
        }
        Ok(page)
    }

    fn map(fd: OwnedFd, workers: usize) -> std::io::Result<SharedPage> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap};
        let len = page_len(workers);
        let size = std::num::NonZeroUsize::new(len).expect("a page is never empty");
        // SAFETY: a fresh shared mapping of our memfd, exactly its length.
        let base = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        Ok(SharedPage {
            fd,
            base: base.cast(),
            len,
            workers,
        })
    }

    pub fn fd_owned(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header and lives as long as self.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    pub fn line(&self, index: usize) -> &WorkerLine {
        assert!(index < self.workers, "worker index {index} out of range");
        let offset = std::mem::size_of::<Header>() + index * std::mem::size_of::<WorkerLine>();
        debug_assert!(offset + std::mem::size_of::<WorkerLine>() <= self.len);
        // SAFETY: in bounds (checked above) and aligned (64-byte stride from
        // a page-aligned base); the page is zeroed atomics.
        unsafe { &*self.base.as_ptr().add(offset).cast::<WorkerLine>() }
    }

    pub fn next_rotation(&self) -> u64 {
        self.header().rotation.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping of exactly this length.
        let _ = unsafe { nix::sys::mman::munmap(self.base.cast(), self.len) };
    }
}
