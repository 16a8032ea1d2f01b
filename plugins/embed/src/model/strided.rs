//! Attention's products for long sequences (scores = Q K^T, context = P V)
//! on the `gemm` crate, over matrices given by pointer and strides.

/// out[m, n] (row stride `out_rs`) = a[m, k] x b[k, n], each of a and b
/// given by its row stride and column stride.
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
