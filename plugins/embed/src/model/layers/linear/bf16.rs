//! bf16 dense layers: the number format, the weights' pair layout, and the
//! product over it, one of three kernels picked at load
//! ([`Bf16Kernel::detect`]).
//!
//! A bf16 is the top 16 bits of an f32 (sign, the 8-bit exponent, 7 bits
//! of mantissa): converting back is a shift, and the product of two bf16
//! is exact in f32. Weights are rounded once, when the cache is written;
//! activations on their way into each product; products and their sums
//! stay f32, as do biases, norms, softmax and activations.
//!
//! The weights' layout is the one `vdpbf16ps` and AMX's B operand read
//! ("VNNI" pairs): a dense layer's `[n, k]` weight as `[panels][k2][PANEL][2]`
//! bf16, k2 = ceil(k / 2), element `[p][kk][j][t]` = w[64p + j][2kk + t]
//! (k padded to even with a zero, columns past n zero). Each 32-bit word is
//! one output column's pair of consecutive inputs, so one broadcast pair of
//! activations times one row of a panel is 64 columns' worth of two
//! multiply-adds.

use super::{Linear, PANEL};

/// Which product a bf16 layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bf16Kernel {
    /// Plain Rust, on every CPU: the reference the tests hold the others
    /// and the model's accuracy to. Never chosen for a user: a CPU without
    /// bf16 instructions computes in f32 ([`Bf16Kernel::detect`] is None).
    Portable,
    /// AVX512-BF16 (`vdpbf16ps`): Zen 4 and 5, Cooper Lake, Sapphire Rapids.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AMX-BF16 tiles (`tdpbf16ps`): Sapphire Rapids and later.
    #[cfg(target_arch = "x86_64")]
    Amx,
    /// The AVX512-BF16 kernel's code over lanes emulated in plain Rust:
    /// its indexing checked on any CPU (tests only).
    #[cfg(all(test, target_arch = "x86_64"))]
    Avx512Emulated,
    /// The AMX kernel's code over tiles emulated in plain Rust: its
    /// addresses and tail checked on any CPU (tests only).
    #[cfg(all(test, target_arch = "x86_64"))]
    AmxEmulated,
}

impl Bf16Kernel {
    /// The best bf16 kernel this CPU (and OS) runs, or None: AMX-BF16 once
    /// Linux has granted this process the tile data
    /// ([`super::amx::permitted`]), else AVX512-BF16, else none.
    pub(crate) fn detect() -> Option<Bf16Kernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if super::amx::permitted() {
                return Some(Bf16Kernel::Amx);
            }
            if super::avx512_bf16::supported() {
                return Some(Bf16Kernel::Avx512);
            }
        }
        None
    }

    /// What `--doctor` reports as `embed.kernels`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Portable => "portable bf16 (reference)",
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Amx => "amx-bf16",
            #[cfg(all(test, target_arch = "x86_64"))]
            Bf16Kernel::Avx512Emulated => "avx512-bf16 (emulated)",
            #[cfg(all(test, target_arch = "x86_64"))]
            Bf16Kernel::AmxEmulated => "amx-bf16 (emulated)",
        }
    }
}

/// `x` rounded to the nearest bf16, ties to even (what `vcvtneps2bf16`
/// does, less its flushing of subnormals to zero); a NaN stays a (quiet)
/// NaN.
pub(crate) fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    // Adds just under half of the dropped part's unit, plus one when the
    // kept part is odd: a tie rounds to even. Cannot overflow: the largest
    // non-NaN pattern, 0xff80_0000 (-inf), plus 0x8000 fits in 32 bits.
    let round = 0x7fff + ((b >> 16) & 1);
    ((b + round) >> 16) as u16
}

/// The f32 a bf16 stands for (exact).
#[inline(always)]
pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Safetensors' `[n, k]` weights (one or more stacked along n, each given
/// with its n) as bf16 pairs: `[panels][k2][PANEL][2]`, see the module
/// docs.
pub(crate) fn pack_pairs(parts: &[(&[f32], usize)], k: usize) -> Vec<u16> {
    let n: usize = parts.iter().map(|&(_, n)| n).sum();
    let (panels, k2) = (n.div_ceil(PANEL), k.div_ceil(2));
    let mut w = vec![0u16; panels * k2 * PANEL * 2];
    let mut col = 0;
    for &(pw, pn) in parts {
        for j in 0..pn {
            let c = col + j;
            let (p, lane) = (c / PANEL, c % PANEL);
            for (i, &v) in pw[j * k..(j + 1) * k].iter().enumerate() {
                w[((p * k2 + i / 2) * PANEL + lane) * 2 + i % 2] = to_bf16(v);
            }
        }
        col += pn;
    }
    w
}

