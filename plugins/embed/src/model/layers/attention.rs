//! Multi-head self-attention over a packed batch: every sequence attends
//! over its own tokens only, so nothing is padded and no mask is needed.
//!
//! The input is the `[tokens, 3 * hidden]` output of the stacked query, key
//! and value product (every architecture packs its three projections into
//! one [`super::linear::Linear`]); the output is the `[tokens, hidden]`
//! context, heads side by side, ready for the output projection.
//!
//! What differs between architectures is only what happens to the scores
//! ([`Scores`]): BERT's are plain; MPNet adds a relative position bias to
//! every head's scores; ModernBERT's local layers see a window of keys.
//! Rotary embeddings (ModernBERT) rotate the query and key columns before
//! this runs, so they need nothing here.

use super::relative_bias::{RelativeBias, scale_add_bias};
use super::window::attention_head_banded;
use crate::model::kernels::{self, Isa};
use crate::model::mmap::Scratch;
use crate::model::profile::{self, Part};
use crate::model::strided::matmul_strided;

/// Sequences up to this long take the row-by-row attention kernel; longer
/// ones two gemm products per head.
const SMALL_ATTENTION: usize = 48;

/// A bias added to one head's scores of one sequence: `(head, len,
/// scores)`, scores `len x len` (query-major), already scaled by
/// 1/sqrt(head size), before the softmax.
pub(crate) type ScoreBias<'a> = &'a (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// What an architecture does to the attention scores besides scaling
/// them; the default (nothing) is BERT's.
#[derive(Clone, Copy, Default)]
pub(crate) struct Scores<'a> {
    /// Added to every head's scaled scores (MPNet's relative position
    /// bias).
    pub bias: Option<ScoreBias<'a>>,
    /// Query i sees only keys j with |i - j| <= window (ModernBERT's local
    /// layers: `local_attention / 2`).
    pub window: Option<usize>,
    /// MPNet's relative position bias, made once per model: short
    /// sequences run [`attention_head_banded`] over the whole sequence
    /// with it, long ones add it to the gemm's scores.
    pub relative: Option<&'a RelativeBias>,
}

impl Scores<'_> {
    fn plain(&self) -> bool {
        self.bias.is_none() && self.window.is_none() && self.relative.is_none()
    }
}

/// The attention of one layer's shape: hidden size and heads.
pub(crate) struct Attention {
    pub hidden: usize,
    pub heads: usize,
    pub isa: Isa,
}

impl Attention {
    /// ctx (`lens.sum() x hidden`) from qkv (`lens.sum() x 3 hidden`), the
    /// sequences of `lens` tokens one after another, over `threads` threads
    /// (`team.rs`).
    pub(crate) fn forward(
        &self,
        qkv: &[f32],
        lens: &[usize],
        ctx: &mut [f32],
        threads: usize,
        scores: Scores<'_>,
    ) {
        let _span = profile::span(Part::Attention);
        let h = self.hidden;
        let heads = self.heads;
        let dh = h / heads;
        // Every (sequence, head) writes its own contiguous block of a
        // head-major buffer: [sequence][head][token][dh].
        let mut blocks = Scratch::zeroed(ctx.len());
        let mut tasks: Vec<(usize, usize, usize, &mut [f32])> =
            Vec::with_capacity(lens.len() * heads);
        let mut rest: &mut [f32] = &mut blocks;
        let mut start = 0;
        for &len in lens {
            for head in 0..heads {
                let (b, r) = rest.split_at_mut(len * dh);
                rest = r;
                tasks.push((start, len, head, b));
            }
            start += len;
        }
        let run = |(start, len, head, out): (usize, usize, usize, &mut [f32])| {
            let rows = &qkv[start * 3 * h..(start + len) * 3 * h];
            self.one(rows, len, head, out, &scores);
        };
        crate::model::team::each_item(threads, tasks, run);
        // Back to token-major [token][head * dh].
        let mut off = 0;
        let mut start = 0;
        for &len in lens {
            for head in 0..heads {
                for t in 0..len {
                    let dst = (start + t) * h + head * dh;
                    ctx[dst..dst + dh].copy_from_slice(&blocks[off + t * dh..off + (t + 1) * dh]);
                }
                off += len * dh;
            }
            start += len;
        }
    }

