//! The blocks every architecture composes (arch/): the dense layer on its
//! panels, LayerNorm, the packed attention, the activations, and the
//! blocks beyond BERT's: `rotary` (ModernBERT's rotary position embedding
//! of queries and keys), `window` (attention of one sequence and one head
//! over a band of keys: ModernBERT's sliding layers, and MPNet's biased
//! scores), `relative_bias` (MPNet's T5-style relative position buckets and
//! their per-head bias), `geglu` (ModernBERT's gated feed-forward
//! activation), `tied` (the product against a row-major table: SPLADE's
//! decoder tied to the word embeddings, a block of the vocabulary at a
//! time); `fixtures` (tests: those four composed into naive
//! ModernBERT and MPNet passes reproduce the tiny fixtures'
//! sentence-transformers vectors). They know shapes and kernels, never an
//! architecture's tensor names or config; each architecture file puts them
//! together in its own forward pass.
//!
//! Every block runs over a packed batch: the sequences' tokens one after
//! another, `[tokens, width]` rows, no padding, with the instruction set
//! [`super::kernels::Isa`] picked at load.

pub(crate) mod activation;
pub(crate) mod attention;
#[cfg(test)]
mod fixtures;
pub(crate) mod geglu;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod relative_bias;
pub(crate) mod rotary;
pub(crate) mod tied;
pub(crate) mod window;

/// Floats a thread takes at least in a row-wise split: a layer norm or an
/// activation over fewer (a short sentence's dozen rows) ends in a few
/// microseconds, about what handing half of it to a helper costs. Tests
/// split at any size, so that the split's code is what they check.
const MIN_FLOATS_A_THREAD: usize = if cfg!(test) { 1 } else { 16 * 1024 };

/// Runs `f(rows, first_row)` over `a` (rows of `row` floats) cut into
/// `threads` runs of whole rows, on as many threads (`team.rs`) when
/// `threads` > 1 and each run is worth a thread.
pub(crate) fn for_rows(
    threads: usize,
    a: &mut [f32],
    row: usize,
    f: impl Fn(&mut [f32], usize) + Sync,
) {
    let m = a.len() / row.max(1);
    let threads = threads.min(a.len() / MIN_FLOATS_A_THREAD);
    if threads <= 1 || m < 2 {
        f(a, 0);
        return;
    }
    let per = m.div_ceil(threads);
    let runs: Vec<(usize, &mut [f32])> = a.chunks_mut(per * row).enumerate().collect();
    crate::model::team::each_item(threads, runs, |(i, rows)| f(rows, i * per));
}