/// Bf16 elements of a layer's packed weight: `[panels][k2][PANEL][2]`.
pub(crate) fn pairs_len(k: usize, n: usize) -> usize {
    n.div_ceil(PANEL) * k.div_ceil(2) * PANEL * 2
}

/// Rows of activations rounded to bf16 for one product, zero-padded to
/// what every kernel reads whole: rows to a multiple of 16 (an AMX tile's
/// rows), each row to a multiple of 32 elements (a tile row of 64 bytes).
pub(crate) struct Activations {
    pub data: Vec<u16>,
    /// Elements per row: k rounded up to 32.
    pub stride: usize,
}

/// An AMX tile's rows, and the rows the activations are padded to.
pub(crate) const TILE_ROWS: usize = 16;
/// Bf16 elements of one 64-byte tile row.
pub(crate) const TILE_K: usize = 32;

impl Activations {
    pub(crate) fn new(a: &[f32], m: usize, k: usize) -> Activations {
        let stride = k.next_multiple_of(TILE_K);
        let mut data = vec![0u16; m.next_multiple_of(TILE_ROWS) * stride];
        for (src, dst) in a[..m * k]
            .chunks_exact(k)
            .zip(data.chunks_exact_mut(stride))
        {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = to_bf16(s);
            }
        }
        Activations { data, stride }
    }

    /// Row `r`'s pair `kk` as one 32-bit word (the first element low), as
    /// `vdpbf16ps` reads a broadcast pair.
    #[inline(always)]
    pub(crate) fn pair(&self, r: usize, kk: usize) -> u32 {
        let i = r * self.stride + 2 * kk;
        u32::from(self.data[i]) | (u32::from(self.data[i + 1]) << 16)
    }
}

