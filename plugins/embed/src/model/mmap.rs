//! Memory the encoder reads and writes without the allocator: read-only
//! shared mappings of files (the weights, one copy in the page cache for
//! every process that maps the same file), and zeroed anonymous mappings
//! for a forward pass's large scratch buffers, returned to the kernel when
//! the pass ends (an allocator would keep the largest pass's pages).

use std::fs::File;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::sync::Arc;

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

/// A zeroed f32 buffer for one forward pass. Large ones are anonymous
/// private mappings, unmapped on drop, so a worker's memory after a long
/// batch is what it runs next, not the longest batch it ever saw.
pub(crate) struct Scratch {
    ptr: *mut f32,
    len: usize,
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
                    heap: None,
                };
            }
        }
        let mut v = vec![0f32; len];
        Scratch {
            ptr: v.as_mut_ptr(),
            len,
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
        if self.heap.is_none() {
            // SAFETY: the range mmap returned in zeroed (len * 4 bytes),
            // unmapped once; no slice of it outlives self.
            unsafe { libc::munmap(self.ptr.cast::<libc::c_void>(), self.len * 4) };
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
