//! Attention of one sequence and one head over a band of keys, with an
//! optional bias that depends on `j - i`: ModernBERT's sliding-window
//! layers, and MPNet's relative position bias.
//!
//! ModernBERT's sliding layers (layer `l` is global when `l %
//! global_attn_every_n_layers == 0`, sliding otherwise; transformers 5
//! writes `layer_types`) let query `i` see key `j` only when `|i - j| <=
//! local_attention / 2` (transformers' `sliding_window_bidirectional_overlay`,
//! `config.sliding_window = local_attention // 2`): a symmetric, inclusive
//! band, cut by the sequence's own ends. Per query that is at most
//! `local_attention + 1` keys (129 for the real models), so a long
//! sequence costs `len * band` multiply-adds per value, not `len²`: no
//! gemm of full scores.
//!
//! The kernel is `kernels::attention_head`'s (keys transposed and scaled
//! once, scores as broadcast multiply-adds over whole 16-lane chunks) over
//! only the chunks that hold the query's band, with lanes outside the band
//! dropped from the softmax by selection. A band as wide as the sequence
//! is plain attention, so MPNet's layers run it too, with `bias`.

use crate::model::kernels::{self, Isa, LANES, hsum, padded, weighted_rows};

/// The keys query `i` of a sequence of `len` tokens sees through a band of
/// `half` on either side: `i - half..=i + half`, within `0..len`.
pub(crate) fn band(i: usize, len: usize, half: usize) -> std::ops::Range<usize> {
    i.saturating_sub(half)..i.saturating_add(half).saturating_add(1).min(len)
}

