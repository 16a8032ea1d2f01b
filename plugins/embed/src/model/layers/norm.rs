//! LayerNorm: the residual add and the norm in one pass over the packed
//! rows (BERT's post-norm blocks), and the embeddings' sum and norm.
//! A norm without a shift (ModernBERT's) is packed with zeros for it, so
//! one kernel serves both.

use super::for_rows;
use crate::model::kernels::{self, Isa};
use crate::model::mmap::Tensor;

/// A LayerNorm's scale, shift and epsilon.
pub(crate) struct LayerNorm {
    pub g: Tensor,
    pub b: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    /// x = layer_norm(x + y) per row of x (rows of `g.len()`), over
    /// `threads` threads of the current rayon pool.
    pub(crate) fn residual(&self, isa: Isa, x: &mut [f32], y: &[f32], threads: usize) {
        let h = self.g.len();
        for_rows(threads, x, h, |rows, first| {
            let y = &y[first * h..first * h + rows.len()];
            kernels::residual_layer_norm(isa, rows, y, &self.g, &self.b, self.eps)
        });
    }

    /// One token's embeddings: out = layer_norm(word + pos + ty).
    pub(crate) fn embed(&self, isa: Isa, out: &mut [f32], word: &[f32], pos: &[f32], ty: &[f32]) {
        kernels::embed_layer_norm(isa, out, word, pos, ty, &self.g, &self.b, self.eps);
    }
}