/// out[:, columns of panels lo..hi] = bf16(a) x those panels of `w` + their
/// bias, with `kernel`.
///
/// # Safety
/// As `super::panels_product`'s; `w` is lin's weight as pairs
/// ([`pairs_len`] of lin.k, lin.n), and `kernel` runs on this CPU (made by
/// [`Bf16Kernel::detect`], or Portable).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panels_product(
    kernel: Bf16Kernel,
    a: &[f32],
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    assert_eq!(
        w.len(),
        pairs_len(lin.k, lin.n),
        "pairs of {} x {}",
        lin.k,
        lin.n
    );
    let act = Activations::new(a, m, lin.k);
    // SAFETY: the caller's contract, passed on; act holds m rows of lin.k
    // (padded), w the layer's pairs (asserted).
    unsafe {
        match kernel {
            Bf16Kernel::Portable => super::portable_bf16::panels(&act, m, lin, w, lo, hi, out),
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => super::avx512_bf16::panels(&act, m, lin, w, lo, hi, out),
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Amx => super::amx::panels(&act, m, lin, w, lo, hi, out),
            #[cfg(all(test, target_arch = "x86_64"))]
            Bf16Kernel::Avx512Emulated => {
                super::avx512_bf16::panels_emulated(&act, m, lin, w, lo, hi, out)
            }
            #[cfg(all(test, target_arch = "x86_64"))]
            Bf16Kernel::AmxEmulated => super::amx::panels_emulated(&act, m, lin, w, lo, hi, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::Isa;
    use crate::model::layers::linear::matmul;

    /// Every bf16 kernel of this crate that this CPU runs, each with a line
    /// saying so for those it lacks.
    fn kernels_here() -> Vec<Bf16Kernel> {
        let mut kernels = vec![Bf16Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            kernels.push(Bf16Kernel::Avx512Emulated);
            kernels.push(Bf16Kernel::AmxEmulated);
            if super::super::avx512_bf16::supported() {
                kernels.push(Bf16Kernel::Avx512);
            } else {
                eprintln!("avx512-bf16 kernel: skipped: this CPU lacks avx512_bf16 (or avx512f)");
            }
            if super::super::amx::permitted() {
                kernels.push(Bf16Kernel::Amx);
            } else {
                eprintln!(
                    "amx-bf16 kernel: skipped: this CPU lacks amx_bf16 (or Linux refused its \
                     tile state)"
                );
            }
        }
        kernels
    }

    /// Against the exact product of the f32 inputs (f64 sums): each operand
    /// of a product is rounded to bf16 (relative error at most u = 2^-8,
    /// so a product's at most 2u + u^2), and k products plus the bias are
    /// summed in f32 (at most (k + 1) 2^-24 of the sum of magnitudes);
    /// against the portable reference, only the sums' order differs.
    #[test]
    fn bf16_kernels_match_an_f32_product_within_bf16s_bound() {
        let u = 2f64.powi(-8);
        let eps = 2f64.powi(-24);
        // k: odd (a padded pair), under one AMX tile's 16 pairs, exactly
        // two tiles, tiles and a tail.
        for k in [19, 32, 64, 100] {
            let n = 73;
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 377.0)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 - 36.0) / 9.0).collect();
            // Past SMALL_M too: bf16 layers take every row count.
            for m in [1, 5, 6, 7, 16, 17, 33, 70] {
                let a: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 104729 % 997) as f32 - 498.0) / 211.0)
                    .collect();
                let mut reference = vec![f32::NAN; m * n];
                let mut first = true;
                for kernel in kernels_here() {
                    let lin = Linear::from_out_in_bf16(&[(&w, &b)], k, kernel);
                    for threads in [1, 2, 3] {
                        let mut out = vec![f32::NAN; m * n + 5];
                        matmul(Isa::detect(), &a, m, &lin, &mut out, threads);
                        assert!(
                            out[m * n..].iter().all(|v| v.is_nan()),
                            "{kernel:?} wrote past the matrix"
                        );
                        let mut rounded = false;
                        for i in 0..m {
                            for j in 0..n {
                                let terms =
                                    (0..k).map(|t| (a[i * k + t] as f64, w[j * k + t] as f64));
                                let exact: f64 =
                                    b[j] as f64 + terms.clone().map(|(x, y)| x * y).sum::<f64>();
                                let size: f64 = (b[j] as f64).abs()
                                    + terms.map(|(x, y)| (x * y).abs()).sum::<f64>();
                                let got = out[i * n + j] as f64;
                                let bound = size * (2.0 * u + u * u + (k + 1) as f64 * eps);
                                assert!(
                                    (got - exact).abs() <= bound,
                                    "{kernel:?} k {k} m {m} threads {threads} [{i}, {j}]: \
                                     {got} vs {exact} (bound {bound})"
                                );
                                rounded |= (got - exact).abs() > size * (k + 1) as f64 * eps;
                                let r = reference[i * n + j] as f64;
                                if !first {
                                    let order = 2.0 * size * (k + 2) as f64 * eps;
                                    assert!(
                                        (got - r).abs() <= order,
                                        "{kernel:?} k {k} m {m} [{i}, {j}]: {got} vs the \
                                         reference's {r}"
                                    );
                                }
                            }
                        }
                        assert!(
                            rounded,
                            "{kernel:?} k {k} m {m}: no sum shows bf16 rounding"
                        );
                        if first {
                            reference.copy_from_slice(&out[..m * n]);
                            first = false;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
        assert_eq!(to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 2^-7 + 2^-8 is halfway up from an odd mantissa: rounds up.
        assert_eq!(to_bf16(1.0 + 2f32.powi(-7) + 2f32.powi(-8)), 0x3f82);
        // Just over half rounds up.
        assert_eq!(to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
        assert_eq!(to_bf16(-2.0), 0xc000);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(to_bf16(f32::MAX), 0x7f80, "rounds up to infinity");
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        for x in [0.0f32, 1.0, -3.5, 1e-3, 65504.0, 1e30] {
            let back = from_bf16(to_bf16(x));
            assert!((back - x).abs() <= x.abs() * 2f32.powi(-8), "{x} -> {back}");
        }
    }

    #[test]
    fn pairs_hold_consecutive_inputs_of_one_column() {
        // Two layers stacked, 3 + 66 = 69 columns (two panels), k = 5 (odd:
        // padded with a zero).
        let k = 5;
        let wa: Vec<f32> = (0..3 * k).map(|i| i as f32).collect();
        let wb: Vec<f32> = (0..66 * k).map(|i| -(i as f32)).collect();
        let w = pack_pairs(&[(&wa, 3), (&wb, 66)], k);
        assert_eq!(w.len(), pairs_len(k, 69));
        let at = |p: usize, kk: usize, j: usize, t: usize| {
            from_bf16(w[((p * 3 + kk) * PANEL + j) * 2 + t])
        };
        for c in 0..69 {
            for i in 0..k {
                let want = if c < 3 {
                    wa[c * k + i]
                } else {
                    wb[(c - 3) * k + i]
                };
                let got = at(c / PANEL, i / 2, c % PANEL, i % 2);
                assert_eq!(got, from_bf16(to_bf16(want)), "column {c}, input {i}");
            }
            assert_eq!(at(c / PANEL, 2, c % PANEL, 1), 0.0, "k padded with zero");
        }
        assert!((69..128).all(|c| (0..3).all(|kk| at(1, kk, c % PANEL, 0) == 0.0)));
    }
}
