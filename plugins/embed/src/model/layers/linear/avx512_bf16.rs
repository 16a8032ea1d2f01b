//! The bf16 panel kernel on AVX512-BF16: 6 rows x one 64-column panel
//! (four zmm of f32 sums) per register block, as the f32 AVX-512 kernel
//! (avx512.rs), with `vdpbf16ps` in place of `vfmadd`: each step takes one
//! pair of a row's inputs, broadcast as a 32-bit word, against one row of
//! the panel (64 columns' pairs, four zmm) and adds both products into
//! each column's sum. Half the weight bytes of f32 per step, and two
//! multiply-adds per lane per instruction.
//!
//! `_mm512_dpbf16_ps` is stable (Rust 1.89). This file was written on an
//! AVX2-only box: the kernel is written once over [`Lanes`], whose
//! instructions it first ran on a CPU with AVX512-BF16 after it was
//! written, and whose plain-Rust emulation (tests) runs the kernel's own
//! indexing on any CPU; its unit test compares both with the reference
//! (portable_bf16.rs) and an f32 product, and says when the instructions
//! are skipped.

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
    // SAFETY: the caller's contract, the CPU's features included.
    unsafe { panels_on::<Zmm>(act, m, lin, w, lo, hi, out) }
}

/// [`panels`] over [`Emulated`] lanes: the kernel's indexing on any CPU.
///
/// # Safety
/// As [`panels`], but for the CPU's features.
#[cfg(test)]
pub(super) unsafe fn panels_emulated(
    act: &Activations,
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    // SAFETY: the caller's contract; the emulation needs no feature.
    unsafe { panels_on::<Emulated>(act, m, lin, w, lo, hi, out) }
}

/// The kernel over lanes `L`.
///
/// # Safety
/// As [`panels`], with the CPU's features as `L` needs them.
unsafe fn panels_on<L: Lanes>(
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
            // SAFETY: the CPU runs L (the caller's contract); act holds
            // rows r..r+rows, panel k2 rows of PANEL pairs; rows r..r+rows
            // of out from column c0 (cols wide) are ours.
            unsafe {
                let o = out.add(r * n + c0);
                match rows {
                    6 => L::block::<6>(act, r, k2, panel, &bias, o, n, cols),
                    5 => L::block::<5>(act, r, k2, panel, &bias, o, n, cols),
                    4 => L::block::<4>(act, r, k2, panel, &bias, o, n, cols),
                    3 => L::block::<3>(act, r, k2, panel, &bias, o, n, cols),
                    2 => L::block::<2>(act, r, k2, panel, &bias, o, n, cols),
                    _ => L::block::<1>(act, r, k2, panel, &bias, o, n, cols),
                }
            }
            r += rows;
        }
    }
}

/// Sixteen f32 lanes and the operations the kernel is written in.
trait Lanes: Copy {
    /// Sixteen pairs of bf16 (32 bits a lane).
    type Pairs: Copy;

    /// Sixteen f32 from `p`.
    ///
    /// # Safety
    /// 64 bytes readable at `p`; the CPU runs Self.
    unsafe fn load(p: *const f32) -> Self;

    /// Sixteen pairs from `p` (64 bytes, any alignment).
    ///
    /// # Safety
    /// As [`Lanes::load`].
    unsafe fn load_pairs(p: *const u16) -> Self::Pairs;

    /// One pair in every lane (`vpbroadcastd`).
    ///
    /// # Safety
    /// The CPU runs Self.
    unsafe fn broadcast(pair: i32) -> Self::Pairs;

    /// self + x's odd elements x w's, then + the even's, lane by lane
    /// (`vdpbf16ps`).
    ///
    /// # Safety
    /// The CPU runs Self.
    unsafe fn dot(self, x: Self::Pairs, w: Self::Pairs) -> Self;

    /// The first `lanes` lanes to `p`.
    ///
    /// # Safety
    /// `lanes` f32 writable at `p`; the CPU runs Self.
    unsafe fn store(self, p: *mut f32, lanes: usize);

    /// `RB` rows of out; see [`block`].
    ///
    /// # Safety
    /// As [`block`].
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
    );
}

