//! The bf16 panel kernel on AVX512-BF16: 6 rows x one 64-column panel
//! (four zmm of f32 sums) per register block, as the f32 AVX-512 kernel
//! (avx512.rs), with `vdpbf16ps` in place of `vfmadd`: each step takes one
//! pair of a row's inputs, broadcast as a 32-bit word, against one row of
//! the panel (64 columns' pairs, four zmm) and adds both products into
//! each column's sum. Half the weight bytes of f32 per step, and two
//! multiply-adds per lane per instruction.
//!
//! `_mm512_dpbf16_ps` is stable (Rust 1.89); it first ran on a CPU with
//! AVX512-BF16 after it was written (this file was written on an AVX2-only
//! box): its unit test compares it with the reference (portable_bf16.rs)
//! and an f32 product, and says when it is skipped.

use super::bf16::Activations;
use super::{Linear, PANEL};
use std::arch::x86_64::*;

/// Rows per register block: 6 x 4 accumulators + 4 weights + 1 broadcast
/// of the 32 zmm registers.
const R: usize = 6;

/// Panel rows (of 64 pairs, 256 bytes) to prefetch ahead, as avx512.rs
/// does for f32 rows of the same size (not tuned for bf16).
const PREFETCH: usize = 96;

/// Whether this CPU (and OS: the zmm state) runs the kernel.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// out[:, columns of panels lo..hi] = act x those panels of `w` + their
/// bias, R rows at a time over each whole panel.
///
/// # Safety
/// The CPU has avx512f and avx512bf16 ([`supported`]); `act` holds m rows
/// of lin.k; `w` is lin's pairs; `out` points at m x lin.n writable f32s,
/// the columns of panels lo..hi ours alone; hi <= lin's panels.
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
        let panel = &w[p * k2 * PANEL * 2..(p + 1) * k2 * PANEL * 2];
        let c0 = p * PANEL;
        let cols = PANEL.min(n - c0);
        let mut bias = [0f32; PANEL];
        bias[..cols].copy_from_slice(&lin.b[c0..c0 + cols]);
        let mut r = 0;
        while r < m {
            let rows = R.min(m - r);
            // SAFETY: the CPU runs it (the caller's contract); act holds
            // rows r..r+rows, panel k2 rows of PANEL pairs; rows r..r+rows
            // of out from column c0 (cols wide) are ours.
            unsafe {
                let o = out.add(r * n + c0);
                match rows {
                    6 => block::<6>(act, r, k2, panel, &bias, o, n, cols),
                    5 => block::<5>(act, r, k2, panel, &bias, o, n, cols),
                    4 => block::<4>(act, r, k2, panel, &bias, o, n, cols),
                    3 => block::<3>(act, r, k2, panel, &bias, o, n, cols),
                    2 => block::<2>(act, r, k2, panel, &bias, o, n, cols),
                    _ => block::<1>(act, r, k2, panel, &bias, o, n, cols),
                }
            }
            r += rows;
        }
    }
}

/// `RB` rows of out (row stride `ldo`, its first `cols` columns) = bias +
/// act's rows r0..r0+RB x the panel (k2 rows of PANEL pairs).
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const RB: usize>(
    act: &Activations,
    r0: usize,
    k2: usize,
    panel: &[u16],
    bias: &[f32; PANEL],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    assert!(
        panel.len() >= k2 * PANEL * 2 && act.data.len() >= (r0 + RB) * act.stride,
        "a block inside its operands"
    );
    assert!(2 * k2 <= act.stride, "pairs within a row");
    let wp = panel.as_ptr();
    let ap = act.data.as_ptr();
    // SAFETY: bias has PANEL = 4 x 16 floats.
    let b: [__m512; 4] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(bias.as_ptr().add(16 * i)) });
    let mut acc = [b; RB];
    for kk in 0..k2 {
        // SAFETY: kk < k2, so the PANEL pairs (4 x 64 bytes) at wp + kk *
        // 2 * PANEL lie in the panel, and the pair at element 2 * kk of
        // rows r0..r0+RB in act (asserted: unaligned 4-byte reads). A
        // prefetch is a hint and never faults, even past the panel's end.
        // Every bit pattern is a valid __m512bh.
        unsafe {
            let wr = wp.add(kk * 2 * PANEL);
            let ahead = wr.wrapping_add(PREFETCH * 2 * PANEL) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(192));
            let w: [__m512bh; 4] = std::array::from_fn(|i| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    wr.add(32 * i).cast::<__m512i>(),
                ))
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                let pair = ap
                    .add((r0 + r) * act.stride + 2 * kk)
                    .cast::<i32>()
                    .read_unaligned();
                let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                acc[0] = _mm512_dpbf16_ps(acc[0], x, w[0]);
                acc[1] = _mm512_dpbf16_ps(acc[1], x, w[1]);
                acc[2] = _mm512_dpbf16_ps(acc[2], x, w[2]);
                acc[3] = _mm512_dpbf16_ps(acc[3], x, w[3]);
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
