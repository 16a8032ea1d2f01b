//! Rotary position embedding (RoPE) of queries and keys, as ModernBERT
//! uses it: ModernBERT has no position table; each layer rotates every
//! head's query and key by angles that grow with the token's position, so
//! the scores depend on relative positions.
//!
//! The layout is transformers' `rotate_half` (GPT-NeoX's), not the
//! interleaved pairs of the original paper: a head's `dh` values are two
//! halves, and value `d` of the first half turns with value `d` of the
//! second, by angle `position * inv_freq[d]`:
//!
//! ```text
//! x[d]        = x[d] cos - x[d + dh/2] sin
//! x[d + dh/2] = x[d + dh/2] cos + x[d] sin
//! ```
//!
//! with `inv_freq[d] = 1 / theta^(2d / dh)`. ModernBERT's two thetas
//! (160000 for global layers, 10000 for sliding ones) make two tables.
//!
//! The tables are made once per model as transformers makes them in f32:
//! `inv_freq` rounded to f32, the angle the f32 product `position *
//! inv_freq`, then its cosine and sine. Angles computed exactly instead
//! move the cosines at position 8191 by up to 4e-4 from transformers'.
//!
//! Positions restart at 0 with every sequence of a packed batch
//! ([`positions`]); a row's position picks its row of the tables.

use crate::model::kernels::Isa;

/// The cosines and sines of one theta, for positions `0..max_positions`.
pub(crate) struct Rotary {
    /// Half a head: the number of angles per position.
    half: usize,
    max_positions: usize,
    /// `[max_positions][half]`.
    cos: Vec<f32>,
    /// `[max_positions][half]`.
    sin: Vec<f32>,
}

impl Rotary {
    /// The tables of base `theta` for heads of `head_dim` (even) values,
    /// positions `0..max_positions`.
    pub(crate) fn new(theta: f64, head_dim: usize, max_positions: usize) -> Rotary {
        assert!(
            head_dim.is_multiple_of(2) && head_dim > 0,
            "rotary: head_dim {head_dim} is not even"
        );
        let half = head_dim / 2;
        // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)),
        // all f32 (torch's f32 pow is within an ulp of the f64 one rounded).
        let inv_freq: Vec<f32> = (0..half)
            .map(|d| {
                let e = (2 * d) as f32 / head_dim as f32;
                1.0 / theta.powf(e as f64) as f32
            })
            .collect();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in &inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rotary {
            half,
            max_positions,
            cos,
            sin,
        }
    }

    /// Values per head.
    pub(crate) fn head_dim(&self) -> usize {
        2 * self.half
    }

