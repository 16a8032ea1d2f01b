//! A shared mapping of a sealed memfd: what the shared page and the metrics
//! page are made of. The supervisor creates and maps it before the workers
//! start; a forked worker inherits the mapping (or maps a duplicate of the
//! descriptor), a spawned one adopts the descriptor by number after exec.
//! Sealed against shrinking and growing, so no process can pull the pages
//! from under the others.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The first two words of every page made here: which kind of page it is
/// and how many workers it was sized for, so a process that adopts a
/// descriptor by number can tell it holds the right one. The pages' own
/// headers begin with these two fields.
#[repr(C)]
struct Stamp {
    magic: AtomicU64,
    workers: AtomicU64,
}

/// A page of `header` bytes then `count` items of `item` bytes, in whole
/// pages of memory.
pub fn page_len(header: usize, count: usize, item: usize) -> usize {
    (header + count * item).div_ceil(4096) * 4096
}

pub struct MemfdMap {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; its users keep only atomics
// in it, which any thread may use.
unsafe impl Send for MemfdMap {}
// SAFETY: as above.
unsafe impl Sync for MemfdMap {}

impl MemfdMap {
    /// A zeroed mapping of `len` bytes (a multiple of the page size), its
    /// size sealed.
    pub fn create(name: &CStr, len: usize) -> std::io::Result<MemfdMap> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
        nix::unistd::ftruncate(&fd, len as i64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        MemfdMap::map(fd, len)
    }

    /// `create`, stamped with `magic` and `workers`.
    pub fn create_stamped(
        name: &CStr,
        len: usize,
        magic: u64,
        workers: usize,
    ) -> std::io::Result<MemfdMap> {
        let map = MemfdMap::create(name, len)?;
        // SAFETY: the mapping begins with the Stamp, two atomics.
        let stamp = unsafe { map.at::<Stamp>(0) };
        stamp.magic.store(magic, Ordering::SeqCst);
        stamp.workers.store(workers as u64, Ordering::SeqCst);
        Ok(map)
    }

    /// `adopt`, refusing a mapping not stamped with `magic` and `workers`
    /// (`what` names the page in the error).
    ///
    /// # Safety
    /// As for `adopt`.
    pub unsafe fn adopt_stamped(
        fd: RawFd,
        len: usize,
        magic: u64,
        workers: usize,
        what: &str,
    ) -> std::io::Result<MemfdMap> {
        // SAFETY: per the contract.
        let map = unsafe { MemfdMap::adopt(fd, len) }?;
        // SAFETY: the mapping begins with the Stamp, two atomics.
        let stamp = unsafe { map.at::<Stamp>(0) };
        if stamp.magic.load(Ordering::SeqCst) != magic
            || stamp.workers.load(Ordering::SeqCst) != workers as u64
        {
            return Err(std::io::Error::other(format!(
                "the {what} is not an m0serve {what} for this many workers"
            )));
        }
        Ok(map)
    }

    /// Map the memfd at descriptor `fd` (a spawned worker's, or a
    /// duplicate), `len` bytes as its creator sized it.
    ///
    /// # Safety
    /// `fd` must be such a memfd, owned by the caller from now on.
    pub unsafe fn adopt(fd: RawFd, len: usize) -> std::io::Result<MemfdMap> {
        // SAFETY: per the contract, we own fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        MemfdMap::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> std::io::Result<MemfdMap> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap};
        let size = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| std::io::Error::other("a shared mapping is never empty"))?;
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
        Ok(MemfdMap {
            fd,
            base: base.cast(),
            len,
        })
    }

    pub fn fd_owned(&self) -> &OwnedFd {
        &self.fd
    }

    /// The `T` at `offset`, which must lie inside the mapping, aligned for
    /// `T`.
    ///
    /// # Safety
    /// `T` must be made of atomics (any bit pattern, zero included, valid)
    /// and every process must agree on what lies at `offset`.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        assert!(offset + std::mem::size_of::<T>() <= self.len);
        assert_eq!(offset % std::mem::align_of::<T>(), 0);
        // SAFETY: in bounds and aligned (checked above, from a page-aligned
        // base); what lies there is the caller's promise.
        unsafe { &*self.base.as_ptr().add(offset).cast::<T>() }
    }
}

impl Drop for MemfdMap {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping of exactly this length.
        let _ = unsafe { nix::sys::mman::munmap(self.base.cast(), self.len) };
    }
}
