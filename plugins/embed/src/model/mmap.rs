//! Memory the encoder reads and writes without the allocator: read-only
//! shared mappings of files (the weights, one copy in the page cache for
//! every process that maps the same file), and zeroed anonymous mappings
//! for a forward pass's large scratch buffers, returned to the kernel when
//! the pass ends (an allocator would keep the largest pass's pages).

use std::fs::File;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

/// A whole file mapped `PROT_READ`, `MAP_SHARED`: its pages are the page
/// cache's, shared by every process that maps the file, and never copied.
pub(crate) struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only for its whole life and unmapped only by
// Drop, when no reference into it is left; reading it from several threads
// at once is reading immutable memory.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `file` (opened for reading) whole. An empty file is refused:
    /// there is nothing to map.
    pub(crate) fn file(file: &File) -> std::io::Result<Mapping> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the file is larger than the address space"))?;
        if len == 0 {
            return Err(std::io::Error::other("the file is empty"));
        }
        // SAFETY: a fresh mapping chosen by the kernel (no address given),
        // of a file descriptor that is open; nothing else is touched. The
        // mapping stays valid after the descriptor closes. Files mapped
        // here are only ever replaced by rename, never truncated or
        // written in place (see cache.rs), so the pages cannot vanish
        // under a reader.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr as *const u8,
            len,
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is mapped readable for as long as self
        // lives (unmapped only in Drop).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// `len` elements from byte `offset`. Panics when they are not inside
    /// the mapping or `offset` is not aligned for `T` (the cache's offsets
    /// are 64-aligned from a page-aligned base).
    fn elements<T: Element>(&self, offset: usize, len: usize) -> &[T] {
        let size = std::mem::size_of::<T>();
        let end = len
            .checked_mul(size)
            .and_then(|b| b.checked_add(offset))
            .expect("tensor size overflows");
        assert!(
            end <= self.len && offset.is_multiple_of(std::mem::align_of::<T>()),
            "tensor [{offset}, {end}) outside the {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds and aligned (asserted; the base is a page);
        // every bit pattern is a valid T (Element's contract); the memory
        // is never written.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset).cast::<T>(), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned, unmapped once; no slice
        // of it outlives self (they borrow it).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// What a tensor may hold: plain numbers for which every bit pattern is a
/// value, read in place from the cache file.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes is a valid `Self`.
pub(crate) unsafe trait Element: Copy + 'static {}
// SAFETY: every 32-bit pattern is an f32 (NaNs included).
unsafe impl Element for f32 {}
// SAFETY: every 16-bit pattern is a u16; bf16 weights are their bits.
unsafe impl Element for u16 {}

/// A weight: elements (f32 by default; `u16` for the bits of bf16 weights)
/// in a mapping shared with other processes (or, in the kernels' own
/// tests, on the heap).
pub(crate) enum Tensor<T: Element = f32> {
    #[cfg(test)]
    Heap(Vec<T>),
    Mapped {
        map: Arc<Mapping>,
        offset: usize,
        len: usize,
        of: PhantomData<T>,
    },
}

impl<T: Element> Tensor<T> {
    /// `len` elements at byte `offset` of `map`; panics when out of bounds
    /// (the cache's table is checked against its size before this).
    pub(crate) fn mapped(map: &Arc<Mapping>, offset: usize, len: usize) -> Tensor<T> {
        let _ = map.elements::<T>(offset, len);
        Tensor::Mapped {
            map: Arc::clone(map),
            offset,
            len,
            of: PhantomData,
        }
    }
}

impl<T: Element> Deref for Tensor<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            #[cfg(test)]
            Tensor::Heap(v) => v,
            Tensor::Mapped {
                map, offset, len, ..
            } => map.elements(*offset, *len),
        }
    }
}

/// Scratch buffers of at least this many bytes are mapped for the pass
/// alone; smaller ones come from the allocator.
const MAPPED_SCRATCH: usize = 1 << 20;

/// Released scratch mappings kept for the next buffers, in bytes at most:
/// a new mapping costs a page fault and a zeroed page for each 4 kB it is
/// touched (3% of a 750-token pass), a kept one a memset. About two passes
/// of 750 tokens of a 384-wide model; a longer batch's buffers are
/// unmapped as before.
const SPARE_BYTES: usize = 32 << 20;

/// A spare not taken within this many scratch buffers asked for since it
/// was released (a few passes) is unmapped: a worker's memory after a
/// long batch comes back to what it runs next.
const SPARE_AGE: u64 = 48;

/// Mappings released and not yet taken again or unmapped.
struct Spare {
    /// (address, bytes, the count of buffers asked for when released).
    maps: Vec<(usize, usize, u64)>,
    asked: u64,
}

static SPARE: Mutex<Spare> = Mutex::new(Spare {
    maps: Vec::new(),
    asked: 0,
});

fn spare() -> std::sync::MutexGuard<'static, Spare> {
    // Nothing under this lock panics; a poisoned list is still whole.
    SPARE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unmaps `bytes` at `addr`, a range mmap returned.
///
/// # Safety
/// No slice of the range is used again.
unsafe fn unmap(addr: usize, bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe { libc::munmap(addr as *mut libc::c_void, bytes) };
}