    /// Each sequence's first token's context alone (`lens.len() x
    /// hidden`, heads side by side) from qkv as [`Attention::forward`]
    /// reads it, of which only the first row of each sequence needs its
    /// queries: the last layer of a pass whose head reads the first token
    /// (a cross-encoder, a [CLS]-pooled embedder) needs no other query.
    pub(crate) fn forward_first(
        &self,
        qkv: &[f32],
        lens: &[usize],
        ctx: &mut [f32],
        threads: usize,
        scores: Scores<'_>,
    ) {
        let _span = profile::span(Part::Attention);
        let (h, heads) = (self.hidden, self.heads);
        let dh = h / heads;
        let mut starts = Vec::with_capacity(lens.len());
        let mut start = 0;
        for &len in lens {
            starts.push(start);
            start += len;
        }
        // Sequence-major, then head: each task's dh floats are its head's
        // columns of its sequence's row.
        let tasks: Vec<(usize, &mut [f32])> = ctx[..lens.len() * h]
            .chunks_exact_mut(dh)
            .enumerate()
            .collect();
        let run = |(t, out): (usize, &mut [f32])| {
            let (seq, head) = (t / heads, t % heads);
            let (start, len) = (starts[seq], lens[seq]);
            let rows = &qkv[start * 3 * h..(start + len) * 3 * h];
            if len == 0 {
                return;
            }
            match (scores.bias, scores.relative) {
                // A bias given as a whole matrix: the whole head, then its
                // first row.
                (Some(_), _) => {
                    let mut all = vec![0f32; len * dh];
                    self.one(rows, len, head, &mut all, &scores);
                    out.copy_from_slice(&all[..dh]);
                }
                (None, rb) => {
                    let bias = rb.map_or(&[][..], |rb| rb.head(head, len));
                    let half = scores.window.unwrap_or(usize::MAX);
                    self.short(rows, len, 1, head, half, bias, out);
                }
            }
        };
        crate::model::team::each_item(threads, tasks, run);
    }

    /// The first `queries` queries of one sequence and one head into out
    /// (`queries x dh`) on a short sequence's kernel: keys within `half`
    /// (`window.rs`), `bias` (`2 len - 1` floats, or none) added to the
    /// scores.
    #[allow(clippy::too_many_arguments)]
    fn short(
        &self,
        qkv: &[f32],
        len: usize,
        queries: usize,
        head: usize,
        half: usize,
        bias: &[f32],
        out: &mut [f32],
    ) {
        let h = self.hidden;
        let dh = h / self.heads;
        let scale = 1.0 / (dh as f32).sqrt();
        let (q, k, v) = (head * dh, h + head * dh, 2 * h + head * dh);
        let mut kt = vec![0f32; dh * kernels::padded(len)];
        let mut scores = vec![0f32; 2 * kernels::padded(len)];
        // The plain kernel (no band to bound, queries in pairs) takes about
        // a third less time a head than the banded one at 28 tokens.
        if half >= len && bias.is_empty() {
            kernels::attention_head(
                self.isa,
                qkv,
                3 * h,
                len,
                queries,
                q,
                k,
                v,
                dh,
                scale,
                &mut kt,
                &mut scores,
                out,
            );
        } else {
            attention_head_banded(
                self.isa,
                qkv,
                3 * h,
                len,
                queries,
                q,
                k,
                v,
                dh,
                scale,
                half,
                bias,
                &mut kt,
                &mut scores,
                out,
            );
        }
    }

