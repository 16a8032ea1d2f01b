//! The dense layer, `out = a x W + b`: every architecture's projections.
//!
//! Weights are packed once into panels of [`PANEL`] output columns:
//! `[n / PANEL][k][PANEL]`, each panel one contiguous run of memory (in
//! the packed cache file, mapped: see cache.rs). Two
//! engines read that one layout:
//!
//! - on AVX-512 and up to [`SMALL_M`] rows (a request of a few
//!   sentences), or AVX2 and up to [`SMALL_M_AVX2`], a register-blocked kernel of this crate's (`linear/`)
//!   that streams each panel once per 6 rows, with the bias folded into
//!   its accumulators;
//! - otherwise the `gemm` crate (its own run-time CPU dispatch and
//!   packing), one call per run of panels, each a plain row-major `[k,
//!   PANEL]` right-hand side.
//!
//! Panels are split over the call's threads (disjoint output columns).
//!
//! A layer's weights are f32 panels, or bf16 in the pair layout of
//! `linear/bf16.rs` where the model computes in bf16: there the product is
//! one of its kernels (AMX-BF16, AVX512-BF16, or the portable reference in
//! tests) at every row count.

use crate::model::kernels::Isa;
use crate::model::mmap::Tensor;
use crate::model::team;

pub(crate) use bf16::Bf16Kernel;

/// Output columns per panel: four AVX-512 vectors.
pub(crate) const PANEL: usize = 64;

/// Rows up to which the panel kernels run instead of gemm.
pub(crate) const SMALL_M: usize = 64;

/// The same on AVX2, whose 16 registers hold a block of 16 columns only:
/// against gemm it won at 12 rows (all-MiniLM-L6-v2 3.8 ms a call instead
/// of 4.7, all-mpnet-base-v2 37.4 instead of 40.3) and lost at 47 (MPNet
/// 115 ms instead of 105) on an AMD EPYC without AVX-512, 2026-12-05.
pub(crate) const SMALL_M_AVX2: usize = 24;

/// Rows past which a product's split cuts each thread's share of the
/// panels into [`PIECES_A_THREAD`] pieces.
const PIECES_PAST_ROWS: usize = 64;
const PIECES_A_THREAD: usize = 3;

/// How a model's dense layers compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    /// f32 panels: the f32 kernels and gemm, by [`Isa`].
    F32,
    /// bf16 pairs, by this kernel.
    Bf16(Bf16Kernel),
}

/// A dense layer's weight, as the model computes it.
pub(crate) enum Weights {
    /// `[panels][k][PANEL]` f32, columns past `n` zero.
    F32(Tensor),
    /// `[panels][ceil(k / 2)][PANEL][2]` bf16 pairs (`linear/bf16.rs`),
    /// multiplied by `kernel`.
    Bf16 { w: Tensor<u16>, kernel: Bf16Kernel },
}

/// A dense layer's weight in panels, and its bias.
pub(crate) struct Linear {
    w: Weights,
    /// `[n]`.
    pub b: Tensor,
    pub k: usize,
    pub n: usize,
}

/// Safetensors' `[n, k]` weights (one or more stacked along n, e.g. query,
/// key and value; each given with its n) in panels: `[panels][k][PANEL]`,
/// panels = ceil(n / PANEL), columns past n zero.
pub(crate) fn pack_panels(parts: &[(&[f32], usize)], k: usize) -> Vec<f32> {
    let n: usize = parts.iter().map(|&(_, n)| n).sum();
    let panels = n.div_ceil(PANEL);
    let mut w = vec![0f32; panels * k * PANEL];
    let mut col = 0;
    for &(pw, pn) in parts {
        for j in 0..pn {
            let c = col + j;
            let (p, lane) = (c / PANEL, c % PANEL);
            let src = &pw[j * k..(j + 1) * k];
            for (i, &v) in src.iter().enumerate() {
                w[(p * k + i) * PANEL + lane] = v;
            }
        }
        col += pn;
    }
    w
}

impl Linear {
    /// Over packed panels ([`pack_panels`], or [`bf16::pack_pairs`]) and
    /// the n biases; panics when their sizes disagree with k and n.
    pub(crate) fn new(w: Weights, b: Tensor, k: usize, n: usize) -> Linear {
        let (len, want) = match &w {
            Weights::F32(w) => (w.len(), n.div_ceil(PANEL) * k * PANEL),
            Weights::Bf16 { w, .. } => (w.len(), bf16::pairs_len(k, n)),
        };
        assert_eq!(len, want, "panels of {k} x {n}");
        assert_eq!(b.len(), n, "biases of {n} columns");
        Linear { w, b, k, n }
    }