/// A zeroed f32 buffer for one forward pass. Large ones are anonymous
/// private mappings, kept for the next buffers a while when released
/// ([`SPARE_BYTES`], [`SPARE_AGE`]) and then unmapped, so a worker's
/// memory after a long batch is what it runs next, not the longest batch
/// it ever saw.
pub(crate) struct Scratch {
    ptr: *mut f32,
    len: usize,
    /// The mapping's bytes (0: `heap` holds the buffer).
    mapped: usize,
    heap: Option<Vec<f32>>,
}

// SAFETY: a Scratch owns its memory alone (heap or a private mapping), as
// a Vec does.
unsafe impl Send for Scratch {}
// SAFETY: shared access only reads, as for a Vec.
unsafe impl Sync for Scratch {}

impl Scratch {
    pub(crate) fn zeroed(len: usize) -> Scratch {
        let bytes = len.checked_mul(4).expect("scratch size overflows");
        let taken = {
            let mut spare = spare();
            spare.asked += 1;
            let now = spare.asked;
            // Past their age: unmapped.
            spare.maps.retain(|&(addr, size, at)| {
                let keep = now - at <= SPARE_AGE;
                if !keep {
                    // SAFETY: a released mapping nobody holds.
                    unsafe { unmap(addr, size) };
                }
                keep
            });
            // The smallest spare that holds `bytes` and is not more than
            // twice it (a small buffer does not hold a large one's pages).
            let best = (bytes >= MAPPED_SCRATCH)
                .then(|| {
                    spare
                        .maps
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.1 >= bytes && m.1 <= bytes.saturating_mul(2))
                        .min_by_key(|(_, m)| m.1)
                        .map(|(i, _)| i)
                })
                .flatten();
            best.map(|i| spare.maps.swap_remove(i))
        };
        if let Some((addr, size, _)) = taken {
            let ptr = addr as *mut f32;
            // SAFETY: a private mapping of `size` >= bytes that this
            // Scratch now owns alone; zeroing makes it what a fresh one
            // reads as.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
            return Scratch {
                ptr,
                len,
                mapped: size,
                heap: None,
            };
        }
        if bytes >= MAPPED_SCRATCH {
            // SAFETY: a fresh private anonymous mapping chosen by the
            // kernel; anonymous pages read as zero, which is 0.0f32.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                return Scratch {
                    ptr: ptr.cast::<f32>(),
                    len,
                    mapped: bytes,
                    heap: None,
                };
            }
        }
        let mut v = vec![0f32; len];
        Scratch {
            ptr: v.as_mut_ptr(),
            len,
            mapped: 0,
            heap: Some(v),
        }
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: ptr points at len initialised f32s that self owns (the
        // Vec's buffer, which does not move, or the mapping).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.heap.is_some() {
            return;
        }
        let (addr, size) = (self.ptr as usize, self.mapped);
        let mut spare = spare();
        let kept: usize = spare.maps.iter().map(|m| m.1).sum();
        if kept + size <= SPARE_BYTES {
            let now = spare.asked;
            spare.maps.push((addr, size, now));
        } else {
            drop(spare);
            // SAFETY: the range mmap returned in zeroed (or a spare of
            // it), unmapped once; no slice of it outlives self.
            unsafe { unmap(addr, size) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_zeroed_and_writable_on_the_heap_and_mapped() {
        for len in [3, MAPPED_SCRATCH / 4 + 7] {
            let mut s = Scratch::zeroed(len);
            assert_eq!(s.heap.is_none(), len * 4 >= MAPPED_SCRATCH);
            assert!(s.iter().all(|&v| v == 0.0));
            s[len - 1] = 2.5;
            assert_eq!(s[len - 1], 2.5);
        }
    }

    #[test]
    fn a_released_mapping_is_taken_again_zeroed_and_unmapped_when_old() {
        // A size no other test asks for, so the spare stays this test's.
        let len = 7 * MAPPED_SCRATCH / 4 + 12_345;
        let mut s = Scratch::zeroed(len);
        s.iter_mut().for_each(|v| *v = 1.0);
        let addr = s.ptr as usize;
        drop(s);
        let again = Scratch::zeroed(len - 100);
        assert_eq!(again.ptr as usize, addr, "the spare was taken again");
        assert!(again.iter().all(|&v| v == 0.0), "and zeroed");
        drop(again);
        assert!(spare().maps.iter().any(|m| m.0 == addr));
        // Smaller buffers do not take it (more than twice their size)...
        let small = Scratch::zeroed(MAPPED_SCRATCH / 4);
        assert_ne!(small.ptr as usize, addr);
        drop(small);
        // ...and after SPARE_AGE more buffers it is unmapped.
        for _ in 0..=SPARE_AGE {
            drop(Scratch::zeroed(3));
        }
        assert!(!spare().maps.iter().any(|m| m.0 == addr));
    }

    #[test]
    fn a_mapped_file_reads_back_as_written() {
        let path = std::env::temp_dir().join(format!("m0embed-mmap-{}", std::process::id()));
        let floats = [1.5f32, -2.0, 3.25, 0.0];
        let bytes: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
        std::fs::write(&path, &bytes).unwrap();
        let map = Arc::new(Mapping::file(&File::open(&path).unwrap()).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(map.bytes(), &bytes[..]);
        let t: Tensor = Tensor::mapped(&map, 4, 3);
        assert_eq!(&t[..], &floats[1..]);
        let halves: Tensor<u16> = Tensor::mapped(&map, 2, 3);
        assert_eq!(halves[0], (1.5f32.to_bits() >> 16) as u16);
    }
}
