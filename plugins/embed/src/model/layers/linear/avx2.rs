//! The panel kernel on AVX2: 6 rows x 16 columns (two ymm) per register
//! block, a 64-column panel as four strips of 16.
//!
//! Without it an AVX2 machine ran small batches through gemm, whose
//! 16-row kernel pads a 12-token request to 16 rows and packs per call:
//! all-mpnet-base-v2 at batch 1 took 40 ms a call on one core, where ONNX
//! Runtime took 33 (AMD EPYC without AVX-512, 2026-12-05).

use super::{Linear, PANEL};
use std::arch::x86_64::*;

/// Rows per register block: 6 x 2 accumulators + 2 weights + 1 broadcast
/// of the 16 ymm registers.
const R: usize = 6;

/// Columns per strip: two ymm.
const STRIP: usize = 16;

/// out[:, panel p] = a x panel p + bias, every row: strip by strip, R rows
/// at a time over the whole strip (later row blocks find it in L2).
///
/// A strip is one 64-byte line of each of the panel's k rows. While a
/// strip is computed, the next one (the panel's next, or the next panel's
/// first) is prefetched line by line, so that its first row block finds
/// it in cache: the memory traffic runs beside the arithmetic instead of
/// before it. (Prefetching a strip's own lines a fixed distance ahead
/// instead left a request of 12 rows at 48 ms on all-mpnet-base-v2, slower
/// than gemm's 40; this way it takes 37.4.)
///
/// # Safety
/// The CPU has avx2 and fma; `a` holds m x lin.k; `all` is lin's f32
/// panels; `out` points at m x
/// lin.n writable f32s, panel p's columns ours alone; p < lin.panels().
pub(super) unsafe fn panel(
    a: &[f32],
    m: usize,
    lin: &Linear,
    all: &[f32],
    p: usize,
    out: *mut f32,
) {
    let (k, n) = (lin.k, lin.n);
    let w = &all[p * k * PANEL..(p + 1) * k * PANEL];
    let c0 = p * PANEL;
    let cols = PANEL.min(n - c0);
    let mut bias = [0f32; PANEL];
    bias[..cols].copy_from_slice(&lin.b[c0..c0 + cols]);
    for s in 0..cols.div_ceil(STRIP) {
        let lanes = (cols - s * STRIP).min(STRIP);
        let bias: &[f32; STRIP] = bias[s * STRIP..][..STRIP].try_into().expect("16 floats");
        // The next strip: a prefetch is a hint and never faults, so past
        // the last panel it may point anywhere.
        let next = all.as_ptr().wrapping_add(p * k * PANEL + (s + 1) * STRIP);
        let next = if (s + 1) * STRIP < PANEL {
            next
        } else {
            all.as_ptr().wrapping_add((p + 1) * k * PANEL)
        };
        let w = &w[s * STRIP..];
        let mut r = 0;
        while r < m {
            let rows = R.min(m - r);
            let a = &a[r * k..(r + rows) * k];
            // SAFETY: avx2 and fma (the caller's contract); a holds rows x
            // k, w k rows of PANEL from this strip's first column; rows
            // r..r+rows of out from column c0 + s * STRIP (lanes wide)
            // are ours.
            unsafe {
                let o = out.add(r * n + c0 + s * STRIP);
                match rows {
                    6 => block::<6>(a, k, w, next, bias, o, n, lanes),
                    5 => block::<5>(a, k, w, next, bias, o, n, lanes),
                    4 => block::<4>(a, k, w, next, bias, o, n, lanes),
                    3 => block::<3>(a, k, w, next, bias, o, n, lanes),
                    2 => block::<2>(a, k, w, next, bias, o, n, lanes),
                    _ => block::<1>(a, k, w, next, bias, o, n, lanes),
                }
            }
            r += rows;
        }
    }
}

/// `RB` rows of out (row stride `ldo`, its first `lanes` columns) = bias +
/// a (RB x k, row-major) x the strip of w (k rows of stride PANEL, the
/// first STRIP floats of each), prefetching the line of each row at
/// `next` (same stride) into L2 as it goes (into L1 too was no faster:
/// the next strip is a whole strip's work ahead).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const RB: usize>(
    a: &[f32],
    k: usize,
    w: &[f32],
    next: *const f32,
    bias: &[f32; STRIP],
    out: *mut f32,
    ldo: usize,
    lanes: usize,
) {
    assert!(a.len() >= RB * k && w.len() >= (k - 1) * PANEL + STRIP);
    let ap = a.as_ptr();
    let wp = w.as_ptr();
    // SAFETY: bias has STRIP = 2 x 8 floats.
    let b = unsafe {
        [
            _mm256_loadu_ps(bias.as_ptr()),
            _mm256_loadu_ps(bias.as_ptr().add(8)),
        ]
    };
    let mut acc = [b; RB];
    for kk in 0..k {
        // SAFETY: kk < k, so the STRIP floats at wp + kk * PANEL lie in w
        // (asserted), and a[r * k + kk] in a (RB x k). A prefetch is a hint
        // and never faults, even past w's end.
        unsafe {
            let wr = wp.add(kk * PANEL);
            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(kk * PANEL) as *const i8);
            let w0 = _mm256_loadu_ps(wr);
            let w1 = _mm256_loadu_ps(wr.add(8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*ap.add(r * k + kk));
                acc[0] = _mm256_fmadd_ps(x, w0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, w1, acc[1]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let mut row = [0f32; STRIP];
        // SAFETY: row holds STRIP = 2 x 8 floats.
        unsafe {
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
        }
        // SAFETY: columns < lanes of row r of out, which the caller owns.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * ldo), lanes) };
    }
}