    /// One sequence (its qkv rows) and one head into out (len x dh).
    fn one(&self, qkv: &[f32], len: usize, head: usize, out: &mut [f32], rule: &Scores<'_>) {
        let h = self.hidden;
        let dh = h / self.heads;
        let stride = 3 * h;
        let (q, k, v) = (head * dh, h + head * dh, 2 * h + head * dh);
        let scale = 1.0 / (dh as f32).sqrt();
        if len == 0 {
            return;
        }
        // A window (ModernBERT's local layers) costs len * band on the
        // banded kernel at any length; MPNet's bias rides it while short,
        // and plain attention takes the plain kernel while short.
        let short = match (rule.window, rule.relative) {
            _ if rule.bias.is_some() => None,
            (Some(w), None) => Some((w, &[][..])),
            (None, Some(rb)) if len <= SMALL_ATTENTION => Some((usize::MAX, rb.head(head, len))),
            (None, None) if len <= SMALL_ATTENTION => Some((usize::MAX, &[][..])),
            _ => None,
        };
        if let Some((half, bias)) = short {
            self.short(qkv, len, len, head, half, bias, out);
            return;
        }
        let mut scores = vec![0f32; len * len];
        // SAFETY: qkv holds len rows of stride floats, so query and key rows
        // at offsets q and k (each dh wide, q + dh <= stride) are in bounds;
        // scores is len x len.
        unsafe {
            matmul_strided(
                len,
                len,
                dh,
                qkv.as_ptr().add(q),
                stride,
                1,
                qkv.as_ptr().add(k),
                1,
                stride,
                scores.as_mut_ptr(),
                len,
            )
        };
        if rule.plain() {
            kernels::softmax_rows(self.isa, &mut scores, len, scale);
        } else {
            match rule.relative {
                Some(rb) => scale_add_bias(self.isa, &mut scores, len, scale, rb.head(head, len)),
                None => kernels::scale(self.isa, &mut scores, scale),
            }
            if let Some(bias) = rule.bias {
                bias(head, len, &mut scores[..]);
            }
            if let Some(w) = rule.window {
                for (i, row) in scores.chunks_exact_mut(len).enumerate() {
                    for (j, s) in row.iter_mut().enumerate() {
                        if i.abs_diff(j) > w {
                            // Past the window: the softmax's exp of it is
                            // below 1e-37, nothing beside the diagonal's 1.
                            *s = f32::MIN;
                        }
                    }
                }
            }
            kernels::softmax_rows(self.isa, &mut scores, len, 1.0);
        }
        // SAFETY: scores is len x len, the value rows at offset v are in
        // bounds as above, out is len x dh and ours alone.
        unsafe {
            matmul_strided(
                len,
                dh,
                len,
                scores.as_ptr(),
                len,
                1,
                qkv.as_ptr().add(v),
                stride,
                1,
                out.as_mut_ptr(),
                dh,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::noise;

    /// The definition in f64: softmax(q k^T / sqrt(dh) + bias, masked) v.
    fn reference(
        qkv: &[f32],
        len: usize,
        hidden: usize,
        heads: usize,
        bias: &dyn Fn(usize, usize, usize) -> f64,
        window: Option<usize>,
    ) -> Vec<f32> {
        let dh = hidden / heads;
        let s3 = 3 * hidden;
        let mut ctx = vec![0f32; len * hidden];
        for hd in 0..heads {
            for i in 0..len {
                let s: Vec<f64> = (0..len)
                    .map(|j| {
                        if window.is_some_and(|w| i.abs_diff(j) > w) {
                            return f64::NEG_INFINITY;
                        }
                        let dot: f64 = (0..dh)
                            .map(|d| {
                                qkv[i * s3 + hd * dh + d] as f64
                                    * qkv[j * s3 + hidden + hd * dh + d] as f64
                            })
                            .sum();
                        dot / (dh as f64).sqrt() + bias(hd, i, j)
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for d in 0..dh {
                    let v: f64 = (0..len)
                        .map(|j| {
                            (s[j] - m).exp() / z * qkv[j * s3 + 2 * hidden + hd * dh + d] as f64
                        })
                        .sum();
                    ctx[i * hidden + hd * dh + d] = v as f32;
                }
            }
        }
        ctx
    }

    /// A score rule, the bias it adds (for the reference) and its window.
    type Case<'a> = (
        Scores<'a>,
        &'a dyn Fn(usize, usize, usize) -> f64,
        Option<usize>,
    );

    #[test]
    fn packed_attention_matches_the_definition_with_and_without_score_rules() {
        let (hidden, heads) = (16, 4);
        let lens = [3usize, 60, 1, 20];
        let total: usize = lens.iter().sum();
        let qkv = noise(total * 3 * hidden, 7);
        let bias_of =
            |hd: usize, i: usize, j: usize| ((hd + 1) as f64 * 0.1) * (i as f64 - j as f64).tanh();
        let bias = |hd: usize, len: usize, s: &mut [f32]| {
            for i in 0..len {
                for j in 0..len {
                    s[i * len + j] += bias_of(hd, i, j) as f32;
                }
            }
        };
        let zero = |_: usize, _: usize, _: usize| 0.0;
        // MPNet's bias: short sequences on the banded kernel, the 60 on
        // the gemm path.
        let table = noise(super::super::relative_bias::NUM_BUCKETS * heads, 3);
        let rb = RelativeBias::new(&table, heads, 60);
        let relative_of = |hd: usize, i: usize, j: usize| {
            let b = super::super::relative_bias::bucket(i as i64 - j as i64);
            table[b * heads + hd] as f64
        };
        for isa in Isa::all_supported() {
            let att = Attention { hidden, heads, isa };
            let cases: [Case<'_>; 4] = [
                (Scores::default(), &zero, None),
                (
                    Scores {
                        bias: Some(&bias),
                        window: None,
                        relative: None,
                    },
                    &bias_of,
                    None,
                ),
                (
                    Scores {
                        bias: None,
                        window: Some(4),
                        relative: None,
                    },
                    &zero,
                    Some(4),
                ),
                (
                    Scores {
                        relative: Some(&rb),
                        ..Scores::default()
                    },
                    &relative_of,
                    None,
                ),
            ];
            for (rule, b, w) in cases {
                for threads in [1, 2] {
                    let mut ctx = vec![f32::NAN; total * hidden];
                    att.forward(&qkv, &lens, &mut ctx, threads, rule);
                    let mut start = 0;
                    for &len in &lens {
                        let rows = &qkv[start * 3 * hidden..(start + len) * 3 * hidden];
                        let want = reference(rows, len, hidden, heads, b, w);
                        let got = &ctx[start * hidden..(start + len) * hidden];
                        for (g, w) in got.iter().zip(&want) {
                            assert!((g - w).abs() < 1e-5, "{isa:?} len {len}: {g} vs {w}");
                        }
                        start += len;
                    }
                }
            }
        }
    }
}
