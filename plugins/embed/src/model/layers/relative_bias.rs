//! MPNet's relative position bias: one `[32, heads]` table
//! (`encoder.relative_attention_bias.weight`) shared by every layer, whose
//! row for the bucket of `i - j` is added to the scores of query `i` and
//! key `j`, after the `1 / sqrt(dh)` scaling and before the softmax.
//!
//! The buckets are T5's bidirectional ones as transformers' MPNet computes
//! them (`MPNetEncoder.relative_position_bucket`, always called with
//! `num_buckets=32, max_distance=128`, whatever the config says;
//! `relative_attention_num_buckets` only sizes the table): for `n = i - j`,
//! 16 buckets per direction, the upper 16 when the key comes after the
//! query (`n < 0`); `|n|` below 8 is its own bucket, from 8 on
//! `8 + floor(8 * ln(|n| / 8) / ln 16)` up to 15. The positions are the
//! tokens' indices 0..n-1 in their sequence (not the padding-offset ids of
//! the position table), so the bias depends on `i - j` alone: one vector
//! per head over every offset, made once per model ([`RelativeBias`]),
//! serves every sequence and every layer.
//!
//! `8 * ln(|n| / 8) / ln 16` is `2 log2(|n| / 8)`, so the bucket is `2 +
//! floor(log2(n²))`, in integers: no libm rounding at the exact bucket
//! edges 16, 32 and 64 (torch's f32 puts them in the upper bucket, and so
//! does this).

use crate::model::kernels::Isa;

/// Rows of the table.
pub(crate) const NUM_BUCKETS: usize = 32;

/// The bucket of query `i` and key `j`, given `i - j`.
pub(crate) fn bucket(i_minus_j: i64) -> usize {
    let upper = if i_minus_j < 0 { NUM_BUCKETS / 2 } else { 0 };
    // Every |n| from 91 on is bucket 15; the clamp keeps n² small.
    let n = i_minus_j.unsigned_abs().min(128);
    let b = if n < 8 {
        n as usize
    } else {
        (2 + (n * n).ilog2() as usize).min(NUM_BUCKETS / 2 - 1)
    };
    upper + b
}

/// Every head's bias for every offset `j - i` of sequences up to
/// `max_len` tokens.
pub(crate) struct RelativeBias {
    heads: usize,
    max_len: usize,
    /// `[heads][2 * max_len - 1]`: entry `k` is the bias of `j - i = k -
    /// (max_len - 1)`.
    rel: Vec<f32>,
}

impl RelativeBias {
    /// From the `[NUM_BUCKETS, heads]` table (row-major, as safetensors
    /// holds it), for sequences of up to `max_len` tokens.
    pub(crate) fn new(table: &[f32], heads: usize, max_len: usize) -> RelativeBias {
        assert_eq!(
            table.len(),
            NUM_BUCKETS * heads,
            "relative_attention_bias: {NUM_BUCKETS} x {heads}"
        );
        let max_len = max_len.max(1);
        let span = 2 * max_len - 1;
        let mut rel = vec![0f32; heads * span];
        for h in 0..heads {
            for (k, r) in rel[h * span..(h + 1) * span].iter_mut().enumerate() {
                let i_minus_j = (max_len - 1) as i64 - k as i64;
                *r = table[bucket(i_minus_j) * heads + h];
            }
        }
        RelativeBias {
            heads,
            max_len,
            rel,
        }
    }

    /// Heads of the table.
    #[cfg(test)]
    pub(crate) fn heads(&self) -> usize {
        self.heads
    }

    /// Head `head`'s bias for a sequence of `len` tokens (at most the
    /// `max_len` it was made for): `2 * len - 1` floats, the bias of query
    /// `i` and key `j` at `len - 1 + j - i`, so query i's row over keys
    /// `0..len` is `[len - 1 - i..][..len]`. The shape
    /// [`super::window::attention_head_banded`] and [`scale_add_bias`]
    /// take.
    pub(crate) fn head(&self, head: usize, len: usize) -> &[f32] {
        assert!(
            head < self.heads && len <= self.max_len,
            "relative bias: head {head} of {}, length {len} of {}",
            self.heads,
            self.max_len
        );
        if len == 0 {
            return &[];
        }
        let span = 2 * self.max_len - 1;
        let start = head * span + self.max_len - len;
        &self.rel[start..start + 2 * len - 1]
    }
}