    /// From safetensors' `[n, k]` weights (one or more stacked along n, e.g.
    /// query, key and value) and their biases, on the heap.
    #[cfg(test)]
    pub(crate) fn from_out_in(parts: &[(&[f32], &[f32])], k: usize) -> Linear {
        let sized: Vec<(&[f32], usize)> = parts.iter().map(|&(w, b)| (w, b.len())).collect();
        let b: Vec<f32> = parts.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let n = b.len();
        let w = Weights::F32(Tensor::Heap(pack_panels(&sized, k)));
        Linear::new(w, Tensor::Heap(b), k, n)
    }

    /// [`Linear::from_out_in`] with its weights rounded to bf16 pairs, for
    /// `kernel`.
    #[cfg(test)]
    pub(crate) fn from_out_in_bf16(
        parts: &[(&[f32], &[f32])],
        k: usize,
        kernel: Bf16Kernel,
    ) -> Linear {
        let sized: Vec<(&[f32], usize)> = parts.iter().map(|&(w, b)| (w, b.len())).collect();
        let b: Vec<f32> = parts.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let n = b.len();
        let w = Tensor::Heap(bf16::pack_pairs(&sized, k));
        Linear::new(Weights::Bf16 { w, kernel }, Tensor::Heap(b), k, n)
    }

    #[cfg(test)]
    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
}

/// A pointer that may cross to a helper thread (team.rs).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to hand disjoint column ranges of one output matrix to
// the threads of one split (team::each), which ends before the matrix is
// used again.
unsafe impl Send for SendPtr {}
// SAFETY: as above; shared only to be copied.
unsafe impl Sync for SendPtr {}

/// out[m, n] = a[m, k] x lin + lin.b, over `threads` threads (1: on this
/// thread; more: this one and the process's helpers, `team.rs`).
pub(crate) fn matmul(isa: Isa, a: &[f32], m: usize, lin: &Linear, out: &mut [f32], threads: usize) {
    matmul_columns(isa, a, m, lin, 0..lin.n, out, threads);
}

/// Whether columns `c0..c1` of `lin` are whole panels, the columns
/// [`matmul_columns`] computes alone.
pub(crate) fn whole_panels(lin: &Linear, c0: usize, c1: usize) -> bool {
    c0 <= c1 && c1 <= lin.n && c0.is_multiple_of(PANEL) && (c1.is_multiple_of(PANEL) || c1 == lin.n)
}

/// [`matmul`]'s columns `cols` alone (whole panels: [`whole_panels`]);
/// out's other columns are left as they are. A stacked product of which
/// some rows need only a part (the last layer's queries, read at the first
/// token alone) computes that part apart.
pub(crate) fn matmul_columns(
    isa: Isa,
    a: &[f32],
    m: usize,
    lin: &Linear,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    threads: usize,
) {
    let _span = crate::model::profile::span(crate::model::profile::Part::Products);
    let (k, n) = (lin.k, lin.n);
    assert!(
        a.len() >= m * k && out.len() >= m * n,
        "matmul: a is {} (want {m} x {k}), out is {} (want {m} x {n})",
        a.len(),
        out.len()
    );
    assert!(
        whole_panels(lin, cols.start, cols.end),
        "matmul: columns {cols:?} of {n} are not whole panels of {PANEL}"
    );
    let (first, panels) = (cols.start / PANEL, cols.end.div_ceil(PANEL));
    if m == 0 || first == panels {
        return;
    }
    let threads = threads.clamp(1, panels - first);
    // Past a few rows, pieces smaller than a thread's share: a thread that
    // the box slows down (another process, an interrupt) takes fewer, and
    // the split ends about together.
    let chunks = if m <= PIECES_PAST_ROWS {
        threads
    } else {
        (threads * PIECES_A_THREAD).min(panels - first)
    };
    let dst = SendPtr(out.as_mut_ptr());
    let run = move |lo: usize, hi: usize| {
        let dst = dst;
        // SAFETY: a is m x k and out m x n (asserted above), lin's panels
        // cover lo..hi by construction; this call writes only the columns
        // of panels lo..hi, which no other task of this call touches.
        unsafe { panels_product(isa, a, m, lin, lo, hi, dst.0) }
    };
    if threads == 1 {
        run(first, panels);
        return;
    }
    let per = (panels - first).div_ceil(chunks);
    team::each(threads, chunks, |c| {
        let (lo, hi) = (first + c * per, (first + (c + 1) * per).min(panels));
        if lo < hi {
            run(lo, hi);
        }
    });
}

