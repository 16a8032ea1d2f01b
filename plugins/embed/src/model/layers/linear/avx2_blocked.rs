//! The product on AVX2 for many rows (a batch's packed pass): a 6 x 16
//! register block over the panels, with `a` packed once per block of rows
//! and k.
//!
//! gemm, called once per panel (the panels are not one strided matrix),
//! packed all of `a` again for each of a layer's panels, and needed the
//! bias written into the output before it added the product to it; here
//! `a` is packed once per block of rows and k, for every panel of the
//! call, and the bias is the accumulators' first value.
//!
//! Loop order, outermost first: k blocks of [`KC`]; chunks of [`MC`] rows
//! (their packed `a`, MC x KC floats, stays in L2); the call's panels
//! (KC x 64 weights, 96 KB, contiguous: in L2 for the chunk); row blocks
//! of [`MR`] (6 x KC of packed `a`, 9 KB, in L1 for the panel's four
//! strips); strips of 16 columns, each weight row of a strip one line
//! read from L2 (prefetched [`PREFETCH`] rows ahead).
//!
//! (A strip does not stay in L1 across row blocks: its lines lie 256
//! bytes apart, so they fall in a quarter of the 64 sets of a 32 KB
//! 8-way L1; keeping the row block there instead measured the same.)

use super::{Linear, PANEL};
use std::arch::x86_64::*;

/// Rows per register block: 6 x 2 accumulators + 2 weights + 1 broadcast
/// of the 16 ymm registers.
const MR: usize = 6;

/// Columns per strip: two ymm.
const NR: usize = 16;

/// k per block: a row block's packed `a`, 6 x KC floats (9 KB), in L1.
const KC: usize = 384;

/// Weight rows ahead to prefetch into L1.
const PREFETCH: usize = 8;

/// Rows per chunk: its packed `a`, 96 x KC floats (144 KB), fits L2.
const MC: usize = 96;

/// out[:, columns of panels lo..hi] = a x those panels + their bias.
///
/// # Safety
/// The CPU has avx2 and fma; `a` holds m x lin.k; `out` points at m x
/// lin.n writable f32s, the columns of panels lo..hi ours alone;
/// lo <= hi <= lin.panels().
pub(super) unsafe fn product(
    a: &[f32],
    m: usize,
    lin: &Linear,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let (k, n) = (lin.k, lin.n);
    assert!(a.len() >= m * k && lo <= hi && hi * PANEL < n + PANEL);
    if lo == hi {
        return;
    }
    // Row blocks of the chunk, each [kc][MR] (rows past m zero).
    let mut packed = vec![0f32; MC * KC];
    let mut bias = vec![0f32; (hi - lo) * PANEL];
    bias[..n.min(hi * PANEL) - lo * PANEL].copy_from_slice(&lin.b[lo * PANEL..n.min(hi * PANEL)]);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for r0 in (0..m).step_by(MC) {
            let rows = MC.min(m - r0);
            pack(&a[r0 * k..(r0 + rows) * k], k, k0, kc, &mut packed);
            for p in lo..hi {
                let cols = PANEL.min(n - p * PANEL);
                let w = &lin.w[p * k * PANEL + k0 * PANEL..];
                let bias = &bias[(p - lo) * PANEL..][..PANEL];
                for (b, ap) in packed
                    .chunks_exact(kc * MR)
                    .take(rows.div_ceil(MR))
                    .enumerate()
                {
                    let rb = MR.min(rows - b * MR);
                    for s in 0..cols.div_ceil(NR) {
                        let lanes = NR.min(cols - s * NR);
                        let init = if k0 == 0 {
                            Init::Bias(bias[s * NR..][..NR].try_into().expect("16 floats"))
                        } else {
                            Init::Out
                        };
                        let o = (r0 + b * MR) * n + p * PANEL + s * NR;
                        // SAFETY: avx2 and fma (the caller's contract); ap
                        // is kc x MR, w[s * NR..] holds kc rows of PANEL
                        // from this strip's column (Linear's layout, k0 +
                        // kc <= k); rows r0 + b * MR.. (rb of them) of out
                        // from its column (lanes wide) are inside out and
                        // ours.
                        unsafe { block(ap, kc, &w[s * NR..], init, out.add(o), n, rb, lanes) }
                    }
                }
            }
        }
    }
}

/// Where a block's accumulators start: the bias (the first k block), or
/// what the earlier k blocks left in out.
#[derive(Clone, Copy)]
enum Init<'a> {
    Bias(&'a [f32; NR]),
    Out,
}

/// Columns k0..k0 + kc of `a`'s rows (row stride k) into `packed` as row
/// blocks of MR, each `[kc][MR]`; a last block's missing rows are zeros.
fn pack(a: &[f32], k: usize, k0: usize, kc: usize, packed: &mut [f32]) {
    let rows = a.len() / k;
    for (b, dst) in packed
        .chunks_exact_mut(kc * MR)
        .take(rows.div_ceil(MR))
        .enumerate()
    {
        for r in 0..MR {
            let row = b * MR + r;
            if row < rows {
                let src = &a[row * k + k0..][..kc];
                for (kk, &v) in src.iter().enumerate() {
                    dst[kk * MR + r] = v;
                }
            } else {
                for kk in 0..kc {
                    dst[kk * MR + r] = 0.0;
                }
            }
        }
    }
}

