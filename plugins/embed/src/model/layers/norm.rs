//! LayerNorm: the residual add and the norm in one pass over the packed
//! rows (BERT's post-norm blocks), the norm into another buffer and the
//! residual add alone (pre-norm blocks, ModernBERT's, with its final
//! norm), and the embeddings' sum and norm.
//! A norm without a shift (ModernBERT's) is packed with zeros for it, so
//! one kernel serves both.

use super::for_rows;
use crate::model::kernels::{self, Isa};
use crate::model::mmap::Tensor;
use crate::model::profile::{self, Part};

/// A LayerNorm's scale, shift and epsilon.
pub(crate) struct LayerNorm {
    pub g: Tensor,
    pub b: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    /// x = layer_norm(x + y) per row of x (rows of `g.len()`), over
    /// `threads` threads (`team.rs`).
    pub(crate) fn residual(&self, isa: Isa, x: &mut [f32], y: &[f32], threads: usize) {
        let _span = profile::span(Part::LayerNorms);
        let h = self.g.len();
        for_rows(threads, x, h, |rows, first| {
            let y = &y[first * h..first * h + rows.len()];
            kernels::residual_layer_norm(isa, rows, y, &self.g, &self.b, self.eps)
        });
    }

    /// out = layer_norm(x) per row, x kept: a pre-norm block's sublayer
    /// input (or a final norm), on `threads` threads.
    pub(crate) fn to(&self, isa: Isa, x: &[f32], out: &mut [f32], threads: usize) {
        let _span = profile::span(Part::LayerNorms);
        let h = self.g.len();
        for_rows(threads, out, h, |rows, first| {
            let x = &x[first * h..first * h + rows.len()];
            kernels::layer_norm_to(isa, rows, x, &self.g, &self.b, self.eps)
        });
    }

    /// One token's embeddings: out = layer_norm(word + pos + ty).
    pub(crate) fn embed(&self, isa: Isa, out: &mut [f32], word: &[f32], pos: &[f32], ty: &[f32]) {
        let _span = profile::span(Part::LayerNorms);
        kernels::embed_layer_norm(isa, out, word, pos, ty, &self.g, &self.b, self.eps);
    }
}

/// x += y over the packed rows (rows of `width`): a pre-norm block's
/// residual, on `threads` threads.
pub(crate) fn residual_add(isa: Isa, x: &mut [f32], y: &[f32], width: usize, threads: usize) {
    for_rows(threads, x, width, |rows, first| {
        kernels::add(isa, rows, &y[first * width..first * width + rows.len()])
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_norm_blocks_match_post_norm_on_every_isa_and_split() {
        let (h, m) = (24, 7);
        let x: Vec<f32> = (0..m * h)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
            .collect();
        let y: Vec<f32> = (0..m * h)
            .map(|i| ((i * 11 % 13) as f32 - 6.0) / 4.0)
            .collect();
        let g: Vec<f32> = (0..h).map(|i| 1.0 + i as f32 / 50.0).collect();
        let b: Vec<f32> = (0..h).map(|i| i as f32 / 10.0 - 1.0).collect();
        let ln = LayerNorm {
            g: Tensor::Heap(g),
            b: Tensor::Heap(b),
            eps: 1e-5,
        };
        for isa in Isa::all_supported() {
            for threads in [1, 3] {
                // layer_norm(x + y), post-norm's one pass, equals the
                // residual add then the norm into another buffer.
                let mut post = x.clone();
                ln.residual(isa, &mut post, &y, threads);
                let mut sum = x.clone();
                residual_add(isa, &mut sum, &y, h, threads);
                let mut pre = vec![f32::NAN; m * h];
                ln.to(isa, &sum, &mut pre, threads);
                for (a, b) in post.iter().zip(&pre) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{isa:?} threads {threads}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
