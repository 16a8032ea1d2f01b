//! The BERT encoder's forward pass over a packed batch.
//!
//! The batch's sequences are concatenated: every dense layer (query, key and
//! value as one product, attention output, feed-forward, layer norms, GELU)
//! runs once over all M real tokens of the batch, and only attention runs
//! per sequence, over that sequence's own tokens. Nothing is padded, so no
//! attention mask is needed.
//!
//! Every weight is a slice of the packed cache's shared mapping
//! (cache.rs); a pass's scratch buffers are its own, freed when it ends
//! (mmap.rs).

use super::cache::Packed;
use super::config::{Activation, BertConfig};
use super::kernels::{self, Isa};
use super::matmul::{Linear, matmul};
use super::mmap::{Scratch, Tensor};
use super::strided::matmul_strided;

pub(crate) struct LayerNorm {
    g: Tensor,
    b: Tensor,
}

struct Layer {
    /// Query, key and value as one `[hidden, 3 * hidden]` product.
    qkv: Linear,
    attn_out: Linear,
    ln_attn: LayerNorm,
    ffn_in: Linear,
    ffn_out: Linear,
    ln_ffn: LayerNorm,
}

pub(crate) struct Encoder {
    word: Tensor,
    pos: Tensor,
    /// Token type 0's embedding (single-sentence inputs use no other).
    ty0: Tensor,
    ln_emb: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    vocab: usize,
    max_len: usize,
    eps: f32,
    activation: Activation,
    isa: Isa,
}

/// Runs `f(rows, first_row)` over `a` (rows of `row` floats) cut into
/// `threads` runs of whole rows, in parallel on the current rayon pool when
/// `threads` > 1.
fn for_rows(threads: usize, a: &mut [f32], row: usize, f: impl Fn(&mut [f32], usize) + Sync) {
    let m = a.len() / row.max(1);
    if threads <= 1 || m < 2 {
        f(a, 0);
        return;
    }
    let per = m.div_ceil(threads);
    use rayon::prelude::*;
    a.par_chunks_mut(per * row)
        .enumerate()
        .for_each(|(i, rows)| f(rows, i * per));
}

/// Sequences up to this long take the row-by-row attention kernel; longer
/// ones two gemm products per head.
const SMALL_ATTENTION: usize = 48;

impl Encoder {
    /// Over the packed cache's tensors, which [`Packed`] has checked
    /// against `cfg`'s shapes.
    pub(crate) fn load(packed: &Packed, cfg: &BertConfig, max_len: usize, isa: Isa) -> Encoder {
        let (h, i) = (cfg.hidden, cfg.intermediate);
        let t = |name: &str| packed.tensor(name);
        let ln = |name: &str| LayerNorm {
            g: t(&format!("{name}.weight")),
            b: t(&format!("{name}.bias")),
        };
        let dense = |name: &str, k: usize, n: usize| {
            Linear::new(
                t(&format!("{name}.weight")),
                t(&format!("{name}.bias")),
                k,
                n,
            )
        };
        let layers = (0..cfg.layers)
            .map(|l| {
                let p = format!("encoder.layer.{l}");
                Layer {
                    qkv: dense(&format!("{p}.attention.self.qkv"), h, 3 * h),
                    attn_out: dense(&format!("{p}.attention.output.dense"), h, h),
                    ln_attn: ln(&format!("{p}.attention.output.LayerNorm")),
                    ffn_in: dense(&format!("{p}.intermediate.dense"), h, i),
                    ffn_out: dense(&format!("{p}.output.dense"), i, h),
                    ln_ffn: ln(&format!("{p}.output.LayerNorm")),
                }
            })
            .collect();
        Encoder {
            word: t("embeddings.word_embeddings.weight"),
            pos: t("embeddings.position_embeddings.weight"),
            ty0: t("embeddings.token_type_embeddings.0"),
            ln_emb: ln("embeddings.LayerNorm"),
            layers,
            hidden: h,
            heads: cfg.heads,
            intermediate: i,
            vocab: cfg.vocab,
            max_len,
            eps: cfg.eps,
            activation: cfg.activation,
            isa,
        }
    }