kernel! {
    /// The scores of one sequence and one head (`len x len`, query rows),
    /// as attention's long path makes them (Q K^T by gemm): `s = s * scale
    /// + bias`, `bias` as [`RelativeBias::head`] gives it. A softmax of the
    /// rows follows (`kernels::softmax_rows(isa, s, len, 1.0)`).
    fn scale_add_bias(s: &mut [f32], len: usize, scale: f32, bias: &[f32]) {
        for (i, row) in s.chunks_exact_mut(len).take(len).enumerate() {
            let b = &bias[len - 1 - i..][..len];
            for (v, b) in row.iter_mut().zip(b) {
                *v = *v * scale + b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::isas;

    /// Where each bucket starts, for n = i - j >= 0, as transformers 5.25's
    /// `MPNetEncoder.relative_position_bucket` (torch 2.15) gives them over
    /// -300..=300: bucket b covers STARTS[b]..STARTS[b + 1].
    const STARTS: [i64; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91];

    fn transformers_bucket(i_minus_j: i64) -> usize {
        let n = i_minus_j.abs();
        let b = STARTS.iter().rposition(|&s| s <= n).unwrap();
        b + if i_minus_j < 0 { 16 } else { 0 }
    }

    #[test]
    fn buckets_are_transformers_mpnet_buckets() {
        for n in -300..=300 {
            assert_eq!(bucket(n), transformers_bucket(n), "i - j = {n}");
        }
        // Straight from transformers, called with relative_position = j - i
        // (-16, -15, -17, 16, 15, 17, -32, 32, -64, 64, -128, 128, -127, 127,
        // -129, 300, -300, -1, 1, 0, -7, 7, -8, 8).
        let j_minus_i: [i64; 24] = [
            -16, -15, -17, 16, 15, 17, -32, 32, -64, 64, -128, 128, -127, 127, -129, 300, -300, -1,
            1, 0, -7, 7, -8, 8,
        ];
        let want = [
            10, 9, 10, 26, 25, 26, 12, 28, 14, 30, 15, 31, 15, 31, 15, 31, 15, 1, 17, 0, 7, 23, 8,
            24,
        ];
        for (r, w) in j_minus_i.into_iter().zip(want) {
            assert_eq!(bucket(-r), w, "j - i = {r}");
        }
        assert_eq!(bucket(i64::MAX), 15);
        assert_eq!(bucket(i64::MIN), 31);
    }

    #[test]
    fn each_heads_bias_is_the_table_row_of_the_bucket_of_i_minus_j() {
        let heads = 3;
        // table[b][h] = 100 b + h: the value names its bucket and head.
        let table: Vec<f32> = (0..NUM_BUCKETS * heads)
            .map(|x| (100 * (x / heads) + x % heads) as f32)
            .collect();
        let rb = RelativeBias::new(&table, heads, 300);
        assert_eq!(rb.heads(), 3);
        assert!(rb.head(0, 0).is_empty());
        for len in [1, 2, 9, 130, 300] {
            for h in 0..heads {
                let b = rb.head(h, len);
                assert_eq!(b.len(), 2 * len - 1);
                for i in 0..len {
                    let row = &b[len - 1 - i..][..len];
                    for (j, &v) in row.iter().enumerate() {
                        let want = 100 * bucket(i as i64 - j as i64) + h;
                        assert_eq!(v, want as f32, "len {len} head {h} i {i} j {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn scale_add_bias_scales_then_adds_each_rows_bias_on_every_isa() {
        let len = 21;
        let bias: Vec<f32> = (0..2 * len - 1).map(|k| k as f32 * 0.5 - 3.0).collect();
        let s0: Vec<f32> = (0..len * len).map(|x| (x as f32 * 0.731).sin()).collect();
        for isa in isas() {
            let mut s = s0.clone();
            scale_add_bias(isa, &mut s, len, 0.125, &bias);
            for i in 0..len {
                for j in 0..len {
                    let want = s0[i * len + j] as f64 * 0.125 + bias[len - 1 + j - i] as f64;
                    assert!(
                        (s[i * len + j] as f64 - want).abs() < 1e-6,
                        "{isa:?} {i} {j}"
                    );
                }
            }
        }
    }
}
