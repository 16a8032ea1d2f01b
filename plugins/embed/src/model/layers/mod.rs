//! The blocks every architecture composes (arch/): the dense layer on its
//! panels, LayerNorm, the packed attention, the activations. They know
//! shapes and kernels, never an architecture's tensor names or config;
//! each architecture file puts them together in its own forward pass.
//!
//! Every block runs over a packed batch: the sequences' tokens one after
//! another, `[tokens, width]` rows, no padding.

pub(crate) mod activation;
pub(crate) mod attention;
pub(crate) mod linear;
pub(crate) mod norm;

/// Runs `f(rows, first_row)` over `a` (rows of `row` floats) cut into
/// `threads` runs of whole rows, in parallel on the current rayon pool when
/// `threads` > 1.
pub(crate) fn for_rows(
    threads: usize,
    a: &mut [f32],
    row: usize,
    f: impl Fn(&mut [f32], usize) + Sync,
) {
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