    /// Multiply-adds x2 of the dense layers for `m` tokens (for GFLOP/s).
    pub(crate) fn dense_flops(&self, m: usize) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        2.0 * m as f64 * self.layers.len() as f64 * (4.0 * h * h + 2.0 * h * i)
    }

    /// The last hidden state of every token of every sequence, packed:
    /// `sum(lens) x hidden` rows, sequence after sequence. Sequences longer
    /// than max_len are cut to it; ids outside the vocabulary read as 0.
    pub(crate) fn forward(&self, seqs: &[&[u32]], threads: usize) -> Scratch {
        let isa = self.isa;
        let h = self.hidden;
        let seqs: Vec<&[u32]> = seqs
            .iter()
            .map(|s| &s[..s.len().min(self.max_len)])
            .collect();
        let m: usize = seqs.iter().map(|s| s.len()).sum();
        let mut x = Scratch::zeroed(m * h);
        let mut row = 0;
        for s in &seqs {
            for (p, &id) in s.iter().enumerate() {
                let id = if (id as usize) < self.vocab {
                    id as usize
                } else {
                    0
                };
                kernels::embed_layer_norm(
                    isa,
                    &mut x[row * h..(row + 1) * h],
                    &self.word[id * h..(id + 1) * h],
                    &self.pos[p * h..(p + 1) * h],
                    &self.ty0,
                    &self.ln_emb.g,
                    &self.ln_emb.b,
                    self.eps,
                );
                row += 1;
            }
        }
        let mut qkv = Scratch::zeroed(m * 3 * h);
        let mut ctx = Scratch::zeroed(m * h);
        let mut tmp = Scratch::zeroed(m * h);
        let mut inter = Scratch::zeroed(m * self.intermediate);
        let eps = self.eps;
        for layer in &self.layers {
            matmul(isa, &x, m, &layer.qkv, &mut qkv, threads);
            self.attention(&qkv, &seqs, &mut ctx, threads);
            matmul(isa, &ctx, m, &layer.attn_out, &mut tmp, threads);
            for_rows(threads, &mut x, h, |rows, first| {
                let y = &tmp[first * h..first * h + rows.len()];
                let ln = &layer.ln_attn;
                kernels::residual_layer_norm(isa, rows, y, &ln.g, &ln.b, eps)
            });
            matmul(isa, &x, m, &layer.ffn_in, &mut inter, threads);
            for_rows(
                threads,
                &mut inter,
                self.intermediate,
                |rows, _| match self.activation {
                    Activation::GeluErf => kernels::gelu_erf(isa, rows),
                    Activation::GeluTanh => kernels::gelu_tanh(isa, rows),
                    Activation::Relu => kernels::relu(isa, rows),
                },
            );
            matmul(isa, &inter, m, &layer.ffn_out, &mut tmp, threads);
            for_rows(threads, &mut x, h, |rows, first| {
                let y = &tmp[first * h..first * h + rows.len()];
                let ln = &layer.ln_ffn;
                kernels::residual_layer_norm(isa, rows, y, &ln.g, &ln.b, eps)
            });
        }
        x
    }

    /// Multi-head self-attention of every sequence over its own tokens:
    /// ctx (m x hidden) from qkv (m x 3 hidden).
    fn attention(&self, qkv: &[f32], seqs: &[&[u32]], ctx: &mut [f32], threads: usize) {
        let h = self.hidden;
        let heads = self.heads;
        let dh = h / heads;
        // Every (sequence, head) writes its own contiguous block of a
        // head-major buffer: [sequence][head][token][dh].
        let mut blocks = Scratch::zeroed(ctx.len());
        let mut tasks: Vec<(usize, usize, usize, &mut [f32])> =
            Vec::with_capacity(seqs.len() * heads);
        let mut rest: &mut [f32] = &mut blocks;
        let mut start = 0;
        for s in seqs {
            let len = s.len();
            for head in 0..heads {
                let (b, r) = rest.split_at_mut(len * dh);
                rest = r;
                tasks.push((start, len, head, b));
            }
            start += len;
        }
        let run = |(start, len, head, out): (usize, usize, usize, &mut [f32])| {
            self.attention_one(&qkv[start * 3 * h..(start + len) * 3 * h], len, head, out);
        };
        if threads > 1 && tasks.len() > 1 {
            use rayon::prelude::*;
            tasks.into_par_iter().with_min_len(1).for_each(run);
        } else {
            tasks.into_iter().for_each(run);
        }
        // Back to token-major [token][head * dh].
        let mut off = 0;
        let mut start = 0;
        for s in seqs {
            let len = s.len();
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

    /// One sequence (its qkv rows) and one head into out (len x dh).
    fn attention_one(&self, qkv: &[f32], len: usize, head: usize, out: &mut [f32]) {
        let h = self.hidden;
        let dh = h / self.heads;
        let stride = 3 * h;
        let (q, k, v) = (head * dh, h + head * dh, 2 * h + head * dh);
        let scale = 1.0 / (dh as f32).sqrt();
        if len == 0 {
            return;
        }
        if len <= SMALL_ATTENTION {
            let mut kt = vec![0f32; dh * kernels::padded(len)];
            let mut scores = [0f32; kernels::padded(SMALL_ATTENTION)];
            kernels::attention_head(
                self.isa,
                qkv,
                stride,
                len,
                q,
                k,
                v,
                dh,
                scale,
                &mut kt,
                &mut scores,
                out,
            );
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
        kernels::softmax_rows(self.isa, &mut scores, len, scale);
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
