//! The dense layers' matrix products, on the `gemm` crate (run-time CPU
//! dispatch of its own), split by output columns over the call's threads.

/// A dense layer's weight, transposed once at load to `[in, out]` row-major
/// (safetensors stores `[out, in]`): gemm streams it far faster that way at
/// the small row counts of a few sentences.
pub(crate) struct Linear {
    /// `[k, n]` row-major.
    pub w: Vec<f32>,
    /// `[n]`.
    pub b: Vec<f32>,
    pub k: usize,
    pub n: usize,
}

impl Linear {
    /// From safetensors' `[n, k]` weights (one or more stacked along n, e.g.
    /// query, key and value) and their biases.
    pub(crate) fn from_out_in(parts: &[(&[f32], &[f32])], k: usize) -> Linear {
        let n: usize = parts.iter().map(|(_, b)| b.len()).sum();
        let mut w = vec![0f32; k * n];
        let mut b = Vec::with_capacity(n);
        let mut col = 0;
        for (pw, pb) in parts {
            let pn = pb.len();
            for j in 0..pn {
                for i in 0..k {
                    w[i * n + col + j] = pw[j * k + i];
                }
            }
            b.extend_from_slice(pb);
            col += pn;
        }
        Linear { w, b, k, n }
    }

    pub(crate) fn bytes(&self) -> usize {
        (self.w.len() + self.b.len()) * 4
    }
}

/// A pointer that may cross to another thread of the pool.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to hand disjoint column ranges of one output matrix to
// the threads of one rayon scope, which ends before the matrix is used again.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer is only read to compute an offset.
unsafe impl Sync for SendPtr {}

/// out[m, n] = a[m, k] x lin.w[k, n] (no bias), over `threads` threads of
/// the current rayon pool (1: on this thread).
pub(crate) fn matmul(a: &[f32], m: usize, lin: &Linear, out: &mut [f32], threads: usize) {
    let (k, n) = (lin.k, lin.n);
    assert!(a.len() >= m * k && out.len() >= m * n, "matmul shapes");
    if m == 0 {
        return;
    }
    let chunks = threads.clamp(1, n.div_ceil(16).max(1));
    if chunks == 1 {
        // SAFETY: a is m x k and out is m x n (asserted above), lin.w is k x
        // n by construction; all row-major with the strides given.
        unsafe { gemm_cols(a, m, k, &lin.w, n, 0, n, out.as_mut_ptr()) };
        return;
    }
    // Column ranges, multiples of 16 wide, one per thread.
    let per = n.div_ceil(chunks).next_multiple_of(16);
    let dst = SendPtr(out.as_mut_ptr());
    rayon::scope(|s| {
        for c in 0..chunks {
            let lo = c * per;
            let hi = ((c + 1) * per).min(n);
            if lo >= hi {
                continue;
            }
            let w = &lin.w;
            s.spawn(move |_| {
                let dst = dst;
                // SAFETY: as above; each task writes only columns lo..hi of
                // out, and the ranges of the tasks are disjoint.
                unsafe { gemm_cols(a, m, k, w, n, lo, hi, dst.0) };
            });
        }
    });
}

/// out[:, lo..hi] = a x w[:, lo..hi].
///
/// # Safety
/// `a` holds m x k, `w` k x n, `out` points at m x n f32s, all row-major;
/// no one else touches out's columns lo..hi meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_cols(
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    // SAFETY: the caller's contract; offsets lo stay inside row 0.
    unsafe {
        gemm::gemm(
            m,
            hi - lo,
            k,
            out.add(lo),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            w.as_ptr().add(lo),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// out[m, n] = a[m, k] x b[k, n] for matrices given by pointer and strides
/// (row stride, then column stride); used for attention of long sequences.
///
/// # Safety
/// Every element the strides address lies in memory valid for reads (a, b)
/// or writes (out) that no one else touches meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_strided(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
    out: *mut f32,
    out_rs: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            out_rs as isize,
            false,
            a,
            a_cs as isize,
            a_rs as isize,
            b,
            b_cs as isize,
            b_rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_for_any_split() {
        let (m, k) = (7, 19);
        let wq: Vec<f32> = (0..23 * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let bq: Vec<f32> = (0..23).map(|i| i as f32).collect();
        let wk: Vec<f32> = (0..18 * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let bk: Vec<f32> = vec![0.0; 18];
        let lin = Linear::from_out_in(&[(&wq, &bq), (&wk, &bk)], k);
        assert_eq!((lin.k, lin.n), (19, 41));
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 3 % 17) as f32 - 8.0) / 4.0)
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for threads in [1, 2, 3, 8] {
            let mut out = vec![f32::NAN; m * 41];
            pool.install(|| matmul(&a, m, &lin, &mut out, threads));
            for i in 0..m {
                for j in 0..41 {
                    let (w, jj) = if j < 23 { (&wq, j) } else { (&wk, j - 23) };
                    let want: f32 = (0..k).map(|t| a[i * k + t] * w[jj * k + t]).sum();
                    assert!((out[i * 41 + j] - want).abs() < 1e-4, "threads {threads}");
                }
            }
        }
    }
}