/// `RB` rows of out (row stride `ldo`, its first `cols` columns) = bias +
/// act's rows r0..r0+RB x the panel (k2 rows of PANEL pairs).
///
/// # Safety
/// The CPU runs `L`; out's rows r0.. (ldo apart) ours for `cols` columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block<L: Lanes, const RB: usize>(
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
    // SAFETY: bias has PANEL = 4 x 16 floats; the CPU runs L.
    let b: [L; 4] = std::array::from_fn(|i| unsafe { L::load(bias.as_ptr().add(16 * i)) });
    let mut acc = [b; RB];
    for kk in 0..k2 {
        // SAFETY: kk < k2, so the PANEL pairs (4 x 64 bytes) at wp + kk *
        // 2 * PANEL lie in the panel, and the pair at element 2 * kk of
        // rows r0..r0+RB in act (asserted: unaligned 4-byte reads). A
        // prefetch is a hint and never faults, even past the panel's end.
        unsafe {
            let wr = wp.add(kk * 2 * PANEL);
            let ahead = wr.wrapping_add(PREFETCH * 2 * PANEL) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128));
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(192));
            let w: [L::Pairs; 4] = std::array::from_fn(|i| L::load_pairs(wr.add(32 * i)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let pair = ap
                    .add((r0 + r) * act.stride + 2 * kk)
                    .cast::<i32>()
                    .read_unaligned();
                let x = L::broadcast(pair);
                acc[0] = acc[0].dot(x, w[0]);
                acc[1] = acc[1].dot(x, w[1]);
                acc[2] = acc[2].dot(x, w[2]);
                acc[3] = acc[3].dot(x, w[3]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (i, v) in acc.iter().enumerate() {
            let lanes = cols.saturating_sub(16 * i).min(16);
            // SAFETY: writes only columns < cols of row r of out, which
            // the caller owns.
            unsafe { v.store(out.add(r * ldo + 16 * i), lanes) };
        }
    }
}

/// The instructions: zmm registers.
#[derive(Clone, Copy)]
struct Zmm(__m512);

impl Lanes for Zmm {
    type Pairs = __m512bh;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Zmm {
        // SAFETY: the caller's contract.
        Zmm(unsafe { _mm512_loadu_ps(p) })
    }

    #[inline(always)]
    unsafe fn load_pairs(p: *const u16) -> __m512bh {
        // SAFETY: the caller's contract; every bit pattern is a valid
        // __m512bh.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast::<__m512i>())) }
    }

    #[inline(always)]
    unsafe fn broadcast(pair: i32) -> __m512bh {
        // SAFETY: the caller's contract; as above.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair)) }
    }

    #[inline(always)]
    unsafe fn dot(self, x: __m512bh, w: __m512bh) -> Zmm {
        // SAFETY: the caller's contract.
        Zmm(unsafe { _mm512_dpbf16_ps(self.0, x, w) })
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32, lanes: usize) {
        let mask: __mmask16 = if lanes >= 16 {
            0xffff
        } else {
            (1u16 << lanes) - 1
        };
        // SAFETY: the caller's contract: the masked store writes only the
        // first `lanes` floats.
        unsafe { _mm512_mask_storeu_ps(p, mask, self.0) };
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
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
        // SAFETY: the caller's contract; compiled for the features Zmm's
        // operations use, so they inline here.
        unsafe { block::<Zmm, RB>(act, r0, k2, panel, bias, out, ldo, cols) }
    }
}

/// The same in plain Rust, as Intel's pseudo-code defines `vdpbf16ps`,
/// reading and writing memory exactly where the instructions would.
#[cfg(test)]
#[derive(Clone, Copy)]
struct Emulated([f32; 16]);

#[cfg(test)]
impl Lanes for Emulated {
    type Pairs = [u32; 16];

    unsafe fn load(p: *const f32) -> Emulated {
        // SAFETY: the caller's contract.
        Emulated(std::array::from_fn(|i| unsafe {
            p.add(i).read_unaligned()
        }))
    }

    unsafe fn load_pairs(p: *const u16) -> [u32; 16] {
        // SAFETY: the caller's contract.
        std::array::from_fn(|i| unsafe { p.add(2 * i).cast::<u32>().read_unaligned() })
    }

    unsafe fn broadcast(pair: i32) -> [u32; 16] {
        [pair as u32; 16]
    }

    unsafe fn dot(self, x: [u32; 16], w: [u32; 16]) -> Emulated {
        use super::bf16::from_bf16;
        let half = |v: u32, e: u32| from_bf16((v >> (16 * e)) as u16);
        Emulated(std::array::from_fn(|i| {
            let acc = self.0[i] + half(x[i], 1) * half(w[i], 1);
            acc + half(x[i], 0) * half(w[i], 0)
        }))
    }

    unsafe fn store(self, p: *mut f32, lanes: usize) {
        for (i, v) in self.0.iter().take(lanes).enumerate() {
            // SAFETY: the caller's contract.
            unsafe { p.add(i).write_unaligned(*v) };
        }
    }

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
        // SAFETY: the caller's contract; the emulation needs no feature.
        unsafe { block::<Emulated, RB>(act, r0, k2, panel, bias, out, ldo, cols) }
    }
}
