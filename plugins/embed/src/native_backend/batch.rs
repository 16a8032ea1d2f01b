//! A batch of tokenized inputs as the header's `M0EmbedBatch` wants it:
//! cut into calls within the limits given to `load`, each packed (ids one
//! input after another, with offsets) or padded (rows of the longest
//! input's width, with a mask).

use m0embed_backend_abi::{M0EmbedBatch, M0EmbedLimits};

use crate::model::Encoded;

/// Which inputs the backend asked for (`M0EmbedInfo.inputs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inputs {
    Packed,
    Padded,
}

impl Inputs {
    pub fn name(self) -> &'static str {
        match self {
            Inputs::Packed => "packed",
            Inputs::Padded => "padded",
        }
    }
}

/// The ids of one call and what points into them; `batch()` borrows them.
pub(super) struct Call {
    rows: u32,
    width: u32,
    ids: Vec<i32>,
    offsets: Vec<u32>,
    mask: Vec<i32>,
}

impl Call {
    pub fn new(inputs: Inputs, chunk: &[Encoded]) -> Call {
        let rows = chunk.len() as u32;
        match inputs {
            Inputs::Packed => {
                let mut ids = Vec::with_capacity(chunk.iter().map(Encoded::tokens).sum());
                let mut offsets = Vec::with_capacity(chunk.len() + 1);
                offsets.push(0);
                for e in chunk {
                    // Ids are below the vocabulary's size, far under 2^31.
                    ids.extend(e.ids().iter().map(|&id| id as i32));
                    offsets.push(ids.len() as u32);
                }
                Call {
                    rows,
                    width: 0,
                    ids,
                    offsets,
                    mask: Vec::new(),
                }
            }
            Inputs::Padded => {
                let width = chunk.iter().map(Encoded::tokens).max().unwrap_or(0);
                let mut ids = vec![0i32; chunk.len() * width];
                let mut mask = vec![0i32; chunk.len() * width];
                for (r, e) in chunk.iter().enumerate() {
                    for (c, &id) in e.ids().iter().enumerate() {
                        ids[r * width + c] = id as i32;
                        mask[r * width + c] = 1;
                    }
                }
                Call {
                    rows,
                    width: width as u32,
                    ids,
                    offsets: Vec::new(),
                    mask,
                }
            }
        }
    }

    /// The header's view of this call, valid while `self` is.
    pub fn batch(&self) -> M0EmbedBatch {
        let or_null = |v: &[u32]| {
            if v.is_empty() {
                std::ptr::null()
            } else {
                v.as_ptr()
            }
        };
        M0EmbedBatch {
            size: size_of::<M0EmbedBatch>() as u32,
            rows: self.rows,
            tokens: self.ids.len() as u32,
            width: self.width,
            ids: self.ids.as_ptr(),
            offsets: or_null(&self.offsets),
            mask: if self.mask.is_empty() {
                std::ptr::null()
            } else {
                self.mask.as_ptr()
            },
        }
    }
}

/// `batch` cut into consecutive chunks of at most `limits.max_rows` inputs
/// and `limits.max_tokens` tokens (packed: their sum; padded: rows times
/// the longest). One input always fits: max_tokens is at least
/// max_seq_len.
pub(super) fn chunks<'a>(
    batch: &'a [Encoded],
    inputs: Inputs,
    limits: &M0EmbedLimits,
) -> Vec<&'a [Encoded]> {
    let (max_rows, max_tokens) = (limits.max_rows.max(1) as usize, limits.max_tokens as usize);
    let mut out = Vec::new();
    let (mut start, mut sum, mut widest) = (0, 0, 0);
    for (i, e) in batch.iter().enumerate() {
        let rows = i - start + 1;
        let (s, w) = (sum + e.tokens(), widest.max(e.tokens()));
        let cost = match inputs {
            Inputs::Packed => s,
            Inputs::Padded => rows * w,
        };
        if rows > 1 && (rows > max_rows || cost > max_tokens) {
            out.push(&batch[start..i]);
            (start, sum, widest) = (i, e.tokens(), e.tokens());
        } else {
            (sum, widest) = (s, w);
        }
    }
    if start < batch.len() {
        out.push(&batch[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(n: usize) -> Encoded {
        Encoded::one((1..=n as u32).collect())
    }

    fn limits(max_rows: u32, max_tokens: u32) -> M0EmbedLimits {
        M0EmbedLimits {
            size: size_of::<M0EmbedLimits>() as u32,
            max_rows,
            max_tokens,
            max_seq_len: max_tokens,
        }
    }

    #[test]
    fn chunks_keep_order_and_both_limits() {
        let batch: Vec<Encoded> = [3, 1, 4, 1, 5, 9, 2].into_iter().map(enc).collect();
        let sizes = |inputs, l| {
            chunks(&batch, inputs, &l)
                .iter()
                .map(|c| c.iter().map(Encoded::tokens).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            sizes(Inputs::Packed, limits(2, 100)),
            [vec![3, 1], vec![4, 1], vec![5, 9], vec![2]]
        );
        assert_eq!(
            sizes(Inputs::Packed, limits(10, 9)),
            [vec![3, 1, 4, 1], vec![5], vec![9], vec![2]]
        );
        // Padded: 3 rows of width 4 is 12 > 10.
        assert_eq!(
            sizes(Inputs::Padded, limits(10, 10)),
            [vec![3, 1], vec![4, 1], vec![5], vec![9], vec![2]]
        );
    }

    #[test]
    fn packed_and_padded_calls_hold_the_ids() {
        let batch = [enc(2), enc(3)];
        let packed = Call::new(Inputs::Packed, &batch);
        assert_eq!(packed.ids, [1, 2, 1, 2, 3]);
        assert_eq!(packed.offsets, [0, 2, 5]);
        let b = packed.batch();
        assert!(b.mask.is_null() && b.rows == 2 && b.tokens == 5 && b.width == 0);
        let padded = Call::new(Inputs::Padded, &batch);
        assert_eq!(padded.ids, [1, 2, 0, 1, 2, 3]);
        assert_eq!(padded.mask, [1, 1, 0, 1, 1, 1]);
        let b = padded.batch();
        assert!(b.offsets.is_null() && b.width == 3 && b.tokens == 6);
    }
}