kernel! {
    /// Self-attention of one sequence and one head, each of the first
    /// `queries` queries `i` over the keys
    /// of [`band`]`(i, len, half)` (`half >= len`: all of them), with
    /// `bias[len - 1 + j - i]` added to the scaled score of query `i` and
    /// key `j` when `bias` is not empty (`2 * len - 1` floats, as
    /// `relative_bias::RelativeBias::head` gives them).
    ///
    /// As `kernels::attention_head`: `qkv` holds the sequence's rows (`len`
    /// of them, `stride` apart) with this head's query, key and value at
    /// columns `q`, `k` and `v`, each `dh` wide; `out` gets the context,
    /// `queries` rows of `dh`; `kt` (at least `dh * padded(len)`) and `scores`
    /// (at least `padded(len)`) are scratch.
    fn attention_head_banded(qkv: &[f32], stride: usize, len: usize, queries: usize, q: usize, k: usize, v: usize, dh: usize, scale: f32, half: usize, bias: &[f32], kt: &mut [f32], scores: &mut [f32], out: &mut [f32]) {
        let lp = padded(len);
        let kt = &mut kt[..dh * lp];
        for j in 0..lp {
            for d in 0..dh {
                kt[d * lp + j] = if j < len { qkv[j * stride + k + d] * scale } else { 0.0 };
            }
        }
        let biased = !bias.is_empty();
        for (i, o) in out.chunks_exact_mut(dh).take(queries.min(len)).enumerate() {
            let keys = band(i, len, half);
            let (lo, hi) = (keys.start, keys.end);
            // The chunks that hold lo..hi; s[x] is key base + x.
            let (c0, c1) = (lo / LANES, hi.div_ceil(LANES));
            let base = c0 * LANES;
            let s = &mut scores[..(c1 - c0) * LANES];
            let qi = &qkv[i * stride + q..i * stride + q + dh];
            for (c, sc) in s.chunks_exact_mut(LANES).enumerate() {
                let col = base + c * LANES;
                let mut a0 = [0f32; LANES];
                let mut a1 = [0f32; LANES];
                let mut d = 0;
                while d + 1 < dh {
                    let r0 = &kt[d * lp + col..][..LANES];
                    let r1 = &kt[(d + 1) * lp + col..][..LANES];
                    let (x0, x1) = (qi[d], qi[d + 1]);
                    for l in 0..LANES {
                        a0[l] += x0 * r0[l];
                        a1[l] += x1 * r1[l];
                    }
                    d += 2;
                }
                if d < dh {
                    let r0 = &kt[d * lp + col..][..LANES];
                    for l in 0..LANES {
                        a0[l] += qi[d] * r0[l];
                    }
                }
                for l in 0..LANES {
                    sc[l] = a0[l] + a1[l];
                }
            }
            if biased {
                // Query i's row of the bias: key j at len - 1 - i + j.
                let b = &bias[len - 1 - i + lo..len - 1 - i + hi];
                for (x, b) in s[lo - base..hi - base].iter_mut().zip(b) {
                    *x += b;
                }
            }
            let mut mx = [f32::MIN; LANES];
            for (c, sc) in s.chunks_exact(LANES).enumerate() {
                for l in 0..LANES {
                    let j = base + c * LANES + l;
                    let x = if j >= lo && j < hi { sc[l] } else { f32::MIN };
                    mx[l] = if x > mx[l] { x } else { mx[l] };
                }
            }
            let m = mx.iter().fold(f32::MIN, |a, &b| if b > a { b } else { a });
            let mut acc = [0f32; LANES];
            for (c, sc) in s.chunks_exact_mut(LANES).enumerate() {
                for l in 0..LANES {
                    let j = base + c * LANES + l;
                    let e = kernels::exp::<FMA>(sc[l] - m);
                    let e = if j >= lo && j < hi { e } else { 0.0 };
                    sc[l] = e;
                    acc[l] += e;
                }
            }
            let inv = 1.0 / hsum(acc);
            weighted_rows(o, &s[lo - base..hi - base], inv, &qkv[lo * stride + v..], stride);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{isas, noise};

    /// The definition with a mask, as transformers' eager attention: scores
    /// scaled, the bias added, keys outside |i - j| <= half at -inf,
    /// softmax, times the values. In f64.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        qkv: &[f32],
        stride: usize,
        len: usize,
        (q, k, v): (usize, usize, usize),
        dh: usize,
        scale: f64,
        half: usize,
        bias: &[f32],
    ) -> Vec<f64> {
        let mut out = vec![0f64; len * dh];
        for i in 0..len {
            let s: Vec<f64> = (0..len)
                .map(|j| {
                    if i.abs_diff(j) > half {
                        return f64::NEG_INFINITY;
                    }
                    let dotp: f64 = (0..dh)
                        .map(|d| qkv[i * stride + q + d] as f64 * qkv[j * stride + k + d] as f64)
                        .sum();
                    let b = if bias.is_empty() {
                        0.0
                    } else {
                        bias[len - 1 + j - i] as f64
                    };
                    dotp * scale + b
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for d in 0..dh {
                out[i * dh + d] = (0..len)
                    .map(|j| (s[j] - m).exp() / z * qkv[j * stride + v + d] as f64)
                    .sum();
            }
        }
        out
    }

    #[test]
    fn band_is_symmetric_inclusive_and_cut_by_the_sequence() {
        assert_eq!(band(0, 10, 4), 0..5);
        assert_eq!(band(5, 10, 4), 1..10);
        assert_eq!(band(9, 10, 4), 5..10);
        assert_eq!(band(3, 10, 0), 3..4);
        assert_eq!(band(3, 10, usize::MAX), 0..10);
    }

    #[test]
    fn banded_attention_is_the_masked_definition_on_every_isa() {
        for isa in isas() {
            for (len, dh, heads) in [(1, 8, 1), (5, 8, 2), (17, 12, 2), (40, 32, 1), (100, 64, 1)] {
                let stride = 3 * dh * heads;
                let qkv = noise(len * stride, (len * 7 + dh) as u32);
                let bias = noise(2 * len - 1, 11);
                for half in [0, 1, 4, 16, 64, usize::MAX] {
                    for biased in [false, true] {
                        let bias: &[f32] = if biased { &bias } else { &[] };
                        for h in 0..heads {
                            let cols = (h * dh, heads * dh + h * dh, 2 * heads * dh + h * dh);
                            let mut out = vec![f32::NAN; len * dh];
                            let mut kt = vec![f32::NAN; dh * padded(len)];
                            let mut scores = vec![f32::NAN; padded(len)];
                            let scale = 1.0 / (dh as f32).sqrt();
                            attention_head_banded(
                                isa,
                                &qkv,
                                stride,
                                len,
                                len,
                                cols.0,
                                cols.1,
                                cols.2,
                                dh,
                                scale,
                                half,
                                bias,
                                &mut kt,
                                &mut scores,
                                &mut out,
                            );
                            let want =
                                reference(&qkv, stride, len, cols, dh, scale as f64, half, bias);
                            for (x, (g, w)) in out.iter().zip(&want).enumerate() {
                                assert!(
                                    (*g as f64 - w).abs() < 2e-5,
                                    "{isa:?} len {len} dh {dh} half {half} bias {biased} \
                                     head {h} at {x}: {g} want {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The first `queries` contexts of one head (q, k, v at columns 0,
    /// dh, 2 dh of rows of `3 dh`, scale 0.2) by the banded kernel.
    fn banded(
        isa: Isa,
        qkv: &[f32],
        len: usize,
        queries: usize,
        dh: usize,
        half: usize,
        bias: &[f32],
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; queries * dh];
        let mut kt = vec![0f32; dh * padded(len)];
        let mut scores = vec![0f32; padded(len)];
        attention_head_banded(
            isa,
            qkv,
            3 * dh,
            len,
            queries,
            0,
            dh,
            2 * dh,
            dh,
            0.2,
            half,
            bias,
            &mut kt,
            &mut scores,
            &mut out,
        );
        out
    }

    /// The same by the plain kernel.
    fn plain(isa: Isa, qkv: &[f32], len: usize, queries: usize, dh: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; queries * dh];
        let mut kt = vec![0f32; dh * padded(len)];
        let mut scores = vec![0f32; 2 * padded(len)];
        kernels::attention_head(
            isa,
            qkv,
            3 * dh,
            len,
            queries,
            0,
            dh,
            2 * dh,
            dh,
            0.2,
            &mut kt,
            &mut scores,
            &mut out,
        );
        out
    }

    #[test]
    fn the_first_query_alone_is_the_first_row_of_all_queries() {
        for isa in isas() {
            for (len, dh) in [(1, 8), (3, 8), (16, 32), (48, 64), (70, 32)] {
                let qkv = noise(len * 3 * dh, 5);
                let bias = noise(2 * len - 1, 3);
                // Same operations in the same order: the same floats.
                for (half, bias) in [(usize::MAX, &[][..]), (2, &[][..]), (usize::MAX, &bias[..])] {
                    assert_eq!(
                        banded(isa, &qkv, len, 1, dh, half, bias),
                        banded(isa, &qkv, len, len, dh, half, bias)[..dh],
                        "{isa:?} len {len} half {half}"
                    );
                }
                // The plain kernel takes queries in pairs and a last one
                // alone: query 0 is the same floats either way.
                let all = plain(isa, &qkv, len, len, dh);
                assert_eq!(
                    plain(isa, &qkv, len, 1, dh),
                    all[..dh],
                    "{isa:?} len {len}: plain"
                );
                assert_eq!(
                    plain(isa, &qkv, len, len - 1, dh),
                    all[..(len - 1) * dh],
                    "{isa:?} len {len}"
                );
            }
        }
    }

    #[test]
    fn a_band_as_wide_as_the_sequence_is_kernels_attention_head() {
        for isa in isas() {
            for (len, dh) in [(3, 8), (16, 32), (48, 64)] {
                let qkv = noise(len * 3 * dh, 5);
                let plain = plain(isa, &qkv, len, len, dh);
                // The plain kernel fuses its multiply-adds where the CPU
                // can, the banded one not: a rounding apart.
                for half in [usize::MAX, len - 1] {
                    let banded = banded(isa, &qkv, len, len, dh, half, &[]);
                    for (x, (b, p)) in banded.iter().zip(&plain).enumerate() {
                        assert!(
                            (b - p).abs() <= 2e-6,
                            "{isa:?} len {len} half {half} at {x}: {b} vs {p}"
                        );
                    }
                }
            }
        }
    }
}
