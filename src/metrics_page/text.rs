//! A short text in the metrics page, which another process reads while its
//! owner may write it: bytes in atomic words, its length published last.

use std::sync::atomic::{AtomicU64, Ordering};

/// Up to `WORDS * 8` bytes. Empty (length 0) until first stored.
#[repr(C)]
pub struct Text<const WORDS: usize> {
    len: AtomicU64,
    words: [AtomicU64; WORDS],
}

impl<const WORDS: usize> Text<WORDS> {
    pub const CAPACITY: usize = WORDS * 8;

    /// Stores `bytes` (cut at the capacity): the words, then the length
    /// with Release, so a reader that sees the length sees the bytes.
    pub fn store(&self, bytes: &[u8]) {
        let bytes = &bytes[..bytes.len().min(Self::CAPACITY)];
        for (word, chunk) in self.words.iter().zip(bytes.chunks(8)) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        self.len.store(bytes.len() as u64, Ordering::Release);
    }

    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// The bytes into `out`; their length.
    pub fn load_into(&self, out: &mut [u8]) -> usize {
        let len = (self.len.load(Ordering::Acquire) as usize)
            .min(Self::CAPACITY)
            .min(out.len());
        for (i, chunk) in out[..len].chunks_mut(8).enumerate() {
            let w = self.words[i].load(Ordering::Relaxed).to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        len
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; Self::CAPACITY];
        let len = self.load_into(&mut out);
        out.truncate(len);
        out
    }

    /// Whether it holds exactly `bytes`, without a copy on the heap.
    pub fn holds(&self, bytes: &[u8]) -> bool {
        let len = self.len.load(Ordering::Acquire) as usize;
        len == bytes.len()
            && bytes.chunks(8).enumerate().all(|(i, chunk)| {
                let w = self.words[i].load(Ordering::Relaxed).to_le_bytes();
                w[..chunk.len()] == *chunk
            })
    }

    /// Back to empty.
    pub fn clear(&self) {
        self.len.store(0, Ordering::Release);
    }
}