/// out[:, columns of panels lo..hi] = a x those panels + their bias.
///
/// # Safety
/// `a` holds m x lin.k, `out` points at m x lin.n writable f32s that no one
/// else touches in those columns meanwhile; lo <= hi <= lin.panels().
unsafe fn panels_product(
    isa: Isa,
    a: &[f32],
    m: usize,
    lin: &Linear,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let w = match &lin.w {
        Weights::F32(w) => w,
        Weights::Bf16 { w, kernel } => {
            // SAFETY: the caller's contract; the pairs are lin's (checked
            // by Linear::new) and the kernel one this CPU runs (detected,
            // or the portable one).
            unsafe { bf16::panels_product(*kernel, a, m, lin, w, lo, hi, out) };
            return;
        }
    };
    #[cfg(target_arch = "x86_64")]
    let small = match isa {
        Isa::Avx512 => SMALL_M,
        Isa::Avx2 => SMALL_M_AVX2,
        Isa::Scalar => 0,
    };
    #[cfg(target_arch = "x86_64")]
    if m <= small {
        for p in lo..hi {
            // SAFETY: the caller's contract, panel p being in range; isa is
            // what this CPU runs (Isa::detect or a test's all_supported).
            unsafe {
                match isa {
                    Isa::Avx512 => avx512::panel(a, m, lin, w, p, out),
                    _ => avx2::panel(a, m, lin, w, p, out),
                }
            }
        }
        return;
    }
    let _ = isa;
    let (k, n) = (lin.k, lin.n);
    let c0 = lo * PANEL;
    let c1 = (hi * PANEL).min(n);
    // The bias first, then gemm adds the product to it.
    for r in 0..m {
        // SAFETY: row r, columns c0..c1 of out: inside the m x n matrix and
        // ours alone (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts_mut(out.add(r * n + c0), c1 - c0) };
        row.copy_from_slice(&lin.b[c0..c1]);
    }
    for p in lo..hi {
        let cols = PANEL.min(n - p * PANEL);
        // SAFETY: dst is out's columns p*PANEL.. (cols of them) with row
        // stride n, lhs is a (m x k, row stride k), rhs panel p (k x cols,
        // row stride PANEL): all in bounds by the contract and Linear's
        // layout.
        unsafe {
            gemm::gemm(
                m,
                cols,
                k,
                out.add(p * PANEL),
                1,
                n as isize,
                true,
                a.as_ptr(),
                1,
                k as isize,
                w.as_ptr().add(p * k * PANEL),
                1,
                PANEL as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
pub(crate) mod bf16;
mod portable_bf16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_panels_is_those_columns_of_the_whole_product_alone() {
        let (k, n) = (21, 3 * PANEL + 9);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 % 19) as f32 - 9.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32 / 10.0).collect();
        let lin = Linear::from_out_in(&[(&w, &b)], k);
        assert!(!whole_panels(&lin, 1, PANEL) && !whole_panels(&lin, 0, PANEL + 1));
        for m in [1, 7, SMALL_M + 5] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 5 % 13) as f32 - 6.0) / 3.0)
                .collect();
            for isa in Isa::all_supported() {
                let mut whole = vec![0f32; m * n];
                matmul(isa, &a, m, &lin, &mut whole, 1);
                for (c0, c1) in [
                    (0, PANEL),
                    (PANEL, n),
                    (2 * PANEL, 3 * PANEL),
                    (PANEL, PANEL),
                ] {
                    for threads in [1, 2, 3] {
                        let mut part = vec![f32::NAN; m * n];
                        matmul_columns(isa, &a, m, &lin, c0..c1, &mut part, threads);
                        for (i, (&g, &want)) in part.iter().zip(&whole).enumerate() {
                            if (c0..c1).contains(&(i % n)) {
                                assert_eq!(g, want, "m {m} {isa:?} columns {c0}..{c1} at {i}");
                            } else {
                                assert!(
                                    g.is_nan(),
                                    "m {m} {isa:?} wrote column {} of {c0}..{c1}",
                                    i % n
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_matches_naive_on_every_path_and_split() {
        let k = 19;
        // 23 + 50 = 73 columns: one full panel and a partial one.
        let wq: Vec<f32> = (0..23 * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let bq: Vec<f32> = (0..23).map(|i| i as f32).collect();
        let wk: Vec<f32> = (0..50 * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let bk: Vec<f32> = (0..50).map(|i| -(i as f32) / 7.0).collect();
        let lin = Linear::from_out_in(&[(&wq, &bq), (&wk, &bk)], k);
        let n = 73;
        assert_eq!((lin.k, lin.n, lin.panels()), (19, n, 2));
        for m in [1, 5, 6, 7, 12, 13, 25, SMALL_M_AVX2, SMALL_M, SMALL_M + 3] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 3 % 17) as f32 - 8.0) / 4.0)
                .collect();
            for isa in Isa::all_supported() {
                for threads in [1, 2, 3] {
                    let mut out = vec![f32::NAN; m * n + 5];
                    matmul(isa, &a, m, &lin, &mut out, threads);
                    for i in 0..m {
                        for j in 0..n {
                            let (w, b, jj) = if j < 23 {
                                (&wq, &bq, j)
                            } else {
                                (&wk, &bk, j - 23)
                            };
                            let want: f32 =
                                b[jj] + (0..k).map(|t| a[i * k + t] * w[jj * k + t]).sum::<f32>();
                            let got = out[i * n + j];
                            assert!(
                                (got - want).abs() < 1e-4,
                                "m {m} {isa:?} threads {threads}: {got} vs {want}"
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