    /// One past the last position the tables hold.
    #[cfg(test)]
    pub(crate) fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates, in every row of `x` (rows `stride` apart, one per entry of
    /// `positions`), the first `width` values, a whole number of heads:
    /// the query and key columns of the packed `[q | k | v]` product are
    /// `width = 2 * hidden`. Row r turns by `positions[r]`.
    ///
    /// Rows are independent: a caller splitting the batch over threads
    /// hands each its rows and their positions. Panics on a position past
    /// the tables or rows that `x` does not hold.
    pub(crate) fn apply(
        &self,
        isa: Isa,
        x: &mut [f32],
        stride: usize,
        width: usize,
        positions: &[u32],
    ) {
        assert!(
            width.is_multiple_of(self.head_dim()) && width <= stride,
            "rotary: width {width} is not whole heads of {} within rows of {stride}",
            self.head_dim()
        );
        if let Some(r) = positions.len().checked_sub(1) {
            assert!(
                x.len() >= r * stride + width,
                "rotary: x holds too few rows"
            );
        }
        assert!(
            positions.iter().all(|&p| (p as usize) < self.max_positions),
            "rotary: a position past the {} of the tables",
            self.max_positions
        );
        rotate_rows(
            isa, x, stride, width, positions, &self.cos, &self.sin, self.half,
        );
    }
}

/// The position of every token of a packed batch of sequences of `lens`
/// tokens: 0..len for each, one after another.
pub(crate) fn positions(lens: &[usize]) -> Vec<u32> {
    lens.iter().flat_map(|&n| 0..n as u32).collect()
}

kernel! {
    /// The rotation itself ([`Rotary::apply`] has checked the bounds).
    fn rotate_rows(x: &mut [f32], stride: usize, width: usize, positions: &[u32], cos: &[f32], sin: &[f32], half: usize) {
        for (r, &p) in positions.iter().enumerate() {
            let p = p as usize;
            let c = &cos[p * half..(p + 1) * half];
            let s = &sin[p * half..(p + 1) * half];
            let row = &mut x[r * stride..r * stride + width];
            for head in row.chunks_exact_mut(2 * half) {
                let (a, b) = head.split_at_mut(half);
                for (((x1, x2), c), s) in a.iter_mut().zip(b.iter_mut()).zip(c).zip(s) {
                    let (u, w) = (*x1, *x2);
                    *x1 = u * c - w * s;
                    *x2 = w * c + u * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{isas, noise};

    #[test]
    fn tables_are_transformers_own() {
        // (theta, position, d, cos, sin) from transformers 5.25's
        // ModernBertRotaryEmbedding with head_dim 64 (torch 2.15, f32).
        let torch = [
            (160000.0, 1, 0, 0.5403023362159729, 0.8414709568023682),
            (160000.0, 1, 1, 0.7727358937263489, 0.6347276568412781),
            (160000.0, 1, 15, 0.9999933838844299, 0.0036355305928736925),
            (160000.0, 1, 31, 1.0, 9.088847036764491e-06),
            (160000.0, 127, 0, 0.23235909640789032, 0.9726300835609436),
            (160000.0, 127, 1, 0.8066862225532532, -0.5909799933433533),
            (160000.0, 127, 15, 0.8952904939651489, 0.4454827606678009),
            (160000.0, 127, 31, 0.9999993443489075, 0.001154283294454217),
            (160000.0, 8191, 0, -0.6463904976844788, -0.7630068063735962),
            (160000.0, 8191, 1, -0.959715723991394, 0.28097277879714966),
            (
                160000.0,
                8191,
                15,
                -0.06638529151678085,
                -0.9977940320968628,
            ),
            (160000.0, 8191, 31, 0.9972301125526428, 0.07437799870967865),
            (10000.0, 1, 0, 0.5403023362159729, 0.8414709568023682),
            (10000.0, 1, 1, 0.7317609786987305, 0.6815613508224487),
            (10000.0, 1, 15, 0.9999110698699951, 0.013334820047020912),
            (10000.0, 1, 31, 1.0, 0.0001333521504420787),
            (10000.0, 127, 0, 0.23235909640789032, 0.9726300835609436),
            (10000.0, 127, 1, 0.5497052073478699, 0.835358738899231),
            (10000.0, 127, 15, -0.12246773391962051, 0.9924724698066711),
            (10000.0, 127, 31, 0.9998565912246704, 0.016934912651777267),
            (10000.0, 8191, 0, -0.6463904976844788, -0.7630068063735962),
            (10000.0, 8191, 1, -0.8420827984809875, -0.539348304271698),
            (10000.0, 8191, 15, -0.7471727132797241, 0.6646298766136169),
            (10000.0, 8191, 31, 0.46045607328414917, 0.8876824975013733),
        ];
        let global = Rotary::new(160000.0, 64, 8192);
        let local = Rotary::new(10000.0, 64, 8192);
        assert_eq!((global.head_dim(), global.max_positions()), (64, 8192));
        for (theta, p, d, c, s) in torch {
            let t = if theta == 160000.0 { &global } else { &local };
            let (gc, gs) = (t.cos[p * 32 + d] as f64, t.sin[p * 32 + d] as f64);
            // An ulp or so of f32 (torch's own cos and sin are within one).
            assert!(
                (gc - c).abs() < 1.2e-7 && (gs - s).abs() < 1.2e-7,
                "theta {theta} position {p} d {d}: ({gc}, {gs}) want ({c}, {s})"
            );
        }
    }

    #[test]
    fn rotation_is_transformers_apply_rotary_pos_emb() {
        // transformers' apply_rotary_pos_emb on q = sin(0.37 i), k = cos(0.23
        // i) (i the index in [token][head][dh]), 3 tokens at positions 0, 1,
        // 2, 2 heads of 8, theta 10000: the half-split layout.
        let want_q = [
            0.0, 0.3616154, 0.6742879, 0.8956987, 0.9958808, 0.9612752, 0.7965655, 0.5240442,
            0.1805962, -0.1872946, -0.5298362, -0.8006669, -0.963131, -0.9952399, -0.8926476,
            -0.6692397, -0.9481811, -0.092701, 0.3583484, 0.678512, 0.1866386, 0.9921777,
            0.9630063, 0.793106, 0.9571579, 0.2693542, -0.1840292, -0.5347134, 0.0012757,
            -0.9427614, -0.9964427, -0.8900903, -0.3458344, -0.5210562, -0.006313, 0.3723727,
            -0.8886845, 0.8143917, 0.9970973, 0.9581765, 0.1642162, 0.6628496, 0.1864741,
            -0.1986769, 0.942035, -0.6908404, -0.9631717, -0.9942186,
        ];
        let want_k = [
            1.0, 0.9736664, 0.8960525, 0.771246, 0.6058201, 0.4084875, 0.1896408, -0.0391936,
            -0.2659639, -0.4787265, -0.666276, -0.8187346, -0.9280727, -0.9885318, -0.9969277,
            -0.9528182, -0.3694907, -0.7271408, -0.5450213, -0.3362844, -0.7830214, 0.0449717,
            0.3352193, 0.545688, -0.4407029, 0.7644328, 0.9461855, 0.9966603, 1.1417515, 1.0074644,
            0.825228, 0.6633698, 0.1784556, 0.3769067, 0.0494583, -0.1929686, 0.6031017, -0.54597,
            -0.773725, -0.8987464, 1.1039381, -0.8605224, -0.9641944, -0.8933511, -0.5668588,
            -0.7883306, -0.4230827, -0.1862977,
        ];
        let (tokens, w) = (3, 16);
        let stride = 3 * w;
        let rope = Rotary::new(10000.0, 8, 16);
        for isa in isas() {
            let mut x = vec![0f32; tokens * stride];
            for t in 0..tokens {
                for i in 0..w {
                    let n = (t * w + i) as f32;
                    x[t * stride + i] = (n * 0.37).sin();
                    x[t * stride + w + i] = (n * 0.23).cos();
                    x[t * stride + 2 * w + i] = 7.0;
                }
            }
            rope.apply(isa, &mut x, stride, 2 * w, &positions(&[tokens]));
            for t in 0..tokens {
                for i in 0..w {
                    let (q, k) = (x[t * stride + i], x[t * stride + w + i]);
                    assert!((q - want_q[t * w + i]).abs() < 1e-6, "{isa:?} q {t} {i}");
                    assert!((k - want_k[t * w + i]).abs() < 1e-6, "{isa:?} k {t} {i}");
                    assert_eq!(x[t * stride + 2 * w + i], 7.0, "values are not turned");
                }
            }
        }
    }

    #[test]
    fn a_packed_batch_turns_each_sequence_from_position_zero_on_every_isa() {
        let (heads, dh) = (3, 12);
        let h = heads * dh;
        let stride = 3 * h;
        let lens = [5, 1, 0, 9, 4];
        let m: usize = lens.iter().sum();
        let pos = positions(&lens);
        assert_eq!(pos.len(), m);
        assert_eq!(&pos[..7], &[0, 1, 2, 3, 4, 0, 0]);
        let x0 = noise(m * stride, 3);
        for theta in [10000.0, 160000.0] {
            let rope = Rotary::new(theta, dh, 16);
            for isa in isas() {
                let mut x = x0.clone();
                rope.apply(isa, &mut x, stride, 2 * h, &pos);
                for (r, &p) in pos.iter().enumerate() {
                    for col in 0..stride {
                        let got = x[r * stride + col] as f64;
                        if col >= 2 * h {
                            assert_eq!(got, x0[r * stride + col] as f64);
                            continue;
                        }
                        // The definition, in f64 over the same f32 angles.
                        let (head, d) = (col / dh, col % dh);
                        let base = r * stride + head * dh;
                        let j = d % (dh / 2);
                        let inv = 1.0 / theta.powf(((2 * j) as f32 / dh as f32) as f64) as f32;
                        let angle = (p as f32 * inv) as f64;
                        let (c, s) = (angle.cos(), angle.sin());
                        let (x1, x2) = (x0[base + j] as f64, x0[base + dh / 2 + j] as f64);
                        let want = if d < dh / 2 {
                            x1 * c - x2 * s
                        } else {
                            x2 * c + x1 * s
                        };
                        assert!(
                            (got - want).abs() < 1e-6,
                            "{isa:?} theta {theta} row {r} col {col}: {got} want {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scores_of_rotated_queries_and_keys_depend_on_the_distance_only() {
        // RoPE's point: q(p) . k(p') is a function of p - p'.
        let dh = 16;
        let rope = Rotary::new(10000.0, dh, 64);
        let q0 = noise(dh, 5);
        let k0 = noise(dh, 6);
        let score = |pq: u32, pk: u32| {
            let mut x = [q0.clone(), k0.clone()].concat();
            rope.apply(Isa::Scalar, &mut x[..dh], dh, dh, &[pq]);
            rope.apply(Isa::Scalar, &mut x[dh..], dh, dh, &[pk]);
            (0..dh).map(|d| x[d] as f64 * x[dh + d] as f64).sum::<f64>()
        };
        for (a, b, shift) in [(3, 1, 10), (0, 7, 40), (20, 20, 3)] {
            assert!((score(a, b) - score(a + shift, b + shift)).abs() < 1e-4);
        }
        assert!((score(3, 1) - score(1, 3)).abs() > 1e-3);
    }
}
