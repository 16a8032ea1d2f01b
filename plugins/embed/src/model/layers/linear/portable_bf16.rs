//! The reference bf16 product, plain Rust on every CPU: what the unit
//! tests hold the AVX512-BF16 and AMX kernels to, and what proves the
//! pair layout, the rounding and the bf16 cache against the model's
//! reference vectors on a CPU without bf16 instructions. Each pair adds
//! as `vdpbf16ps` adds it: the odd element's product first, then the
//! even's, each an exact f32 product rounded once into the f32 sum.

use super::bf16::{Activations, from_bf16};
use super::{Linear, PANEL};

/// out[:, columns of panels lo..hi] = act x those panels of `w` + their
/// bias, row by row.
///
/// # Safety
/// `act` holds m rows of lin.k; `w` is lin's pairs; `out` points at m x
/// lin.n writable f32s, the columns of panels lo..hi ours alone; hi <=
/// lin's panels.
pub(super) unsafe fn panels(
    act: &Activations,
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let (k2, n) = (lin.k.div_ceil(2), lin.n);
    for p in lo..hi {
        let c0 = p * PANEL;
        let cols = PANEL.min(n - c0);
        let panel = &w[p * k2 * PANEL * 2..(p + 1) * k2 * PANEL * 2];
        for r in 0..m {
            let mut acc = [0f32; PANEL];
            acc[..cols].copy_from_slice(&lin.b[c0..c0 + cols]);
            for (kk, row) in panel.chunks_exact(PANEL * 2).enumerate() {
                let pair = act.pair(r, kk);
                let (x0, x1) = (from_bf16(pair as u16), from_bf16((pair >> 16) as u16));
                for (acc, w) in acc.iter_mut().zip(row.chunks_exact(2)) {
                    *acc += x1 * from_bf16(w[1]);
                    *acc += x0 * from_bf16(w[0]);
                }
            }
            // SAFETY: row r, columns c0..c0 + cols of out: inside the m x n
            // matrix and ours alone (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out.add(r * n + c0), cols) };
        }
    }
}