/// `rb` rows of out (row stride `ldo`, its first `lanes` columns) =
/// init + ap (kc x MR, a row block packed) x the strip of w (kc rows of
/// stride PANEL, the first NR floats of each).
///
/// # Safety
/// avx2 and fma; ap holds kc x MR, w (kc - 1) x PANEL + NR floats; out
/// rows 0..rb, columns 0..lanes (stride ldo) writable and ours.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    ap: &[f32],
    kc: usize,
    w: &[f32],
    init: Init,
    out: *mut f32,
    ldo: usize,
    rb: usize,
    lanes: usize,
) {
    assert!(ap.len() >= kc * MR && w.len() >= (kc - 1) * PANEL + NR);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let mut row = [0f32; NR];
    for (r, acc) in acc.iter_mut().enumerate().take(rb) {
        let src: &[f32; NR] = match init {
            Init::Bias(b) => b,
            Init::Out => {
                // SAFETY: row r < rb, columns < lanes: the caller's.
                unsafe { std::ptr::copy_nonoverlapping(out.add(r * ldo), row.as_mut_ptr(), lanes) };
                &row
            }
        };
        // SAFETY: src holds NR = 2 x 8 floats.
        unsafe {
            acc[0] = _mm256_loadu_ps(src.as_ptr());
            acc[1] = _mm256_loadu_ps(src.as_ptr().add(8));
        }
    }
    let ap = ap.as_ptr();
    let wp = w.as_ptr();
    for kk in 0..kc {
        // SAFETY: kk < kc, so the NR floats at wp + kk * PANEL lie in w and
        // the MR at ap + kk * MR in ap (asserted).
        unsafe {
            let wr = wp.add(kk * PANEL);
            _mm_prefetch::<_MM_HINT_T0>(wr.wrapping_add(PREFETCH * PANEL) as *const i8);
            let w0 = _mm256_loadu_ps(wr);
            let w1 = _mm256_loadu_ps(wr.add(8));
            let x = ap.add(kk * MR);
            for (r, acc) in acc.iter_mut().enumerate() {
                let xr = _mm256_broadcast_ss(&*x.add(r));
                acc[0] = _mm256_fmadd_ps(xr, w0, acc[0]);
                acc[1] = _mm256_fmadd_ps(xr, w1, acc[1]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(rb) {
        // SAFETY: row r < rb of out, which the caller owns: a whole strip
        // stored straight, a narrower one through row.
        unsafe {
            let o = out.add(r * ldo);
            if lanes == NR {
                _mm256_storeu_ps(o, acc[0]);
                _mm256_storeu_ps(o.add(8), acc[1]);
            } else {
                _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
                std::ptr::copy_nonoverlapping(row.as_ptr(), o, lanes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::linear::Linear;

    /// Every row count edge of the register block and the chunk, k below,
    /// at and past a k block, a partial panel and a partial strip, and
    /// runs of panels that start past the first: against a naive product.
    #[test]
    fn product_matches_naive_on_every_edge() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("skipped: this CPU lacks avx2 or fma");
            return;
        }
        for k in [19, KC, KC + 7, 2 * KC + 1] {
            let n = 2 * PANEL + 41; // three panels, the last 41 columns: two strips and 9
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 / 3.0 - 20.0).collect();
            let lin = Linear::from_out_in(&[(&w, &b)], k);
            for m in [1, 5, 6, 7, 24, 25, 64, MC - 1, MC, MC + 1, 200, 754] {
                let a: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 3 % 17) as f32 - 8.0) / 4.0)
                    .collect();
                for (lo, hi) in [(0, 3), (1, 3), (0, 1), (2, 3), (1, 1)] {
                    let mut out = vec![f32::NAN; m * n + 5];
                    // SAFETY: this CPU has avx2 and fma (checked above); a
                    // is m x k, out m x n (and 5 more), lo <= hi <= 3.
                    unsafe { product(&a, m, &lin, lo, hi, out.as_mut_ptr()) };
                    for i in 0..m {
                        for j in 0..n {
                            let got = out[i * n + j];
                            if j < lo * PANEL || j >= hi * PANEL {
                                assert!(got.is_nan(), "k {k} m {m} {lo}..{hi}: wrote column {j}");
                                continue;
                            }
                            let want: f64 = b[j] as f64
                                + (0..k)
                                    .map(|t| a[i * k + t] as f64 * w[j * k + t] as f64)
                                    .sum::<f64>();
                            assert!(
                                (got as f64 - want).abs() < 1e-3 * want.abs().max(1.0),
                                "k {k} m {m} {lo}..{hi} [{i}, {j}]: {got} vs {want}"
                            );
                        }
                    }
                    assert!(
                        out[m * n..].iter().all(|v| v.is_nan()),
                        "wrote past the matrix"
                    );
                }
            }
        }
    }
}
