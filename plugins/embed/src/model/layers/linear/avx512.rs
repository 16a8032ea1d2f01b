//! The panel kernel on AVX-512: 6 rows x one 64-column panel (four zmm)
//! per register block.

use super::{Linear, PANEL};
use std::arch::x86_64::*;

/// Rows per register block: 6 x 4 accumulators + 4 weights + 1
/// broadcast of the 32 zmm registers.
const R: usize = 6;

/// Weight rows (of PANEL floats, 256 bytes) to prefetch ahead. Without
/// it the first row block's pass over a panel waits on memory (the
/// weights, 42.5 MB for MiniLM, do not stay in cache between calls):
/// batch 1 went from 1.9 to 1.3 ms; 16, 48, 64, 96 and 160 were tried.
const PREFETCH: usize = 96;

/// out[:, panel p] = a x panel p + bias, every row, R rows at a time
/// over the whole panel (later row blocks find it in L2).
///
/// # Safety
/// The CPU has avx512f; `a` holds m x lin.k; `w` is lin's f32 panels;
/// `out` points at m x lin.n
/// writable f32s, panel p's columns ours alone; p < lin.panels().
pub(super) unsafe fn panel(a: &[f32], m: usize, lin: &Linear, w: &[f32], p: usize, out: *mut f32) {
    let (k, n) = (lin.k, lin.n);
    let w = &w[p * k * PANEL..(p + 1) * k * PANEL];
    let c0 = p * PANEL;
    let cols = PANEL.min(n - c0);
    let mut bias = [0f32; PANEL];
    bias[..cols].copy_from_slice(&lin.b[c0..c0 + cols]);
    let mut r = 0;
    while r < m {
        let rows = R.min(m - r);
        let a = &a[r * k..(r + rows) * k];
        // SAFETY: avx512f (the caller's contract); a holds rows x k, w
        // k x PANEL; rows r..r+rows of out from column c0 (cols wide)
        // are ours.
        unsafe {
            let o = out.add(r * n + c0);
            match rows {
                6 => block::<6>(a, k, w, &bias, o, n, cols),
                5 => block::<5>(a, k, w, &bias, o, n, cols),
                4 => block::<4>(a, k, w, &bias, o, n, cols),
                3 => block::<3>(a, k, w, &bias, o, n, cols),
                2 => block::<2>(a, k, w, &bias, o, n, cols),
                _ => block::<1>(a, k, w, &bias, o, n, cols),
            }
        }
        r += rows;
    }
}

/// `RB` rows of out (row stride `ldo`, its first `cols` columns) =
/// bias + a (RB x k, row-major) x w (k x PANEL).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const RB: usize>(
    a: &[f32],
    k: usize,
    w: &[f32],
    bias: &[f32; PANEL],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    assert!(a.len() >= RB * k && w.len() >= k * PANEL);
    let ap = a.as_ptr();
    let wp = w.as_ptr();
    // SAFETY: bias has PANEL = 4 x 16 floats.
    let b: [__m512; 4] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(bias.as_ptr().add(16 * i)) });
    let mut acc = [b; RB];
    for kk in 0..k {
        // SAFETY: kk < k, so the PANEL floats at wp + kk * PANEL lie in
        // w (k x PANEL), and a[r * k + kk] in a (RB x k), as asserted.
        // A prefetch is a hint and never faults, even past w's end.
        unsafe {
            let wr = wp.add(kk * PANEL);
            let ahead = wr.wrapping_add(PREFETCH * PANEL) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(192));
            let w0 = _mm512_loadu_ps(wr);
            let w1 = _mm512_loadu_ps(wr.add(16));
            let w2 = _mm512_loadu_ps(wr.add(32));
            let w3 = _mm512_loadu_ps(wr.add(48));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ap.add(r * k + kk));
                acc[0] = _mm512_fmadd_ps(x, w0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, w1, acc[1]);
                acc[2] = _mm512_fmadd_ps(x, w2, acc[2]);
                acc[3] = _mm512_fmadd_ps(x, w3, acc[3]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (i, v) in acc.iter().enumerate() {
            let lanes = cols.saturating_sub(16 * i).min(16);
            let mask: __mmask16 = if lanes == 16 {
                0xffff
            } else {
                (1u16 << lanes) - 1
            };
            // SAFETY: the masked store writes only columns < cols of row
            // r of out, which the caller owns.
            unsafe { _mm512_mask_storeu_ps(out.add(r * ldo + 16 * i), mask, *v) };
        }
    }
}
